"""Repeated runs folded into one row each: medians over rounds, and ratios.

A hot-path label runs several times, interleaved with the others
(:mod:`.hotpath.plan`); one :class:`Summary` per (scenario, label) holds the median of
its rounds and their spread. The median, not the mean, because one round caught by
another process's burst of work should not move the number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llmbatch_bench.metrics import RunMetrics

__all__ = ["Summary", "find_summary", "median", "ratio", "summarize"]


def median(values: Iterable[float | None]) -> float:
    """The median of the finite values; ``nan`` when there are none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def ratio(a: float, b: float) -> float:
    """``a / b``; ``nan`` unless both are finite and ``b`` is not zero."""
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return a / b


@dataclass(frozen=True, slots=True)
class Summary:
    """One label of one scenario over its rounds (times in seconds, CPU in µs)."""

    scenario: str
    label: str
    rounds: int
    #: Totals over the rounds.
    ok: int
    failed: int
    unfinished: int
    #: Medians over the rounds.
    cpu_us_per_prompt: float
    prompts_per_s: float
    wall_s: float
    #: Each round's own latency p50/p99 (its only tier), then the median of those.
    p50_s: float
    p99_s: float
    #: Spread of CPU per prompt over the rounds.
    cpu_us_min: float
    cpu_us_max: float
    #: The highest peak RSS of any round (memory is judged by its worst case).
    peak_rss_mb: float | None
    #: Medians over the rounds: client CPU seconds of a round, and the API requests
    #: the server counted during it (``nan`` where not counted; absent in older reports).
    cpu_s: float = math.nan
    server_requests: float = math.nan
    #: Median over the rounds of the garbage collector's time a prompt, in µs (part
    #: of ``cpu_us_per_prompt``; ``nan`` where not timed, as in older reports).
    gc_us_per_prompt: float = math.nan

    @property
    def per_round(self) -> int:
        """Inputs each round ran (answered, failed or unfinished)."""
        return (self.ok + self.failed + self.unfinished) // max(self.rounds, 1)

    def to_json(self) -> dict[str, Any]:
        return {k: v if _finite(v) else None for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        nan_if_none = {
            "cpu_us_per_prompt",
            "prompts_per_s",
            "wall_s",
            "p50_s",
            "p99_s",
            "cpu_us_min",
            "cpu_us_max",
            "cpu_s",
            "server_requests",
            "gc_us_per_prompt",
        }
        fields: dict[str, Any] = {
            k: math.nan if k in nan_if_none and v is None else v for k, v in data.items()
        }
        return cls(**fields)


def _finite(value: Any) -> bool:
    return not (isinstance(value, float) and not math.isfinite(value))


def summarize(runs: Sequence[RunMetrics]) -> list[Summary]:
    """One :class:`Summary` per (scenario, label), in the order labels first ran."""
    groups: dict[tuple[str, str], list[RunMetrics]] = {}
    for run in runs:
        groups.setdefault((run.scenario, run.label), []).append(run)
    return [_summary(scenario, label, group) for (scenario, label), group in groups.items()]


def _summary(scenario: str, label: str, group: Sequence[RunMetrics]) -> Summary:
    cpu = [r.cpu_us_per_prompt for r in group]
    finite_cpu = [v for v in cpu if math.isfinite(v)]
    rss = [r.peak_rss_mb for r in group if r.peak_rss_mb is not None]
    return Summary(
        scenario=scenario,
        label=label,
        rounds=len(group),
        ok=sum(r.ok for r in group),
        failed=sum(r.failed for r in group),
        unfinished=sum(r.unfinished for r in group),
        cpu_us_per_prompt=median(cpu),
        prompts_per_s=median(r.prompts_per_s for r in group),
        wall_s=median(r.wall_s for r in group),
        p50_s=median(_latency(r, "p50") for r in group),
        p99_s=median(_latency(r, "p99") for r in group),
        cpu_us_min=min(finite_cpu, default=math.nan),
        cpu_us_max=max(finite_cpu, default=math.nan),
        peak_rss_mb=max(rss) if rss else None,
        cpu_s=median(r.cpu_s for r in group),
        server_requests=median(r.extra.get("server_requests") for r in group),
        gc_us_per_prompt=median(_gc_us_per_prompt(r) for r in group),
    )


def _gc_us_per_prompt(run: RunMetrics) -> float:
    """The collector's time in a run, per prompt asked, in µs (``nan``: not timed)."""
    seconds = run.extra.get("gc_s")
    if seconds is None or not run.requested:
        return math.nan
    return float(seconds) * 1e6 / run.requested


def _latency(run: RunMetrics, quantile: str) -> float:
    """A run's latency percentile when it has exactly one tier (else ``nan``)."""
    if len(run.latency) != 1:
        return math.nan
    (tier,) = run.latency.values()
    value: float = getattr(tier, quantile)
    return value


def find_summary(summaries: Iterable[Summary], scenario: str, label: str) -> Summary | None:
    """The summary of ``label`` in ``scenario``, if that ran."""
    return next((s for s in summaries if s.scenario == scenario and s.label == label), None)
