"""The replicas scenario's logic on made-up numbers: the prefix workload and its KV
sizing, what a fleet's /metrics readings add up to, the failover's absorption time,
the targets' verdicts, the report's tables, and the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from llmbatch_bench.cli import build_parser, config_from_args
from llmbatch_bench.closedloop.stepmodel import sim_model
from llmbatch_bench.config import EXTRA_SCENARIOS, SMOKE, BenchConfig
from llmbatch_bench.jobs import prefix_prompts, system_prompt
from llmbatch_bench.replicas import plan as replicaplan
from llmbatch_bench.replicas.fleetmetrics import (
    absorbed,
    histogram_quantile,
    parse_buckets,
    replica_summary,
)
from llmbatch_bench.replicas.targets import evaluate_replicas
from llmbatch_bench.report import render

# -- the prefix workload -----------------------------------------------------------------


def test_prefix_prompts_share_one_of_the_system_prompts_picked_at_random() -> None:
    make = prefix_prompts(400, 8, 4000, seed=0)
    systems = [system_prompt(k, 4000) for k in range(8)]
    assert all(len(s) == 4000 for s in systems)
    # Distinct from the first words on: each one is its own group of hot prompts.
    assert len({s[:256] for s in systems}) == 8
    picked = [next(k for k, s in enumerate(systems) if make(i).startswith(s)) for i in range(400)]
    assert set(picked) == set(range(8))
    # Not in turn: dealt in turn to 4 clients, every client sees every prefix.
    for k in range(4):
        assert set(picked[k::4]) == set(range(8))
    assert len({make(i) for i in range(400)}) == 400  # a question of its own each
    later = prefix_prompts(10, 8, 4000, seed=1, start=1000)
    assert "User 1003:" in later(1003)


def test_the_prefix_kv_cache_holds_a_full_batch_and_a_share_of_the_prefixes() -> None:
    sizing = replicaplan.prefix_sizing(
        prefix_tokens=1100,
        prompt_tokens=1112,
        max_tokens=64,
        prefixes=32,
        replicas=4,
        max_num_seqs=256,
    )
    # 68 full blocks shared; 1112 + 64 - 1088 = 88 own tokens: 6 blocks, plus one.
    assert sizing["private_blocks"] == 7
    assert sizing["batch_tokens"] == 256 * 7 * 16
    # 1.5x the even share of 8 prefixes: 12 prefixes of 68 blocks.
    assert sizing["prefix_room_tokens"] == 12 * 68 * 16
    assert sizing["kv_tokens"] == (12 * 68 + 256 * 7) * 16
    assert sizing["all_prefixes_tokens"] == 32 * 68 * 16
    assert sizing["prefixes_over_room"] == pytest.approx(32 / 12)
    assert sizing["all_prefixes_need"] > sizing["kv_tokens"]


# -- a fleet's readings ------------------------------------------------------------------

METRICS = """\
vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.1"} 50
vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 90
vllm:time_to_first_token_seconds_bucket{model_name="m",le="1.0"} 100
vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 100
vllm:time_to_first_token_seconds_sum{model_name="m"} 12.0
"""


def test_histogram_buckets_and_their_quantiles() -> None:
    buckets = parse_buckets(METRICS, "vllm:time_to_first_token_seconds")
    assert buckets == [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.1)
    # 70th of 100: halfway through the 0.1-0.5 bucket's 40.
    assert histogram_quantile(buckets, 0.7) == pytest.approx(0.3)
    assert histogram_quantile(buckets, 0.99) == pytest.approx(0.95)
    assert histogram_quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5) is None
    # Past the last finite bound: that bound, as Prometheus answers.
    assert histogram_quantile([(0.1, 1.0), (float("inf"), 10.0)], 0.99) == 0.1


def counters(**values: float) -> dict[str, Any]:
    names = {
        "queries": "vllm:prefix_cache_queries_total",
        "hits": "vllm:prefix_cache_hits_total",
        "itl_sum": "vllm:inter_token_latency_seconds_sum",
        "itl_count": "vllm:inter_token_latency_seconds_count",
        "finished": "vllm:request_success_total",
    }
    return {names[k]: v for k, v in values.items()} | {"ttft_buckets": []}


def test_a_replica_summary_is_the_difference_of_its_readings() -> None:
    model = sim_model(["--speed", "10"], 64)
    running = [(0.2 * i, 200.0) for i in range(10)]
    first = counters(queries=1000, hits=0, itl_sum=0.0, itl_count=0, finished=0)
    step = model.step_seconds(200)  # with 40-token prompts each prefilled once
    last = counters(
        queries=1000 + 100 * 1040,
        hits=100 * 1000,
        itl_sum=step * 1.1 * 5000,
        itl_count=5000,
        finished=100,
    )
    s = replica_summary(running, [1.0, 3.0], [0.5, 0.7], first, last, model)
    assert s["running_mean"] == 200.0
    assert s["waiting_mean"] == 2.0
    assert s["kv_usage_mean"] == pytest.approx(0.6)
    assert s["hit_rate"] == pytest.approx(100 * 1000 / (100 * 1040))
    assert s["finished"] == 100
    # Each request prefilled 40 uncached tokens: the model's step at 200 running.
    assert s["step_model_s"] == pytest.approx(step, rel=1e-3)
    assert s["step_vs_model"] == pytest.approx(1.1, rel=1e-3)
    empty = replica_summary([], [], [], None, None, None)
    assert (empty["running_mean"], empty["hit_rate"], empty["step_vs_model"]) == (None,) * 3


def test_absorption_is_the_time_until_the_others_run_the_fleets_load() -> None:
    # Four replicas at 100 each; replica 1 dies at 10.0; the others climb back.
    rows: list[list[float | None]] = [[8.0 + 0.2 * i] + [100.0] * 4 for i in range(10)]
    rows += [[10.1, 100.0, None, 100.0, 100.0], [10.3, 120.0, None, 110.0, 120.0]]
    rows += [[10.5, 125.0, None, 125.0, 125.0], [10.7, 133.0, None, 133.0, 134.0]]
    out = absorbed(rows, killed=1, killed_at=10.0, max_num_seqs=256)
    assert out["before_total"] == 400.0
    assert out["level"] == pytest.approx(360.0)
    assert out["absorb_s"] == pytest.approx(0.5)  # 375 >= 360 at 10.5
    # Saturated: the others cannot run the fleet's load, only all they can.
    full = [[9.0, 250.0, 250.0, 250.0, 250.0], [10.1, 250.0, None, 250.0, 250.0]]
    out = absorbed(full, killed=1, killed_at=10.0, max_num_seqs=256)
    assert out["level"] == pytest.approx(0.9 * 3 * 256)
    assert out["absorb_s"] == pytest.approx(0.1)
    assert absorbed(rows[:10], killed=1, killed_at=20.0, max_num_seqs=256)["absorb_s"] is None
    assert absorbed([], killed=1, killed_at=1.0, max_num_seqs=256)["level"] is None


# -- targets and report ------------------------------------------------------------------


def replica(running: float, hits: float = 0.0, queries: float = 1.0) -> dict[str, Any]:
    return {
        "running_mean": running,
        "waiting_mean": 0.0,
        "kv_usage_mean": 0.5,
        "prefix_hits": hits,
        "prefix_queries": queries,
        "hit_rate": hits / queries,
        "step_vs_model": 1.02,
    }


def run(label: str, rate: float, **fields: Any) -> dict[str, Any]:
    extra = fields.pop("extra", {})
    base: dict[str, Any] = {
        "scenario": "replicas",
        "contender": "llmbatch",
        "label": label,
        "requested": 1000,
        "ok": 1000,
        "failed": 0,
        "unfinished": 0,
        "errors": {},
        "wall_s": 20.0,
        "cpu_s": 1.0,
        "cpu_us_per_prompt": 1000.0,
        "prompts_per_s": rate,
        "output_tokens": 64_000,
        "output_tokens_per_s": rate * 64,
        "peak_rss_mb": 80.0,
        "rss_before_mb": 50.0,
        "latency": {"batch": {"n": 1000, "p50": 1.0, "p95": 1.5, "p99": 2.0, "max": 2.5}},
        "ttft": {},
        "tpot": {},
        "extra": {"replicas": 4, **extra},
    }
    return {**base, **fields}


def ttft(p99: float) -> dict[str, Any]:
    return {"realtime": {"n": 50, "p50": p99 / 2, "p95": p99, "p99": p99, "max": p99}}


def fleet_runs(
    fleet_rate: float = 500.0, rr_ttft: float = 0.5, absorb: float | None = 0.4
) -> list[dict[str, Any]]:
    sizing = replicaplan.prefix_sizing(
        prefix_tokens=1100, prompt_tokens=1112, max_tokens=64, prefixes=32, replicas=4,
        max_num_seqs=256,
    )  # fmt: skip
    return [
        run(replicaplan.ONE, 130.0, extra={"replicas": 1, "per_replica": [replica(240)]}),
        run(
            replicaplan.FLEET,
            fleet_rate,
            extra={"per_replica": [replica(230), replica(240), replica(235), replica(200)]},
        ),
        run(
            replicaplan.PREFIX_OURS,
            450.0,
            ttft=ttft(0.2),
            extra={
                "per_replica": [replica(240, 95, 100)] * 4,
                "sizing": sizing,
                "streams": 50,
                "bulk_ok": 1000,
            },
        ),
        run(
            replicaplan.PREFIX_ROUND_ROBIN,
            300.0,
            ttft=ttft(rr_ttft),
            extra={"per_replica": [replica(90, 60, 100)] * 4, "streams": 50, "bulk_ok": 1000},
        ),
        run(
            replicaplan.FAILOVER,
            400.0,
            requested=20_000,
            ok=20_000,
            extra={
                "missing": 0,
                "duplicates": 0,
                "killed": 1,
                "killed_at": 20.0,
                "handback_s": 0.05,
                "before_total": 960.0,
                "level": 691.2,
                "absorb_s": absorb,
                "per_second": [500] * 5 + [380] * 10,
                "per_replica": [replica(240)] * 4,
            },
        ),
    ]


def verdicts(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {t.id: t for t in evaluate_replicas(runs)}


def test_replicas_targets_met() -> None:
    t = verdicts(fleet_runs())
    assert t["replicas_throughput"].value == pytest.approx(500 / 130)
    assert t["replicas_balance"].value == pytest.approx(240 / 200)
    assert "mean running 230.0 / 240.0 / 235.0 / 200.0" in t["replicas_balance"].detail
    assert t["replicas_prefix_throughput"].value == pytest.approx(1.5)
    assert "hit rate 95.0 % vs 60.0 %" in t["replicas_prefix_throughput"].detail
    assert t["replicas_prefix_ttft"].value == pytest.approx(0.4)
    assert t["replicas_failover_results"].value == 0
    assert t["replicas_failover_absorb"].value == pytest.approx(0.4)
    assert {k for k, v in t.items() if v.met is not True} == {"replicas_slo_tpot_p99"}
    assert t["replicas_slo_tpot_p99"].met is None  # the SLO job did not run


def test_replicas_targets_missed_and_not_measured() -> None:
    runs = fleet_runs(fleet_rate=400.0, rr_ttft=0.1, absorb=None)
    runs[-1] = {**runs[-1], "ok": 19_990, "failed": 10}
    t = verdicts(runs)
    assert t["replicas_throughput"].met is False
    assert t["replicas_prefix_ttft"].met is False
    assert t["replicas_failover_results"].value == 10
    assert t["replicas_failover_absorb"].met is None  # never absorbed: not measured
    nothing = verdicts([])
    assert {v.met for v in nothing.values()} == {None}
    json.dumps([v.to_json() for v in nothing.values()], allow_nan=False)


def test_render_the_replicas_tables() -> None:
    runs = fleet_runs()
    text = render({"runs": runs, "targets": [t.to_json() for t in evaluate_replicas(runs)]})
    for title in ("throughput, one replica vs all", "prefix-heavy", "a replica killed mid-map"):
        assert f"### Replicas: {title}" in text
    assert "| 230.0 / 240.0 / 235.0 / 200.0 " in text
    assert "3.85x" in text  # 500 / 130
    assert "95 % / 95 % / 95 % / 95 %" in text
    assert "(2.7x that room)" in text
    assert "500 500 500 500 500 380" in text
    assert "| replicas_failover_absorb " in text


# -- the command line --------------------------------------------------------------------


def parse(*argv: str) -> BenchConfig:
    args: argparse.Namespace = build_parser().parse_args(list(argv))
    return config_from_args(args)


def test_replicas_runs_on_request_and_smoke_shortens_it() -> None:
    assert "replicas" in EXTRA_SCENARIOS
    assert "replicas" not in parse().scenarios
    full = parse("--scenario", "replicas")
    assert full.scenarios == ("replicas",)
    assert (full.replicas, full.replicas_bulk_n, full.replicas_failover_n) == (4, 3_000, 20_000)
    assert full.replicas_sim_args == ("--speed", "10")
    smoke = parse("--scenario", "replicas", "--smoke", "--replicas-sim", "--speed 20")
    assert smoke.replicas_prefix_n == SMOKE["replicas_prefix_n"]
    assert smoke.replicas_slo_duration == SMOKE["replicas_slo_duration"]
    assert smoke.replicas_sim_args == ("--speed", "20")
    assert parse("--smoke", "--replicas-bulk-n", "50").replicas_bulk_n == 50


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--replicas", "1"), "--replicas must be >= 2"),
        (("--replicas-prefix-n", "0"), "--replicas-prefix-n must be >= 1"),
        (("--replicas-stream-rate", "0"), "--replicas-stream-rate must be > 0"),
        (("--replicas-slo-duration", "-1"), "must be >= 0"),
    ],
)
def test_bad_replicas_options_are_refused(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(*argv)
