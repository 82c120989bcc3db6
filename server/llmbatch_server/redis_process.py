"""Start a real ``redis-server`` on 127.0.0.1 for tests, demos and the bench.

    with run_redis() as redis:
        RateLimit(requests_per_minute=1200, redis_url=redis.url, key="team-a")

It listens on a free port, keeps nothing on disk, is ready (answers ``PING``) when
the ``with`` body starts, and is stopped (SIGTERM, then SIGKILL) when it ends.
``redis-server`` comes from the system (Debian: ``apt-get install redis-server``);
:func:`redis_server_path` says whether it is there.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from llmbatch_server._lifetime import stop_with_parent

__all__ = ["RedisError", "RedisProcess", "redis_server_path", "run_redis"]

STARTUP_TIMEOUT = 10.0


class RedisError(RuntimeError):
    """redis-server did not start, or is not installed."""


def redis_server_path() -> str | None:
    """Where ``redis-server`` is, or None if it is not installed."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """A running redis-server subprocess."""

    def __init__(self) -> None:
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix="llmbatch-redis-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._argv: list[str] = []

    def __repr__(self) -> str:
        return f"RedisProcess(url={self.url!r}, pid={self.pid})"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Start on a free port and wait until it answers PING (a port taken between
        choosing and binding it is retried with another)."""
        binary = redis_server_path()
        if binary is None:
            raise RedisError("redis-server is not installed (Debian: apt-get install redis-server)")
        for _ in range(3):
            self.port = _free_port()
            argv = [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self._dir),
                "--logfile", str(self._dir / "redis.log"),
            ]  # fmt: skip
            self._argv = argv
            self._process = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                preexec_fn=stop_with_parent(),
            )
            if self._wait_ready(timeout):
                return
        raise RedisError(f"redis-server did not start:\n{self.log_tail()}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False  # exited (the port was taken): try another
            if self.ping():
                return True
            time.sleep(0.02)
        self.stop()
        raise RedisError(f"redis-server not ready after {timeout}s:\n{self.log_tail()}")

    def ping(self) -> bool:
        """Whether it answers PING now."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop it and remove its directory (its log goes with it)."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def restart(self) -> None:
        """Stop, then start again on the same port (its data is gone: nothing is saved)."""
        self.stop()
        self._process = subprocess.Popen(
            self._argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=stop_with_parent(),
        )
        if not self._wait_ready(STARTUP_TIMEOUT):
            raise RedisError(f"redis-server did not restart:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        log = self._dir / "redis.log"
        if not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def run_redis() -> Iterator[RedisProcess]:
    """A redis-server for the duration of the ``with`` block."""
    redis = RedisProcess()
    try:
        redis.start()
        yield redis
    finally:
        redis.close()
