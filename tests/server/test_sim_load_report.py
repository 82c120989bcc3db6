"""The ``endpoint-load-metrics`` response header (vLLM's ORCA load report)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from llmbatch_server.sim.metrics import load_report
from llmbatch_server.testing import SimulatorProcess, run_simulator

ASK = {"endpoint-load-metrics-format": "json"}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    # Priority scheduling and a small KV cache let a test hold one request running
    # and one waiting (too big for the cache) while a small, urgent one finishes.
    with run_simulator(
        "--speed", "1", "--scheduling-policy", "priority", "--kv-cache-tokens", "6000"
    ) as server:
        yield server


def _gauge(metrics_text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", metrics_text, re.M)
    assert match, name
    return float(match.group(1))


def test_report_format_matches_vllm() -> None:
    report = load_report("JSON", waiting=3, kv_usage=0.25)
    assert report == {
        "endpoint-load-metrics": 'JSON {"named_metrics": '
        '{"num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.25}}'
    }
    assert load_report("text", waiting=0, kv_usage=0.5) == {
        "endpoint-load-metrics": "TEXT named_metrics.num_requests_waiting=0.0, "
        "named_metrics.kv_cache_usage_perc=0.5"
    }
    assert load_report("xml", waiting=0, kv_usage=0.0) == {}


def test_header_reports_the_load_the_response_left(sim: SimulatorProcess) -> None:
    hold = {"max_tokens": 4000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=sim.url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json={"prompt": "hold", **hold}) as running,
    ):
        lines = running.iter_lines()  # kept: dropping the iterator would close the stream
        next(lines)  # a first token: it runs, holding its KV cache
        # Too big for the cache that is left: it waits until `running` ends.
        with http.stream("POST", "/v1/completions", json={"prompt": "wait", **hold}) as waiting:
            assert waiting.status_code == 200
            r = http.post(
                "/v1/completions",
                json={"prompt": "urgent", "max_tokens": 2, "priority": -1},
                headers=ASK,
            )
            assert r.status_code == 200
            kind, _, data = r.headers["endpoint-load-metrics"].partition(" ")
            assert kind == "JSON"
            named = json.loads(data)["named_metrics"]
            assert set(named) == {"kv_cache_usage_perc", "num_requests_waiting"}
            assert named["num_requests_waiting"] == 1.0
            assert 0.0 < named["kv_cache_usage_perc"] < 1.0
            # Nothing changes until `running` ends, so /metrics agrees exactly.
            text = http.get("/metrics").text
            assert _gauge(text, "vllm:num_requests_waiting") == named["num_requests_waiting"]
            assert _gauge(text, "vllm:kv_cache_usage_perc") == named["kv_cache_usage_perc"]


def test_header_only_when_asked_and_only_where_vllm_sends_it(sim: SimulatorProcess) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(base_url=sim.url, timeout=60) as http:
        plain = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert "endpoint-load-metrics" not in plain.headers
        text = http.post(
            "/v1/chat/completions", json=chat, headers={"endpoint-load-metrics-format": "TEXT"}
        )
        assert text.headers["endpoint-load-metrics"].startswith(
            "TEXT named_metrics.num_requests_waiting="
        )
        other = http.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 2},
            headers={"endpoint-load-metrics-format": "proto"},
        )
        assert "endpoint-load-metrics" not in other.headers
        stream = http.post("/v1/chat/completions", json={**chat, "stream": True}, headers=ASK)
        assert "endpoint-load-metrics" not in stream.headers
        batch = http.post(
            "/v1/chat/completions/batch",
            json={"messages": [chat["messages"]], "max_tokens": 2},
            headers=ASK,
        )
        assert batch.status_code == 200
        assert "endpoint-load-metrics" not in batch.headers
        error = http.post("/v1/completions", json={"prompt": []}, headers=ASK)
        assert error.status_code == 400
        assert "endpoint-load-metrics" not in error.headers


@pytest.mark.parametrize(
    ("args", "gauges", "histograms", "header"),
    [
        pytest.param(("--metrics", "gauges"), True, False, True, id="gauges-only"),
        pytest.param(("--metrics", "none", "--no-load-header"), False, False, False, id="none"),
    ],
)
def test_the_simulator_can_expose_less_than_vllm(
    args: tuple[str, ...], gauges: bool, histograms: bool, header: bool
) -> None:
    # Servers that are not vLLM, or sit behind a proxy that filters /metrics, expose
    # less: the client's control loop is tested against each kind.
    with (
        run_simulator("--zero-latency", *args) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        answer = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=ASK)
        assert answer.status_code == 200
        assert ("endpoint-load-metrics" in answer.headers) is header
        metrics = http.get("/metrics")
        assert metrics.status_code == (200 if gauges else 404)
        assert ("vllm:num_requests_running{" in metrics.text) is gauges
        assert ("vllm:inter_token_latency_seconds_sum" in metrics.text) is histograms
        assert ("vllm:time_to_first_token_seconds_sum" in metrics.text) is histograms
