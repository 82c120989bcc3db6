"""PNG plots of a bench report (matplotlib)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmbatch_bench.closedloop import plots as plots_closed
from llmbatch_bench.hotpath.report import summaries_of
from llmbatch_bench.report import capacity_run, runs_of
from llmbatch_bench.targets import BURST_RSS_MB, CPU_US

__all__ = ["write_plots"]


def write_plots(report: Mapping[str, Any], directory: Path) -> list[Path]:
    """PNG plots of each scenario present; [] when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    wide = (9.0, 4.2)
    plots: list[tuple[str, Callable[[Any, Mapping[str, Any]], bool], tuple[float, float]]] = [
        ("bench-throughput.png", _plot_throughput, wide),
        ("bench-realtime.png", _plot_realtime, wide),
        ("slo.png", plots_closed.plot_slo, wide),
        ("frontier.png", plots_closed.plot_frontier, (7.0, 4.6)),
        ("control.png", plots_closed.plot_control, (10.0, 8.0)),
        ("bench-cpu.png", _plot_cpu, wide),
        ("bench-burst.png", _plot_burst, wide),
    ]
    for name, draw, size in plots:
        figure = plt.figure(figsize=size, dpi=110)
        try:
            if draw(figure, report):
                figure.tight_layout()
                figure.savefig(directory / name)
                written.append(directory / name)
        finally:
            plt.close(figure)
    return written


def _bars(ax: Any, labels: Sequence[str], values: Sequence[float], fmt: str = "{:,.0f}") -> None:
    bars = ax.bar(
        labels, values, color=["#2a6f97" if "llmbatch" in x else "#999999" for x in labels]
    )
    for bar, value in zip(bars, values, strict=True):
        if math.isfinite(value):
            ax.annotate(
                fmt.format(value),
                (bar.get_x() + bar.get_width() / 2, value),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.tick_params(axis="x", labelsize=8)


def _value(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _plot_throughput(figure: Any, report: Mapping[str, Any]) -> bool:
    bulk, sweep = runs_of(report, "bulk"), runs_of(report, "sweep")
    if not bulk and not sweep:
        return False
    left, right = figure.subplots(1, 2)
    if sweep:
        xs = [r["extra"].get("concurrency", 0) for r in sweep]
        left.plot(xs, [_value(r["prompts_per_s"]) for r in sweep], marker="o", color="#555555")
        left.set_xscale("log", base=2)
        left.set_xlabel("prompts in flight (probe)")
        left.set_ylabel("prompts/s")
        left.set_title("Server capacity sweep")
    if bulk:
        _bars(right, [r["label"] for r in bulk], [_value(r["prompts_per_s"]) for r in bulk])
        best = capacity_run(report)
        if best:
            right.axhline(
                best["prompts_per_s"],
                color="#c0392b",
                linestyle="--",
                linewidth=1,
                label="capacity",
            )
            right.legend(fontsize=8)
        right.set_ylabel("prompts/s")
        right.set_title("Bulk throughput")
    return True


def _plot_realtime(figure: Any, report: Mapping[str, Any]) -> bool:
    mixed = runs_of(report, "mixed")
    if not mixed:
        return False
    idle = {r["label"]: r for r in runs_of(report, "idle")}
    ax = figure.subplots()
    labels = [r["label"] for r in mixed]
    width = 0.2
    series = [
        (
            "idle p99",
            [idle.get(x, {}).get("latency", {}).get("realtime", {}).get("p99") for x in labels],
            "#9ecae1",
        ),
        ("loaded p50", [r["latency"].get("realtime", {}).get("p50") for r in mixed], "#6baed6"),
        ("loaded p95", [r["latency"].get("realtime", {}).get("p95") for r in mixed], "#3182bd"),
        ("loaded p99", [r["latency"].get("realtime", {}).get("p99") for r in mixed], "#08519c"),
    ]
    for k, (name, values, color) in enumerate(series):
        xs = [i + (k - 1.5) * width for i in range(len(labels))]
        ax.bar(xs, [_value(v) * 1e3 for v in values], width, label=name, color=color)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("realtime stream latency, ms (log)")
    ax.set_title("Realtime latency under saturating bulk vs idle server")
    ax.legend(fontsize=8)
    if any(r["extra"].get("censored") for r in mixed):
        ax.text(
            0.99,
            0.02,
            "loaded values of clients with unfinished calls are lower bounds",
            transform=ax.transAxes,
            ha="right",
            fontsize=8,
            color="#555555",
        )
    return True


def _plot_cpu(figure: Any, report: Mapping[str, Any]) -> bool:
    bulk = runs_of(report, "bulk")
    overhead = [s for s in summaries_of(report) if s.scenario == "overhead"]
    if not bulk and not overhead:
        return False
    left, right = figure.subplots(1, 2)
    panels: tuple[tuple[Any, list[str], list[float], str], ...] = (
        (
            left,
            [r["label"] for r in bulk],
            [_value(r["cpu_us_per_prompt"]) for r in bulk],
            "bulk",
        ),
        (
            right,
            [s.label for s in overhead],
            [s.cpu_us_per_prompt for s in overhead],
            "zero-latency server (median)",
        ),
    )
    for ax, labels, values, title in panels:
        if labels:
            _bars(ax, labels, values, "{:,.1f}")
            ax.set_yscale("log")
            ax.set_ylabel("client CPU µs per prompt (log)")
            ax.set_title(f"Client CPU: {title}")
    if overhead:
        right.axhline(CPU_US, color="#c0392b", linestyle="--", linewidth=1, label="20 µs target")
        right.legend(fontsize=8)
    return True


def _plot_burst(figure: Any, report: Mapping[str, Any]) -> bool:
    burst = runs_of(report, "burst")
    if not burst:
        return False
    left, right = figure.subplots(1, 2)
    labels = [r["label"] for r in burst]
    _bars(left, labels, [_value(r["peak_rss_mb"]) for r in burst])
    left.axhline(BURST_RSS_MB, color="#c0392b", linestyle="--", linewidth=1, label="300 MB target")
    left.legend(fontsize=8)
    left.set_ylabel("peak RSS, MB")
    left.set_title(f"Burst of {burst[0]['requested']:,}: memory")
    _bars(right, labels, [_value(r["wall_s"]) for r in burst], "{:,.1f}")
    right.set_ylabel("seconds to finish (or give up)")
    right.set_title("Burst: time")
    return True
