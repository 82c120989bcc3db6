"""The replicas scenario's smallest form through the harness, against real
simulators: two replicas, a few hundred prompts per job (the full form runs in
``llmbatch bench --scenario replicas``, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from llmbatch_bench.closedloop.targets import lost
from llmbatch_bench.config import BenchConfig
from llmbatch_bench.harness import run_bench
from llmbatch_bench.replicas import plan as replicaplan
from llmbatch_bench.report import render

pytest.importorskip("llmbatch_server.testing")

#: Twice the scenario's default speed: shorter runs, a step model this machine holds.
SIM = ("--speed", "20")


@pytest.mark.slow  # ~11 s; CI's slow stage (and its replicas smoke) run the jobs
@pytest.mark.timeout(180)
def test_every_replicas_job_runs_and_is_judged() -> None:
    config = BenchConfig(
        scenarios=("replicas",),
        contenders=("llmbatch",),
        replicas_sim_args=SIM,
        replicas=2,
        max_tokens=32,
        realtime_max_tokens=8,
        replicas_bulk_n=400,
        replicas_prefix_n=300,
        replicas_prefixes=4,
        replicas_stream_rate=10.0,
        replicas_failover_n=600,
        replicas_slo_warmup=1.0,
        replicas_slo_duration=1.5,
        isolate=False,
    )
    report = run_bench(config)
    assert report["notes"] == []
    runs = {r["label"]: r for r in report["runs"] if r["scenario"] == "replicas"}
    assert set(runs) == {
        replicaplan.ONE,
        replicaplan.FLEET,
        replicaplan.PREFIX_OURS,
        replicaplan.PREFIX_ROUND_ROBIN,
        replicaplan.FAILOVER,
        replicaplan.SLO,
    }
    assert runs[replicaplan.ONE]["ok"] == 400
    fleet = runs[replicaplan.FLEET]
    assert fleet["ok"] == 800
    assert len(fleet["extra"]["per_replica"]) == 2
    # Both replicas served, and their /metrics were read throughout.
    assert all(p["finished"] > 0 for p in fleet["extra"]["per_replica"])
    assert all(p["samples"] > 0 for p in fleet["extra"]["per_replica"])
    for label in (replicaplan.PREFIX_OURS, replicaplan.PREFIX_ROUND_ROBIN):
        prefix = runs[label]
        assert prefix["extra"]["bulk_ok"] == 300
        assert prefix["extra"]["missing"] == prefix["extra"]["duplicates"] == 0
        # The prefix jobs' KV cache was sized, and the shared prefixes hit it.
        assert prefix["extra"]["sizing"]["kv_tokens"] > 0
        assert all(p["hit_rate"] > 0.5 for p in prefix["extra"]["per_replica"])
    assert runs[replicaplan.PREFIX_OURS]["extra"]["routing"] == "llmbatch"
    assert runs[replicaplan.PREFIX_ROUND_ROBIN]["extra"]["routing"] == "round_robin"
    failover = runs[replicaplan.FAILOVER]
    assert lost(failover) == 0, failover["errors"]
    extra = failover["extra"]
    assert extra["killed_at"] > 0
    assert extra["handback_s"] is not None
    assert len(extra["per_second"]) == 15
    slo = runs[replicaplan.SLO]
    assert slo["tpot"]["realtime"]["n"] > 0
    assert slo["extra"]["slo_tpot_s"] > 0
    verdicts = {t["id"]: t for t in report["targets"]}
    assert verdicts["replicas_failover_results"]["met"] is True
    for target in (
        "replicas_throughput",
        "replicas_balance",
        "replicas_prefix_throughput",
        "replicas_prefix_ttft",
        "replicas_slo_tpot_p99",
    ):
        # Measured (met or not: a run this short only shows the wiring).
        assert verdicts[target]["met"] is not None, verdicts[target]
    assert report["replicas_server"] == {"replicas": 2, "simulator_args": list(SIM)}
    assert "### Replicas: a replica killed mid-map" in render(report)
