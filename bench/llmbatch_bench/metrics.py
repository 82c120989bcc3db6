"""What a run measures: latency samples, outcomes, client CPU, wall time, peak RSS.

A :class:`Recorder` collects per-request samples while a workload runs (compact
``array('d')`` storage: a 100,000-request burst must not inflate the RSS it
measures). :func:`measure` brackets the workload with wall clock, the process's own
CPU time, the garbage collector's share of it and its peak RSS, and
:meth:`Recorder.finish` turns it all into a JSON-ready :class:`RunMetrics`.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Meter",
    "Percentiles",
    "Recorder",
    "RunMetrics",
    "Tally",
    "measure",
    "peak_rss_mb",
    "percentile",
    "percentiles",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks.

    The same definition as ``numpy.percentile``'s default; ``nan`` for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


_QUANTILES = ("p50", "p95", "p99", "max")


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Latency percentiles in seconds over ``n`` samples."""

    n: int
    p50: float
    p95: float
    p99: float
    max: float


def percentiles(values: Sequence[float]) -> Percentiles:
    """p50/p95/p99/max of ``values`` (all ``nan`` when there are none)."""
    ordered = sorted(values)
    return Percentiles(
        n=len(ordered),
        p50=percentile(ordered, 50),
        p95=percentile(ordered, 95),
        p99=percentile(ordered, 99),
        max=ordered[-1] if ordered else math.nan,
    )


def peak_rss_mb() -> float | None:
    """This process's peak resident set size so far, in MiB (None if unknown)."""
    try:
        import resource
    except ImportError:  # Windows: psutil knows the peak working set
        try:
            import psutil  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            return None
        info = psutil.Process().memory_info()
        return float(getattr(info, "peak_wset", info.rss)) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


@dataclass(slots=True)
class Meter:
    """Wall and CPU seconds of one bracketed workload (filled when it ends)."""

    wall: float = 0.0
    cpu: float = 0.0
    gc_s: float = 0.0
    """Seconds the garbage collector ran (within ``cpu``: it runs in this process's
    threads), timed from each collection's start to its stop."""
    gc_collections: int = 0
    rss_before_mb: float | None = None
    peak_rss_mb: float | None = None
    started_wall: float = field(default_factory=time.perf_counter)
    started_cpu: float = field(default_factory=time.process_time)

    def stop(self) -> Meter:
        """Record wall, CPU and peak RSS as of now (again if called again)."""
        self.wall = time.perf_counter() - self.started_wall
        self.cpu = time.process_time() - self.started_cpu
        self.peak_rss_mb = peak_rss_mb()
        return self


@contextmanager
def measure() -> Iterator[Meter]:
    """Bracket a workload: wall time, this process's CPU time (all threads), peak RSS.

    CPU comes from ``time.process_time``, which counts only this process: the server
    under test runs elsewhere, so none of its work lands here. The collector's time
    is what separates a client that keeps objects per prompt from one that keeps
    none (``Meter.gc_s``).
    """
    meter = Meter(rss_before_mb=peak_rss_mb())
    started = 0.0

    def timed(phase: str, info: Mapping[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            meter.gc_s += time.perf_counter() - started
            meter.gc_collections += 1

    gc.callbacks.append(timed)
    meter.started_wall, meter.started_cpu = time.perf_counter(), time.process_time()
    try:
        yield meter
    finally:
        gc.callbacks.remove(timed)
        meter.stop()


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """One contender's numbers in one scenario (the JSON report's ``runs`` entries)."""

    scenario: str
    contender: str
    label: str
    requested: int
    ok: int
    failed: int
    unfinished: int
    errors: Mapping[str, int]
    wall_s: float
    cpu_s: float
    cpu_us_per_prompt: float
    prompts_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    latency: Mapping[str, Percentiles]
    ttft: Mapping[str, Percentiles]
    peak_rss_mb: float | None
    rss_before_mb: float | None
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Per-request time per output token of streams, after the first token.
    tpot: Mapping[str, Percentiles] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A plain dict; ``nan`` becomes ``None`` so the JSON is standard."""
        data: dict[str, Any] = _clean(asdict(self))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunMetrics:
        """Rebuild from :meth:`to_json` output (``None`` percentiles back to ``nan``)."""

        def tiers(raw: Mapping[str, Any]) -> dict[str, Percentiles]:
            return {
                tier: Percentiles(
                    n=int(p["n"]),
                    **{k: math.nan if p[k] is None else float(p[k]) for k in _QUANTILES},
                )
                for tier, p in raw.items()
            }

        fields = dict(data)
        for name in (
            "wall_s",
            "cpu_s",
            "cpu_us_per_prompt",
            "prompts_per_s",
            "output_tokens_per_s",
        ):
            if fields[name] is None:
                fields[name] = math.nan
        fields["latency"] = tiers(fields["latency"])
        fields["ttft"] = tiers(fields["ttft"])
        fields["tpot"] = tiers(fields.get("tpot", {}))  # absent in older reports
        return cls(**fields)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class Tally:
    """Successes counted by a hot loop: two integer additions per result, so the
    bench's own bookkeeping stays out of the per-prompt CPU it measures. Made by
    :meth:`Recorder.tally`, folded into the recorder when it finishes."""

    __slots__ = ("ok", "tokens")

    def __init__(self) -> None:
        self.ok = 0
        self.tokens = 0


class Recorder:
    """Per-request outcomes of one run, per tier, kept compact."""

    def __init__(self) -> None:
        self._latency: dict[str, array[float]] = {}
        self._ttft: dict[str, array[float]] = {}
        self._tpot: dict[str, array[float]] = {}
        self._queued: dict[str, array[float]] = {}
        self.ok = 0
        self.failed = 0
        self.done: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        self.censored: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self._tallies: list[tuple[str, Tally]] = []
        self.streams: list[StreamRecord] = []
        """Each answered realtime stream's timing (``record_stream``)."""
        self.calls: list[tuple[float, float]] = []
        """Each answered realtime single call: when it was sent (``time.monotonic``)
        and its latency, so a run's tail can be placed in its trace."""

    @property
    def output_tokens(self) -> int:
        """Output tokens of every successful request, all tiers."""
        return sum(self.tokens.values())

    def count(self, tier: str) -> int:
        """Successful requests of ``tier`` so far."""
        return self.done[tier]

    def success(
        self,
        tier: str,
        latency: float,
        output_tokens: int,
        ttft: float | None = None,
        tpot: float | None = None,
    ) -> None:
        """One request answered after ``latency`` seconds (``ttft`` and ``tpot``, its
        time per output token after the first, for streams)."""
        self.ok += 1
        self.done[tier] += 1
        self.tokens[tier] += output_tokens
        self._latency.setdefault(tier, array("d")).append(latency)
        if ttft is not None:
            self._ttft.setdefault(tier, array("d")).append(ttft)
        if tpot is not None:
            self._tpot.setdefault(tier, array("d")).append(tpot)

    def success_many(
        self, tier: str, count: int, output_tokens: int, latency: float | None = None
    ) -> None:
        """``count`` requests answered together (one HTTP request, or a tally kept by a
        hot loop that must not pay for a sample per prompt); ``latency``, if given, is
        recorded once for all of them."""
        self.ok += count
        self.done[tier] += count
        self.tokens[tier] += output_tokens
        if latency is not None:
            self._latency.setdefault(tier, array("d")).append(latency)

    def queued(self, tier: str, seconds: float) -> None:
        """How long an answered request of ``tier`` waited inside the client before
        it was sent (``Timings.queued``): its latency less the server's part."""
        self._queued.setdefault(tier, array("d")).append(seconds)

    def tally(self, tier: str) -> Tally:
        """A :class:`Tally` whose counts join ``tier`` when this recorder finishes."""
        counts = Tally()
        self._tallies.append((tier, counts))
        return counts

    def failure(self, error: BaseException | str) -> None:
        """One request failed; errors are counted by type name."""
        self.failed += 1
        self.errors[error if isinstance(error, str) else type(error).__name__] += 1

    def unfinished(self, tier: str, elapsed: float) -> None:
        """A request given up on after ``elapsed`` seconds without an answer.

        It fails, and ``elapsed`` (a lower bound of its latency) joins the latency
        samples: dropping it would flatter exactly the percentiles that matter.
        """
        self.failure("Unfinished")
        self.censored[tier] += 1
        self._latency.setdefault(tier, array("d")).append(elapsed)

    def finish(
        self,
        *,
        scenario: str,
        contender: str,
        label: str,
        requested: int,
        meter: Meter,
        prompts: int | None = None,
        tokens: int | None = None,
        window: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> RunMetrics:
        """Freeze into :class:`RunMetrics`.

        Rates use ``prompts`` and ``tokens`` (default: every successful request) over
        ``window`` seconds (default: the whole run's wall time). CPU per prompt always
        divides the whole run's CPU by the prompts answered, so setup and teardown are
        charged to the client too.
        """
        for tier, counts in self._tallies:
            # Zeroed as they are folded in: finishing twice must not count twice.
            self.success_many(tier, counts.ok, counts.tokens)
            counts.ok = counts.tokens = 0
        answered = self.ok if prompts is None else prompts
        produced = self.output_tokens if tokens is None else tokens
        seconds = meter.wall if window is None else window
        return RunMetrics(
            scenario=scenario,
            contender=contender,
            label=label,
            requested=requested,
            ok=self.ok,
            failed=self.failed,
            unfinished=max(0, requested - self.ok - self.failed),
            errors=dict(self.errors.most_common()),
            wall_s=meter.wall,
            cpu_s=meter.cpu,
            cpu_us_per_prompt=meter.cpu / self.ok * 1e6 if self.ok else math.nan,
            prompts_per_s=answered / seconds if seconds > 0 else math.nan,
            output_tokens=produced,
            output_tokens_per_s=produced / seconds if seconds > 0 else math.nan,
            latency={t: percentiles(v) for t, v in sorted(self._latency.items())},
            ttft={t: percentiles(v) for t, v in sorted(self._ttft.items())},
            tpot={t: percentiles(v) for t, v in sorted(self._tpot.items())},
            peak_rss_mb=meter.peak_rss_mb,
            rss_before_mb=meter.rss_before_mb,
            extra={
                **(extra or {}),
                **({"censored": dict(self.censored)} if self.censored else {}),
                **(
                    {"queued": {t: asdict(percentiles(v)) for t, v in self._queued.items()}}
                    if self._queued
                    else {}
                ),
            },
        )


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One realtime stream: when it started and when its longest wait between two
    tokens ended (``time.monotonic()`` readings, to set beside a run's trace), its
    TTFT and time per output token, that longest gap, and its tokens (seconds)."""

    started: float
    ttft: float | None
    tpot: float | None
    max_gap: float | None
    max_gap_at: float | None
    tokens: int

    def row(self, origin: float) -> list[float | int | None]:
        """[started, ttft, tpot, max_gap, max_gap_at, tokens], times from ``origin``."""
        at = None if self.max_gap_at is None else self.max_gap_at - origin
        values = (self.started - origin, self.ttft, self.tpot, self.max_gap, at)
        return [None if v is None else round(v, 4) for v in values] + [self.tokens]


#: The fields of ``StreamRecord.row``, as a run's JSON names them.
STREAM_FIELDS = ("t", "ttft", "tpot", "max_gap", "max_gap_at", "tokens")


async def record_stream(
    rec: Recorder, deltas: AsyncIterator[str], start: float
) -> tuple[float | None, float | None] | None:
    """Consume one realtime stream into ``rec``: latency and time to first text from
    ``start`` (a ``time.perf_counter()`` reading), time per output token after the
    first (each non-empty delta is a token on vLLM and the simulator), its longest
    gap between two tokens (``rec.streams``), or the failure. Returns the stream's
    (TTFT, time per output token), None if it failed."""
    to_monotonic = time.monotonic() - time.perf_counter()
    first: float | None = None
    last = 0.0
    gap = gap_end = None
    chunks = texts = 0
    try:
        async for delta in deltas:
            if delta:
                now = time.perf_counter()
                if first is None:
                    first = now
                elif gap is None or now - last > gap:
                    gap, gap_end = now - last, now
                last = now
                texts += 1
            chunks += 1
    except Exception as exc:
        rec.failure(exc)
        return None
    tpot = (last - first) / (texts - 1) if first is not None and texts > 1 else None
    ttft = first - start if first is not None else None
    rec.success("realtime", time.perf_counter() - start, chunks, ttft=ttft, tpot=tpot)
    at = None if gap_end is None else gap_end + to_monotonic
    rec.streams.append(StreamRecord(start + to_monotonic, ttft, tpot, gap, at, texts))
    return ttft, tpot
