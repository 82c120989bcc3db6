"""``llmbatch-server sim``'s switches become the configuration they name."""

from __future__ import annotations

import argparse

import pytest

from llmbatch_server.sim import options
from llmbatch_server.sim.metrics import EngineMetrics, render


def _config(*argv: str) -> options.SimConfig:
    parser = argparse.ArgumentParser()
    options.add_parser(parser.add_subparsers())
    return options.config_from_args(parser.parse_args(["sim", *argv]))


def test_jitter_and_preemption_are_off_unless_asked() -> None:
    config = _config()
    assert config.step.jitter == 0.0
    assert config.limits.preemption is False
    asked = _config("--step-jitter", "0.3", "--preemption")
    assert asked.step.jitter == 0.3
    assert asked.limits.preemption is True


def test_the_queue_gauge_is_vllms_per_step_reading_unless_asked_live() -> None:
    assert _config().queue_gauge == "step"
    assert _config("--queue-gauge", "live").queue_gauge == "live"
    with pytest.raises(SystemExit):
        _config("--queue-gauge", "sometimes")


@pytest.mark.parametrize("value", ["-0.1", "1", "2.5"])
def test_a_jitter_outside_its_range_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ValueError, match="--step-jitter must be in"):
        _config("--step-jitter", value)


def test_metrics_count_preemptions_under_vllms_name() -> None:
    metrics = EngineMetrics(preemptions=3)
    body = render(metrics, model="m", running=0, waiting=0, kv_usage=0.0)
    assert 'vllm:num_preemptions_total{model_name="m"} 3' in body
