"""Log records worth a person's attention, at a rate a person can read.

A flaky server can make every batch retry at once; a WARNING per retry would bury
the log, and DEBUG (0.1's choice) hid them. :class:`Throttle` lets one WARNING
through per interval and says how many it held back. Bisection keeps its
per-split detail at DEBUG and logs one INFO line when the split is over
(:class:`Bisection`).
"""

from __future__ import annotations

import contextvars
import logging

from llmbatch._clock import Clock

__all__ = ["BISECTION", "Bisection", "Throttle", "logger"]

logger = logging.getLogger("llmbatch")
"""Every llmbatch record goes to this logger (``logging.getLogger("llmbatch")``)."""


class Throttle:
    """At most one record per ``interval`` seconds; counts those it holds back."""

    __slots__ = ("_clock", "_interval", "_next", "held")

    def __init__(self, clock: Clock, interval: float = 5.0) -> None:
        self._clock = clock
        self._interval = interval
        self._next = float("-inf")
        self.held = 0
        """Records held back since the last one let through."""

    def allow(self) -> int | None:
        """None to hold this record back, else how many were held back before it."""
        now = self._clock()
        if now < self._next:
            self.held += 1
            return None
        self._next = now + self._interval
        held, self.held = self.held, 0
        return held


class Bisection:
    """One 400-answered batch being split until its bad items fail alone."""

    __slots__ = ("error", "requests", "size")

    def __init__(self, size: int, error: str) -> None:
        self.size = size
        self.error = error
        self.requests = 0
        """HTTP requests the split sent (its parts, at every level)."""


BISECTION: contextvars.ContextVar[Bisection | None] = contextvars.ContextVar(
    "llmbatch_bisection", default=None
)
"""The split a task is part of. Its parts run in child tasks, which inherit it, so
only the outermost split sets it and reports."""
