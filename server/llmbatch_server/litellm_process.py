"""LiteLLM's proxy (``litellm --config ...``) in front of one OpenAI-compatible
server, as a process for tests and experiments: a server nobody here wrote that
enforces limits of its own and rewrites the answers' rate-limit headers.

    with LiteLLMProxyProcess(binary, upstream=sim.base_url, model="llmbatch-sim",
                             rpm=600, tpm=20_000) as proxy:
        client = llmbatch.Client(proxy.base_url, api_key=proxy.master_key)

It runs without a database (no virtual keys, no spend logs), started on 127.0.0.1
on a free port without a shell, is ready when ``/health/liveliness`` answers, and
is stopped with its process group. ``binary`` is the ``litellm`` command of an
environment with ``litellm[proxy]`` (CI installs one apart: its dependencies
would pin the test environment's).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import httpx

from llmbatch_server._process import ManagedProcess, free_port

__all__ = ["LiteLLMError", "LiteLLMProxyProcess"]

#: Importing LiteLLM's proxy takes seconds on a small machine.
STARTUP_TIMEOUT = 120.0
#: The proxy's own key (no database: the master key is the only one).
MASTER_KEY = "sk-llmbatch-test"


class LiteLLMError(RuntimeError):
    """LiteLLM's proxy did not start."""


class LiteLLMProxyProcess(ManagedProcess):
    """One LiteLLM proxy serving ``model`` from ``upstream``, with the deployment's
    ``rpm`` and ``tpm`` (None: not set) and the router's usage-based routing, which
    enforces them."""

    name = "litellm"
    error = LiteLLMError
    own_group = True
    poll_interval = 0.25
    startup_timeout = STARTUP_TIMEOUT

    def __init__(
        self,
        binary: str | Path,
        *,
        upstream: str,
        model: str,
        rpm: int | None = None,
        tpm: int | None = None,
        master_key: str = MASTER_KEY,
    ) -> None:
        super().__init__(tag="litellm")
        self.binary = str(binary)
        self.upstream = upstream
        self.model = model
        self.rpm = rpm
        self.tpm = tpm
        self.master_key = master_key
        self.port = free_port()
        self.config = self._dir / "config.json"

    def __enter__(self) -> LiteLLMProxyProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self) -> list[str]:
        self._write_config()
        return [
            self.binary,
            "--config", str(self.config),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--num_workers", "1",
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            # No network: its bundled price map, no telemetry.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_MASTER_KEY": self.master_key,
        }

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.port}/health/liveliness"
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=2).status_code == 200
        return False

    def start(self, timeout: float | None = None) -> None:
        for _ in range(2):
            self.spawn()
            if self.await_ready(timeout):
                return
            time.sleep(0.5)
            self.port = free_port()
        raise LiteLLMError(f"litellm did not start:\n{self.log_tail()}")

    def _write_config(self) -> None:
        """YAML is a superset of JSON: the config is written as JSON."""
        params: dict[str, object] = {
            "model": f"openai/{self.model}",
            "api_base": self.upstream,
            "api_key": "unused",
        }
        if self.rpm is not None:
            params["rpm"] = self.rpm
        if self.tpm is not None:
            params["tpm"] = self.tpm
        config = {
            "model_list": [{"model_name": self.model, "litellm_params": params}],
            "router_settings": {"routing_strategy": "usage-based-routing-v2"},
            "general_settings": {"master_key": self.master_key},
        }
        self.config.write_text(json.dumps(config, indent=2))
