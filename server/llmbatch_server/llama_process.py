"""llama.cpp's own server (``llama-server``) as a process for tests and benchmarks:
started on 127.0.0.1 on a free port without a shell, waited for until ``/health``
answers, stopped (or killed and restarted on the same port) by its owner.

    with LlamaServerProcess(binary, "tiny.gguf", parallel=16) as server:
        client = llmbatch.Client(server.base_url)
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx

from llmbatch_server._process import ManagedProcess, free_port

__all__ = ["LlamaServerProcess"]

#: How long a start may take before it counts as failed.
STARTUP_TIMEOUT = 60.0
#: Starts tried before giving up on one that exits at once (its port still taken).
START_TRIES = 5


class LlamaServerProcess(ManagedProcess):
    """One ``llama-server`` with ``--parallel`` slots and ``--metrics`` on, and its
    host-memory prompt cache off (``prompt_cache_mib``, MiB; None: its default)."""

    name = "llama-server"
    own_group = True
    poll_interval = 0.1
    startup_timeout = STARTUP_TIMEOUT

    def __init__(
        self,
        binary: str | Path,
        model: str | Path,
        *,
        parallel: int = 16,
        context: int = 16384,
        threads: int | None = None,
        prompt_cache_mib: int | None = 0,
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(tag="llama-server")
        self.binary = str(binary)
        self.model = str(model)
        self.parallel = parallel
        self.context = context
        self.threads = threads
        self.prompt_cache_mib = prompt_cache_mib
        self.extra = extra
        self.port = free_port()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self) -> list[str]:
        argv = [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port)]
        # The context is shared by the slots: each gets context / parallel tokens.
        argv += ["--parallel", str(self.parallel), "-c", str(self.context), "--metrics"]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        if self.prompt_cache_mib is not None:
            # llama-server keeps each prompt a slot lets go in host memory (8 GiB by
            # default) to reuse its prefix later. Measurements send distinct prompts:
            # the cache only grows, and the server slows as it does, so rounds of
            # one run would not measure the same server (docs/benchmarks.md, "The
            # frontier, fifth run"). None keeps llama-server's own default.
            argv += ["--cache-ram", str(self.prompt_cache_mib)]
        return [*argv, *self.extra]

    def ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        return False

    def start(self, timeout: float | None = None) -> None:
        """Start it and wait until ``/health`` answers 200. Restarted on its port
        right after a kill, it may find the port not yet free: it tries again."""
        for _ in range(START_TRIES - 1):
            self.spawn()
            if self.await_ready(timeout):
                return
            time.sleep(0.5)
        super().start(timeout)
