"""Counters and latency samples, and the immutable :class:`Stats` snapshot.

The recorder is also where a request is settled: setting its outcome and counting
it happen in one call, so no outcome goes uncounted or is counted twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from llmbatch._config import Priority
from llmbatch._exceptions import DeadlineExceeded, LLMBatchError, RequestCancelled

if TYPE_CHECKING:
    from llmbatch._request import Request
    from llmbatch._scheduler import Batch

__all__ = ["Percentiles", "ServerStats", "Stats", "StatsRecorder", "TierStats"]

#: Latency samples kept per tier for percentiles (a sliding window, bounded memory).
SAMPLE_WINDOW = 8192


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Percentiles(_Frozen):
    """p50/p95/p99 in seconds over the most recent samples (0.0 when none)."""

    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0


class TierStats(_Frozen):
    """One tier's counters."""

    queued: int
    """Requests waiting client-side now: in the tier's queue, or waiting for room in it
    (``Limits.max_queued``)."""
    in_flight: int
    """Requests sent and not yet answered now."""
    done: int
    """Requests answered successfully."""
    failed: int
    """Requests that ended with an error from the server or the network, or bad input
    found after queueing (not counting cancelled ones)."""
    retried: int
    """Requests that needed more than one HTTP attempt."""
    cancelled: int
    """Requests that ended without an answer because their caller went away, their
    ``timeout`` ran out (:class:`DeadlineExceeded`), or the client closed first."""
    queue_wait: Percentiles
    """From the call until the request's batch was sent."""
    latency: Percentiles
    """From the call until the answer was complete (successful requests)."""


class ServerStats(_Frozen):
    """What the client knows and decides about one server (closed-loop admission)."""

    base_url: str
    bulk_limit: int
    """Sequences normal and batch work may have in flight there now (the admission
    controller's limit, realtime's reserve left out)."""
    ceiling: int
    """``Limits.max_in_flight``: no limit exceeds it."""
    realtime_reserve: int
    """Seats kept free for realtime now (follows recent realtime use)."""
    step_time: float | None
    """Observed time per output token on the server, seconds (None until measured)."""
    ttft: float | None
    """Observed realtime time to first token, seconds (None until measured)."""
    waiting: int | None
    """Requests in the server's own queue at its last report."""
    kv_cache_usage: float | None
    """The server's KV-cache use at its last report, 0 to 1."""
    slo_met: int
    """Realtime answers within ``Client(slo=...)``."""
    slo_missed: int
    breaker: str
    """``"closed"`` (sending), ``"open"`` (waiting out an outage) or ``"half_open"``."""
    outages: int
    """How many times the server became unavailable and requests waited for it."""


class Stats(_Frozen):
    """An immutable snapshot of a client's activity (``client.stats()``)."""

    tiers: Mapping[Priority, TierStats]
    """Per-tier counters, keyed by :class:`Priority`."""
    batches_sent: int
    """HTTP requests sent (retries and bisection halves included)."""
    mean_batch_size: float
    """Prompts per HTTP request sent, on average."""
    max_batch_size: int
    bisections: int
    """400-answered batches that were split to find the offending prompts."""
    prompt_tokens: int
    completion_tokens: int
    uptime: float
    """Seconds since the client opened."""
    tokens_per_second: float
    """Completion tokens per second of uptime."""
    server: ServerStats | None = None
    """The server's admission state (None before the client opened)."""


def _percentiles(samples: deque[float]) -> Percentiles:
    if not samples:
        return Percentiles()
    ordered = sorted(samples)
    last = len(ordered) - 1

    def pick(q: float) -> float:
        return ordered[min(last, round(q * last))]

    return Percentiles(p50=pick(0.50), p95=pick(0.95), p99=pick(0.99))


class _TierCounters:
    __slots__ = ("cancelled", "done", "failed", "latency", "queue_wait", "retried")

    def __init__(self) -> None:
        self.done = self.failed = self.retried = self.cancelled = 0
        self.queue_wait: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.latency: deque[float] = deque(maxlen=SAMPLE_WINDOW)


class StatsRecorder:
    """Mutable counters owned by one client; :meth:`snapshot` freezes them."""

    def __init__(self, started_at: float) -> None:
        self._started_at = started_at
        self._tiers = {p: _TierCounters() for p in Priority}
        self.batches_sent = 0
        self._batch_items = 0
        self.max_batch_size = 0
        self.bisections = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def batch_sent(self, size: int) -> None:
        self.batches_sent += 1
        self._batch_items += size
        self.max_batch_size = max(self.max_batch_size, size)

    def dispatched(self, batch: Batch, now: float) -> None:
        waits = self._tiers[batch.priority].queue_wait
        waits.extend(now - r.created_at for r in batch.requests)

    def settle_value(
        self, request: Request, value: object, latency: float, prompt: int, completion: int
    ) -> bool:
        """Give ``request`` its value and count it; False if it was already settled."""
        if not request.set_value(value):
            return False
        tier = self._tiers[request.priority]
        tier.done += 1
        tier.latency.append(latency)
        tier.retried += request.retried
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        return True

    def settle_error(self, request: Request, error: LLMBatchError) -> bool:
        """Give ``request`` its error and count it as failed or cancelled; False if it
        was already settled."""
        if not request.set_error(error):
            return False
        tier = self._tiers[request.priority]
        if isinstance(error, RequestCancelled | DeadlineExceeded):
            tier.cancelled += 1
        else:
            tier.failed += 1
        tier.retried += request.retried
        return True

    def snapshot(
        self,
        now: float,
        queued: Mapping[Priority, int],
        in_flight: Mapping[Priority, int],
        server: ServerStats | None = None,
    ) -> Stats:
        uptime = max(0.0, now - self._started_at)
        return Stats(
            tiers={
                p: TierStats(
                    queued=queued[p],
                    in_flight=in_flight[p],
                    done=t.done,
                    failed=t.failed,
                    retried=t.retried,
                    cancelled=t.cancelled,
                    queue_wait=_percentiles(t.queue_wait),
                    latency=_percentiles(t.latency),
                )
                for p, t in self._tiers.items()
            },
            batches_sent=self.batches_sent,
            mean_batch_size=self._batch_items / self.batches_sent if self.batches_sent else 0.0,
            max_batch_size=self.max_batch_size,
            bisections=self.bisections,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            uptime=uptime,
            tokens_per_second=self.completion_tokens / uptime if uptime > 0 else 0.0,
            server=server,
        )
