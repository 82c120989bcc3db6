"""The hot-path scenarios' tables: overhead, chat, embed, single, burst, dropin,
transport, scale.

Repeated scenarios show one row per label: the median of its rounds
(:mod:`.summary`) and the spread of CPU per prompt, so a reader sees how steady the
number was. Burst and scale run once and show their runs as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch_bench.hotpath import plan as hotplan
from llmbatch_bench.metrics import RunMetrics
from llmbatch_bench.summary import Summary, find_summary, ratio, summarize
from llmbatch_bench.tables import num, section, table

__all__ = ["sections", "summaries_of"]


def summaries_of(report: Mapping[str, Any]) -> list[Summary]:
    """The report's summaries (computed from its runs if it predates them)."""
    if "summaries" in report:
        return [Summary.from_json(s) for s in report["summaries"]]
    return summarize([RunMetrics.from_json(r) for r in report["runs"]])


def sections(report: Mapping[str, Any]) -> list[str]:
    """Each hot-path scenario's section that has runs, in run order."""
    summaries = summaries_of(report)
    runs = [r for r in report["runs"] if r["scenario"] in ("burst", "scale")]
    out = [
        _overhead([s for s in summaries if s.scenario == "overhead"]),
        _chat([s for s in summaries if s.scenario == "chat"]),
        _embed([s for s in summaries if s.scenario == "embed"]),
        _single([s for s in summaries if s.scenario == "single"]),
        _burst([r for r in runs if r["scenario"] == "burst"]),
        _dropin([s for s in summaries if s.scenario == "dropin"]),
        _transport([s for s in summaries if s.scenario == "transport"]),
        _scale([r for r in runs if r["scenario"] == "scale"]),
    ]
    return [s for s in out if s]


def _rounds(rows: Sequence[Summary]) -> str:
    counts = sorted({s.rounds for s in rows})
    return "median of " + "/".join(str(c) for c in counts) + " interleaved rounds"


def _spread(s: Summary) -> str:
    return f"{num(s.cpu_us_min, 1)} to {num(s.cpu_us_max, 1)}"


def _ok(s: Summary) -> str:
    return f"{s.ok:,}/{s.ok + s.failed + s.unfinished:,}"


def _overhead(rows: Sequence[Summary]) -> str:
    if not rows:
        return ""
    ours = find_summary(rows, "overhead", hotplan.MAP)
    probe = find_summary(rows, "overhead", hotplan.PROBE)
    base = ours.cpu_us_per_prompt if ours else float("nan")
    floor = probe.cpu_us_per_prompt if probe else float("nan")
    body = table(
        [
            "client",
            "ok, all rounds",
            "CPU µs/prompt",
            "range",
            "of it GC",
            "prompts/s",
            "vs map",
            "vs probe",
        ],
        [
            [
                s.label,
                _ok(s),
                num(s.cpu_us_per_prompt, 1),
                _spread(s),
                num(s.gc_us_per_prompt, 1),
                num(s.prompts_per_s),
                num(ratio(s.cpu_us_per_prompt, base), 2, suffix="x"),
                num(ratio(s.cpu_us_per_prompt, floor), 2, suffix="x"),
            ]
            for s in rows
        ],
    )
    note = (
        "Client CPU per prompt in steady state (after a warm-up), "
        f'{_rounds(rows)}; "of it GC": the garbage collector\'s part of it. llmbatch '
        "and the probe send the same batches with the same prompts in flight; openai "
        "sends one request per prompt."
    )
    return section("Overhead: client CPU per prompt, zero-latency server", body, note)


def _chat(rows: Sequence[Summary]) -> str:
    if not rows:
        return ""
    plain = find_summary(rows, "chat", hotplan.COMPLETIONS)
    base = plain.cpu_us_per_prompt if plain else float("nan")
    body = table(
        ["client", "ok, all rounds", "CPU µs/prompt", "range", "prompts/s", "vs completions"],
        [
            [
                s.label,
                _ok(s),
                num(s.cpu_us_per_prompt, 1),
                _spread(s),
                num(s.prompts_per_s),
                num(ratio(s.cpu_us_per_prompt, base), 2, suffix="x"),
            ]
            for s in rows
        ],
    )
    return section("Chat: map over conversations vs prompts", body, _rounds(rows) + ".")


def _per_request(s: Summary) -> str:
    """Inputs answered per HTTP request the server counted, in a median round."""
    return num(ratio(s.ok / s.rounds if s.rounds else math.nan, s.server_requests), 1)


def _embed(rows: Sequence[Summary]) -> str:
    if not rows:
        return ""
    plain = find_summary(rows, "embed", hotplan.COMPLETIONS)
    base = plain.cpu_us_per_prompt if plain else math.nan
    body = table(
        [
            "client",
            "ok, all rounds",
            "CPU µs/item",
            "range",
            "items/s",
            "HTTP requests",
            "items/request",
            "vs completions",
        ],
        [
            [
                s.label,
                _ok(s),
                num(s.cpu_us_per_prompt, 1),
                _spread(s),
                num(s.prompts_per_s),
                num(s.server_requests),
                _per_request(s),
                num(ratio(s.cpu_us_per_prompt, base), 2, suffix="x"),
            ]
            for s in rows
        ],
    )
    note = (
        f"The same texts embedded and completed through map, {_rounds(rows)}; every "
        "vector is read, as JSON floats (llmbatch's default) or base64 (openai-python's "
        "default). HTTP requests as the server counted them in a round. openai embeds "
        "one text per request (a tenth of the texts)."
    )
    return section("Embed: map over embeddings vs completions", body, note)


def _dropin(rows: Sequence[Summary]) -> str:
    if not rows:
        return ""
    plain = find_summary(rows, "dropin", hotplan.DROPIN_OPENAI)
    cpu = plain.cpu_us_per_prompt if plain else math.nan
    sent = plain.server_requests if plain else math.nan
    body = table(
        [
            "program's AsyncOpenAI",
            "ok, all rounds",
            "HTTP requests",
            "calls/request",
            "CPU s",
            "CPU µs/call",
            "range",
            "wall s",
            "calls/s",
            "requests: openai / this",
            "CPU: openai / this",
        ],
        [
            [
                s.label,
                _ok(s),
                num(s.server_requests),
                _per_request(s),
                num(s.cpu_s, 2),
                num(s.cpu_us_per_prompt, 0),
                f"{num(s.cpu_us_min, 0)} to {num(s.cpu_us_max, 0)}",
                num(s.wall_s, 2),
                num(s.prompts_per_s),
                num(ratio(sent, s.server_requests), 1, suffix="x"),
                num(ratio(cpu, s.cpu_us_per_prompt), 2, suffix="x"),
            ]
            for s in rows
        ],
    )
    note = (
        "One unmodified program, asyncio.gather over completions.create calls, run with "
        f"each import; {_rounds(rows)}, after a warm-up through the same program. HTTP "
        "requests as the server counted them in a round."
    )
    title = f"Drop-in: {rows[0].per_round:,} concurrent completions.create calls"
    return section(title, body, note)


def _single(rows: Sequence[Summary]) -> str:
    if not rows:
        return ""
    raw = find_summary(rows, "single", hotplan.RAW)

    def added(s: Summary, value: float, reference: float | None) -> str:
        if s is raw or reference is None:
            return "-"
        return num((value - reference) * 1e6, 0)

    body = table(
        [
            "client",
            "ok, all rounds",
            "p50 µs",
            "p99 µs",
            "added p50 µs",
            "added p99 µs",
            "CPU µs/call",
        ],
        [
            [
                s.label,
                _ok(s),
                num(s.p50_s, 0, 1e6),
                num(s.p99_s, 0, 1e6),
                added(s, s.p50_s, raw.p50_s if raw else None),
                added(s, s.p99_s, raw.p99_s if raw else None),
                num(s.cpu_us_per_prompt, 0),
            ]
            for s in rows
        ],
    )
    note = (
        f"One call at a time, max_tokens=1; {_rounds(rows)}. "
        '"added" is over a raw aiohttp request with the same body: a difference of '
        "medians, so at p99 it carries the server's jitter too."
    )
    return section("Single: one complete() at a time", body, note)


def _burst(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return ""
    by_label = {r["label"]: r for r in runs}
    mapped, bare = by_label.get(hotplan.MAP), by_label.get(hotplan.BARE)
    rows = []
    for r in runs:
        share = None
        if bare and r is not bare and r["peak_rss_mb"] and bare["peak_rss_mb"]:
            share = (r["peak_rss_mb"] - bare["peak_rss_mb"]) * 1024 / r["requested"]
        rows.append(
            [
                r["label"],
                f"{r['ok']:,}",
                f"{r['failed']:,}",
                f"{r['unfinished']:,}",
                num(r["wall_s"], 1),
                num(r["cpu_us_per_prompt"], 1),
                num(ratio(r["cpu_us_per_prompt"] or float("nan"), _cpu(mapped)), 2, suffix="x")
                if r is not bare
                else "-",
                num(r["peak_rss_mb"]),
                num(share, 2),
                ", ".join(f"{k}: {v}" for k, v in list(r["errors"].items())[:3]) or "-",
            ]
        )
    headers = [
        "client",
        "ok",
        "failed",
        "unfinished",
        "wall s",
        "CPU µs/prompt",
        "vs map",
        "peak RSS MB",
        "over bare KB/call",
        "errors",
    ]
    note = (
        '"bare gather" is the memory baseline: as many coroutines that only wait, in a '
        "process that opened and warmed up llmbatch the same way; peak RSS is a "
        "high-water mark, so the KB per call is meaningful only when the burst dominates "
        "it (100,000 calls). "
        '"unfinished" = not answered when the time limit stopped the run.'
    )
    title = f"Burst: {runs[0]['requested']:,} calls at once, zero-latency server"
    return section(title, table(headers, rows), note)


def _cpu(run: Mapping[str, Any] | None) -> float:
    value = run["cpu_us_per_prompt"] if run else None
    return float(value) if value is not None else float("nan")


def _transport(rows: Sequence[Summary]) -> str:
    if not rows:
        return ""
    body = table(
        ["transport, prompts/request", "ok, all rounds", "CPU µs/prompt", "range", "prompts/s"],
        [
            [s.label, _ok(s), num(s.cpu_us_per_prompt, 1), _spread(s), num(s.prompts_per_s)]
            for s in rows
        ],
    )
    return section(
        "Transport: llmbatch map per transport and batch size", body, _rounds(rows) + "."
    )


def _scale(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return ""
    body = table(
        [
            "client",
            "ok",
            "failed",
            "unfinished",
            "wall s",
            "prompts/s",
            "CPU µs/prompt",
            "peak RSS MB",
        ],
        [
            [
                r["label"],
                f"{r['ok']:,}",
                f"{r['failed']:,}",
                f"{r['unfinished']:,}",
                num(r["wall_s"], 1),
                num(r["prompts_per_s"]),
                num(r["cpu_us_per_prompt"], 1),
                num(r["peak_rss_mb"]),
            ]
            for r in runs
        ],
    )
    return section(f"Scale: {runs[0]['requested']:,} prompts through map_unordered", body)
