"""The gauge series tool: parsing /metrics, and a real run against the simulator."""

from __future__ import annotations

import json
import pathlib

import pytest

from llmbatch_bench.gauges import gauge_values, main, summarize
from llmbatch_server.testing import run_simulator


def test_gauges_are_read_from_vllm_and_llama_cpp_names() -> None:
    vllm = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a"} 3\n'
        'vllm:num_requests_waiting{model_name="b"} 2\n'
        'vllm:num_requests_running{model_name="a"} 7.0\n'
    )
    assert gauge_values(vllm) == {"waiting": 5.0, "running": 7.0}
    llama = "llamacpp:requests_deferred 1\nllamacpp:requests_processing 16\n"
    assert gauge_values(llama) == {"waiting": 1.0, "running": 16.0}
    assert gauge_values("other_metric 4\n") == {}


def test_mean_and_p90_by_nearest_rank() -> None:
    assert summarize([float(x) for x in range(1, 11)]) == {"mean": 5.5, "p90": 9.0}
    assert summarize([])["mean"] != summarize([])["mean"]  # nan: no samples


def test_a_run_against_the_simulator_samples_both_gauges(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "g.json"
    with run_simulator("--speed", "20", "--max-num-seqs", "8") as sim:
        assert (
            main(["--url", sim.base_url, "--seconds", "1", "--warmup", "0.5", "--json", str(out)])
            == 0
        )
    result = json.loads(out.read_text())
    assert result["samples"] >= 10
    assert 0 < result["running"]["mean"] <= 8
    assert result["running"]["p90"] == pytest.approx(8, abs=1)
