"""One lifecycle for the server processes this package starts and owns.

The simulator, a real vLLM behind the launcher, llama.cpp's server and Redis are
each a :class:`ManagedProcess`: started without a shell on loopback, its output in a
log file of its own, ready when its own check says so, stopped with SIGTERM and then
SIGKILL after a bound, killed at once as a crash would, and never outliving this
process (:func:`~llmbatch_server._lifetime.stop_with_parent`). A subclass says only
what differs: the command line, the environment, the readiness check, and whether
the server runs in a process group of its own (a server with workers: signals then
reach the whole group). The asynchronous launcher (:class:`VLLMServer`) streams its
child's log instead of writing a file, and shares :func:`signal_group` with this.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from llmbatch_server._lifetime import stop_with_parent

__all__ = ["ManagedProcess", "free_port", "signal_group"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group; nothing if it has gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class ManagedProcess:
    """A server process started here: spawn, wait until ready, stop, kill, restart."""

    #: What the errors call it ("llama-server").
    name: ClassVar[str] = "server"
    #: The error a failed start raises (a subclass of RuntimeError).
    error: ClassVar[type[RuntimeError]] = RuntimeError
    #: Whether it runs in a session of its own, signalled as a whole group.
    own_group: ClassVar[bool] = False
    #: How often :meth:`wait_ready` checks.
    poll_interval: ClassVar[float] = 0.02
    #: How long :meth:`start` waits by default.
    startup_timeout: ClassVar[float] = 30.0

    def __init__(self, *, tag: str) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix=f"llmbatch-{tag}-"))
        self._log = self._dir / f"{tag}.log"
        self._process: subprocess.Popen[bytes] | None = None

    # What a subclass says.

    def argv(self) -> list[str]:
        """The command line (no shell reads it)."""
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The child's environment; None inherits this process's."""
        return None

    def ready(self) -> bool:
        """One readiness check (``/health`` answered, PING answered, ...)."""
        raise NotImplementedError

    # The lifecycle.

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the process has been started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def spawn(self) -> None:
        """Start the process without waiting for it (see :meth:`wait_ready`)."""
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=self.own_group,
                preexec_fn=stop_with_parent(),
            )

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until :meth:`ready`; the class's error if it exits or time runs out."""
        if not self.await_ready(timeout):
            assert self._process is not None
            raise self.error(
                f"{self.name} exited with {self._process.returncode}:\n{self.log_tail()}"
            )

    def await_ready(self, timeout: float | None = None) -> bool:
        """True once ready, False if the process exited first (a subclass may try
        again); stopped and the class's error raised when ``timeout`` passes."""
        if self._process is None:
            raise RuntimeError("spawn() first")
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                return False
            if self.ready():
                return True
            if time.monotonic() > deadline:
                self.stop()
                raise self.error(f"{self.name} not ready after {timeout:g} s:\n{self.log_tail()}")
            time.sleep(self.poll_interval)

    def start(self, timeout: float | None = None) -> None:
        """Start and wait until ready."""
        self.spawn()
        self.wait_ready(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        self._signal(process, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(process, signal.SIGKILL)
            process.wait()

    def kill(self) -> None:
        """SIGKILL at once (a crashed server): in-flight requests lose their connection."""
        process = self._process
        if process is not None and process.poll() is None:
            self._signal(process, signal.SIGKILL)
            process.wait()

    def restart(self, timeout: float | None = None) -> None:
        """Stop if running, then start again (on the same port where it has one)."""
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Stop it and remove its directory (its log goes with it)."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines it logged (for error messages)."""
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _signal(self, process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        if self.own_group:
            signal_group(process.pid, sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
