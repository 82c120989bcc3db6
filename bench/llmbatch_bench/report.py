"""Turns a bench report (the JSON dict) into tables and a JSON file.

Tables are Markdown pipe tables: readable on a terminal and pasted as they are into
docs/benchmarks.md. Plots live in :mod:`llmbatch_bench.plots`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["capacity_run", "render", "runs_of", "write_json"]

Run = Mapping[str, Any]


def write_json(report: Mapping[str, Any], path: Path) -> None:
    """The report as indented JSON (``nan`` already mapped to ``null``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")


def runs_of(report: Mapping[str, Any], scenario: str) -> list[Run]:
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


def capacity_run(report: Mapping[str, Any]) -> Run | None:
    sweep = [r for r in runs_of(report, "sweep") if r["ok"]]
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
    runs = runs_of(report, "sweep")
    if not runs:
        return ""
    best = capacity_run(report)
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
    runs = runs_of(report, "bulk")
    if not runs:
        return ""
    best = capacity_run(report)
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
    runs = runs_of(report, "mixed")
    if not runs:
        return ""
    idle = {r["label"]: r for r in runs_of(report, "idle")}
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
    runs = runs_of(report, "burst")
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
    runs = runs_of(report, "overhead")
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
