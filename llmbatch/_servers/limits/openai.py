"""OpenAI's family, which Groq and LiteLLM's proxy send too:
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as durations
(``1s``, ``6m0s``, ``12ms``). The window is not stated: a reset within a minute is
a per-minute limit (Groq's requests reset over a day)."""

from __future__ import annotations

from llmbatch._servers.limits.values import Values
from llmbatch._stats import ProviderLimits

__all__ = ["read"]


def read(values: Values) -> ProviderLimits | None:
    if not values.has("x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"):
        return None
    return ProviderLimits(
        family="openai",
        requests_limit=values.count("x-ratelimit-limit-requests"),
        requests_remaining=values.count("x-ratelimit-remaining-requests"),
        requests_reset=values.reset("x-ratelimit-reset-requests"),
        tokens_limit=values.count("x-ratelimit-limit-tokens"),
        tokens_remaining=values.count("x-ratelimit-remaining-tokens"),
        tokens_reset=values.reset("x-ratelimit-reset-tokens"),
    )
