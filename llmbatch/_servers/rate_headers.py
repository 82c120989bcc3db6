"""Rate-limit headers, read from an answer into a :class:`ProviderLimits`.

Hosted providers say what is left of a caller's rate limits on every answer. The
family read here is OpenAI's (``x-ratelimit-{limit,remaining,reset}-{requests,
tokens}``, resets as Go durations such as ``1s``, ``6m0s``, ``12ms``), which Groq
and LiteLLM's proxy send too; a kind of server whose provider has its own family
reads it in its :meth:`Dialect.provider_limits` with the helpers here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from llmbatch._stats import ProviderLimits

__all__ = ["header_int", "openai_rate_headers", "parse_duration", "retry_after"]

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str | None) -> float | None:
    """Seconds in a duration as OpenAI writes a reset (``"1m30.5s"``, ``"12ms"``;
    a bare number is seconds); None for anything else."""
    if text is None:
        return None
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if seconds >= 0 else None
    total, at = 0.0, 0
    for part in _PART.finditer(text):
        if part.start() != at:
            return None
        total += float(part.group(1)) * _SECONDS[part.group(2)]
        at = part.end()
    return total if at == len(text) and at > 0 else None


def header_int(headers: Mapping[str, str], name: str) -> int | None:
    """A whole-number header (None: absent or not a number)."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(float(value))
    except (ValueError, OverflowError):  # not a number, or infinite
        return None
    return number if number >= 0 else None


def openai_rate_headers(headers: Mapping[str, str]) -> ProviderLimits | None:
    """OpenAI's family from an answer's (lower-cased) headers; None without it."""
    if (
        "x-ratelimit-remaining-requests" not in headers
        and "x-ratelimit-remaining-tokens" not in headers
    ):
        return None
    return ProviderLimits(
        requests_limit=header_int(headers, "x-ratelimit-limit-requests"),
        requests_remaining=header_int(headers, "x-ratelimit-remaining-requests"),
        requests_reset=parse_duration(headers.get("x-ratelimit-reset-requests")),
        tokens_limit=header_int(headers, "x-ratelimit-limit-tokens"),
        tokens_remaining=header_int(headers, "x-ratelimit-remaining-tokens"),
        tokens_reset=parse_duration(headers.get("x-ratelimit-reset-tokens")),
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait: OpenAI's ``retry-after-ms`` where it is sent
    (finer than a second), else ``Retry-After`` in seconds or as an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            wait = float(millis) / 1000
        except ValueError:
            pass
        else:
            if wait >= 0 and wait == wait:  # (not NaN)
                return wait
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None
