"""The conformance matrix's rows and its summary of the bench's slo report."""

from __future__ import annotations

from typing import Any

import pytest

from llmbatch_bench.cli import build_parser, config_from_args
from llmbatch_bench.closedloop.stepmodel import sim_model
from llmbatch_bench.experiments.matrix import (
    ROWS,
    _bench_args,
    _parser,
    render,
    row_prefill_cost,
    summarize_row,
)


def _run(label: str, tokens_per_s: float, p99: float | None = None) -> dict[str, Any]:
    extra = {"slo_tpot_s": 0.01, "bound": {"tokens_per_s": 1000.0}, "inferences": []}
    return {
        "scenario": "slo",
        "label": label,
        "output_tokens_per_s": tokens_per_s,
        "tpot": {"realtime": {"p99": p99}},
        "extra": extra,
    }


def test_a_row_is_judged_against_the_slo_the_bound_and_its_own_no_slo_rate() -> None:
    report = {"runs": [_run("llmbatch, SLO", 800.0, 0.0105), _run("llmbatch, no SLO", 1000.0)]}
    row = summarize_row("vllm-full", "full signals", report)
    assert row["p99_over_slo"] == pytest.approx(1.05)
    assert row["bulk_over_bound"] == pytest.approx(0.8)
    assert row["bulk_over_no_slo"] == pytest.approx(0.8)
    table = render([row])
    assert "| vllm-full" in table
    assert "1.05x" in table


def test_every_simulated_row_is_a_simulator_the_bench_can_bound() -> None:
    for row in ROWS:
        sim_model(row.sim_args.split(), max_tokens=64)  # the bench's own parser takes it
        argv = _bench_args(row, _parser().parse_args(["--smoke"]))
        config = config_from_args(build_parser().parse_args(argv))
        assert config.scenarios == ("slo",)
    assert {r.name for r in ROWS} >= {"transient-queue", "step-model", "refusals-503"}


def test_a_rows_prefill_cost_is_its_step_models_over_its_speed() -> None:
    row = next(r for r in ROWS if r.name == "long-prompts")  # --speed 10
    assert row_prefill_cost(row) == pytest.approx(0.0002 / 10)
    argv = _bench_args(row, _parser().parse_args(["--pace", "--prefill-cost"]))
    config = config_from_args(build_parser().parse_args(argv))
    assert config.slo_pace is True
    assert config.slo_prefill_cost == pytest.approx(0.00002)
    unstated = config_from_args(
        build_parser().parse_args(_bench_args(row, _parser().parse_args([])))
    )
    assert unstated.slo_prefill_cost is None
