"""Turns a bench report (the JSON dict) into tables and a JSON file.

Sections for the server scenarios (sweep, bulk, mixed) and the targets are here;
the closed-loop scenarios' sections are in :mod:`.closedloop.report`, the replicas
scenario's in :mod:`.replicas.report`, the hot-path
scenarios' in :mod:`.hotpath.report`, plots in :mod:`.plots`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmbatch_bench.closedloop import report as report_closed
from llmbatch_bench.hotpath import report as report_hot
from llmbatch_bench.replicas import report as report_replicas
from llmbatch_bench.tables import num, section, server_cpu_per_prompt, table

__all__ = ["capacity_run", "render", "runs_of", "write_json"]

Run = Mapping[str, Any]


def write_json(report: Mapping[str, Any], path: Path) -> None:
    """The report as indented JSON (``nan`` already mapped to ``null``); a list of
    plain values (a time series' row, an exchange) stays on one line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dumps(report, "") + "\n")


def _dumps(value: Any, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, Mapping) and value:
        items = (f"{inner}{json.dumps(str(k))}: {_dumps(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list | tuple) and value:
        if not any(isinstance(v, Mapping | list | tuple) for v in value):
            return json.dumps(list(value), allow_nan=False)
        return "[\n" + ",\n".join(inner + _dumps(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value, allow_nan=False)


def runs_of(report: Mapping[str, Any], scenario: str) -> list[Run]:
    return [r for r in report["runs"] if r["scenario"] == scenario]


def _ms(run: Run | None, tier: str, key: str, which: str = "latency") -> str:
    if run is None:
        return "-"
    p = run[which].get(tier)
    return num(p[key] if p else None, 1, 1e3)


def capacity_run(report: Mapping[str, Any]) -> Run | None:
    sweep = [r for r in runs_of(report, "sweep") if r["ok"]]
    return max(sweep, key=lambda r: r["prompts_per_s"] or 0.0, default=None)


def render(report: Mapping[str, Any]) -> str:
    """Every scenario's table, then the targets."""
    sections = [
        _sweep(report),
        _bulk(report),
        _ceiling(report),
        _bulk(report, "bulk-chat"),
        _mixed(report),
        *report_closed.sections(report),
        *report_replicas.sections(report),
        _hosted(report),
        *report_hot.sections(report),
        _targets(report),
    ]
    return "\n\n".join(s for s in sections if s)


def _sweep(report: Mapping[str, Any]) -> str:
    runs = runs_of(report, "sweep")
    if not runs:
        return ""
    best = capacity_run(report)
    rows = [
        [
            r["label"] + (" (best)" if r is best else ""),
            num(r["prompts_per_s"]),
            num(r["output_tokens_per_s"]),
            num(r["extra"].get("server_running_mean"), 1),
            num(r["latency"].get("batch", {}).get("p50"), 0, 1e3),
            str(r["failed"]),
        ]
        for r in runs
    ]
    headers = ["probe", "prompts/s", "tokens/s", "server running", "p50 ms", "failed"]
    return section("Capacity sweep (lean probe client)", table(headers, rows))


def _bulk(report: Mapping[str, Any], scenario: str = "bulk") -> str:
    runs = runs_of(report, scenario)
    if not runs:
        return ""
    best = capacity_run(report)
    cap = best["prompts_per_s"] if best else None
    rows = [
        [
            _labelled(r, runs),
            f"{r['ok']}/{r['requested']}",
            num(r["prompts_per_s"]),
            num(r["output_tokens_per_s"]),
            num(r["prompts_per_s"] / cap * 100, 1) + " %" if cap else "-",
            num(r["cpu_us_per_prompt"], 1),
            _ms(r, "batch", "p50"),
            _ms(r, "batch", "p99"),
            num(r["peak_rss_mb"]),
            num(r["extra"].get("server_running_mean"), 1),
            server_cpu_per_prompt(r),
            server_cpu_per_prompt(r, "engine_cpu_s"),
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
        "server CPU µs/prompt",
        "engine CPU µs/prompt",
    ]
    note = (
        "'CPU µs/prompt' is the client's; 'server CPU' the simulator's process when the "
        "bench started it, vLLM's API server process with --vllm, or (with --url) the "
        "API server's own process_cpu_seconds_total from its /metrics; 'engine CPU' "
        "vLLM's engine core and workers with --vllm ('-' where not measured)."
    )
    if scenario == "bulk-chat":
        note = (
            "The same prompts as one-message conversations: llmbatch's map (the chat "
            "batch route, one request per batch, where the server serves it) against "
            "one chat.completions.create per conversation. " + note
        )
    title = "Bulk" if scenario == "bulk" else "Bulk chat"
    return section(title, table(headers, rows), note) + _medians(runs)


def _ceiling(report: Mapping[str, Any]) -> str:
    """Each client as a share of vLLM's offline run (the first row), with the CPU
    each process spent a prompt: the client's, the API server's, the engine's."""
    offline = report.get("ceiling")
    runs = runs_of(report, "ceiling")
    if not offline:
        return ""
    rows = [
        [
            "vLLM LLM.generate (offline)",
            f"{offline['prompts']}/{offline['prompts']}",
            num(offline["prompts_per_s"]),
            num(offline["output_tokens_per_s"]),
            "1.00x",
            "-",
            num(offline.get("front_cpu_s", math.nan) / offline["prompts"] * 1e6, 0),
            num(offline.get("engine_cpu_s", math.nan) / offline["prompts"] * 1e6, 0),
        ]
    ]
    for r in runs:
        share = r["prompts_per_s"] / offline["prompts_per_s"]
        rows.append(
            [
                _labelled(r, runs),
                f"{r['ok']}/{r['requested']}",
                num(r["prompts_per_s"]),
                num(r["output_tokens_per_s"]),
                f"{share:.2f}x",
                num(r["cpu_us_per_prompt"], 1),
                server_cpu_per_prompt(r),
                server_cpu_per_prompt(r, "engine_cpu_s"),
            ]
        )
    headers = [
        "client",
        "ok",
        "prompts/s",
        "tokens/s",
        "of the ceiling",
        "client CPU µs/prompt",
        "API server CPU µs/prompt",
        "engine CPU µs/prompt",
    ]
    note = (
        f"The ceiling: vLLM's offline LLM.generate of {offline['prompts']} "
        f"{offline.get('prompt_shape', '')} prompts with the engine flags vllm serve got "
        "(measured before the server started), then each client over HTTP on prompts of "
        "its own. For the offline row, 'API server' is the LLM's own process "
        "(scheduling, detokenizing) and 'engine' its engine core."
    )
    medians = _medians(runs, offline["prompts_per_s"])
    return section("The engine's ceiling", table(headers, rows), note) + medians


def _labelled(run: Run, runs: list[Run]) -> str:
    """A run's label, with its round where its client ran more than once."""
    label = run["label"]
    if sum(1 for r in runs if r["label"] == label) < 2:
        return str(label)
    return f"{label} (round {run['extra'].get('round', '?')})"


def _hosted(report: Mapping[str, Any]) -> str:
    """llmbatch beside AsyncOpenAI against the limiter: 429s, conversations lost, the
    rate after the first 10 s against the binding limit."""
    results = report.get("hosted")
    if not results:
        return ""
    names = {"llmbatch": "llmbatch (no RateLimit)", "asyncopenai": "AsyncOpenAI (8 retries, 64)"}
    rows = []
    for name, r in results.items():
        rows.append(
            [
                names.get(name, name),
                f"{r['answered']:,}/{r['conversations']:,}",
                f"{r['http_requests']:,}",
                f"{r['http_429']:,} ({100 * r['share_429']:.1f} %)",
                f"{r['http_429_first_second']:,}",
                num(r["steady_per_s"]),
                "-" if r["steady_share"] is None else f"{r['steady_share']:.3f}x",
                num(r["wall_s"], 1),
            ]
        )
    headers = [
        "client",
        "answered",
        "HTTP requests",
        "429s",
        "429s in the first second",
        "conversations/s after 10 s",
        "vs the binding limit",
        "wall s",
    ]
    any_result = next(iter(results.values()))
    note = (
        f"A chat map (max_tokens 16) against `llmbatch-server sim {any_result['simulator']}`, "
        f"each client against a fresh limiter; the binding limit is "
        f"{any_result['binding_per_s']} conversations a second (requests, or tokens as the "
        "provider counts them)."
    )
    return section("Hosted endpoints: a provider's limiter", table(headers, rows), note)


def _medians(runs: list[Run], ceiling: float | None = None) -> str:
    """Each client's median over its interleaved rounds, beside the best other
    client's median (and the offline ceiling, where there is one); nothing when each
    ran once."""
    by_label: dict[str, list[float]] = {}
    for r in runs:
        by_label.setdefault(str(r["label"]), []).append(float(r["prompts_per_s"]))
    if all(len(rates) < 2 for rates in by_label.values()):
        return ""
    medians = {label: statistics.median(rates) for label, rates in by_label.items()}
    rows = []
    for label, rates in by_label.items():
        others = [m for other, m in medians.items() if other != label]
        best_other = max(others, default=math.nan)
        rows.append(
            [
                label,
                str(len(rates)),
                num(medians[label]),
                f"{num(min(rates))} to {num(max(rates))}",
                f"{medians[label] / best_other:.2f}x" if others and best_other else "-",
                f"{medians[label] / ceiling:.2f}x" if ceiling else "-",
            ]
        )
    headers = ["client", "rounds", "median prompts/s", "range", "vs best other", "of the ceiling"]
    note = (
        "Medians over interleaved rounds (each client once a round, on prompts of its "
        "own); the targets judge these. 'vs best other': this client's median over the "
        "best median of the others."
    )
    return "\n\n" + section("Medians over rounds", table(headers, rows), note)


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
                num(r["prompts_per_s"]),
                _ms(r, "realtime", "p50"),
                _ms(r, "realtime", "p95"),
                ("≥ " if censored else "") + _ms(r, "realtime", "p99"),
                _ms(base, "realtime", "p99"),
                ("≥ " if censored else "") + num(ratio, 2) + "x",
                _ms(r, "realtime", "p99", "ttft"),
                _ms(base, "realtime", "p99", "ttft"),
                f"{censored}/{r['requested']}",
                server_cpu_per_prompt(r),
                server_cpu_per_prompt(r, "engine_cpu_s"),
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
        "server CPU µs/prompt",
        "engine CPU µs/prompt",
    ]
    note = "Server and engine CPU per answered prompt, as in the bulk table."
    return section("Mixed: realtime streams under saturating bulk", table(headers, rows), note)


def _targets(report: Mapping[str, Any]) -> str:
    marks = {True: "met", False: "MISSED", None: "not measured"}
    ops = {"<=": "≤", ">=": "≥", "<": "<", "==": "="}
    rows = []
    for t in report["targets"]:
        unit = t.get("unit", "")
        suffix = unit if unit == "x" else f" {unit}"
        digits = 0 if unit in ("calls", "MB", "prompts") else (1 if unit == "µs" else 2)
        op = ops.get(t.get("op", ""), t.get("op", ""))
        rows.append(
            [
                t["id"],
                num(t["value"], digits, suffix=suffix),
                f"{op} {num(t['threshold'], digits)}{suffix}",
                marks[t["met"]],
                t["detail"],
            ]
        )
    if not rows:
        return section("Targets", "None of this run's scenarios measures a target.")
    headers = ["target", "this run", "threshold", "verdict", "detail"]
    return section("Targets", table(headers, rows))
