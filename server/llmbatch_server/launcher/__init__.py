"""vLLM launcher: tuned profiles, the ``vllm serve`` argv, and a managed server."""

from llmbatch_server.launcher.profiles import (
    PROFILES,
    build_argv,
    display_command,
    suggested_client_settings,
)
from llmbatch_server.launcher.server import LauncherError, VLLMServer

__all__ = [
    "PROFILES",
    "LauncherError",
    "VLLMServer",
    "build_argv",
    "display_command",
    "suggested_client_settings",
]
