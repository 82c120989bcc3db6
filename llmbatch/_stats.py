"""The immutable :class:`Stats` snapshot that ``client.stats()`` returns, its parts,
and its table (``str(stats)``). The counters it is frozen from are ``_recorder``'s.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from llmbatch._config import SLO, Priority
from llmbatch._exceptions import usd

__all__ = [
    "OTHER_TENANTS",
    "CacheStats",
    "Histogram",
    "Inference",
    "Percentiles",
    "ProviderLimits",
    "RateStats",
    "ServerStats",
    "SharedStats",
    "SignalSource",
    "Stats",
    "StructuredStats",
    "TenantStats",
    "TierStats",
]

#: The label of every tenant not named in ``tenants=`` (bounded metric labels).
OTHER_TENANTS = "other"


@dataclass(frozen=True, slots=True)
class Inference:
    """One belief of the admission controller about a server, for ``stats()``."""

    name: str
    """``"queue"`` (the server's queue is real), ``"api_queue"`` (a queue in its API
    process is real), ``"seats"`` (what it runs at once), ``"step_time"``,
    ``"slo_unreachable"``, ``"slo_floor"`` (the bulk limit an SLO's cuts stop at: one
    sequence, or a larger one tried and found faster for realtime) or ``"slo_auto"``
    (the default SLO's per-token target, seconds)."""
    value: float | None
    """The belief now: seats, the step time in seconds, 1.0 for a real queue or an
    unreachable SLO, the most sequences the API process held; None when nothing is
    believed (after dismissals, say)."""
    source: str
    """``"stated"`` (by the server or the configuration), ``"learnt"`` (from
    readings that persisted), ``"measured"`` (an average of samples) or ``"none"``."""
    evidence: str
    """What it rests on, in words (or what was seen and dismissed)."""
    dismissed: int = 0
    """Readings that pointed to it but did not last, and were dismissed."""


class SignalSource(enum.StrEnum):
    """A source of samples about a server, as ``ServerStats.signals`` names it (every
    source a server may speak through: what is live is in ``signals``)."""

    LOAD_HEADER = "load_header"
    """vLLM's ``endpoint-load-metrics`` response header: its queue and KV cache."""
    METRICS_GAUGES = "metrics_gauges"
    """``/metrics`` gauges: requests running and waiting, KV-cache use."""
    METRICS_STEP_TIME = "metrics_step_time"
    """``/metrics`` inter-token (or per-output-token) latency histogram."""
    STREAM_TIMING = "stream_timing"
    """Streamed answers: time to first token and per-token time, as they arrive."""
    ANSWER_LATENCY = "answer_latency"
    """Non-streamed answers: latency per generated token (an upper bound of the step
    time: it includes the prefill and the queue)."""
    OVERLOAD_STATUS = "overload_status"
    """429 and 503 answers."""


class _Snapshot:
    """What every part of a :class:`Stats` snapshot offers besides its fields: plain
    data for logs and exporters. ``model_dump()`` and ``model_dump_json()`` keep
    0.1's names (its snapshots were pydantic models, which slowed ``import llmbatch``
    and validated nothing here)."""

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
class Cost(_Snapshot):
    """The tokens the server was paid for, and what they cost.

    Every answer counts, its caller's or not (one whose caller left while it was in
    flight was still generated), and every attempt of a structured call."""

    answers: int = 0
    """Requests answered (each a prompt or a conversation)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Of the prompt tokens, those read from the server's prompt cache, where its
    usage says (``prompt_tokens_details.cached_tokens``)."""
    completion_tokens: int = 0
    dollars: float = 0.0
    """What they cost at their models' prices (answers of models without one: 0)."""
    unpriced: int = 0
    """Answers of a model with no price (state one: ``Client(prices=...)``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheStats(_Snapshot):
    """The response cache since the client opened (``Client(cache=...)``)."""

    location: str
    """The file, or the Redis URL (without its password)."""
    namespace: str = ""
    hits: int = 0
    """Answers read from the cache: nothing sent, nothing charged."""
    misses: int = 0
    """Requests looked up and not found (sent to the server)."""
    shared: int = 0
    """Answers shared with an identical request in flight at the same time."""
    stored: int = 0
    """Answers written to the cache."""
    unreadable: int = 0
    """Entries that could not be read back (dropped and asked again)."""
    write_errors: int = 0
    """Batches of answers the file could not take (asked again next time)."""
    saved: Cost = Cost()
    """What the hits and shared answers would have cost (their tokens, at the
    client's prices)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SpendingStats(_Snapshot):
    """The client's spending limit (``max_cost``)."""

    max_cost: float
    spent: float
    """Dollars spent under it (what the answers cost)."""
    reserved: float
    """Dollars reserved by requests queued or in flight: the most they may cost."""
    held: int
    """Requests waiting for the reservations to settle."""


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
    cost: Cost = Cost()
    """The tier's tokens paid for and their dollars, since the client opened."""


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
    named: bool = False
    """Named in ``Client(tenants=...)``: its counters are kept for good (others' are
    forgotten once idle, and summed in ``Stats.other_tenants`` as well)."""
    cost: Cost = Cost()
    """Its tokens paid for and their dollars."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProviderLimits(_Snapshot):
    """What a server's last answer said of this caller's rate limits, in its headers:
    OpenAI's ``x-ratelimit-*`` family (which Groq and LiteLLM's proxy send too),
    Anthropic's ``anthropic-ratelimit-*``, Together's ``x-ratelimit-*`` and
    ``x-tokenlimit-*``, Fireworks' ``x-ratelimit-limit-tokens-*`` (docs/hosted.md). None
    where the answer did not say."""

    family: str | None = None
    """Whose headers: ``openai``, ``anthropic``, ``together``, ``fireworks`` (joined by
    ``+`` where an answer carried two)."""
    window: float | None = None
    """Seconds the limits count over, where the family states it (60 a minute, 1 a
    second); None: OpenAI's, read from the resets."""

    requests_limit: int | None = None
    """Requests allowed in the provider's window."""
    requests_remaining: int | None = None
    """Requests left in it."""
    requests_reset: float | None = None
    """Seconds until the request budget is whole again, as of this snapshot."""
    tokens_limit: int | None = None
    """Tokens allowed in the provider's window."""
    tokens_remaining: int | None = None
    """Tokens left in it."""
    tokens_reset: float | None = None
    """Seconds until the token budget is whole again, as of this snapshot."""
    input_tokens_limit: int | None = None
    """Prompt tokens allowed in the window, where they are limited apart (Anthropic's
    input tokens, Fireworks' prompt tokens)."""
    input_tokens_remaining: int | None = None
    input_tokens_reset: float | None = None
    output_tokens_limit: int | None = None
    """Generated tokens allowed in the window, where they are limited apart."""
    output_tokens_remaining: int | None = None
    output_tokens_reset: float | None = None
    malformed: int = 0
    """Values in this answer's limit headers that could not be read (ignored)."""

    def aged(self, seconds: float) -> ProviderLimits:
        """The same reading ``seconds`` later: the resets that much nearer."""

        def nearer(reset: float | None) -> float | None:
            return None if reset is None else max(0.0, reset - seconds)

        return replace(
            self,
            requests_reset=nearer(self.requests_reset),
            tokens_reset=nearer(self.tokens_reset),
            input_tokens_reset=nearer(self.input_tokens_reset),
            output_tokens_reset=nearer(self.output_tokens_reset),
        )


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
    """Realtime answers within ``Client(slo=...)``: a stream's first token within
    ``ttft`` and its tokens within ``tpot``; a call not streamed, of n tokens, within
    ``ttft + (n - 1) x tpot``."""
    slo_missed: int
    """Realtime answers over it."""
    slo_aim: float | None = None
    """With an SLO, the share of it the server's latencies are held to now: it starts
    at 0.9 and follows how many realtime answers miss (about 1% may, as for a p99)."""
    slo_unreachable: bool = False
    """With an SLO: bulk is down to one sequence and the server's latencies are still
    over the target, so the server is too slow for this SLO (loosen it, or add
    capacity) rather than too busy."""
    slo_auto: str | None = None
    """With the default ``slo="auto"``: what it aims at now and why (``dormant`` until
    realtime is seen; ``measuring`` the idle latency; ``active`` with its target;
    ``stood_down`` where the latency does not follow the load); None with a stated
    SLO or ``slo=None``."""
    slo: SLO | None = None
    """The SLO followed now: the stated one, or the default's target while active
    (None: none). Where only ``tpot`` was stated its ``ttft`` is derived (six times
    ``tpot``, at least 0.1 s; ``slo_ttft_derived``), so the first token is bounded
    too."""
    slo_ttft_derived: bool = False
    """``slo.ttft`` was derived from ``slo.tpot`` rather than stated."""
    api_queue: int | None = None
    """This client's sequences the server has taken but its engine neither runs nor
    queues, at the last ``/metrics`` read (the client's in flight less the engine's
    running and waiting): requests still in its API process, or finished prompts
    waiting for the rest of their batch. None where the server reports no such
    gauges. A realtime request crosses that queue first come first served, before
    any engine priority applies: under an SLO, one that lasts cuts bulk as the
    engine's queue does (``inferences``: ``api_queue``)."""
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
    ``api_queue`` (likewise in its API process), ``seats`` (what it runs at once:
    stated, learnt or none), ``step_time``, ``slo_unreachable``. Readings that did not
    last are counted as dismissed."""

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
    provider_limits: ProviderLimits | None = None
    """What its last answer's headers said of its rate limits (None: nothing)."""
    cooldown: float | None = None
    """Seconds until batches go to it again, after a 429 that asked to wait (None:
    not cooling down)."""

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
    cooldowns_heard: int | None = None
    """Waits a 429 asked of another process sharing the rate limit's key that held
    this client too (None: no rate limit shared)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RateStats(_Snapshot):
    """The rate budget the client paces what it sends by (``Stats.rate``)."""

    requests_per_minute: float | None
    """HTTP requests a minute it sends at most (None: not limited that way)."""
    tokens_per_minute: float | None
    """Tokens a minute (None: not limited that way)."""
    source: str
    """``"stated"`` (``rate_limit=``), ``"learnt"`` (a provider's answers' headers
    stated it: the client spends 95 % of it) or ``"shared"`` (another process sharing
    the ``RateLimit`` key learnt it)."""
    evidence: str
    """Where it comes from, in words."""


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
    rate: RateStats | None = None
    """The rate budget in force (None: none stated, none learnt)."""
    tenants: Mapping[str, TenantStats] = field(default_factory=dict)
    """Per named tenant (``tenant=``): those named in ``Client(tenants=...)`` always,
    others while active and for five minutes after. Calls without a tenant are in
    the tiers' counters only."""
    other_tenants: TenantStats | None = None
    """Every tenant not named in ``Client(tenants=...)`` together, since the client
    opened (what Prometheus exports as ``tenant="other"``; None: no such tenant yet)."""
    structured: StructuredStats = StructuredStats()
    """Answers validated, re-asked and failed for ``response_model`` calls."""
    cost: Cost = Cost()
    """Every tier's tokens paid for and their dollars, since the client opened."""
    models: Mapping[str, Cost] = field(default_factory=dict)
    """The same by model (as the requests named it)."""
    spending: SpendingStats | None = None
    """The client's ``max_cost``: spent and reserved (None: no limit)."""
    cache: CacheStats | None = None
    """The response cache's hits and what they saved (None: no cache)."""

    @property
    def server(self) -> ServerStats | None:
        """The first server's admission state (None if there is none)."""
        return self.servers[0] if self.servers else None

    def __str__(self) -> str:
        return render(self)


# -- str(stats): the snapshot as a table a person can read at a glance ----------------

_COLUMNS = ("tier", "queued", "in flight", "done", "failed", "cancelled", "retried")


def render(stats: Stats) -> str:
    """Every figure of ``stats``, one tier per row, then batches, tokens and server."""
    lines = [
        f"llmbatch: up {_duration(stats.uptime)}; last {_duration(stats.rate_window)}: "
        f"{stats.requests_per_second:,.1f} answers/s, "
        f"{stats.tokens_per_second:,.1f} completion tokens/s"
    ]
    rows = [
        [
            tier.value,
            *(f"{n:,}" for n in (t.queued, t.in_flight, t.done, t.failed, t.cancelled, t.retried)),
            _percentiles(t.latency) if t.done else "-",
            _percentiles(t.queue_wait) if t.queue_wait_histogram.count else "-",
        ]
        for tier, t in stats.tiers.items()
    ]
    header = [*_COLUMNS, "latency p50/p95/p99", "queue wait p50/p95/p99"]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    mean = f"{stats.mean_batch_size:,.1f}"
    lines.append(
        f"HTTP requests {stats.batches_sent:,} (prompts each: mean {mean}, "
        f"max {stats.max_batch_size:,}); retries {stats.retries:,}; "
        f"bisections {stats.bisections:,}"
    )
    lines.append(f"tokens: {stats.prompt_tokens:,} prompt, {stats.completion_tokens:,} completion")
    if stats.rate is not None:
        lines.append(_rate(stats.rate))
    lines.extend(_cost(stats))
    if stats.cache is not None:
        lines.append(_cache(stats.cache))
    lines.extend(_server(server) for server in stats.servers)
    lines.extend(_tenants(stats))
    return "\n".join(lines)


def _cache(cache: CacheStats) -> str:
    """``cache: 900 hits, 100 misses, 3 shared; saved 12,000 tokens ($0.01)``."""
    saved = cache.saved
    dollars = f" ({usd(saved.dollars)})" if saved.answers > saved.unpriced else ""
    return (
        f"cache: {cache.hits:,} hits, {cache.misses:,} misses, {cache.shared:,} shared in "
        f"flight, {cache.stored:,} stored; saved "
        f"{saved.prompt_tokens + saved.completion_tokens:,} tokens{dollars}"
    )


def _cost(stats: Stats) -> list[str]:
    """``cost: $1.23 (by model: a $1.20, b $0.03)`` and the spending limit, where
    some answer was priced or a limit is set."""
    lines = []
    cost = stats.cost
    if cost.answers > cost.unpriced:
        models = ", ".join(
            f"{name or '(none)'} {usd(c.dollars) if c.answers > c.unpriced else 'no price'}"
            for name, c in stats.models.items()
        )
        cached = (
            f", {cost.cached_tokens:,} of the prompt tokens cached" if cost.cached_tokens else ""
        )
        lines.append(f"cost: {usd(cost.dollars)}{cached} (by model: {models})")
    spending = stats.spending
    if spending is not None:
        lines.append(
            f"max_cost {usd(spending.max_cost)}: {usd(spending.spent)} spent, "
            f"{usd(spending.reserved)} reserved in flight, {spending.held:,} waiting"
        )
    return lines


def _rate(rate: RateStats) -> str:
    limits = [
        f"{value:,.0f} {unit}/min"
        for value, unit in (
            (rate.requests_per_minute, "requests"),
            (rate.tokens_per_minute, "tokens"),
        )
        if value
    ]
    return f"rate limit ({rate.source}): {', '.join(limits)}; {rate.evidence}"


#: Tenants listed by name in the table (the busiest; the rest are summed).
SHOWN_TENANTS = 8


def _tenants(stats: Stats) -> list[str]:
    """One line per busy tenant (queued and in flight first, then answers)."""
    if not stats.tenants:
        return []
    busiest = sorted(
        stats.tenants.items(), key=lambda kv: (-(kv[1].queued + kv[1].in_flight), -kv[1].done)
    )
    lines = [
        f"tenant {name}: queued {t.queued:,}, in flight {t.in_flight:,}, done {t.done:,}, "
        f"failed {t.failed:,}, cancelled {t.cancelled:,}; latency p50/p99 "
        f"{_duration(t.latency.p50)} / {_duration(t.latency.p99)}"
        for name, t in busiest[:SHOWN_TENANTS]
    ]
    if len(busiest) > SHOWN_TENANTS:
        lines.append(f"... and {len(busiest) - SHOWN_TENANTS:,} more tenants")
    return lines


def _server(server: ServerStats) -> str:
    parts = [
        f"in flight {server.in_flight:,}",
        f"bulk limit {server.bulk_limit:,} of {server.ceiling:,}",
        f"realtime reserve {server.realtime_reserve}",
        f"step {_duration(server.step_time)}",
        f"TTFT {_duration(server.ttft)}",
        f"waiting {'-' if server.waiting is None else server.waiting}",
        "KV cache -" if server.kv_cache_usage is None else f"KV cache {server.kv_cache_usage:.0%}",
        f"breaker {server.breaker}",
    ]
    if server.slo_aim is not None:
        slo = server.slo
        target = "" if slo is None else f" ({_slo_text(slo, derived=server.slo_ttft_derived)})"
        parts.append(
            f"SLO{target} met {server.slo_met:,}, missed {server.slo_missed:,}, "
            f"aiming at {server.slo_aim:.0%} of it"
        )
    if server.slo_auto is not None and not server.slo_auto.startswith("dormant"):
        parts.append(f"default SLO {server.slo_auto}")
    if server.outages:
        parts.append(f"outages {server.outages}")
    if server.ejected:
        parts.append("ejected (slow)")
    if server.cooldown is not None:
        parts.append(f"cooling down {_duration(server.cooldown)} (a 429 asked to wait)")
    if server.provider_limits is not None:
        parts.append(_provider_limits(server.provider_limits))
    return f"server {server.base_url}: " + "; ".join(parts)


def _provider_limits(limits: ProviderLimits) -> str:
    """``provider limits: requests 98 of 100 left (whole in 0.6 s), tokens ...``."""
    said = []
    for name, limit, left, reset in (
        ("requests", limits.requests_limit, limits.requests_remaining, limits.requests_reset),
        ("tokens", limits.tokens_limit, limits.tokens_remaining, limits.tokens_reset),
    ):
        if left is None:
            continue
        text = f"{name} {left:,}" + ("" if limit is None else f" of {limit:,}") + " left"
        if reset is not None:
            text += f" (whole in {_duration(reset)})"
        said.append(text)
    return "provider limits: " + (", ".join(said) or "-")


def _percentiles(p: Percentiles) -> str:
    return f"{_duration(p.p50)} / {_duration(p.p95)} / {_duration(p.p99)}"


def _slo_text(slo: SLO, *, derived: bool) -> str:
    parts = [] if slo.tpot is None else [f"tpot {_duration(slo.tpot)}"]
    if slo.ttft is not None:
        parts.append(f"ttft {_duration(slo.ttft)}" + (" derived" if derived else ""))
    return ", ".join(parts)


def _duration(seconds: float | None) -> str:
    """Seconds in the unit a person reads best: ``0.4 ms``, ``123 ms``, ``2.50 s``."""
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 600:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"
