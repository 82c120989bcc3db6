"""A real redis-server on a free loopback port for the shared-budget tests.

They are skipped, saying why, where redis-server or the ``redis`` package is
missing; CI installs both (``apt-get install redis-server``, the dev extra)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from llmbatch_server.redis_process import RedisProcess, redis_server_path, run_redis

_MISSING = (
    "redis-server is not installed (Debian: apt-get install redis-server)"
    if redis_server_path() is None
    else "the redis package is not installed (pip install 'llmbatch[redis]')"
    if importlib.util.find_spec("redis") is None
    else None
)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisProcess]:
    if _MISSING is not None:
        pytest.skip(_MISSING)
    with run_redis() as redis:
        yield redis
