"""The replicas targets, judged from one bench run's runs in their JSON
form, so the report computes its columns with the same functions.

- ``replicas_throughput``: the same bulk ``map`` through one client over every
  replica ≥ 3.6x its prompts/s against one replica (four replicas);
- ``replicas_balance``: under that uniform load, the busiest replica's mean running
  count ≤ 1.5x the idlest's (``vllm:num_requests_running``, sampled);
- ``replicas_prefix_throughput``: prefix-heavy work through llmbatch ≥ 1.3x the
  same work dealt round-robin to a client per replica;
- ``replicas_prefix_ttft``: the streamed sample's TTFT p99 beside that work lower
  through llmbatch than round-robin (ratio < 1);
- ``replicas_failover_results``: with a replica killed mid-map, every input exactly
  one successful result;
- ``replicas_failover_absorb``: the others run its share within 1 s
  (:func:`~.fleetmetrics.absorbed`);
- ``replicas_slo_tpot_p99``: realtime TPOT p99 within the SLO across the replicas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch_bench.closedloop.targets import lost, tpot_p99
from llmbatch_bench.replicas import plan as replicaplan
from llmbatch_bench.targets import Target, judge

__all__ = [
    "BALANCE_RATIO",
    "FAILOVER_ABSORB_S",
    "PREFIX_RATIO",
    "PREFIX_TTFT_RATIO",
    "THROUGHPUT_RATIO",
    "balance",
    "evaluate_replicas",
    "find",
    "hit_rate",
    "running_means",
    "stream_ttft_p99",
]

THROUGHPUT_RATIO = 3.6
BALANCE_RATIO = 1.5
PREFIX_RATIO = 1.3
#: llmbatch's streamed TTFT p99 / round-robin's: below 1 (lower than round-robin).
PREFIX_TTFT_RATIO = 1.0
FAILOVER_ABSORB_S = 1.0

Run = Mapping[str, Any]


def find(runs: Sequence[Run], label: str) -> Run | None:
    return next((r for r in runs if r["scenario"] == "replicas" and r["label"] == label), None)


def running_means(run: Run) -> list[float | None]:
    """Each replica's mean running count over the job."""
    return [p.get("running_mean") for p in run["extra"].get("per_replica", [])]


def balance(run: Run | None) -> float:
    """The busiest replica's mean running count / the idlest's."""
    means = [m for m in running_means(run) if m is not None] if run else []
    if not means or min(means) <= 0:
        return math.nan
    return max(means) / min(means)


def hit_rate(run: Run) -> float | None:
    """The fleet's prefix-cache hit rate over the job: hits / queries, in tokens."""
    per = run["extra"].get("per_replica", [])
    queries = sum(p.get("prefix_queries") or 0 for p in per)
    hits = sum(p.get("prefix_hits") or 0 for p in per)
    return hits / queries if queries else None


def stream_ttft_p99(run: Run | None) -> float:
    """The streamed sample's TTFT p99 (seconds), ``nan`` if none."""
    p = run.get("ttft", {}).get("realtime") if run else None
    value = p.get("p99") if p else None
    return float(value) if value is not None else math.nan


def _rate(run: Run | None) -> float:
    value = run.get("prompts_per_s") if run else None
    return float(value) if value else math.nan


def _t(
    id: str, description: str, value: float | None, op: str, threshold: float, unit: str,
    detail: str,
) -> Target:  # fmt: skip
    if value is not None and not math.isfinite(value):
        value = None
    return Target(id, description, value, op, threshold, unit, judge(value, op, threshold), detail)


def evaluate_replicas(runs: Sequence[Run]) -> list[Target]:
    """Every replicas target (``met=None`` for what did not run)."""
    return [*_throughput(runs), *_prefix(runs), *_failover(runs), _slo(runs)]


def _throughput(runs: Sequence[Run]) -> list[Target]:
    one, fleet = find(runs, replicaplan.ONE), find(runs, replicaplan.FLEET)
    missing = "needs the replicas scenario"
    count = fleet["extra"].get("replicas") if fleet else None
    ratio = _rate(fleet) / _rate(one) if one and fleet else math.nan
    means = running_means(fleet) if fleet else []
    return [
        _t(
            "replicas_throughput",
            f"bulk map over {count or 'N'} replicas / the same map against one, prompts/s",
            ratio,
            ">=",
            THROUGHPUT_RATIO,
            "x",
            f"{_rate(fleet):,.1f} vs {_rate(one):,.1f} prompts/s" if one and fleet else missing,
        ),
        _t(
            "replicas_balance",
            "uniform load: busiest replica's mean running count / the idlest's",
            balance(fleet),
            "<=",
            BALANCE_RATIO,
            "x",
            "mean running " + " / ".join("-" if m is None else f"{m:.1f}" for m in means)
            if fleet
            else missing,
        ),
    ]


def _prefix(runs: Sequence[Run]) -> list[Target]:
    ours, theirs = find(runs, replicaplan.PREFIX_OURS), find(runs, replicaplan.PREFIX_ROUND_ROBIN)
    missing = "needs the replicas scenario"
    both = ours is not None and theirs is not None
    ratio = _rate(ours) / _rate(theirs) if both else math.nan
    ttft = stream_ttft_p99(ours) / stream_ttft_p99(theirs) if both else math.nan

    def hits(run: Run | None) -> str:
        rate = hit_rate(run) if run else None
        return "-" if rate is None else f"{rate * 100:.1f} %"

    return [
        _t(
            "replicas_prefix_throughput",
            "prefix-heavy work: llmbatch's routing / round-robin over a client per replica",
            ratio,
            ">=",
            PREFIX_RATIO,
            "x",
            f"{_rate(ours):,.1f} vs {_rate(theirs):,.1f} prompts/s; prefix-cache hit rate "
            f"{hits(ours)} vs {hits(theirs)}"
            if both
            else missing,
        ),
        _t(
            "replicas_prefix_ttft",
            "beside that work, streamed requests' TTFT p99: llmbatch / round-robin",
            ttft,
            "<",
            PREFIX_TTFT_RATIO,
            "x",
            f"{stream_ttft_p99(ours) * 1e3:,.0f} vs {stream_ttft_p99(theirs) * 1e3:,.0f} ms"
            if both
            else missing,
        ),
    ]


def _failover(runs: Sequence[Run]) -> list[Target]:
    run = find(runs, replicaplan.FAILOVER)
    extra = run["extra"] if run else {}
    missing = "needs the replicas scenario"
    return [
        _t(
            "replicas_failover_results",
            "a replica killed mid-map: inputs without exactly one successful result",
            float(lost(run)) if run else None,
            "==",
            0,
            "prompts",
            f"{run['ok']:,} ok of {run['requested']:,}; failed {run['failed']}, missing "
            f"{extra.get('missing')}, duplicated {extra.get('duplicates')}"
            if run
            else missing,
        ),
        _t(
            "replicas_failover_absorb",
            "seconds from the kill until the others run 90 % of the fleet's load (or "
            "of what they can run)",
            extra.get("absorb_s"),
            "<=",
            FAILOVER_ABSORB_S,
            "s",
            f"level {extra['level']:.0f} running (before the kill {extra['before_total']:.0f}); "
            f"the client's requests there failed over after {extra.get('handback_s')} s"
            if run and extra.get("level") is not None
            else ("no kill recorded" if run else missing),
        ),
    ]


def _slo(runs: Sequence[Run]) -> Target:
    run = find(runs, replicaplan.SLO)
    slo = run["extra"].get("slo_tpot_s") if run else None
    p99 = tpot_p99(run)
    return _t(
        "replicas_slo_tpot_p99",
        "with SLO(tpot), realtime p99 time per output token beside bulk, all replicas",
        p99 * 1e3 if math.isfinite(p99) else None,
        "<=",
        slo * 1e3 if slo else math.nan,
        "ms",
        f"p99 {p99 * 1e3:.2f} ms vs SLO {slo * 1e3:.2f} ms" if run and slo and math.isfinite(p99)
        else "needs the replicas scenario's SLO job",
    )  # fmt: skip
