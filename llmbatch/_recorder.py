"""What a client counts while it runs: answers, failures and cancellations by tier
and tenant, batches, tokens, latencies and rates. It counts what it is told (plain
numbers; a request's outcome is set in ``_calls.outcome``, which tells it), and
:meth:`StatsRecorder.snapshot` freezes the counts into a :class:`Stats`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence

from llmbatch._config import Priority
from llmbatch._stats import (
    Cost,
    Histogram,
    Percentiles,
    RateStats,
    ServerStats,
    SharedStats,
    SpendingStats,
    Stats,
    StructuredStats,
    TenantStats,
    TierStats,
)

__all__ = ["LATENCY_BOUNDS", "RATE_WINDOW", "StatsRecorder"]

#: Latency samples kept per tier for percentiles (a sliding window, bounded memory).
SAMPLE_WINDOW = 8192
#: Latency samples kept per tenant (tenants may be many: each conversation, say).
TENANT_SAMPLE_WINDOW = 256
#: Seconds a tenant not named in ``tenants=`` keeps its own counters after its last
#: request ends (its counts stay in the ``other`` totals, which Prometheus exports).
TENANT_FORGET_AFTER = 300.0
#: Seconds over which ``Stats`` rates are measured (the most recent ones).
RATE_WINDOW = 10
#: Histogram bucket upper bounds. Latency spans a realtime answer (tens of ms) to a
#: long bulk generation (minutes); queue waits start lower; batch sizes are powers of 2.
# fmt: off
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0, 300.0)
QUEUE_WAIT_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0, 300.0)
# fmt: on
BATCH_SIZE_BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


def _percentiles(samples: deque[float]) -> Percentiles:
    if not samples:
        return Percentiles()
    ordered = sorted(samples)
    last = len(ordered) - 1

    def pick(q: float) -> float:
        return ordered[min(last, round(q * last))]

    return Percentiles(p50=pick(0.50), p95=pick(0.95), p99=pick(0.99))


class _Buckets:
    """A histogram being filled: one bisect and two additions per observation."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def frozen(self) -> Histogram:
        return Histogram(
            bounds=self.bounds, counts=tuple(self.counts), sum=self.sum, count=sum(self.counts)
        )


class _Rates:
    """Answers and completion tokens per second over the last ``RATE_WINDOW`` seconds:
    a ring of one-second slots, so memory and cost stay constant."""

    __slots__ = ("_done", "_second", "_tokens")

    SLOTS = 16  # a power of two above RATE_WINDOW

    def __init__(self) -> None:
        self._second = [-1] * self.SLOTS
        self._done = [0] * self.SLOTS
        self._tokens = [0] * self.SLOTS

    def add(self, now: float, tokens: int, answers: int = 1) -> None:
        second = int(now)
        slot = second & (self.SLOTS - 1)
        if self._second[slot] != second:
            self._second[slot] = second
            self._done[slot] = self._tokens[slot] = 0
        self._done[slot] += answers
        self._tokens[slot] += tokens

    def per_second(self, now: float, started_at: float) -> tuple[float, float, float]:
        """``(window, answers/s, tokens/s)``: the window covers the slots from
        ``RATE_WINDOW - 1`` whole seconds ago to now (less just after the start)."""
        current = int(now)
        oldest = current - (RATE_WINDOW - 1)
        window = now - max(oldest, started_at)
        if window <= 0:
            return 0.0, 0.0, 0.0
        done = tokens = 0
        for slot in range(self.SLOTS):
            if oldest <= self._second[slot] <= current:
                done += self._done[slot]
                tokens += self._tokens[slot]
        return window, done / window, tokens / window


class _Paid:
    """Tokens paid for and their dollars (a :class:`Cost` being counted)."""

    __slots__ = ("answers", "cached", "completion", "dollars", "prompt", "unpriced")

    def __init__(self) -> None:
        self.answers = self.prompt = self.cached = self.completion = self.unpriced = 0
        self.dollars = 0.0

    def add(
        self, answers: int, prompt: int, cached: int, completion: int, dollars: float | None
    ) -> None:
        self.answers += answers
        self.prompt += prompt
        self.cached += cached
        self.completion += completion
        if dollars is None:
            self.unpriced += answers
        else:
            self.dollars += dollars

    def frozen(self) -> Cost:
        return Cost(
            answers=self.answers,
            prompt_tokens=self.prompt,
            cached_tokens=self.cached,
            completion_tokens=self.completion,
            dollars=self.dollars,
            unpriced=self.unpriced,
        )


def _total(parts: Sequence[_Paid]) -> Cost:
    total = _Paid()
    for part in parts:
        total.add(part.answers, part.prompt, part.cached, part.completion, part.dollars)
        total.unpriced += part.unpriced
    return total.frozen()


class _TierCounters:
    __slots__ = (
        "cancelled",
        "done",
        "failed",
        "latency",
        "latency_buckets",
        "paid",
        "queue_wait",
        "queue_wait_buckets",
        "retried",
    )

    def __init__(self) -> None:
        self.done = self.failed = self.retried = self.cancelled = 0
        self.paid = _Paid()
        self.queue_wait: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.latency: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.queue_wait_buckets = _Buckets(QUEUE_WAIT_BOUNDS)
        self.latency_buckets = _Buckets(LATENCY_BOUNDS)


class _TenantCounters:
    __slots__ = ("cancelled", "completion", "done", "failed", "last", "latency", "paid", "prompt")

    def __init__(self) -> None:
        self.done = self.failed = self.cancelled = self.prompt = self.completion = 0
        self.paid = _Paid()
        self.latency: deque[float] = deque(maxlen=TENANT_SAMPLE_WINDOW)
        self.last = 0.0

    def frozen(self, queued: int, in_flight: int, *, named: bool = False) -> TenantStats:
        return TenantStats(
            named=named,
            queued=queued,
            in_flight=in_flight,
            done=self.done,
            failed=self.failed,
            cancelled=self.cancelled,
            prompt_tokens=self.prompt,
            completion_tokens=self.completion,
            latency=_percentiles(self.latency),
            cost=self.paid.frozen(),
        )


class StatsRecorder:
    """Mutable counters owned by one client; :meth:`snapshot` freezes them.

    ``tenants``: the names given to ``Client(tenants=...)``, whose counters are kept
    for good; other tenants' are kept while they are active, and summed under
    ``other`` as well."""

    def __init__(self, started_at: float, tenants: frozenset[str] = frozenset()) -> None:
        self._started_at = started_at
        self._named = tenants - {"*"}
        self._tenants: dict[str, _TenantCounters] = {}
        self._other: _TenantCounters | None = None
        self._next_sweep = started_at + TENANT_FORGET_AFTER
        self._tiers = {p: _TierCounters() for p in Priority}
        self.batches_sent = 0
        self._batch_items = 0
        self.max_batch_size = 0
        self._batch_sizes = _Buckets(BATCH_SIZE_BOUNDS)
        self.retries = 0
        self.bisections = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._rates = _Rates()
        self._models: dict[str, _Paid] = {}
        self.validated = 0
        self.reasked = 0
        self.structured_failed = 0

    def batch_sent(self, size: int) -> None:
        self.batches_sent += 1
        self._batch_items += size
        self._batch_sizes.observe(size)
        if size > self.max_batch_size:
            self.max_batch_size = size

    def dispatched(self, priority: Priority, waits: Sequence[float]) -> None:
        """A batch of ``priority`` left the queue; ``waits``: its requests' queue waits."""
        tier = self._tiers[priority]
        tier.queue_wait.extend(waits)
        observe = tier.queue_wait_buckets.observe
        for wait in waits:
            observe(wait)

    def answered(
        self,
        priority: Priority,
        latencies: Sequence[float],
        retried: int,
        prompt_tokens: int,
        completion_tokens: int,
        now: float,
    ) -> None:
        """Answers of one tier, settled together at ``now`` (one batch's): their
        latencies, how many needed a retry, and their tokens. Counted once for all of
        them: a bulk batch of 64 pays for one counter update, not 64."""
        if not latencies:
            return
        tier = self._tiers[priority]
        tier.latency.extend(latencies)
        observe = tier.latency_buckets.observe
        for latency in latencies:
            observe(latency)
        tier.done += len(latencies)
        tier.retried += retried
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self._rates.add(now, completion_tokens, len(latencies))

    def paid(
        self,
        priority: Priority,
        model: str,
        answers: int,
        tokens: tuple[int, int, int],
        dollars: float | None,
    ) -> None:
        """One batch's answers were paid for: their (prompt, cached, completion)
        tokens, and their dollars (None: their model has no price)."""
        prompt, cached, completion = tokens
        self._tiers[priority].paid.add(answers, prompt, cached, completion, dollars)
        by_model = self._models.get(model)
        if by_model is None:
            by_model = self._models[model] = _Paid()
        by_model.add(answers, prompt, cached, completion, dollars)

    def tenant_paid(
        self, name: str, counts: tuple[int, int, int, int], dollars: float | None, now: float
    ) -> None:
        """The answers among them that were one tenant's: (answers, prompt, cached and
        completion tokens), and their dollars."""
        for counters in self._tenant_counters(name, now):
            counters.paid.add(*counts, dollars)

    def tenant_answered(
        self,
        name: str,
        prompt_tokens: int,
        completion_tokens: int,
        latencies: Sequence[float],
        now: float,
    ) -> None:
        """The answers among them that were one tenant's."""
        for counters in self._tenant_counters(name, now):
            counters.done += len(latencies)
            counters.prompt += prompt_tokens
            counters.completion += completion_tokens
            counters.latency.extend(latencies)

    def ended(
        self, priority: Priority, tenant: str | None, at: float, *, cancelled: bool, retried: bool
    ) -> None:
        """A request of ``priority`` (and ``tenant``, made ``at``) ended without an
        answer: ``cancelled`` (its caller left, its deadline passed, the client
        closed), or failed."""
        tier = self._tiers[priority]
        if cancelled:
            tier.cancelled += 1
        else:
            tier.failed += 1
        if tenant is not None:
            for counters in self._tenant_counters(tenant, at):
                if cancelled:
                    counters.cancelled += 1
                else:
                    counters.failed += 1
        tier.retried += retried

    def _tenant_counters(self, name: str, now: float) -> tuple[_TenantCounters, ...]:
        """The tenant's own counters, and ``other``'s if it is not named in ``tenants=``."""
        counters = self._tenants.get(name)
        if counters is None:
            counters = self._tenants[name] = _TenantCounters()
        counters.last = now
        if name in self._named:
            return (counters,)
        other = self._other
        if other is None:
            other = self._other = _TenantCounters()
        return counters, other

    def _tenant_stats(
        self, now: float, counts: Mapping[str, tuple[int, int]]
    ) -> tuple[dict[str, TenantStats], TenantStats | None]:
        if now >= self._next_sweep:
            # Forget tenants idle for a while (not named, nothing queued or in flight).
            self._next_sweep = now + TENANT_FORGET_AFTER
            cutoff = now - TENANT_FORGET_AFTER
            for name in [
                n
                for n, c in self._tenants.items()
                if c.last < cutoff and n not in self._named and n not in counts
            ]:
                del self._tenants[name]
        names = self._named | self._tenants.keys() | counts.keys()
        idle = _TenantCounters()
        tenants = {
            name: self._tenants.get(name, idle).frozen(
                *counts.get(name, (0, 0)), named=name in self._named
            )
            for name in sorted(names)
        }
        other = None
        if self._other is not None or any(n not in self._named for n in counts):
            queued = sum(q for n, (q, _) in counts.items() if n not in self._named)
            flying = sum(f for n, (_, f) in counts.items() if n not in self._named)
            other = (self._other or idle).frozen(queued, flying)
        return tenants, other

    def snapshot(
        self,
        now: float,
        queued: Mapping[Priority, int],
        in_flight: Mapping[Priority, int],
        servers: tuple[ServerStats, ...] = (),
        shared: SharedStats | None = None,
        tenant_counts: Mapping[str, tuple[int, int]] | None = None,
        rate: RateStats | None = None,
        spending: SpendingStats | None = None,
    ) -> Stats:
        """Freeze the counters; ``tenant_counts``: each named tenant's (queued, in
        flight) now, from the scheduler; ``rate``: the rate budget in force."""
        uptime = max(0.0, now - self._started_at)
        window, requests_per_second, tokens_per_second = self._rates.per_second(
            now, self._started_at
        )
        tenants, other_tenants = self._tenant_stats(now, tenant_counts or {})
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
                    queue_wait_histogram=t.queue_wait_buckets.frozen(),
                    latency_histogram=t.latency_buckets.frozen(),
                    cost=t.paid.frozen(),
                )
                for p, t in self._tiers.items()
            },
            batches_sent=self.batches_sent,
            mean_batch_size=self._batch_items / self.batches_sent if self.batches_sent else 0.0,
            max_batch_size=self.max_batch_size,
            batch_size_histogram=self._batch_sizes.frozen(),
            retries=self.retries,
            bisections=self.bisections,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            uptime=uptime,
            rate_window=window,
            tokens_per_second=tokens_per_second,
            requests_per_second=requests_per_second,
            servers=servers,
            shared=shared,
            rate=rate,
            tenants=tenants,
            other_tenants=other_tenants,
            structured=StructuredStats(
                validated=self.validated, reasked=self.reasked, failed=self.structured_failed
            ),
            cost=_total([t.paid for t in self._tiers.values()]),
            models={name: paid.frozen() for name, paid in sorted(self._models.items())},
            spending=spending,
        )
