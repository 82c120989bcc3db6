"""Fireworks' family: the effective (adaptive) per-minute limits of prompt and
generated tokens, ``x-ratelimit-limit-tokens-{prompt,generated}``, with their
``remaining`` where sent. No combined token limit: a bucket charging prompt and
answer together is not learnt from them. A 503 there is "Service Overloaded"."""

from __future__ import annotations

from llmbatch._servers.limits.values import Values
from llmbatch._stats import ProviderLimits

__all__ = ["read"]

_LIMIT = "x-ratelimit-limit-tokens-"
_REMAINING = "x-ratelimit-remaining-tokens-"


def read(values: Values) -> ProviderLimits | None:
    if not values.has(f"{_LIMIT}prompt", f"{_LIMIT}generated"):
        return None
    return ProviderLimits(
        family="fireworks",
        window=60.0,
        input_tokens_limit=values.count(f"{_LIMIT}prompt"),
        input_tokens_remaining=values.count(f"{_REMAINING}prompt"),
        output_tokens_limit=values.count(f"{_LIMIT}generated"),
        output_tokens_remaining=values.count(f"{_REMAINING}generated"),
    )
