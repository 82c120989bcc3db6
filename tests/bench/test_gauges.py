"""The gauge series tool: parsing /metrics, and a real run against the simulator."""

from __future__ import annotations

import json
import pathlib

import pytest

from llmbatch_bench.experiments.gauges import gauge_values, main, pool, summarize
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
    reads = result["series"]["reads"]
    assert result["series"]["fields"] == ["t", "waiting", "running"]
    assert len(reads) == result["samples"]
    assert [read[0] for read in reads] == sorted(read[0] for read in reads)
    assert max(read[2] for read in reads) <= 8


def _run(reads: list[list[float]]) -> dict[str, object]:
    return {
        "url": "u",
        "seconds": 1.0,
        "interval": 0.05,
        "max_tokens": 4,
        "series": {"fields": ["t", "waiting", "running"], "reads": reads},
    }


def test_pooled_runs_are_summarized_over_every_read() -> None:
    first = _run([[0.0, 0.0, 10.0], [0.05, 2.0, 20.0]])
    second = _run([[0.0, 40.0, 64.0], [0.05, float("nan"), 64.0]])
    pooled = pool([first, second])
    assert pooled["samples"] == 4
    assert pooled["running"] == {"mean": 39.5, "p90": 64.0}
    # a read that lacked a gauge is left out of that gauge only
    assert pooled["waiting"]["mean"] == pytest.approx(14.0)
    assert len(pooled["rounds"]) == 2
    with pytest.raises(ValueError, match="at least one run"):
        pool([])


def test_rounds_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--url", "http://127.0.0.1:9/v1", "--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
