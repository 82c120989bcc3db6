"""Client-side request and token rate limits (aiolimiter, kept private).

aiolimiter is asyncio-only, so a client with a :class:`RateLimit` refuses to open
under trio; everything else works there.
"""

from __future__ import annotations

import sniffio
from aiolimiter import AsyncLimiter

from llmbatch._config import RateLimit
from llmbatch._exceptions import InvalidRequestError

__all__ = ["RateLimiter"]


class RateLimiter:
    """Waits until one more HTTP request, weighing ``tokens``, fits both budgets."""

    def __init__(self, limit: RateLimit) -> None:
        if sniffio.current_async_library() != "asyncio":
            raise InvalidRequestError(
                "RateLimit needs asyncio (aiolimiter is asyncio-only); under trio, "
                "bound load with Limits(max_in_flight=...) instead",
                field="rate_limit",
            )
        self._requests = (
            AsyncLimiter(limit.requests_per_minute, 60.0) if limit.requests_per_minute else None
        )
        self._token_rate = limit.tokens_per_minute
        self._tokens = (
            AsyncLimiter(limit.tokens_per_minute, 60.0) if limit.tokens_per_minute else None
        )

    async def acquire(self, tokens: int) -> None:
        if self._requests is not None:
            await self._requests.acquire()
        if self._tokens is not None and self._token_rate is not None:
            # A single request larger than the whole per-minute budget would wait
            # forever in aiolimiter; let it take the full bucket instead.
            await self._tokens.acquire(min(float(tokens), self._token_rate))
