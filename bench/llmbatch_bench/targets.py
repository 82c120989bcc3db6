"""The issue's four targets, judged from one run's metrics.

Each is a ratio or a bound computed from runs made on the same machine in the same
bench run; a target whose inputs were not measured is reported as ``met=None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llmbatch_bench.metrics import RunMetrics

__all__ = [
    "BULK_RATIO",
    "BURST_RSS_MB",
    "CPU_RATIO",
    "CPU_US",
    "REALTIME_RATIO",
    "Target",
    "capacity",
    "evaluate",
    "find",
]

BULK_RATIO = 0.95
REALTIME_RATIO = 1.5
CPU_US = 20.0
CPU_RATIO = 10.0
BURST_RSS_MB = 300.0


@dataclass(frozen=True, slots=True)
class Target:
    """One target's verdict."""

    id: str
    description: str
    value: float | None
    threshold: float
    met: bool | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.value is not None and not math.isfinite(self.value):
            data["value"] = None
        return data


def find(runs: Sequence[RunMetrics], scenario: str, label: str) -> RunMetrics | None:
    """The run of ``label`` in ``scenario``, if there is one."""
    return next((r for r in runs if r.scenario == scenario and r.label == label), None)


def capacity(runs: Sequence[RunMetrics]) -> RunMetrics | None:
    """The sweep run with the best prompts/s: the server's saturated capacity."""
    sweep = [r for r in runs if r.scenario == "sweep" and r.ok]
    return max(sweep, key=lambda r: r.prompts_per_s, default=None)


def _p99(run: RunMetrics | None, which: str = "latency") -> float:
    if run is None:
        return math.nan
    tiers = run.latency if which == "latency" else run.ttft
    p = tiers.get("realtime")
    return p.p99 if p is not None else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def _fmt(value: float, spec: str) -> str:
    return f"{value:{spec}}x" if math.isfinite(value) else "n/a"


def _verdict(value: float, ok: bool) -> bool | None:
    return None if not math.isfinite(value) else ok


def evaluate(runs: Sequence[RunMetrics]) -> list[Target]:
    """Judge every target from ``runs`` (all of one bench run)."""
    return [_bulk(runs), _realtime(runs), *_cpu(runs), _burst(runs)]


def _bulk(runs: Sequence[RunMetrics]) -> Target:
    best = capacity(runs)
    ours = find(runs, "bulk", "llmbatch")
    value = _ratio(ours.prompts_per_s if ours else math.nan, best.prompts_per_s if best else 0)
    detail = (
        f"llmbatch {ours.prompts_per_s:.0f} prompts/s vs capacity {best.prompts_per_s:.0f} "
        f"prompts/s ({best.label})"
        if ours and best
        else "needs the bulk and sweep scenarios"
    )
    return Target(
        id="bulk_throughput",
        description="bulk throughput / server's saturated capacity (best of the sweep)",
        value=value,
        threshold=BULK_RATIO,
        met=_verdict(value, value >= BULK_RATIO),
        detail=detail,
    )


def _realtime(runs: Sequence[RunMetrics]) -> Target:
    loaded, idle = find(runs, "mixed", "llmbatch"), find(runs, "idle", "llmbatch")
    value = _ratio(_p99(loaded), _p99(idle))
    parts = []
    for run in runs:
        if run.scenario == "mixed":
            base = find(runs, "idle", run.label)
            ratio = _ratio(_p99(run), _p99(base))
            ttft = _ratio(_p99(run, "ttft"), _p99(base, "ttft"))
            censored = "≥ " if run.extra.get("censored") else ""
            parts.append(
                f"{run.label}: p99 {censored}{_p99(run) * 1e3:.0f} ms loaded vs "
                f"{_p99(base) * 1e3:.0f} ms idle = {censored}{ratio:.2f}x "
                f"(TTFT p99 {_fmt(ttft, '.2f')})"
            )
    return Target(
        id="realtime_p99_ratio",
        description="realtime p99 under saturating bulk / realtime p99 on an idle server",
        value=value,
        threshold=REALTIME_RATIO,
        met=_verdict(value, value <= REALTIME_RATIO),
        detail="; ".join(parts) or "needs the mixed scenario",
    )


def _cpu(runs: Sequence[RunMetrics]) -> list[Target]:
    ours, openai = find(runs, "bulk", "llmbatch"), find(runs, "bulk", "openai")
    us = ours.cpu_us_per_prompt if ours else math.nan
    theirs = openai.cpu_us_per_prompt if openai else math.nan
    ratio = _ratio(theirs, us)
    return [
        Target(
            id="cpu_per_prompt",
            description="client CPU per prompt in bulk (µs)",
            value=us,
            threshold=CPU_US,
            met=_verdict(us, us <= CPU_US),
            detail=f"llmbatch {us:.1f} µs/prompt" if ours else "needs the bulk scenario",
        ),
        Target(
            id="cpu_vs_openai",
            description="openai SDK CPU per prompt / llmbatch CPU per prompt (bulk)",
            value=ratio,
            threshold=CPU_RATIO,
            met=_verdict(ratio, ratio >= CPU_RATIO),
            detail=(
                f"openai {theirs:.0f} µs vs llmbatch {us:.1f} µs per prompt"
                if ours and openai
                else "needs the bulk scenario with the openai baseline"
            ),
        ),
    ]


def _burst(runs: Sequence[RunMetrics]) -> Target:
    ours = [r for r in runs if r.scenario == "burst" and r.contender == "llmbatch"]
    if not ours:
        return Target(
            id="burst",
            description=f"burst: zero failures and peak RSS < {BURST_RSS_MB:.0f} MB",
            value=None,
            threshold=BURST_RSS_MB,
            met=None,
            detail="needs the burst scenario",
        )
    worst = max(ours, key=lambda r: (r.failed + r.unfinished, r.peak_rss_mb or 0.0))
    rss = max((r.peak_rss_mb or math.nan) for r in ours)
    met = all(r.failed == 0 and r.unfinished == 0 for r in ours) and rss < BURST_RSS_MB
    detail = "; ".join(
        f"{r.label}: {r.ok}/{r.requested} ok, {r.failed} failed, {r.unfinished} unfinished, "
        f"peak RSS {r.peak_rss_mb or math.nan:.0f} MB"
        for r in runs
        if r.scenario == "burst"
    )
    return Target(
        id="burst",
        description=f"burst of {worst.requested}: zero failures and peak RSS < "
        f"{BURST_RSS_MB:.0f} MB",
        value=rss,
        threshold=BURST_RSS_MB,
        met=_verdict(rss, met),
        detail=detail,
    )
