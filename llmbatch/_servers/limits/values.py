"""Header values as the providers write them, read without ever raising: counts, and
resets as durations (``1m30s``, ``12ms``), seconds, epoch times or timestamps (RFC
3339, HTTP dates). A value present but unreadable is ignored and counted."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["Values", "parse_duration"]

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
#: A bare number this large is an epoch time in seconds (September 2001 on) ...
_EPOCH = 1e9
#: ... and this large, in milliseconds.
_EPOCH_MS = 1e12


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
        return seconds if 0 <= seconds < float("inf") else None
    total, at = 0.0, 0
    for part in _PART.finditer(text):
        if part.start() != at:
            return None
        total += float(part.group(1)) * _SECONDS[part.group(2)]
        at = part.end()
    return total if at == len(text) and at > 0 else None


def _timestamp(text: str) -> datetime | None:
    """An RFC 3339 timestamp or an HTTP date, in UTC (None: neither)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


class Values:
    """One answer's headers (lower-cased names), read field by field; ``malformed``
    counts the values that were there but could not be read (each is then None)."""

    __slots__ = ("_headers", "_now", "malformed")

    def __init__(self, headers: Mapping[str, str], now: float) -> None:
        self._headers = headers
        self._now = now
        """Wall-clock time (``time.time()``) the answer came: resets given as times
        are read as the seconds from then."""
        self.malformed = 0

    def has(self, *names: str) -> bool:
        """Any of ``names`` is there (a family's mark)."""
        return any(name in self._headers for name in names)

    def _get(self, name: str) -> str | None:
        return self._headers.get(name)

    def _bad(self) -> None:
        self.malformed += 1

    def count(self, name: str) -> int | None:
        """A whole number of requests or tokens (a provider may round it)."""
        value = self._get(name)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            self._bad()
            return None
        if not 0 <= number < float("inf"):
            self._bad()
            return None
        return int(number)

    def reset(self, name: str) -> float | None:
        """Seconds until a budget is whole again: a duration, a number of seconds, an
        epoch time (seconds or milliseconds) or a timestamp; a time already past is 0."""
        value = self._get(name)
        if value is None:
            return None
        seconds = parse_duration(value)
        if seconds is not None:
            if seconds >= _EPOCH_MS:
                return max(0.0, seconds / 1000 - self._now)
            if seconds >= _EPOCH:
                return max(0.0, seconds - self._now)
            return seconds
        when = _timestamp(value)
        if when is None:
            self._bad()
            return None
        return max(0.0, when.timestamp() - self._now)
