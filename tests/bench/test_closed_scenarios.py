"""One short real run of each closed-loop scenario against the simulator (a few
seconds each; the full forms run in ``llmbatch bench``, docs/benchmarks.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from llmbatch_bench.closedloop import frontier as sweep
from llmbatch_bench.closedloop import plan as closedplan
from llmbatch_bench.closedloop.stepmodel import sim_model
from llmbatch_bench.closedloop.targets import lost
from llmbatch_bench.closedloop.trace import column
from llmbatch_bench.config import BenchConfig
from llmbatch_bench.harness import run_bench
from llmbatch_bench.jobs import Job
from llmbatch_bench.plots import write_plots
from llmbatch_bench.report import render
from llmbatch_bench.scenarios import run_job

pytest.importorskip("llmbatch_server.testing")

#: Twice the closed-loop default speed: shorter runs, still a step model this machine holds.
SIM = ("--speed", "20")


@pytest.mark.slow  # ~10 s; CI's slow stage (and its closed-loop smoke) run it
@pytest.mark.timeout(120)
def test_slo_and_saturate_run_side_by_side_through_the_harness() -> None:
    config = BenchConfig(
        scenarios=("slo", "saturate"),
        contenders=("llmbatch",),
        closed_sim_args=SIM,
        max_tokens=16,
        realtime_max_tokens=16,
        slo_warmup=1.5,
        slo_duration=2.0,
        slo_baselines=(),
        saturate_n=200,
        saturate_sweep=(256,),
        saturate_rounds=1,
        isolate=False,
    )
    report = run_bench(config)
    runs = {(r["scenario"], r["label"]): r for r in report["runs"]}
    assert set(runs) == {
        ("slo", closedplan.IDLE),
        ("slo", closedplan.SLO_ON),
        ("slo", closedplan.SLO_BOTH),
        ("slo", closedplan.SLO_OFF),
        ("saturate", closedplan.probe_label(256)),
        ("saturate", closedplan.SATURATE),
    }
    slo = runs[("slo", closedplan.SLO_ON)]
    model = sim_model(SIM, 16)
    assert slo["extra"]["slo_tpot_s"] == pytest.approx(3 * model.idle_token_seconds)
    assert slo["extra"]["bound"]["sequences"] > 0
    assert slo["tpot"]["realtime"]["n"] == slo["extra"]["realtime_ok"] > 0
    assert slo["extra"]["controller"]["samples"] > 0
    # The streamed run with a TTFT target: 3x the idle realtime TTFT p50, both p99s judged.
    both = runs[("slo", closedplan.SLO_BOTH)]
    idle_ttft = runs[("slo", closedplan.IDLE)]["ttft"]["realtime"]["p50"]
    assert both["extra"]["slo_ttft_s"] == pytest.approx(3 * idle_ttft)
    assert both["ttft"]["realtime"]["n"] > 0
    assert runs[("saturate", closedplan.SATURATE)]["ok"] == 200
    verdicts = {t["id"]: t for t in report["targets"]}
    # Measured (met or not: a run this short only shows the wiring).
    for target in (
        "slo_realtime_tpot_p99",
        "slo_bulk_vs_bound",
        "slo_both_ttft_p99",
        "slo_both_tpot_p99",
        "saturate_vs_probe",
    ):
        assert verdicts[target]["met"] is not None, verdicts[target]
    assert report["closed_loop_server"]["simulator_args"] == list(SIM)


@pytest.mark.slow  # ~25 s; CI's slow stage (and its closed-loop smoke) run it
@pytest.mark.timeout(180)
def test_the_frontier_sweeps_static_settings_and_judges_the_controller(
    tmp_path: Path,
) -> None:
    config = BenchConfig(
        scenarios=("frontier",),
        contenders=("llmbatch",),
        closed_sim_args=SIM,
        max_tokens=16,
        frontier_caps=(1, 32),
        frontier_batches=(8,),
        frontier_rounds=2,
        frontier_confirm=1,
        frontier_warmup=1.0,
        frontier_duration=2.5,
        frontier_rate=4.0,
        isolate=False,
    )
    report = run_bench(config)
    runs = report["runs"]
    labels = [r["label"] for r in runs]
    static = [closedplan.static_label(s) for s in sweep.grid((1, 32), (8,))]
    ends = [*static, closedplan.FRONTIER_CONTROLLER]
    # The idle runs, then the grid and the controller in order, then in reverse; then
    # a confirming round of the controller and the settings the verdict turns on.
    assert labels[:8] == [
        closedplan.FRONTIER_IDLE_STREAM,
        closedplan.FRONTIER_IDLE_CALL,
        *ends,
        *reversed(ends),
    ]
    mixed = runs[2:8]
    medians = sweep.median_points([[_point(r) for r in mixed]])
    bound = mixed[0]["extra"]["bound_s"]
    near = sweep.contested([p for p in medians if p.label in static], bound)
    assert labels[8:] == [label for label in ends if label in near] + [
        closedplan.FRONTIER_CONTROLLER
    ]
    by_label = {r["label"]: r for r in runs}
    idle = by_label[closedplan.FRONTIER_IDLE_STREAM]
    cap1, cap32 = (by_label[label] for label in static)
    bound = cap1["extra"]["bound_s"]
    slo_ttft, slo_tpot = 3 * idle["ttft"]["realtime"]["p50"], 3 * idle["tpot"]["realtime"]["p50"]
    assert bound == pytest.approx(slo_ttft + 15 * slo_tpot)
    # Static settings hold their cap (the controller pinned); realtime single calls
    # were answered beside bulk, and their time inside the client recorded.
    assert (cap1["extra"]["bulk_limit"], cap32["extra"]["bulk_limit"]) == (1, 32)
    assert cap32["prompts_per_s"] > cap1["prompts_per_s"] > 0
    assert cap1["latency"]["realtime"]["n"] > 0
    assert not cap1["ttft"]
    assert cap1["extra"]["queued"]["realtime"]["n"] == cap1["latency"]["realtime"]["n"]
    verdicts = {t["id"]: t for t in report["targets"]}
    assert verdicts["frontier_controller"]["value"] is not None
    rounds = "3 rounds" if set(near) == set(static) else "2 rounds (3 for the controller"
    assert f"medians of {rounds}" in verdicts["frontier_controller"]["detail"]
    assert (tmp_path / "frontier.png") in write_plots(report, tmp_path)
    # Each controller round read by its slowest calls, the first placed at its limit.
    title = "### Frontier: the controller's rounds, by their slowest calls"
    rounds = render(report).split(title)[1]
    controller = [r for r in runs if r["label"] == closedplan.FRONTIER_CONTROLLER]
    row = next(line for line in rounds.splitlines() if line.startswith("| 1 "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    first = min(controller[0]["extra"]["calls"]["rows"])  # the earliest sent
    assert cells[1] == f"{controller[0]['latency']['realtime']['p99'] / bound:.2f}"
    assert cells[2].startswith(f"{first[1] / bound:.2f} (limit ")
    assert cells[5] == str(len(controller[0]["extra"]["calls"]["rows"]))


def _point(run: dict[str, Any]) -> sweep.Point:
    p99 = run["latency"]["realtime"]["p99"]
    return sweep.Point(run["label"], math.inf if p99 is None else p99, run["prompts_per_s"])


def closed_job(**fields: Any) -> Job:
    base: dict[str, Any] = {
        "scenario": "test",
        "contender": "llmbatch",
        "base_url": "http://127.0.0.1:0/v1",
        "model": "llmbatch-sim",
        "sim_args": SIM,
        "max_tokens": 16,
        "realtime_max_tokens": 16,
    }
    return Job(**{**base, **fields})


@pytest.mark.slow  # ~9 s; CI's closed-loop smoke runs the scenario, its slow stage this test
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["503", "restart"])
@pytest.mark.anyio
@pytest.mark.asyncio_only("the benchmark's runners are asyncio code")
async def test_a_map_through_an_outage_loses_nothing_and_is_recorded(mode: str) -> None:
    m = await run_job(
        closed_job(kind="outage", n=1000, outage_mode=mode, outage_seconds=2.0, time_limit=60)
    )
    run = m.to_json()
    assert lost(run) == 0, run["errors"]
    extra = run["extra"]
    assert extra["breaker"] == "closed"
    assert extra["down_s"] >= 2.0
    assert len(extra["per_second"]) == round(extra["down_s"])
    # Whole seconds only (a last part of a second under half a second is left out).
    assert sum(extra["per_second"]) <= sum(extra["sent_during"].values())
    assert extra["resume"]["first_answer_s"] is not None
    # Everything the client sent is in the log, the outage's answers among it.
    outcomes = {x[4] for x in extra["exchanges"]}
    assert ("503" if mode == "503" else "ConnectError") in outcomes


@pytest.mark.slow  # ~8 s; CI's slow stage (and its closed-loop smoke) run it
@pytest.mark.timeout(90)
@pytest.mark.anyio
@pytest.mark.asyncio_only("the benchmark's runners are asyncio code")
async def test_control_records_the_limit_following_load(tmp_path: Path) -> None:
    tpot = 3 * sim_model(SIM, 16).idle_token_seconds
    m = await run_job(
        closed_job(
            scenario="control",
            kind="control",
            phases=(1.5, 2.0, 2.0, 2.0),
            slo_tpot=tpot,
            realtime_rate=10,
        )
    )
    extra = m.to_json()["extra"]
    trace = extra["trace"]
    assert len(trace["rows"]) >= 25  # 7.5 s at 0.2 s
    assert extra["down_at"] == pytest.approx(3.5, abs=0.5)
    assert extra["back_at"] - extra["down_at"] == pytest.approx(2.0, abs=0.1)
    assert any(x is not None for x in column(trace, "step_real"))
    assert max(column(trace, "bulk_limit")) >= 1
    assert extra["realtime"]  # one row per stream
    report = {"runs": [m.to_json()], "targets": []}
    assert [p.name for p in write_plots(report, tmp_path)] == ["control.png"]


@pytest.mark.slow  # ~2 s of probes
def test_fit_as_the_prefill_cost_measures_the_server_it_is_given() -> None:
    from types import SimpleNamespace

    from llmbatch_bench.server import ServerInfo
    from llmbatch_server.sim.config import StepModel
    from llmbatch_server.testing import run_simulator

    with run_simulator("--speed", "2", "--max-model-len", "4096") as sim:
        runner = SimpleNamespace(
            config=BenchConfig(slo_prefill_cost="fit"),
            server=ServerInfo(base_url=sim.base_url, model="llmbatch-sim"),
            notes=[],
        )
        seconds = closedplan._prefill_cost(runner)  # type: ignore[arg-type]
    assert seconds == pytest.approx(StepModel().per_prefill_token / 2, rel=0.25)
    assert "prefill cost measured on the server" in runner.notes[0]
