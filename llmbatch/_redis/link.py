"""One process's connection to the Redis that holds shared budgets.

On asyncio it is redis-py's asyncio client, on the client's own event loop. trio
has no redis-py client, so there the synchronous one runs in a worker thread (one
call at a time). Either way a call is one ``EVALSHA`` round trip (the script is
loaded once, on first use), and every round trip is timed as the process sees it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import sniffio

from llmbatch._config import redact_url

__all__ = ["RedisLink", "SharedBudgetUnreachable", "require_redis"]

#: Seconds a connect or a reply may take before the call counts as failed: a
#: Redis that slow cannot keep a budget, and the fallback policy applies.
SOCKET_TIMEOUT = 1.0
#: Round-trip samples kept for percentiles.
SAMPLES = 100_000


class SharedBudgetUnreachable(Exception):
    """A call to Redis failed (connection refused, timeout, an error reply)."""


def require_redis() -> Any:
    """The ``redis`` package, or an ImportError that says how to get it."""
    try:
        import redis
    except ImportError as exc:
        raise ImportError(
            "budgets shared through Redis need the 'redis' package: pip install 'llmbatch[redis]'"
        ) from exc
    return redis


class RedisLink:
    """Runs the budget scripts on one Redis; counts and times every round trip."""

    def __init__(self, url: str) -> None:
        self._redis = require_redis()
        self._url = url
        self._errors: tuple[type[BaseException], ...] = (self._redis.RedisError, OSError)
        self.where = redact_url(url)
        """The URL without its password (for logs)."""
        self._client: Any = None
        self._threaded = False
        self._scripts: dict[str, Any] = {}
        self._limiter = anyio.CapacityLimiter(1)
        self.round_trips = 0
        self.failures = 0
        self.samples: deque[float] = deque(maxlen=SAMPLES)
        """Seconds per round trip (all but the first, which connects)."""

    def _connect(self) -> Any:
        options: dict[str, Any] = {
            "socket_timeout": SOCKET_TIMEOUT,
            "socket_connect_timeout": SOCKET_TIMEOUT,
            "decode_responses": True,
        }
        if sniffio.current_async_library() == "asyncio":
            import redis.asyncio

            return redis.asyncio.Redis.from_url(self._url, **options)
        self._threaded = True
        return self._redis.Redis.from_url(self._url, **options)

    async def run(self, script: str, keys: Sequence[str], args: Sequence[object]) -> list[str]:
        """Run ``script``; raise :class:`SharedBudgetUnreachable` if Redis fails."""
        if self._client is None:
            self._client = self._connect()
        runner = self._scripts.get(script)
        if runner is None:
            runner = self._scripts[script] = self._client.register_script(script)
        started = time.perf_counter()
        try:
            if self._threaded:
                reply = await anyio.to_thread.run_sync(
                    lambda: runner(keys=list(keys), args=list(args)),
                    limiter=self._limiter,
                    abandon_on_cancel=True,
                )
            else:
                reply = await runner(keys=list(keys), args=list(args))
        except self._errors as exc:
            self.failures += 1
            raise SharedBudgetUnreachable(f"{type(exc).__name__}: {exc}") from None
        if self.round_trips:  # the first one also connects (and loads the script)
            self.samples.append(time.perf_counter() - started)
        self.round_trips += 1
        return list(reply)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self._threaded:
            await anyio.to_thread.run_sync(client.close)
        else:
            await client.aclose()
