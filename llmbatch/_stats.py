"""Counters and latency samples, and the immutable :class:`Stats` snapshot.

The recorder is also where a request is settled: setting its outcome and counting
it happen in one call, so no outcome goes uncounted or is counted twice.
"""

from __future__ import annotations

import enum
import json
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from llmbatch._config import Priority
from llmbatch._control.evidence import Inference
from llmbatch._exceptions import DeadlineExceeded, LLMBatchError, RequestCancelled

if TYPE_CHECKING:
    from llmbatch._calls.request import Request
    from llmbatch._scheduler import Batch
    from llmbatch._tracing import Tracer

__all__ = [
    "Histogram",
    "Percentiles",
    "ServerStats",
    "SharedStats",
    "Stats",
    "StatsRecorder",
    "StructuredStats",
    "TenantStats",
    "TierStats",
]

#: Latency samples kept per tier for percentiles (a sliding window, bounded memory).
SAMPLE_WINDOW = 8192
#: Latency samples kept per tenant (tenants may be many: each conversation, say).
TENANT_SAMPLE_WINDOW = 256
#: Seconds a tenant not named in ``tenants=`` keeps its own counters after its last
#: request ends (its counts stay in the ``other`` totals, which Prometheus exports).
TENANT_FORGET_AFTER = 300.0
#: The label of every tenant not named in ``tenants=`` (bounded metric labels).
OTHER_TENANTS = "other"
#: Seconds over which ``Stats`` rates are measured (the most recent ones).
RATE_WINDOW = 10
#: Histogram bucket upper bounds. Latency spans a realtime answer (tens of ms) to a
#: long bulk generation (minutes); queue waits start lower; batch sizes are powers of 2.
LATENCY_BOUNDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
QUEUE_WAIT_BOUNDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
BATCH_SIZE_BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


class _Snapshot:
    """What every part of a :class:`Stats` snapshot offers besides its fields: plain
    data for logs and exporters. ``model_dump()`` and ``model_dump_json()`` keep
    0.1's names (its snapshots were pydantic models; pydantic cost ~40 ms of
    ``import llmbatch`` and validated nothing here)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain dicts, lists of values and numbers (tiers keyed by
        :class:`Priority`)."""
        return self.model_dump()

    def model_dump(self, *, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """:meth:`to_dict`; ``mode="json"`` gives only JSON types (tier names as keys)."""
        plain: dict[str, Any] = _plain(self, mode == "json")
        return plain

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """The snapshot as a JSON document."""
        return json.dumps(_plain(self, True), indent=indent)


def _plain(value: object, for_json: bool) -> Any:
    if isinstance(value, _Snapshot | Inference):
        return {f.name: _plain(getattr(value, f.name), for_json) for f in fields(value)}  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        return {
            (key.value if for_json and isinstance(key, enum.Enum) else key): _plain(item, for_json)
            for key, item in value.items()
        }
    if isinstance(value, tuple):
        items = [_plain(item, for_json) for item in value]
        return items if for_json else tuple(items)
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Percentiles(_Snapshot):
    """p50/p95/p99 in seconds over the most recent samples (0.0 when none)."""

    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Histogram(_Snapshot):
    """Observations counted by bucket, as Prometheus histograms keep them.

    ``counts[i]`` is how many observations were ``<= bounds[i]`` and above the bound
    before it; the last count is those above every bound. Counts only grow, from
    the client's open.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` pairs, ending with ``(inf, count)``."""
        pairs: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            pairs.append((bound, total))
        return pairs


@dataclass(frozen=True, kw_only=True, slots=True)
class TierStats(_Snapshot):
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
    queue_wait_histogram: Histogram
    """Every queue wait since the client opened (``queue_wait`` is recent ones)."""
    latency_histogram: Histogram
    """Every successful request's latency since the client opened."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TenantStats(_Snapshot):
    """One tenant's counters (every tier)."""

    queued: int
    """Its requests waiting client-side now: queued, waiting for room, or held back
    by its ``TenantLimits``."""
    in_flight: int
    done: int
    failed: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    latency: Percentiles
    """From the call until the answer was complete (its recent successful requests)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerStats(_Snapshot):
    """What the client knows and decides about one server (closed-loop admission)."""

    base_url: str
    kind: str = "openai-compatible"
    """What the server said it is: ``vllm``, ``sglang``, ``llama.cpp`` or
    ``openai-compatible`` (any other)."""
    in_flight: int = 0
    """Sequences the client has in flight there now (every tier)."""
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
    slo_aim: float | None = None
    """With an SLO, the share of it the server's latencies are held to now: it starts
    at 0.9 and follows how many realtime answers miss (about 1% may, as for a p99)."""
    slo_unreachable: bool = False
    """With an SLO: bulk is down to one sequence and the server's latencies are still
    over the target, so the server is too slow for this SLO (loosen it, or add
    capacity) rather than too busy."""
    signals: tuple[str, ...] = ()
    """The sources that reported on this server in the last few seconds, which the
    client's picture of it comes from: ``load_header`` (vLLM's load report),
    ``metrics_gauges``, ``metrics_step_time`` (its latency histogram),
    ``stream_timing``, ``answer_latency``, ``overload_status`` (429/503)."""
    step_time_source: str | None = None
    """Which of them ``step_time`` follows now: the best live one of
    ``metrics_step_time``, ``stream_timing`` and ``answer_latency``."""
    breaker: str
    """``"closed"`` (sending), ``"open"`` (waiting out an outage) or ``"half_open"``."""
    outages: int
    """How many times the server became unavailable and requests waited for it."""
    ejected: bool = False
    """Sent nothing because it was far slower than its peers, until a health probe
    and a trial batch re-admit it."""
    inferences: tuple[Inference, ...] = ()
    """What the admission controller believes of the server, each with its evidence
    (:class:`Inference`): ``queue`` (its queue is real, not a step's arrivals),
    ``seats`` (what it runs at once: stated, learnt or none), ``step_time``,
    ``slo_unreachable``. Readings that did not last are counted as dismissed."""

    bulk_pace: float | None = None
    """With ``SLO(pace=True)``: the estimated bulk prompt tokens a second sent there
    at most now (twice what keeps the bulk limit full), so each engine step carries
    about the prefill the limit needs; None while unpaced (not asked, or before bulk
    answers)."""
    bulk_slice: float | None = None
    """... and the most prompt tokens one bulk request carries (four steps' worth,
    at least eight prompts of few tokens)."""
    bulk_refill: int = 0
    """Bulk sequences allowed to wait on the server beyond its seats now (included in
    ``bulk_limit``): one bulk batch, without an SLO, on a server that is sent each
    tier's priority, until the client's first realtime request runs there
    (docs/concepts.md, "Refill"); else 0."""

    def inference(self, name: str) -> Inference | None:
        """The belief called ``name`` (``"queue"``, ``"seats"``, ...), if held."""
        return next((i for i in self.inferences if i.name == name), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedStats(_Snapshot):
    """The budgets a client shares through Redis (``RateLimit(redis_url=...)``,
    ``SharedInFlight``)."""

    round_trips: int
    """Calls to Redis (leases, renewals, give-backs)."""
    failures: int
    """Calls that failed (Redis unreachable, a timeout, an error reply)."""
    round_trip_p50: float | None
    """Seconds per call as the connection saw it (None before the first)."""
    round_trip_p99: float | None
    reachable: bool
    """False while Redis cannot be reached (the ``on_redis_error`` policy applies)."""
    rate_sharers: int | None
    """Processes (clients) seen sharing the rate limit in the last 10 s."""
    rate_refusals: int | None
    """Lease calls the shared rate budget refused with a time to come back (each costs
    a round trip; many mean the processes wait for each other's leases)."""
    seats_allowed: int | None
    """Sequences the shared in-flight budget lets this client have in flight now."""
    seats_held: int | None
    """Sequences held for it in Redis (at least what it has in flight)."""
    seat_sharers: int | None
    """Processes (clients) holding a share of the in-flight budget."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StructuredStats(_Snapshot):
    """Answers checked against a call's ``response_model`` since the client opened."""

    validated: int = 0
    """Answers that validated (first time or after re-asks)."""
    reasked: int = 0
    """Answers sent back to be corrected (one per re-ask)."""
    failed: int = 0
    """Calls or items that ended in :class:`StructuredOutputError`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Stats(_Snapshot):
    """An immutable snapshot of a client's activity (``client.stats()``)."""

    tiers: Mapping[Priority, TierStats]
    """Per-tier counters, keyed by :class:`Priority`."""
    batches_sent: int
    """HTTP requests sent (retries and bisection halves included)."""
    mean_batch_size: float
    """Prompts per HTTP request sent, on average."""
    max_batch_size: int
    batch_size_histogram: Histogram
    """Prompts per HTTP request sent."""
    retries: int
    """HTTP requests sent again after a failed attempt (429, 5xx, network errors)."""
    bisections: int
    """400-answered batches that were split to find the offending prompts."""
    prompt_tokens: int
    completion_tokens: int
    uptime: float
    """Seconds since the client opened."""
    rate_window: float
    """The seconds the rates below are measured over: the most recent ones, up to
    ``RATE_WINDOW`` (10), fewer just after the client opened."""
    tokens_per_second: float
    """Completion tokens per second over the last ``rate_window`` seconds."""
    requests_per_second: float
    """Requests answered successfully per second over the last ``rate_window`` seconds."""
    servers: tuple[ServerStats, ...] = ()
    """Each server's admission state, in the order they were given (one per replica)."""
    shared: SharedStats | None = None
    """The budgets shared through Redis (None: the client shares none)."""
    tenants: Mapping[str, TenantStats] = field(default_factory=dict)
    """Per named tenant (``tenant=``): those named in ``Client(tenants=...)`` always,
    others while active and for five minutes after. Calls without a tenant are in
    the tiers' counters only."""
    other_tenants: TenantStats | None = None
    """Every tenant not named in ``Client(tenants=...)`` together, since the client
    opened (what Prometheus exports as ``tenant="other"``; None: no such tenant yet)."""
    structured: StructuredStats = StructuredStats()
    """Answers validated, re-asked and failed for ``response_model`` calls."""

    @property
    def server(self) -> ServerStats | None:
        """The first server's admission state (None if there is none)."""
        return self.servers[0] if self.servers else None

    def __str__(self) -> str:
        from llmbatch._stats_table import render

        return render(self)


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


class _TierCounters:
    __slots__ = (
        "cancelled",
        "done",
        "failed",
        "latency",
        "latency_buckets",
        "queue_wait",
        "queue_wait_buckets",
        "retried",
    )

    def __init__(self) -> None:
        self.done = self.failed = self.retried = self.cancelled = 0
        self.queue_wait: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.latency: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.queue_wait_buckets = _Buckets(QUEUE_WAIT_BOUNDS)
        self.latency_buckets = _Buckets(LATENCY_BOUNDS)


class _TenantCounters:
    __slots__ = ("cancelled", "completion", "done", "failed", "last", "latency", "prompt")

    def __init__(self) -> None:
        self.done = self.failed = self.cancelled = self.prompt = self.completion = 0
        self.latency: deque[float] = deque(maxlen=TENANT_SAMPLE_WINDOW)
        self.last = 0.0

    def frozen(self, queued: int, in_flight: int) -> TenantStats:
        return TenantStats(
            queued=queued,
            in_flight=in_flight,
            done=self.done,
            failed=self.failed,
            cancelled=self.cancelled,
            prompt_tokens=self.prompt,
            completion_tokens=self.completion,
            latency=_percentiles(self.latency),
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
        self.tracer: Tracer | None = None
        """Ends each request's span as it settles, when tracing is on."""
        self.validated = 0
        self.reasked = 0
        self.structured_failed = 0

    def batch_sent(self, size: int) -> None:
        self.batches_sent += 1
        self._batch_items += size
        self._batch_sizes.observe(size)
        if size > self.max_batch_size:
            self.max_batch_size = size

    def dispatched(self, batch: Batch, now: float) -> None:
        tier = self._tiers[batch.priority]
        waits = [now - r.created_at for r in batch.requests]
        tier.queue_wait.extend(waits)
        observe = tier.queue_wait_buckets.observe
        for wait in waits:
            observe(wait)

    def settle_batch(
        self,
        requests: Sequence[Request],
        values: Sequence[object],
        now: float,
        prompts: Sequence[int],
        completions: Sequence[int],
    ) -> None:
        """Give each request of one answered batch its value, and count it. What the
        batch shares (its tier, the time it was answered) is counted once: a bulk
        batch of 64 pays for one counter update, not 64."""
        tier = self._tiers[requests[0].priority]
        latencies = tier.latency
        observe = tier.latency_buckets.observe
        tracer = self.tracer
        settled = retried = prompt_total = completion_total = 0
        # Per tenant: answers, prompt and completion tokens, latencies; counted into
        # the tenants' counters once per batch (a batch's requests share a spec, and
        # with it their tenant, unless the batch mixes tenants).
        by_tenant: dict[str, list[Any]] | None = None
        last_spec: object = None
        entry: list[Any] = []
        for request, value, prompt, completion in zip(
            requests, values, prompts, completions, strict=True
        ):
            if not request.set_value(value):
                continue  # settled already (cancelled, past its deadline)
            latency = now - request.created_at
            latencies.append(latency)
            observe(latency)
            settled += 1
            retried += request.retried
            prompt_total += prompt
            completion_total += completion
            spec = request.spec
            if spec.tenant is not None:
                if spec is not last_spec:
                    last_spec = spec
                    if by_tenant is None:
                        by_tenant = {}
                    entry = by_tenant.setdefault(spec.tenant, [0, 0, 0, []])
                entry[0] += 1
                entry[1] += prompt
                entry[2] += completion
                entry[3].append(latency)
            if tracer is not None:
                tracer.request_settled(request)
        if by_tenant is not None:
            for name, (done, prompt, completion, tenant_latencies) in by_tenant.items():
                for counters in self._tenant_counters(name, now):
                    counters.done += done
                    counters.prompt += prompt
                    counters.completion += completion
                    counters.latency.extend(tenant_latencies)
        if settled:
            tier.done += settled
            tier.retried += retried
            self.prompt_tokens += prompt_total
            self.completion_tokens += completion_total
            self._rates.add(now, completion_total, settled)

    def settle_error(self, request: Request, error: LLMBatchError) -> bool:
        """Give ``request`` its error and count it as failed or cancelled; False if it
        was already settled."""
        if not request.set_error(error):
            return False
        tier = self._tiers[request.priority]
        cancelled = isinstance(error, RequestCancelled | DeadlineExceeded)
        if cancelled:
            tier.cancelled += 1
        else:
            tier.failed += 1
        name = request.spec.tenant
        if name is not None:
            for counters in self._tenant_counters(name, request.created_at):
                if cancelled:
                    counters.cancelled += 1
                else:
                    counters.failed += 1
        tier.retried += request.retried
        if self.tracer is not None:
            self.tracer.request_settled(request)
        return True

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
            name: self._tenants.get(name, idle).frozen(*counts.get(name, (0, 0)))
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
    ) -> Stats:
        """Freeze the counters; ``tenant_counts``: each named tenant's (queued, in
        flight) now, from the scheduler."""
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
            tenants=tenants,
            other_tenants=other_tenants,
            structured=StructuredStats(
                validated=self.validated, reasked=self.reasked, failed=self.structured_failed
            ),
        )
