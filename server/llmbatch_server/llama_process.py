"""llama.cpp's own server (``llama-server``) as a process for tests and benchmarks:
started on 127.0.0.1 on a free port without a shell, waited for until ``/health``
answers, stopped (or killed and restarted on the same port) by its owner.

    with LlamaServerProcess(binary, "tiny.gguf", parallel=16) as server:
        client = llmbatch.Client(server.base_url)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

from llmbatch_server._lifetime import stop_with_parent

__all__ = ["LlamaServerProcess"]

#: How long a start may take before it counts as failed.
STARTUP_TIMEOUT = 60.0
#: Starts tried before giving up on one that exits at once (its port still taken).
START_TRIES = 5


class LlamaServerProcess:
    """One ``llama-server`` with ``--parallel`` slots and ``--metrics`` on."""

    def __init__(
        self,
        binary: str | Path,
        model: str | Path,
        *,
        parallel: int = 16,
        context: int = 16384,
        threads: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.binary = str(binary)
        self.model = str(model)
        self.parallel = parallel
        self.context = context
        self.threads = threads
        self.extra = extra
        self.port = _free_port()
        self._log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def argv(self) -> list[str]:
        argv = [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port)]
        # The context is shared by the slots: each gets context / parallel tokens.
        argv += ["--parallel", str(self.parallel), "-c", str(self.context), "--metrics"]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return [*argv, *self.extra]

    def start(self, timeout: float = STARTUP_TIMEOUT) -> LlamaServerProcess:
        """Start it and wait until ``/health`` answers 200. Restarted on its port
        right after a kill, it may find the port not yet free: it tries again."""
        deadline = time.monotonic() + timeout
        self._spawn()
        exits = 0
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                exits += 1
                if exits >= START_TRIES or time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server exited:\n{self.log_tail()}")
                time.sleep(0.5)
                self._spawn()
                continue
            try:
                if (
                    httpx.get(self.base_url[: -len("/v1")] + "/health", timeout=2).status_code
                    == 200
                ):
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def _spawn(self) -> None:
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=stop_with_parent(),
            )

    def kill(self) -> None:
        """SIGKILL it (an engine crash): in-flight requests lose their connection."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 10 s."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> LlamaServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._log.unlink(missing_ok=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
