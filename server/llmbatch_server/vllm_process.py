"""Run a real vLLM through ``llmbatch-server vllm`` as a subprocess, for benches.

The counterpart of :class:`llmbatch_server.testing.SimulatorProcess` for the engine
itself: start it on a free loopback port, kill it as a crash would (SIGKILL to
vLLM's whole process group) and restart it on the same port, stop it, and tell its
processes apart (the API server, the engine core and its workers) so their CPU can
be counted separately.

    with run_vllm("/models/tiny", "--", "--enforce-eager") as server:
        ... server.base_url ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from llmbatch_server._process import ManagedProcess, free_port, signal_group

#: vLLM loads, compiles and warms up before it answers: minutes on a small CPU.
DEFAULT_STARTUP_TIMEOUT = 300.0


class VLLMProcessError(RuntimeError):
    """vLLM did not start; the message carries the launcher's log tail."""


__all__ = ["VLLMProcess", "VLLMProcessError", "free_port", "run_vllm"]


class VLLMProcess(ManagedProcess):
    """One ``llmbatch-server vllm`` launcher and the vLLM it runs."""

    name = "vLLM"
    error = VLLMProcessError
    own_group = True
    poll_interval = 0.5
    startup_timeout = DEFAULT_STARTUP_TIMEOUT

    def __init__(
        self,
        model: str,
        vllm_args: Sequence[str] = (),
        *,
        profile: str = "latency",
        port: int = 0,
        vllm_bin: str | None = None,
        cpus: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(tag="vllm")
        self.model = model
        self.vllm_args = tuple(vllm_args)
        self.profile = profile
        self.port = port or free_port()
        self.vllm_bin = vllm_bin
        self.cpus = cpus
        self.env = env or {}

    def __repr__(self) -> str:
        return f"VLLMProcess(model={self.model!r}, port={self.port}, pid={self.pid})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "llmbatch_server", "vllm", "--model", self.model]
        argv += ["--profile", self.profile, "--port", str(self.port)]
        argv += ["--startup-timeout", str(DEFAULT_STARTUP_TIMEOUT)]
        if self.vllm_bin:
            argv += ["--vllm-bin", self.vllm_bin]
        if self.cpus:
            argv += ["--cpus", self.cpus]
        return [*argv, "--", *self.vllm_args]

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code == 200
        return False

    def processes(self) -> tuple[int | None, list[int]]:
        """(the API server's pid, the engine's pids: engine core and workers)."""
        psutil = _psutil()
        if psutil is None or self.pid is None:
            return None, []
        try:
            launcher = psutil.Process(self.pid)
            servers = launcher.children()
            if not servers:
                return None, []
            api = servers[0]
            engine = [p.pid for p in api.children(recursive=True) if _is_engine(p)]
        except psutil.Error:
            return None, []
        return int(api.pid), engine

    def kill(self) -> None:
        """Crash: SIGKILL vLLM's process group (the API server's), then the launcher."""
        api, _ = self.processes()
        if api is not None:
            with contextlib.suppress(ProcessLookupError):
                signal_group(os.getpgid(api), signal.SIGKILL)
        super().kill()

    def restart(self, timeout: float | None = None) -> None:
        """Start again on the same port (after :meth:`kill`)."""
        self.start(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the launcher (it stops vLLM's group), SIGKILL what is left."""
        api, _ = self.processes()
        super().stop(timeout)
        if api is not None:
            with contextlib.suppress(ProcessLookupError):
                signal_group(os.getpgid(api), signal.SIGKILL)


def _psutil() -> Any:
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    return psutil


def _is_engine(process: Any) -> bool:
    """vLLM names its engine processes ``VLLM::EngineCore`` and ``VLLM::Worker``;
    the multiprocessing resource tracker beside them does no engine work."""
    with contextlib.suppress(Exception):
        return "resource_tracker" not in " ".join(process.cmdline())
    return False


@contextlib.contextmanager
def run_vllm(model: str, *vllm_args: str, **options: Any) -> Iterator[VLLMProcess]:
    """A started :class:`VLLMProcess` for the block; stopped after it."""
    server = VLLMProcess(model, vllm_args, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
