"""Turns a bench report (the JSON dict) into tables and PNG plots.

Tables are Markdown pipe tables: readable on a terminal and pasted as they are into
docs/benchmarks.md. Plots need matplotlib (the ``plots`` extra) and are skipped
with a note without it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmbatch._bench.targets import BURST_RSS_MB, CPU_US

__all__ = ["render", "write_json", "write_plots"]

Run = Mapping[str, Any]


def write_json(report: Mapping[str, Any], path: Path) -> None:
    """The report as indented JSON (``nan`` already mapped to ``null``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")


def _runs(report: Mapping[str, Any], scenario: str) -> list[Run]:
    return [r for r in report["runs"] if r["scenario"] == scenario]


def _num(value: float | None, digits: int = 0, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:,.{digits}f}"


def _ms(run: Run | None, tier: str, key: str, which: str = "latency") -> str:
    if run is None:
        return "-"
    p = run[which].get(tier)
    return _num(p[key] if p else None, 1, 1e3)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown pipe table, padded for the terminal; text columns left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    left = [i == 0 or h in _TEXT_COLUMNS for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.ljust(w) if flush else c.rjust(w)
            for c, w, flush in zip(cells, widths, left, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = "".join(
        f"|{'-' * (w + 1)}{'-' if flush else ':'}" for w, flush in zip(widths, left, strict=True)
    )
    return "\n".join([line(headers), rule + "|", *(line(r) for r in rows)])


_TEXT_COLUMNS = frozenset({"detail", "errors", "verdict"})


def _capacity(report: Mapping[str, Any]) -> Run | None:
    sweep = [r for r in _runs(report, "sweep") if r["ok"]]
    return max(sweep, key=lambda r: r["prompts_per_s"] or 0.0, default=None)


def render(report: Mapping[str, Any]) -> str:
    """Every scenario's table, then the targets."""
    sections = [
        _sweep(report),
        _bulk(report),
        _mixed(report),
        _burst(report),
        _overhead(report),
        _targets(report),
    ]
    return "\n\n".join(s for s in sections if s)


def _section(title: str, table: str) -> str:
    return f"### {title}\n\n{table}"


def _sweep(report: Mapping[str, Any]) -> str:
    runs = _runs(report, "sweep")
    if not runs:
        return ""
    best = _capacity(report)
    rows = [
        [
            r["label"] + (" (best)" if r is best else ""),
            _num(r["prompts_per_s"]),
            _num(r["output_tokens_per_s"]),
            _num(r["extra"].get("server_running_mean"), 1),
            _num(r["latency"].get("batch", {}).get("p50"), 0, 1e3),
            str(r["failed"]),
        ]
        for r in runs
    ]
    headers = ["probe", "prompts/s", "tokens/s", "server running", "p50 ms", "failed"]
    return _section("Capacity sweep (lean probe client)", _table(headers, rows))


def _bulk(report: Mapping[str, Any]) -> str:
    runs = _runs(report, "bulk")
    if not runs:
        return ""
    best = _capacity(report)
    cap = best["prompts_per_s"] if best else None
    rows = [
        [
            r["label"],
            f"{r['ok']}/{r['requested']}",
            _num(r["prompts_per_s"]),
            _num(r["output_tokens_per_s"]),
            _num(r["prompts_per_s"] / cap * 100, 1) + " %" if cap else "-",
            _num(r["cpu_us_per_prompt"], 1),
            _ms(r, "batch", "p50"),
            _ms(r, "batch", "p99"),
            _num(r["peak_rss_mb"]),
            _num(r["extra"].get("server_running_mean"), 1),
        ]
        for r in runs
    ]
    headers = [
        "client",
        "ok",
        "prompts/s",
        "tokens/s",
        "of capacity",
        "CPU µs/prompt",
        "p50 ms",
        "p99 ms",
        "peak RSS MB",
        "server running",
    ]
    return _section("Bulk", _table(headers, rows))


def _mixed(report: Mapping[str, Any]) -> str:
    runs = _runs(report, "mixed")
    if not runs:
        return ""
    idle = {r["label"]: r for r in _runs(report, "idle")}
    rows = []
    for r in runs:
        base = idle.get(r["label"])
        loaded_p99 = r["latency"].get("realtime", {}).get("p99")
        idle_p99 = base["latency"].get("realtime", {}).get("p99") if base else None
        ratio = loaded_p99 / idle_p99 if loaded_p99 and idle_p99 else None
        censored = r["extra"].get("censored", {}).get("realtime", 0)
        rows.append(
            [
                r["label"],
                _num(r["prompts_per_s"]),
                _ms(r, "realtime", "p50"),
                _ms(r, "realtime", "p95"),
                ("≥ " if censored else "") + _ms(r, "realtime", "p99"),
                _ms(base, "realtime", "p99"),
                ("≥ " if censored else "") + _num(ratio, 2) + "x",
                _ms(r, "realtime", "p99", "ttft"),
                _ms(base, "realtime", "p99", "ttft"),
                f"{censored}/{r['requested']}",
            ]
        )
    headers = [
        "client",
        "bulk prompts/s",
        "rt p50 ms",
        "rt p95 ms",
        "rt p99 ms",
        "idle p99 ms",
        "p99 ratio",
        "TTFT p99 ms",
        "idle TTFT p99 ms",
        "unfinished",
    ]
    return _section("Mixed: realtime streams under saturating bulk", _table(headers, rows))


def _burst(report: Mapping[str, Any]) -> str:
    runs = _runs(report, "burst")
    if not runs:
        return ""
    rows = [
        [
            r["label"],
            str(r["ok"]),
            str(r["failed"]),
            str(r["unfinished"]),
            _num(r["wall_s"], 1),
            _num(r["prompts_per_s"]),
            _num(r["cpu_us_per_prompt"], 1),
            _num(r["peak_rss_mb"]),
            ", ".join(f"{k}: {v}" for k, v in list(r["errors"].items())[:3]) or "-",
        ]
        for r in runs
    ]
    headers = [
        "client",
        "ok",
        "failed",
        "unfinished",
        "wall s",
        "prompts/s",
        "CPU µs/prompt",
        "peak RSS MB",
        "errors",
    ]
    return _section(f"Burst: {runs[0]['requested']:,} requests at once", _table(headers, rows))


def _overhead(report: Mapping[str, Any]) -> str:
    runs = _runs(report, "overhead")
    if not runs:
        return ""
    ours = next((r for r in runs if r["label"] == "llmbatch"), None)
    rows = [
        [
            r["label"],
            str(r["ok"]),
            _num(r["cpu_us_per_prompt"] / 1e3 if r["cpu_us_per_prompt"] else None, 3),
            _num(r["prompts_per_s"]),
            _num(r["cpu_us_per_prompt"] / ours["cpu_us_per_prompt"], 1) + "x"
            if ours and ours["cpu_us_per_prompt"] and r["cpu_us_per_prompt"]
            else "-",
        ]
        for r in runs
    ]
    headers = ["client", "ok", "CPU s / 1,000 prompts", "prompts/s", "vs llmbatch"]
    return _section("Overhead: zero-latency server", _table(headers, rows))


def _targets(report: Mapping[str, Any]) -> str:
    marks = {True: "met", False: "MISSED", None: "not measured"}
    rows = [
        [t["id"], _num(t["value"], 2), _num(t["threshold"], 2), marks[t["met"]], t["detail"]]
        for t in report["targets"]
    ]
    return _section("Targets", _table(["target", "value", "threshold", "verdict", "detail"], rows))


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
    plots: list[tuple[str, Callable[[Any, Mapping[str, Any]], bool]]] = [
        ("bench-throughput.png", _plot_throughput),
        ("bench-realtime.png", _plot_realtime),
        ("bench-cpu.png", _plot_cpu),
        ("bench-burst.png", _plot_burst),
    ]
    for name, draw in plots:
        figure = plt.figure(figsize=(9, 4.2), dpi=110)
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
    bulk, sweep = _runs(report, "bulk"), _runs(report, "sweep")
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
        best = _capacity(report)
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
    mixed = _runs(report, "mixed")
    if not mixed:
        return False
    idle = {r["label"]: r for r in _runs(report, "idle")}
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
    bulk, overhead = _runs(report, "bulk"), _runs(report, "overhead")
    if not bulk and not overhead:
        return False
    axes = figure.subplots(1, 2)
    for ax, runs, title in ((axes[0], bulk, "bulk"), (axes[1], overhead, "zero-latency server")):
        if runs:
            _bars(ax, [r["label"] for r in runs], [_value(r["cpu_us_per_prompt"]) for r in runs])
            ax.set_yscale("log")
            ax.set_ylabel("client CPU µs per prompt (log)")
            ax.set_title(f"Client CPU: {title}")
    if bulk:
        axes[0].axhline(CPU_US, color="#c0392b", linestyle="--", linewidth=1, label="20 µs target")
        axes[0].set_ylim(bottom=CPU_US / 2)
        axes[0].legend(fontsize=8)
    return True


def _plot_burst(figure: Any, report: Mapping[str, Any]) -> bool:
    burst = _runs(report, "burst")
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
