"""Together's family: ``x-ratelimit-{limit,remaining,reset}`` for requests and
``x-tokenlimit-{limit,remaining}`` for tokens, per second, limits that move with the
platform's capacity (``x-ratelimit-limit-dynamic``, where sent, is the one in force).
A 503 there is the platform at capacity, a 429 this caller over its rate."""

from __future__ import annotations

from llmbatch._servers.limits.values import Values
from llmbatch._stats import ProviderLimits

__all__ = ["read"]


def read(values: Values) -> ProviderLimits | None:
    if not values.has("x-ratelimit-remaining", "x-tokenlimit-remaining"):
        return None
    dynamic = values.count("x-ratelimit-limit-dynamic")
    stated = values.count("x-ratelimit-limit")
    return ProviderLimits(
        family="together",
        window=1.0,
        requests_limit=dynamic if dynamic is not None else stated,
        requests_remaining=values.count("x-ratelimit-remaining"),
        requests_reset=values.reset("x-ratelimit-reset"),
        tokens_limit=values.count("x-tokenlimit-limit"),
        tokens_remaining=values.count("x-tokenlimit-remaining"),
    )
