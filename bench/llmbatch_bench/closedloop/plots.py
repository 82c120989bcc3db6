"""Plots of the closed-loop scenarios: the control time series (``control.png``,
shown in docs/concepts.md), the SLO trade-off (``slo.png``) and the frontier
(``frontier.png``: every static setting, the line no other beats, the bound and the
controller's point)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch_bench.closedloop import frontier as sweep
from llmbatch_bench.closedloop import plan as closedplan
from llmbatch_bench.closedloop.targets import tpot_p99
from llmbatch_bench.closedloop.trace import column

__all__ = ["plot_control", "plot_frontier", "plot_slo"]

_LIMIT, _RUNNING, _WAITING = "#1f4e79", "#2e86c1", "#e67e22"
_REAL, _EST, _SLO, _RT = "#34495e", "#8e44ad", "#c0392b", "#27ae60"


def _num(values: Sequence[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def plot_control(figure: Any, report: Mapping[str, Any]) -> bool:
    run = next((r for r in report["runs"] if r["scenario"] == "control"), None)
    if run is None or not run["extra"].get("trace"):
        return False
    extra = run["extra"]
    trace = extra["trace"]
    t = _num(column(trace, "t"))
    slo = extra.get("slo_tpot_s")
    phases = extra.get("phases") or []
    top, middle, bottom = figure.subplots(3, 1, sharex=True, height_ratios=[1.2, 1.2, 0.8])

    limit = _num(column(trace, "bulk_limit"))
    top.step(t, limit, where="post", color=_LIMIT, linewidth=2, label="bulk limit (client)")
    top.plot(t, _num(column(trace, "running")), color=_RUNNING, linewidth=1, label="server running")
    top.plot(t, _num(column(trace, "waiting")), color=_WAITING, linewidth=1, label="server waiting")
    top.set_ylabel("sequences")
    top.set_ylim(bottom=0)
    top.legend(loc="upper right", fontsize=8, ncol=3)

    real = [x * 1e3 for x in _num(column(trace, "step_real"))]
    est = [x * 1e3 for x in _num(column(trace, "step_est"))]
    middle.plot(t, real, color=_REAL, linewidth=1.2, label="server step (real)")
    middle.plot(t, est, color=_EST, linewidth=1, linestyle="--", label="client's estimate")
    rows = extra.get("realtime") or []
    done = [r[1] for r in rows if r[3] is not None]
    tpot = [r[3] * 1e3 for r in rows if r[3] is not None]
    middle.scatter(done, tpot, s=6, color=_RT, alpha=0.6, label="realtime stream TPOT", zorder=3)
    if slo:
        middle.axhline(slo * 1e3, color=_SLO, linestyle="--", linewidth=1, label="SLO")
    finite = [x for x in (*real, *tpot) if math.isfinite(x)]
    if finite and slo:
        middle.set_ylim(0, min(max(finite) * 1.1, slo * 1e3 * 3))
    middle.set_ylabel("ms per output token")
    middle.legend(loc="upper right", fontsize=8, ncol=4)

    interval = float(trace.get("interval") or 0.2)
    tokens = [x / interval / 1e3 for x in _num(column(trace, "tokens"))]
    bottom.plot(t, tokens, color=_REAL, linewidth=1, label="server tokens/s (k)")
    bottom.set_ylabel("k tokens/s")
    bottom.set_ylim(bottom=0)
    right = bottom.twinx()
    right.plot(
        t, _num(column(trace, "rt_in_flight")), color=_RT, linewidth=1, label="realtime in flight"
    )
    right.plot(
        t,
        _num(column(trace, "rt_queued")),
        color=_RT,
        linewidth=1,
        linestyle=":",
        label="realtime queued (client)",
    )
    right.set_ylabel("realtime requests", color=_RT)
    right.set_ylim(bottom=0)
    bottom.set_xlabel("seconds")
    lines = bottom.get_lines() + right.get_lines()
    bottom.legend(lines, [x.get_label() for x in lines], loc="upper right", fontsize=8, ncol=3)

    down, back = extra.get("down_at"), extra.get("back_at")
    for ax in (top, middle, bottom):
        if phases:
            ax.axvspan(phases[0], t[-1] if t else phases[0], color=_RT, alpha=0.06, lw=0)
        if down is not None and back is not None:
            ax.axvspan(down, back, color=_SLO, alpha=0.12, lw=0)
    labels = [(phases[0] / 2, "bulk alone")] if phases else []
    if phases and down is not None:
        labels.append(((phases[0] + down) / 2, "+ realtime (Poisson)"))
    if down is not None and back is not None:
        labels.append(((down + back) / 2, "503 outage"))
        labels.append(((back + (t[-1] if t else back)) / 2, "recovery"))
    for x, text in labels:
        top.annotate(text, (x, 1.02), xycoords=("data", "axes fraction"), ha="center", fontsize=8)
    title = "Admission control following load (llmbatch, simulator"
    model = extra.get("model") or {}
    speed = f" --speed {model['speed']:g}" if model.get("speed") else ""
    figure.suptitle(
        f"{title}{speed}, SLO TPOT {slo * 1e3:.1f} ms)" if slo else f"{title}{speed})",
        fontsize=10,
    )
    return True


def plot_slo(figure: Any, report: Mapping[str, Any]) -> bool:
    runs = [r for r in report["runs"] if r["scenario"] == "slo" and r["label"] != closedplan.IDLE]
    if not runs:
        return False
    left, right = figure.subplots(1, 2)
    labels = [r["label"] for r in runs]
    colors = ["#2a6f97" if r["contender"] == "llmbatch" else "#999999" for r in runs]
    p99 = [tpot_p99(r) * 1e3 for r in runs]
    _bars(left, labels, p99, colors, "{:.1f} ms", "no stream finished")
    slo = runs[0]["extra"].get("slo_tpot_s")
    if slo:
        left.axhline(slo * 1e3, color=_SLO, linestyle="--", linewidth=1, label="SLO")
        left.legend(fontsize=8, loc="upper left")
    left.set_ylabel("realtime time per output token, p99 (ms)")
    left.set_title("Realtime per-token time (p99)")
    tokens = _num([r["output_tokens_per_s"] for r in runs])
    _bars(right, labels, tokens, colors, "{:,.0f}", "-")
    bound = runs[0]["extra"].get("bound")
    if bound:
        right.axhline(
            bound["tokens_per_s"], color=_SLO, linestyle="--", linewidth=1, label="best under SLO"
        )
        right.legend(fontsize=8, loc="upper left")
    right.set_ylabel("bulk tokens/s (realtime window)")
    right.set_title("Bulk throughput")
    return True


def plot_frontier(figure: Any, report: Mapping[str, Any]) -> bool:
    found = sweep.from_runs(report["runs"], closedplan.FRONTIER_CONTROLLER)
    if found is None or not found.statics:
        return False
    ax = figure.subplots()
    finite = [p for p in found.statics if math.isfinite(p.realtime_p99)]
    ax.scatter(
        [p.realtime_p99 * 1e3 for p in finite],
        [p.bulk for p in finite],
        color="#999999",
        s=18,
        label="static settings",
    )
    for p in finite:
        short = p.label.removeprefix("static cap ").replace(", batch ", "/")
        ax.annotate(short, (p.realtime_p99 * 1e3, p.bulk), fontsize=6, color="#666666")
    line = [p for p in sweep.frontier(finite)]
    ax.plot(
        [p.realtime_p99 * 1e3 for p in line],
        [p.bulk for p in line],
        color=_LIMIT,
        linewidth=1,
        label="frontier",
    )
    ax.axvline(found.bound * 1e3, color=_SLO, linestyle="--", linewidth=1, label="SLO bound")
    best = sweep.oracle(found.statics, found.bound)
    if best is not None:
        ax.scatter([best.realtime_p99 * 1e3], [best.bulk], color=_LIMIT, marker="s", s=40,
                   label="oracle")  # fmt: skip
    ours = found.controller
    if ours is not None and math.isfinite(ours.realtime_p99):
        ax.scatter([ours.realtime_p99 * 1e3], [ours.bulk], color=_RT, marker="*", s=140,
                   label="controller")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("realtime end-to-end p99 (ms, log)")
    ax.set_ylabel("bulk prompts/s")
    ax.set_title(f"Frontier ({found.medians_of})", fontsize=10)
    ax.legend(fontsize=8)
    return True


def _bars(
    ax: Any, labels: list[str], values: list[float], colors: list[str], fmt: str, missing: str
) -> None:
    drawn = [v if math.isfinite(v) else 0.0 for v in values]
    bars = ax.bar(labels, drawn, color=colors)
    for bar, value in zip(bars, values, strict=True):
        text = fmt.format(value) if math.isfinite(value) else missing
        x = bar.get_x() + bar.get_width() / 2
        ax.annotate(text, (x, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.margins(y=0.15)
