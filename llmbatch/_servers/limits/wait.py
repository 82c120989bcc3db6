"""The wait a refusal asks for, from its headers: OpenAI's ``retry-after-ms``
(finer than a second) where it is sent, else ``Retry-After`` in seconds or as an
HTTP date."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["retry_after"]


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait (None: it does not say, or not readably)."""
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
