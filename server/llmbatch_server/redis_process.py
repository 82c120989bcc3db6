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
from collections.abc import Iterator

from llmbatch_server._process import ManagedProcess, free_port

__all__ = ["RedisError", "RedisProcess", "redis_server_path", "run_redis"]

STARTUP_TIMEOUT = 10.0


class RedisError(RuntimeError):
    """redis-server did not start, or is not installed."""


def redis_server_path() -> str | None:
    """Where ``redis-server`` is, or None if it is not installed."""
    return shutil.which("redis-server")


class RedisProcess(ManagedProcess):
    """A running redis-server subprocess."""

    name = "redis-server"
    error = RedisError
    startup_timeout = STARTUP_TIMEOUT

    def __init__(self) -> None:
        super().__init__(tag="redis")
        self.port = 0

    def __repr__(self) -> str:
        return f"RedisProcess(url={self.url!r}, pid={self.pid})"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        binary = redis_server_path()
        if binary is None:
            raise RedisError("redis-server is not installed (Debian: apt-get install redis-server)")
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._dir),
            "--logfile", str(self._log),
        ]  # fmt: skip

    def ready(self) -> bool:
        return self.ping()

    def start(self, timeout: float | None = None) -> None:
        """Start on a free port and wait until it answers PING (a port taken between
        choosing and binding it is retried with another)."""
        for _ in range(3):
            self.port = free_port()
            self.spawn()
            if self.await_ready(timeout):
                return
        raise RedisError(f"redis-server did not start:\n{self.log_tail()}")

    def restart(self, timeout: float | None = None) -> None:
        """Stop, then start again on the same port (its data is gone: nothing is saved)."""
        self.stop()
        self.spawn()
        self.wait_ready(timeout)

    def ping(self) -> bool:
        """Whether it answers PING now."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        return super().log_tail(lines) or "(no log)"


@contextlib.contextmanager
def run_redis() -> Iterator[RedisProcess]:
    """A redis-server for the duration of the ``with`` block."""
    redis = RedisProcess()
    try:
        redis.start()
        yield redis
    finally:
        redis.close()
