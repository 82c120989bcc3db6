"""A circuit breaker per server: ride out restarts and outages instead of failing
every request that meets them. Pure, with time passed in.

A server that was answering and then refuses connections or answers 503 to
everything is usually restarting (a vLLM restart takes 40-60 s on CPU and minutes for
a large model on GPUs) or overloaded. Retrying each request on its own backoff sends
a storm into the outage and still fails long jobs once their attempts run out. So
after ``failure_threshold`` consecutive connection failures or 503s (answers to
requests sent before the latest failure do not break the run) the breaker
**opens**: nothing is sent and requests wait in the client (their own deadlines still
apply, and waiting costs none of their retry attempts). Every ``probe_interval`` one
probe goes out (``/health``, then one real batch); when it succeeds the breaker is
**half-open**, and the first answered batch **closes** it. Past ``outage_tolerance``
seconds of outage the breaker gives up: waiting requests fail with
:class:`ServerOutageError`, and new ones fail at once until a probe succeeds.

A server that has never answered (a wrong URL, a server not started) gets no
patience: it is a configuration problem, reported at once.
"""

from __future__ import annotations

import enum

__all__ = ["Breaker", "BreakerState"]

#: Consecutive failures before the breaker opens: enough that random 503s on a busy
#: server (a fault matrix injects 7 % of them) practically never trip it.
DEFAULT_FAILURE_THRESHOLD = 5
DEFAULT_PROBE_INTERVAL = 1.0
DEFAULT_OUTAGE_TOLERANCE = 120.0


class BreakerState(enum.StrEnum):
    """``closed``: sending; ``open``: waiting out an outage; ``half_open``: a probe
    succeeded and one batch is testing the server."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    """Consecutive failures open it; a successful probe half-opens it; an answered
    batch closes it."""

    def __init__(
        self,
        *,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        outage_tolerance: float = DEFAULT_OUTAGE_TOLERANCE,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.probe_interval = probe_interval
        self.outage_tolerance = outage_tolerance
        self.state = BreakerState.CLOSED
        self.failures = 0
        """Consecutive failures since the last success of a request sent after them."""
        self._failed_at: float | None = None
        self.opened_at: float | None = None
        """When the current outage began (the breaker opened)."""
        self._next_probe: float | None = None
        self._trial_out = False
        self.ever_answered = False
        """The server has answered at least once: it deserves patience."""
        self.opened = 0
        """How many times the breaker has opened (for stats)."""
        self.last_error: str | None = None

    # -- what the dispatcher reports -------------------------------------------------

    def on_success(self, sent_at: float | None = None) -> None:
        """An answer (any status but 503) came back: the server is up.

        An answer to a request sent before the latest failure says nothing about
        the server since (a batch that ran for seconds finishes with 200 while new
        requests get 503s), so it does not reset the count of failures."""
        self.ever_answered = True
        if sent_at is not None and self._failed_at is not None and sent_at < self._failed_at:
            return
        self.failures = 0
        if self.state is not BreakerState.CLOSED:
            self.state = BreakerState.CLOSED
            self.opened_at = self._next_probe = None
            self._trial_out = False

    def on_failure(self, now: float, error: str) -> bool:
        """A connection failure or a 503; returns True if this opened the breaker."""
        self.failures += 1
        self._failed_at = now
        self.last_error = error
        if self.state is BreakerState.HALF_OPEN:
            # The trial batch failed: back to waiting, probing again later.
            self.state = BreakerState.OPEN
            self._trial_out = False
            self._next_probe = now + self.probe_interval
            return False
        if self.state is BreakerState.CLOSED and self.failures >= self.failure_threshold:
            self.state = BreakerState.OPEN
            self.opened_at = now
            self._next_probe = now + self.probe_interval
            self.opened += 1
            return True
        return False

    # -- what the engine asks --------------------------------------------------------

    def allows(self) -> bool:
        """May a batch be sent now? (Half-open: exactly one, the trial.)"""
        if self.state is BreakerState.CLOSED:
            return True
        return self.state is BreakerState.HALF_OPEN and not self._trial_out

    def trial_sent(self) -> None:
        """The half-open breaker's one trial batch went out."""
        if self.state is BreakerState.HALF_OPEN:
            self._trial_out = True

    def probe_due(self, now: float) -> bool:
        return (
            self.state is BreakerState.OPEN
            and self._next_probe is not None
            and now >= self._next_probe
        )

    def next_probe(self) -> float | None:
        """When the open breaker probes next (None unless open)."""
        return self._next_probe if self.state is BreakerState.OPEN else None

    def on_probe(self, now: float, healthy: bool) -> None:
        """A ``/health`` probe's result: half-open on success, wait again on failure."""
        if self.state is not BreakerState.OPEN:
            return
        if healthy:
            self.state = BreakerState.HALF_OPEN
            self._trial_out = False
            self._next_probe = None
        else:
            self._next_probe = now + self.probe_interval

    def open_without_failure(self, now: float, reason: str) -> None:
        """Stop sending to a server the client chose to leave out (far slower than its
        peers, or not up yet): open, probe, and re-admit through the usual trial
        batch."""
        if self.state is BreakerState.CLOSED:
            self.state = BreakerState.OPEN
            self.opened_at = now
            self._next_probe = now + self.probe_interval
            self.last_error = reason

    def outage_over_tolerance(self, now: float) -> bool:
        """The breaker has been open longer than ``outage_tolerance``."""
        return (
            self.state is not BreakerState.CLOSED
            and self.opened_at is not None
            and now - self.opened_at > self.outage_tolerance
        )

    def outage_seconds(self, now: float) -> float:
        return 0.0 if self.opened_at is None else now - self.opened_at
