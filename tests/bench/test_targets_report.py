"""Targets judged from synthetic runs, and the report's tables, JSON and plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from llmbatch_bench.metrics import Meter, Recorder, RunMetrics
from llmbatch_bench.plots import write_plots
from llmbatch_bench.report import render, write_json
from llmbatch_bench.targets import capacity, evaluate


def run(
    scenario: str,
    label: str,
    *,
    ok: int = 100,
    wall: float = 1.0,
    cpu: float = 0.001,
    latency: float = 0.1,
    tier: str = "batch",
    failed: int = 0,
    requested: int | None = None,
    rss: float = 50.0,
    contender: str | None = None,
    extra: dict[str, Any] | None = None,
) -> RunMetrics:
    rec = Recorder()
    for _ in range(ok):
        rec.success(tier, latency, 8, ttft=latency / 10 if tier == "realtime" else None)
    for _ in range(failed):
        rec.failure("HTTP 500")
    return rec.finish(
        scenario=scenario,
        contender=contender or label.split(" ")[0],
        label=label,
        requested=requested if requested is not None else ok + failed,
        meter=Meter(wall=wall, cpu=cpu, rss_before_mb=40.0, peak_rss_mb=rss),
        extra=extra,
    )


def full_set() -> list[RunMetrics]:
    return [
        run("sweep", "probe c=64", ok=800, extra={"concurrency": 64}),
        run("sweep", "probe c=256", ok=1000, extra={"concurrency": 256}),
        run("bulk", "llmbatch", ok=960, cpu=0.0096),  # 10 µs per prompt
        run("bulk", "openai", ok=400, cpu=1.2),  # 3000 µs per prompt
        run("idle", "llmbatch", tier="realtime", latency=0.010),
        run("mixed", "llmbatch", tier="realtime", latency=0.014),
        run("idle", "aiohttp", tier="realtime", latency=0.010),
        run("mixed", "aiohttp", tier="realtime", latency=2.0),
        run("burst", "llmbatch", ok=100_000, rss=120.0),
        run("burst", "aiohttp (unbounded)", ok=90_000, failed=10_000, rss=900.0),
    ]


def by_id(runs: list[RunMetrics]) -> dict[str, Any]:
    return {t.id: t for t in evaluate(runs)}


def test_capacity_is_the_best_sweep_point() -> None:
    best = capacity(full_set())
    assert best is not None
    assert best.label == "probe c=256"
    assert capacity([run("bulk", "llmbatch")]) is None


def test_every_target_met() -> None:
    targets = by_id(full_set())
    assert targets["bulk_throughput"].value == pytest.approx(0.96)
    assert targets["realtime_p99_ratio"].value == pytest.approx(1.4)
    assert targets["cpu_per_prompt"].value == pytest.approx(10.0)
    assert targets["cpu_vs_openai"].value == pytest.approx(300.0)
    assert targets["burst"].value == pytest.approx(120.0)
    assert all(t.met is True for t in targets.values())
    # The baseline's queueing shows up beside ours.
    assert "aiohttp: p99 2000 ms loaded vs 10 ms idle = 200.00x" in (
        targets["realtime_p99_ratio"].detail
    )


def test_misses_are_reported_with_their_values() -> None:
    runs = full_set()
    runs[2] = run("bulk", "llmbatch", ok=900, cpu=0.09)  # 90% of capacity, 100 µs
    runs[5] = run("mixed", "llmbatch", tier="realtime", latency=0.05)
    runs[8] = run("burst", "llmbatch", ok=99_999, failed=1, rss=120.0)
    targets = by_id(runs)
    assert targets["bulk_throughput"].met is False
    assert targets["bulk_throughput"].value == pytest.approx(0.9)
    assert targets["realtime_p99_ratio"].value == pytest.approx(5.0)
    assert targets["realtime_p99_ratio"].met is False
    assert targets["cpu_per_prompt"].met is False
    assert targets["cpu_vs_openai"].value == pytest.approx(30.0)
    assert targets["cpu_vs_openai"].met is True
    assert targets["burst"].met is False


def test_burst_memory_bound() -> None:
    runs = [run("burst", "llmbatch", ok=10, rss=301.0)]
    assert by_id(runs)["burst"].met is False


def test_unmeasured_targets_are_none() -> None:
    targets = by_id([run("bulk", "llmbatch")])
    assert targets["bulk_throughput"].met is None
    assert targets["realtime_p99_ratio"].met is None
    assert targets["cpu_vs_openai"].met is None
    assert targets["burst"].met is None
    assert targets["cpu_per_prompt"].met is True
    assert all(math.isfinite(t.threshold) for t in targets.values())


def report(runs: list[RunMetrics]) -> dict[str, Any]:
    return {
        "schema": "llmbatch-bench/1",
        "runs": [r.to_json() for r in runs],
        "targets": [t.to_json() for t in evaluate(runs)],
    }


def test_render_has_a_table_per_scenario_and_the_verdicts() -> None:
    text = render(report(full_set()))
    for title in ("Capacity sweep", "Bulk", "Mixed", "Burst", "Targets"):
        assert f"### {title}" in text
    assert "| probe c=256 (best) |" in text
    assert "96.0 %" in text  # llmbatch's share of capacity
    assert "1.40x" in text  # realtime p99 ratio
    assert "met" in text
    assert "Overhead" not in text  # not measured, not shown


def test_json_is_standard_and_plots_are_written(tmp_path: Path) -> None:
    data = report(full_set())
    write_json(data, tmp_path / "out" / "bench.json")
    loaded = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert loaded["runs"][0]["latency"]["batch"]["p99"] == pytest.approx(0.1)
    pytest.importorskip("matplotlib")
    written = write_plots(data, tmp_path / "img")
    names = sorted(p.name for p in written)
    assert names == [
        "bench-burst.png",
        "bench-cpu.png",
        "bench-realtime.png",
        "bench-throughput.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
