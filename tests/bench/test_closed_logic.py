"""The closed-loop scenarios' logic on made-up numbers: the bound from the step
model, per-second counting of an outage's requests, the controller's time series,
the targets' verdicts, the report's tables, and the command line's smoke form."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmbatch_bench.cli import build_parser, config_from_args
from llmbatch_bench.closedloop import plan as closedplan
from llmbatch_bench.closedloop.report import phase_rows, step_timing
from llmbatch_bench.closedloop.stepmodel import SimModel, best_under_slo, sim_model
from llmbatch_bench.closedloop.targets import evaluate_closed
from llmbatch_bench.closedloop.trace import (
    FIELDS,
    PlacedCall,
    Trace,
    column,
    place_calls,
    window_summary,
)
from llmbatch_bench.closedloop.wirelog import Exchange, per_second, rate, resume
from llmbatch_bench.config import SMOKE, BenchConfig
from llmbatch_bench.jobs import prompt
from llmbatch_bench.plots import write_plots
from llmbatch_bench.report import render

# -- the bound ---------------------------------------------------------------------------


def test_the_bound_is_the_largest_batch_whose_step_meets_the_slo() -> None:
    def step(n: int) -> float:
        return 0.010 + 0.001 * n  # 11 ms with one sequence, 20 ms with ten

    bound = best_under_slo(step, tpot=0.020, max_seqs=256, max_tokens=50)
    assert bound is not None
    assert bound.sequences == 10
    assert bound.step_s == pytest.approx(0.020)
    assert bound.tokens_per_s == pytest.approx(10 / 0.020)
    assert bound.prompts_per_s == pytest.approx(500 / 50)
    # The server's max_num_seqs caps it; an SLO below one sequence's step is unreachable.
    assert best_under_slo(step, tpot=1.0, max_seqs=64, max_tokens=50).sequences == 64  # type: ignore[union-attr]
    assert best_under_slo(step, tpot=0.0105, max_seqs=64, max_tokens=50) is None


def test_the_simulators_own_model_gives_the_slo_and_its_bound() -> None:
    model = sim_model(["--speed", "10"], 64, [prompt(1000)])
    # (22.25 ms + 1.065 ms) / 10: one sequence, no prefill.
    assert model.idle_token_seconds == pytest.approx(0.0023315)
    assert model.max_num_seqs == 256
    # Each sequence is prefilled once in 64 steps: 0.2 ms x 41 / 64 per sequence.
    assert model.step_seconds(39) == pytest.approx(
        (0.02225 + 0.001065 * 39 + 0.0002 * 39 * 41 / 64) / 10
    )
    bound = model.bound(3 * model.idle_token_seconds)
    assert bound is not None
    assert bound.sequences == 39
    assert model.step_seconds(40) > 3 * model.idle_token_seconds >= bound.step_s
    assert bound.tokens_per_s == pytest.approx(39 / bound.step_s)
    # The profile's max_num_seqs and the speed follow the simulator's arguments.
    latency = sim_model(["--profile", "latency", "--speed", "20"], 64)
    assert (latency.max_num_seqs, latency.speed) == (64, 20.0)
    with pytest.raises(ValueError, match="zero-latency"):
        sim_model(["--zero-latency"], 64)
    with pytest.raises(RuntimeError, match="not simulator arguments"):
        sim_model(["--no-such-flag"], 64)


# -- an outage's exchanges ---------------------------------------------------------------


def ex(sent: float, path: str = "/health", outcome: str = "ConnectError") -> Exchange:
    method = "POST" if path.startswith("/v1") else "GET"
    return Exchange(sent, sent + 0.01, method, path, outcome)


def test_requests_are_counted_per_second_of_outage() -> None:
    # Down from 10.0 to 15.2: five failures in the first second, then one probe a second.
    log = [ex(9.5, "/v1/completions", "200")]
    log += [ex(10.0 + 0.1 * i, "/v1/completions", "503") for i in range(5)]
    log += [ex(11.3 + i) for i in range(4)]
    log += [ex(15.3, outcome="200"), ex(15.31, "/v1/completions", "200")]
    assert per_second(log, 10.0, 15.2) == [5, 1, 1, 1, 1]
    # A last partial second of at least half a second counts as one.
    assert per_second(log, 10.0, 15.6) == [5, 1, 1, 1, 1, 2]
    assert rate(log, 11.0, 15.0) == pytest.approx(1.0)
    assert rate(log, 15.0, 15.0) is None
    back = resume(log, 15.2)
    assert back.first_sent_s == pytest.approx(0.1)
    assert back.work_sent_s == pytest.approx(0.11)
    assert back.first_answer_s == pytest.approx(0.12)
    assert resume(log, 20.0).work_sent_s is None


# -- the controller's time series ----------------------------------------------------------


def snapshot(limit: int, step: float | None, breaker: str = "closed") -> Any:
    server = SimpleNamespace(
        bulk_limit=limit,
        realtime_reserve=2,
        step_time=step,
        breaker=breaker,
        slo_met=3,
        slo_missed=1,
    )
    tier = SimpleNamespace(in_flight=4, queued=1)
    return SimpleNamespace(server=server, tiers={"realtime": tier, "batch": tier, "normal": tier})


def gauges(running: float, itl_sum: float, itl_count: float, tokens: float) -> dict[str, float]:
    return {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": 0.0,
        "vllm:inter_token_latency_seconds_sum": itl_sum,
        "vllm:inter_token_latency_seconds_count": itl_count,
        "vllm:generation_tokens_total": tokens,
    }


def test_a_trace_turns_histogram_deltas_into_the_real_step_time() -> None:
    trace = Trace(origin=100.0)
    trace.add(100.0, snapshot(8, None), gauges(8, 1.0, 100, 100))
    trace.add(100.5, snapshot(12, 0.004), gauges(12, 1.6, 200, 200))
    trace.add(101.0, snapshot(20, 0.006, "open"), None)  # /metrics unreachable
    trace.add(101.5, snapshot(16, 0.005), gauges(0, 0.0, 0, 0))  # a restarted server
    data = trace.to_json()
    assert data["fields"] == list(FIELDS)
    assert column(data, "t") == [0.0, 0.5, 1.0, 1.5]
    assert column(data, "step_real") == [None, pytest.approx(0.006), None, None]
    assert column(data, "tokens") == [None, 100.0, None, 0.0]
    assert column(data, "bulk_in_flight") == [8, 8, 8, 8]  # normal + batch
    # 12 in flight (4 realtime, 8 bulk) less what the engine runs and queues.
    assert column(data, "api_queue") == [4.0, 0.0, None, 12.0]
    assert column(data, "breaker")[2] == "open"
    summary = window_summary(data, 0.0, 1.2)
    assert (summary["limit_min"], summary["limit_max"], summary["limit_p50"]) == (8, 20, 12)
    assert summary["running_mean"] == pytest.approx(10.0)
    assert summary["step_real_mean_s"] == pytest.approx(0.006)
    assert summary["api_queue_mean"] == pytest.approx(2.0)
    assert window_summary(data, 5.0, 6.0)["limit_p50"] is None


def test_each_realtime_call_is_placed_at_the_limit_in_force_when_it_was_sent() -> None:
    trace = Trace(origin=100.0)
    for t, limit in ((100.0, 8), (100.5, 12), (101.0, 20), (101.5, 16)):
        trace.add(t, snapshot(limit, 0.005), gauges(limit, 1.0, 100, 100))
    # As the JSON keeps them: (sent in the trace's time, latency), in the order answered.
    calls = {"fields": ["t", "latency"], "rows": [[1.5, 0.3], [0.7, 0.9], [-0.1, 0.2]]}
    assert place_calls(trace.to_json(), calls) == [
        PlacedCall(-0.1, 0.2, None),  # before the trace's first row
        PlacedCall(0.7, 0.9, 12),  # the latest row before it, not the next
        PlacedCall(1.5, 0.3, 16),  # a row at the very time counts
    ]
    assert place_calls(trace.to_json(), {"fields": ["t", "latency"], "rows": []}) == []


# -- targets and report --------------------------------------------------------------------

MODEL = SimModel(
    base=0.02225,
    per_sequence=0.001065,
    per_prefill_token=0.00002,
    speed=10.0,
    max_num_seqs=256,
    prompt_tokens=41,
    max_tokens=64,
)
SLO = 3 * MODEL.idle_token_seconds


def pct(p50: float, p99: float, n: int = 100) -> dict[str, Any]:
    return {"n": n, "p50": p50, "p95": p99, "p99": p99, "max": p99}


def run(scenario: str, label: str, **fields: Any) -> dict[str, Any]:
    extra = fields.pop("extra", {})
    base: dict[str, Any] = {
        "scenario": scenario,
        "contender": "llmbatch",
        "label": label,
        "requested": 100,
        "ok": 100,
        "failed": 0,
        "unfinished": 0,
        "errors": {},
        "wall_s": 10.0,
        "cpu_s": 1.0,
        "cpu_us_per_prompt": 100.0,
        "prompts_per_s": 90.0,
        "output_tokens": 1000,
        "output_tokens_per_s": 5800.0,
        "latency": {},
        "ttft": {},
        "tpot": {},
        "peak_rss_mb": 60.0,
        "rss_before_mb": 50.0,
        "extra": extra,
    }
    return {**base, **fields}


def slo_runs(p99: float = 0.0065, tokens: float = 5800.0) -> list[dict[str, Any]]:
    bound = MODEL.bound(SLO)
    assert bound is not None
    context = {
        "slo_tpot_s": SLO,
        "idle_token_s": MODEL.idle_token_seconds,
        "idle_token_source": "step model",
        "slo_factor": 3.0,
        "model": MODEL.to_json(),
        "bound": bound.to_json(),
        "controller": {
            "limit_p10": 30,
            "limit_p50": 38,
            "limit_p90": 41,
            "running_mean": 42.0,
            "step_real_mean_s": MODEL.step_seconds(42.0) * 1.02,
        },
    }
    return [
        run("slo", closedplan.IDLE, tpot={"realtime": pct(0.0024, 0.0031)}, extra={}),
        run(
            "slo",
            closedplan.SLO_ON,
            tpot={"realtime": pct(0.005, p99)},
            ttft={"realtime": pct(0.01, 0.03)},
            output_tokens_per_s=tokens,
            extra=context,
        ),
        run(
            "slo",
            closedplan.SLO_BOTH,
            tpot={"realtime": pct(0.005, p99)},
            ttft={"realtime": pct(0.01, 0.015)},
            output_tokens_per_s=tokens,
            extra={**context, "slo_ttft_s": 0.0168},
        ),
        run(
            "slo",
            closedplan.SLO_OFF,
            tpot={"realtime": pct(0.029, 0.031)},
            output_tokens_per_s=8000.0,
            extra={**context, "controller": {"limit_p50": 255, "running_mean": 250.0}},
        ),
    ]


def saturate_runs(ours: list[float], probes: dict[int, list[float]]) -> list[dict[str, Any]]:
    out = []
    for r, value in enumerate(ours):
        for c, values in probes.items():
            out.append(run("saturate", closedplan.probe_label(c), prompts_per_s=values[r]))
        out.append(run("saturate", closedplan.SATURATE, prompts_per_s=value))
    return out


def outage_run(label: str, **extra: Any) -> dict[str, Any]:
    base = {
        "down_at": 5.0,
        "back_at": 20.0,
        "down_s": 15.0,
        "per_second": [7, 3] + [1] * 13,
        "opened_at": 6.2,
        "sent_before_open": 9,
        "open_rate": 1.0,
        "sent_during": {"POST /v1/completions": 9, "GET /health": 14},
        "resume": {"first_sent_s": 0.4, "work_sent_s": 0.41, "first_answer_s": 1.1},
        "refill_s": 2.5,
        "missing": 0,
        "duplicates": 0,
    }
    return run("outage", label, requested=3000, ok=3000, extra={**base, **extra})


def targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {t.id: t for t in evaluate_closed(runs)}


def test_closed_loop_targets_met() -> None:
    runs = [
        *slo_runs(),
        *saturate_runs([99.0, 97.5, 98.0], {256: [99.0, 100.0, 98.0], 384: [95.0, 99.5, 96]}),
        outage_run(closedplan.OUTAGE_503),
        outage_run(closedplan.OUTAGE_RESTART),
    ]
    t = targets(runs)
    # The frontier's target needs its own scenario (tests/bench/test_frontier.py).
    assert t.pop("frontier_controller").met is None
    assert t["slo_realtime_tpot_p99"].value == pytest.approx(6.5)
    assert t["slo_realtime_tpot_p99"].threshold == pytest.approx(SLO * 1e3)
    bound = MODEL.bound(SLO)
    assert bound is not None
    assert t["slo_bulk_vs_bound"].value == pytest.approx(5800.0 / bound.tokens_per_s)
    # Medians over rounds: llmbatch 98.0 vs probe c=256's 99.0 (c=384: 96.0).
    assert t["saturate_vs_probe"].value == pytest.approx(98.0 / 99.0)
    assert "probe c=256 99.0 prompts/s, medians of 3" in t["saturate_vs_probe"].detail
    assert t["outage_503_rate"].value == 1.0
    assert "9 before the breaker opened 1.2 s in" in t["outage_503_rate"].detail
    assert t["outage_restart_resume"].value == pytest.approx(0.41)
    assert t["slo_both_ttft_p99"].value == pytest.approx(15.0)
    assert t["slo_both_ttft_p99"].threshold == pytest.approx(16.8)
    assert t["slo_both_tpot_p99"].value == pytest.approx(6.5)
    assert {k: v.met for k, v in t.items() if v.met is not True} == {}


def test_a_streamed_ttft_over_its_slo_is_a_miss_and_no_run_is_not_measured() -> None:
    runs = slo_runs()
    both = next(r for r in runs if r["label"] == closedplan.SLO_BOTH)
    both["ttft"] = {"realtime": pct(0.012, 0.02)}
    assert targets(runs)["slo_both_ttft_p99"].met is False
    alone = [r for r in runs if r["label"] != closedplan.SLO_BOTH]
    assert targets(alone)["slo_both_ttft_p99"].met is None


def test_closed_loop_targets_missed_say_by_how_much() -> None:
    runs = [
        *slo_runs(p99=0.0136, tokens=3000.0),
        *saturate_runs([90.0], {256: [100.0]}),
        outage_run(closedplan.OUTAGE_503, open_rate=4.0, missing=2, duplicates=1),
        run("outage", closedplan.OUTAGE_RESTART, ok=2990, failed=10, requested=3000, extra={}),
    ]
    t = targets(runs)
    assert t["slo_realtime_tpot_p99"].met is False
    assert "p99 13.60 ms vs SLO 6.99 ms" in t["slo_realtime_tpot_p99"].detail
    assert t["slo_bulk_vs_bound"].met is False
    assert t["saturate_vs_probe"].value == pytest.approx(0.9)
    assert t["outage_503_results"].value == 3  # two missing, one answered twice
    assert t["outage_503_rate"].met is False
    assert t["outage_restart_results"].value == 10
    # An outage that was never seen cannot be judged.
    assert t["outage_restart_rate"].met is None
    assert t["outage_restart_rate"].detail == "breaker never seen open"


def test_closed_loop_targets_not_run_are_not_measured() -> None:
    t = targets([])
    assert {v.met for v in t.values()} == {None}
    assert all(v.to_json()["value"] is None for v in t.values())
    # The SLO's threshold is the run's own SLO: unknown without one, null in the JSON.
    assert t["slo_realtime_tpot_p99"].to_json()["threshold"] is None
    json.dumps([v.to_json() for v in t.values()], allow_nan=False)


def test_step_timing_compares_the_real_step_with_the_model() -> None:
    assert step_timing(slo_runs()[1]) == pytest.approx(1.02)
    assert step_timing(run("slo", "x", extra={})) is None


def control_run() -> dict[str, Any]:
    trace = Trace(origin=0.0)
    for i in range(60):  # 12 s at 0.2 s: phases 2 + 4 + 3 + 3
        t = i * 0.2
        down = 6.0 <= t < 9.0
        trace.add(
            t,
            snapshot(40 if t < 6 else (4 if down else 20), 0.006, "open" if down else "closed"),
            None if down else gauges(40, 0.006 * i, i, 100 * i),
        )
    realtime = [[2.0 + 0.1 * i, 2.3 + 0.1 * i, 0.01, 0.005 + 0.0001 * i, True] for i in range(80)]
    extra = {
        "phases": [2.0, 4.0, 3.0, 3.0],
        "slo_tpot_s": SLO,
        "model": MODEL.to_json(),
        "trace": trace.to_json(),
        "realtime": realtime,
        "down_at": 6.0,
        "back_at": 9.0,
    }
    return run("control", closedplan.CONTROL, extra=extra)


def test_control_phases_summarise_the_series() -> None:
    rows = {row[0]: row for row in phase_rows(control_run())}
    assert list(rows) == ["bulk alone", "realtime joins", "outage (503)", "recovery"]
    assert rows["bulk alone"][2] == "40 (40-40)"
    assert rows["outage (503)"][2] == "4 (4-4)"
    assert rows["bulk alone"][7] == "0"  # realtime arrives from the second phase
    assert rows["realtime joins"][7] == "40"


def test_render_and_plots_of_the_closed_loop(tmp_path: Path) -> None:
    runs = [
        *slo_runs(),
        *saturate_runs([98.0], {256: [99.0]}),
        outage_run(closedplan.OUTAGE_503),
        control_run(),
    ]
    report = {"runs": runs, "targets": [t.to_json() for t in evaluate_closed(runs)]}
    text = render(report)
    for title in ("SLO: realtime", "Saturate:", "Outage:", "Control:"):
        assert f"### {title}" in text
    assert "SLO: TPOT ≤ 6.99 ms = 3x the idle per-token time 2.331 ms (step model)" in text
    assert "44 running, step 6.97 ms, 6,315 tokens/s = 98.7 prompts/s" in text
    assert "| probe c=256 (best) " in text
    assert "| 503 outage " in text
    assert "7 3 1 1 1" in text
    written = {p.name for p in write_plots(report, tmp_path)}
    assert {"control.png", "slo.png"} <= written


# -- the command line --------------------------------------------------------------------


def parse(*argv: str) -> BenchConfig:
    args: argparse.Namespace = build_parser().parse_args(list(argv))
    return config_from_args(args)


def test_smoke_shortens_the_closed_loop_and_explicit_options_win() -> None:
    full = parse("--scenario", "slo")
    assert (full.slo_duration, full.outage_503, full.saturate_rounds) == (20.0, 15.0, 3)
    assert full.closed_sim_args == ("--speed", "10")
    smoke = parse("--scenario", "slo,outage", "--smoke")
    for name, value in SMOKE.items():
        assert getattr(smoke, name) == value
    mixed = parse("--smoke", "--outage-503", "7", "--closed-sim", "--speed 20")
    assert (mixed.outage_503, mixed.outage_restart) == (7.0, SMOKE["outage_restart"])
    assert mixed.closed_sim_args == ("--speed", "20")
    assert parse("--slo-baselines", "").slo_baselines == ()
    # "all" takes the closed-loop scenarios too.
    assert {"slo", "saturate", "outage", "control"} <= set(parse().scenarios)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--control-phases", "1,2,3"), "four positive"),
        (("--outage-n", "0"), "--outage-n must be >= 1"),
        (("--slo-factor", "0"), "--slo-factor must be > 0"),
    ],
)
def test_bad_closed_loop_options_are_refused(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(*argv)


def test_no_nan_in_missing_bound() -> None:
    # A server that is not the simulator has no step model: no bound, not a crash.
    runs = slo_runs()
    runs[1]["extra"] = {**runs[1]["extra"], "bound": None, "model": None}
    t = targets(runs)
    assert t["slo_bulk_vs_bound"].met is None
    assert "bound unknown" in t["slo_bulk_vs_bound"].detail
    assert math.isfinite(t["slo_realtime_tpot_p99"].threshold)


def test_only_the_asked_scenarios_targets_are_listed() -> None:
    ids = {t.id for t in evaluate_closed([], ["slo"])}
    assert ids == {"slo_realtime_tpot_p99", "slo_bulk_vs_bound", "slo_both_ttft_p99",
                   "slo_both_tpot_p99"}  # fmt: skip
    assert all(t.id.startswith("outage_") for t in evaluate_closed([], ["outage"]))
    assert evaluate_closed([], ["control"]) == []


def test_a_step_model_server_is_two_simulator_flags_and_the_bound_follows_them() -> None:
    model = sim_model(
        ["--speed", "10", "--step-base-ms", "10", "--step-per-sequence-ms", "1"], max_tokens=64
    )
    # 10 ms + 1 ms a running sequence, ten times faster.
    assert (model.base, model.per_sequence, model.speed) == (0.01, 0.001, 10)


def test_the_prefill_cost_is_seconds_or_fit_and_nothing_else() -> None:
    def parsed(value: str) -> object:
        args = build_parser().parse_args(["--scenario", "slo", "--slo-prefill-cost", value])
        return config_from_args(args).slo_prefill_cost

    assert parsed("fit") == "fit"
    assert parsed("2e-05") == pytest.approx(2e-5)
    for bad in ("0", "-1e-5", "inf", "fast"):
        with pytest.raises(SystemExit):
            parsed(bad)


def test_a_stated_prefill_cost_is_passed_on_as_given() -> None:
    runner = SimpleNamespace(config=BenchConfig(slo_prefill_cost=3e-5), notes=[])
    assert closedplan._prefill_cost(runner) == pytest.approx(3e-5)  # type: ignore[arg-type]
    assert runner.notes == []


class _Recorded:
    """What a closed-loop plan asked a runner for, answered with made-up idle
    latencies (no server)."""

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.server = SimpleNamespace(sim_args=None, model="m", base_url="http://127.0.0.1:0/v1")
        self.notes: list[str] = []
        self.jobs: list[dict[str, Any]] = []

    def job(self, **fields: Any) -> dict[str, Any]:
        return fields

    def run(self, job: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
        self.jobs.append(job)
        timing = {"realtime": SimpleNamespace(p50=0.01)}
        return SimpleNamespace(
            ttft=timing, tpot=timing, label=job["label"], latency={}, prompts_per_s=1.0
        )


@pytest.mark.parametrize("pace", [False, True])
def test_slo_pace_paces_the_frontiers_controller_and_no_static_setting(pace: bool) -> None:
    config = BenchConfig(
        frontier_caps=(1, 8),
        frontier_batches=(8,),
        frontier_rounds=1,
        frontier_confirm=0,
        slo_pace=pace,
    )
    runner = _Recorded(config)
    closedplan.frontier(runner, [])  # type: ignore[arg-type]
    mixed = [job for job in runner.jobs if job["kind"] == "mixed"]
    controller = [job for job in mixed if job["label"] == closedplan.FRONTIER_CONTROLLER]
    assert len(controller) == 1
    assert len(mixed) == 3
    assert controller[0]["slo_pace"] is pace
    assert not any(job.get("slo_pace") for job in mixed if job not in controller)
