"""Anthropic's family: ``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}``, per minute, resets as RFC 3339 timestamps
(when the bucket is whole again), remaining tokens rounded to the thousand. Its
``tokens`` fields are the most restrictive token limit in force."""

from __future__ import annotations

from llmbatch._servers.limits.values import Values
from llmbatch._stats import ProviderLimits

__all__ = ["read"]

_P = "anthropic-ratelimit-"
_MARKS = tuple(
    f"{_P}{kind}-{field}"
    for kind in ("requests", "tokens", "input-tokens", "output-tokens")
    for field in ("limit", "remaining")
)


def read(values: Values) -> ProviderLimits | None:
    kinds = ("requests", "tokens", "input-tokens", "output-tokens")
    if not values.has(
        *(f"{_P}{kind}-{field}" for kind in kinds for field in ("limit", "remaining"))
    ):
        return None
    return ProviderLimits(
        family="anthropic",
        window=60.0,
        requests_limit=values.count(f"{_P}requests-limit"),
        requests_remaining=values.count(f"{_P}requests-remaining"),
        requests_reset=values.reset(f"{_P}requests-reset"),
        tokens_limit=values.count(f"{_P}tokens-limit"),
        tokens_remaining=values.count(f"{_P}tokens-remaining"),
        tokens_reset=values.reset(f"{_P}tokens-reset"),
        input_tokens_limit=values.count(f"{_P}input-tokens-limit"),
        input_tokens_remaining=values.count(f"{_P}input-tokens-remaining"),
        input_tokens_reset=values.reset(f"{_P}input-tokens-reset"),
        output_tokens_limit=values.count(f"{_P}output-tokens-limit"),
        output_tokens_remaining=values.count(f"{_P}output-tokens-remaining"),
        output_tokens_reset=values.reset(f"{_P}output-tokens-reset"),
    )
