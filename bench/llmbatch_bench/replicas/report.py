"""The replicas scenario's tables: throughput against one replica, prefix-heavy work
against round-robin, failover, and the SLO across replicas.

Per-replica columns list the replicas in order, separated by ``/``. Every table
carries "step vs model": each replica's real mean step (its inter-token latency)
over the simulator's step model at the running counts sampled, the worst replica
shown; about 1 means this machine kept every simulator on its model. "other load
cores" is what the machine's CPUs did beyond the client and the simulators (the
machine is shared).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmbatch_bench.closedloop.targets import lost, tpot_p99
from llmbatch_bench.replicas import plan as replicaplan
from llmbatch_bench.replicas.targets import balance, find, hit_rate, running_means
from llmbatch_bench.tables import num, section, table

__all__ = ["sections"]

Run = Mapping[str, Any]


def sections(report: Mapping[str, Any]) -> list[str]:
    runs = [r for r in report["runs"] if r["scenario"] == "replicas"]
    if not runs:
        return []
    out = [_throughput(runs), _prefix(runs), _failover(runs), _slo(runs)]
    return [s for s in out if s]


def _each(run: Run, key: str, fmt: Callable[[Any], str]) -> str:
    return " / ".join(fmt(p.get(key)) for p in run["extra"].get("per_replica", []))


#: What the machine did meanwhile: the simulators' CPU, and other work (shared machine).
_MACHINE = ("simulators CPU s", "other load cores")


def _machine(run: Run) -> list[str]:
    extra = run["extra"]
    return [num(extra.get("server_cpu_s"), 1), num(extra.get("other_load_cores"), 2)]


def _worst_step(run: Run) -> str:
    ratios = [p.get("step_vs_model") for p in run["extra"].get("per_replica", [])]
    known = [x for x in ratios if x is not None]
    return num(max(known), 2, suffix="x") if known else "-"


def _ms(run: Run, which: str, tier: str, q: str, digits: int = 0) -> str:
    p = run.get(which, {}).get(tier)
    return num(p.get(q) if p else None, digits, 1e3)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f} %"


def _throughput(runs: Sequence[Run]) -> str:
    rows_runs = [r for r in (find(runs, replicaplan.ONE), find(runs, replicaplan.FLEET)) if r]
    if not rows_runs:
        return ""
    base = rows_runs[0]["prompts_per_s"] if rows_runs[0]["label"] == replicaplan.ONE else None
    rows = [
        [
            r["label"],
            str(r["extra"].get("replicas")),
            f"{r['ok']:,}/{r['requested']:,}",
            num(r["prompts_per_s"], 1),
            num(r["output_tokens_per_s"]),
            num(r["prompts_per_s"] / base, 2, suffix="x") if base else "-",
            " / ".join(num(m, 1) for m in running_means(r)),
            num(balance(r), 2, suffix="x"),
            _ms(r, "latency", "batch", "p50"),
            _ms(r, "latency", "batch", "p99"),
            num(r["cpu_s"], 2),
            *_machine(r),
            _worst_step(r),
            num(r["wall_s"], 1),
        ]
        for r in rows_runs
    ]
    headers = [
        "run",
        "replicas",
        "ok",
        "prompts/s",
        "tokens/s",
        "vs 1 replica",
        "mean running per replica",
        "busiest / idlest",
        "p50 ms",
        "p99 ms",
        "client CPU s",
        *_MACHINE,
        "step vs model",
        "wall s",
    ]
    first = rows_runs[0]
    tokens = first["output_tokens_per_s"] / first["prompts_per_s"] if first["prompts_per_s"] else 0
    note = (
        f"The same bulk map ({tokens:.0f} tokens a prompt) through one llmbatch.Client with the "
        "library's defaults, the prompts per replica the same in both runs; prompts/s "
        "over the map's time. Running counts are each replica's "
        "vllm:num_requests_running, read every 0.2 s."
    )
    return section("Replicas: throughput, one replica vs all", table(headers, rows), note)


def _prefix(runs: Sequence[Run]) -> str:
    found = [find(runs, replicaplan.PREFIX_OURS), find(runs, replicaplan.PREFIX_ROUND_ROBIN)]
    rows_runs = [r for r in found if r]
    if not rows_runs:
        return ""
    base = found[1]["prompts_per_s"] if found[1] else None
    rows = []
    for r in rows_runs:
        extra = r["extra"]
        censored = extra.get("censored", {}).get("realtime", 0)
        rows.append(
            [
                r["label"],
                f"{extra.get('bulk_ok', 0):,}/{r['requested'] - extra.get('streams', 0):,}",
                num(r["prompts_per_s"], 1),
                num(r["output_tokens_per_s"]),
                num(r["prompts_per_s"] / base, 2, suffix="x") if base else "-",
                _ms(r, "latency", "batch", "p50"),
                _ms(r, "latency", "batch", "p99"),
                f"{extra.get('streams', 0)} ({censored} late)",
                _ms(r, "ttft", "realtime", "p50"),
                _ms(r, "ttft", "realtime", "p99"),
                num(extra.get("server_ttft_p50_s"), 0, 1e3),
                num(extra.get("server_ttft_p99_s"), 0, 1e3),
                _pct(hit_rate(r)),
                _each(r, "hit_rate", _pct),
                " / ".join(num(m, 0) for m in running_means(r)),
                _each(r, "waiting_mean", lambda x: num(x, 0)),
                _each(r, "kv_usage_mean", _pct),
                *_machine(r),
                _worst_step(r),
            ]
        )
    headers = [
        "routing",
        "ok",
        "prompts/s",
        "tokens/s",
        "vs round-robin",
        "p50 ms",
        "p99 ms",
        "streams",
        "stream TTFT p50 ms",
        "stream TTFT p99 ms",
        "server TTFT p50 ms",
        "server TTFT p99 ms",
        "hit rate",
        "hit rate per replica",
        "mean running per replica",
        "mean waiting per replica",
        "KV usage per replica",
        *_MACHINE,
        "step vs model",
    ]
    note = _prefix_note(rows_runs[0])
    return section(
        "Replicas: prefix-heavy work, llmbatch vs round-robin", table(headers, rows), note
    )


def _prefix_note(run: Run) -> str:
    s = run["extra"].get("sizing") or {}
    if not s:
        return ""
    return (
        f"Each prompt: one of the shared system prompts ({s['prefix_tokens']:,} tokens), "
        f"then a short question of its own ({s['prompt_tokens']:,} tokens in all). Each "
        f"replica's KV cache: {s['kv_tokens']:,} tokens = a full batch's own blocks "
        f"({s['batch_tokens']:,}) + room for {s['prefix_room_tokens']:,} tokens of "
        f"prefixes; all of them take {s['all_prefixes_tokens']:,} "
        f"({s['prefixes_over_room']:.1f}x that room). Hit rate = prefix-cache hits / "
        "queries, in tokens, over the job. p50/p99 = the map's latency (from map taking "
        "the prompt to its answer); stream TTFT = streamed realtime requests of the same "
        "kind sent beside the map (Poisson); server TTFT = every request's, from the "
        "servers' vllm:time_to_first_token_seconds histograms (interpolated in buckets)."
    )


def _failover(runs: Sequence[Run]) -> str:
    r = find(runs, replicaplan.FAILOVER)
    if r is None:
        return ""
    e = r["extra"]
    row = [
        r["label"],
        f"{r['ok']:,}/{r['requested']:,}",
        str(r["failed"]),
        str(e.get("missing")),
        str(e.get("duplicates")),
        str(lost(r)),
        num(r["prompts_per_s"], 1),
        num(e.get("killed_at"), 1),
        num(e.get("handback_s"), 2),
        num(e.get("before_total"), 0),
        num(e.get("level"), 0),
        num(e.get("absorb_s"), 2),
        " ".join(str(x) for x in e.get("per_second") or []),
        " / ".join(num(m, 0) for m in running_means(r)),
        *_machine(r),
        _worst_step(r),
        num(r["wall_s"], 1),
    ]
    headers = [
        "run",
        "ok",
        "failed",
        "missing",
        "duplicated",
        "lost",
        "prompts/s",
        "killed at s",
        "failed over after s",
        "running before",
        "level",
        "absorbed after s",
        "results per second (5 s before the kill to 10 s after)",
        "mean running per replica",
        *_MACHINE,
        "step vs model",
        "wall s",
    ]
    note = (
        f"Replica {e.get('killed')} (counting from 0) is killed (SIGKILL) once half the "
        "results are in. 'failed over after' = the client holds nothing in flight there "
        "and its breaker is open; 'running before' = the whole fleet's mean running in "
        "the 3 s before the kill; 'level' = 90 % of that, or of what the others can run "
        "(max_num_seqs each) if less; 'absorbed after' = from the kill to the first "
        "reading in which the others together run that level."
    )
    return section("Replicas: a replica killed mid-map", table(headers, [row]), note)


def _slo(runs: Sequence[Run]) -> str:
    r = find(runs, replicaplan.SLO)
    if r is None:
        return ""
    e = r["extra"]
    censored = e.get("censored", {}).get("realtime", 0)
    fleet_bound = e.get("fleet_bound_tokens_per_s")
    p99 = tpot_p99(r)
    row = [
        r["label"],
        num(r["output_tokens_per_s"]),
        num(r["prompts_per_s"], 1),
        num(r["output_tokens_per_s"] / fleet_bound * 100, 1) + " %" if fleet_bound else "-",
        _ms(r, "tpot", "realtime", "p50", 2),
        ("≥ " if censored else "") + num(p99, 2, 1e3),
        num(e.get("slo_tpot_s"), 2, 1e3),
        _ms(r, "ttft", "realtime", "p50", 1),
        _ms(r, "ttft", "realtime", "p99", 1),
        f"{censored}/{r['requested']}",
        " / ".join(num(m, 1) for m in running_means(r)),
        *_machine(r),
        _worst_step(r),
    ]
    headers = [
        "client",
        "bulk tokens/s",
        "bulk prompts/s",
        "of bound",
        "rt TPOT p50 ms",
        "rt TPOT p99 ms",
        "SLO ms",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "rt unfinished",
        "mean running per replica",
        *_MACHINE,
        "step vs model",
    ]
    note = (
        "As the slo scenario, over every replica: realtime streams (Poisson, 20/s per "
        "replica) beside a saturating bulk map, SLO(tpot = 3x the idle per-token time); "
        "the bound is the step model's best under the SLO, times the replicas. Bulk "
        "counts the realtime window only."
    )
    return section("Replicas: the SLO across replicas", table(headers, [row]), note)
