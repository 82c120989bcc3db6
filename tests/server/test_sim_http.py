"""The simulator as a real process on 127.0.0.1: vLLM's API, errors and faults."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmbatch_server.testing import SimulatorProcess, run_simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator(
        "--speed", "200", "--poison", "POISON", "--enable-admin", "--max-model-len", "512"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def http(sim: SimulatorProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        yield client


def _events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_list_prompt_choices_are_indexed_prompt_times_n(http: httpx.Client) -> None:
    r = http.post(
        "/v1/completions",
        json={"prompt": ["one two", "three"], "n": 2, "max_tokens": 5, "ignore_eos": True},
    )
    assert r.status_code == 200
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert all(len(c["text"].split()) == 5 for c in body["choices"])
    # BOS + words: 3 + 2 prompt tokens, counted once per prompt.
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 20,
        "total_tokens": 25,
        "prompt_tokens_details": None,
    }
    assert body["object"] == "text_completion"


def test_output_is_deterministic_and_eos_ends_early(http: httpx.Client) -> None:
    body = {"prompt": "same prompt", "max_tokens": 400}
    a = http.post("/v1/completions", json=body).json()["choices"][0]
    b = http.post("/v1/completions", json=body).json()["choices"][0]
    assert a == b
    assert a["finish_reason"] == "stop"
    assert 8 <= len(a["text"].split()) < 400
    seeded = http.post("/v1/completions", json={**body, "seed": 7}).json()["choices"][0]
    assert seeded["text"] != a["text"]


def test_stop_string_ends_the_text_before_it(http: httpx.Client) -> None:
    full = http.post(
        "/v1/completions", json={"prompt": "p", "max_tokens": 30, "ignore_eos": True}
    ).json()
    words = full["choices"][0]["text"].split()
    stop_word = words[4]
    cut = http.post(
        "/v1/completions",
        json={"prompt": "p", "max_tokens": 30, "ignore_eos": True, "stop": [stop_word]},
    ).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop_word
    assert stop_word not in choice["text"].split()
    assert choice["text"].split() == words[: words.index(stop_word)]


def test_streamed_list_interleaves_choices_and_ends_with_usage(http: httpx.Client) -> None:
    r = http.post(
        "/v1/completions",
        json={
            "prompt": ["a", "b", "c"],
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 12
    chunks = events[:-2]
    assert all(len(c["choices"]) == 1 for c in chunks)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for c in chunks:
        choice = c["choices"][0]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    whole = http.post(
        "/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 4, "ignore_eos": True}
    ).json()
    assert [texts[i] for i in range(3)] == [c["text"] for c in whole["choices"]]


def test_chat_and_chat_stream(http: httpx.Client) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6}).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    r = http.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 6, "stream": True}
    )
    events = _events(r.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(e["choices"][0]["delta"]["content"] for e in events[:-1])
    assert streamed == body["choices"][0]["message"]["content"]


def test_models_health_version_tokenize_metrics(http: httpx.Client) -> None:
    card = http.get("/v1/models").json()["data"][0]
    assert card["id"] == "llmbatch-sim"
    assert card["max_model_len"] == 512
    assert http.get("/health").status_code == 200
    assert "version" in http.get("/version").json()
    tok = http.post("/tokenize", json={"prompt": "Hello, world"}).json()
    assert tok["count"] == 4
    assert len(tok["tokens"]) == 4
    text = http.get("/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
    ):
        assert name in text


def test_metrics_count_http_requests_as_vllm_does(http: httpx.Client) -> None:
    def counts() -> dict[str, float]:
        out: dict[str, float] = {}
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("http_requests_total{"):
                labels, value = line.rsplit(" ", 1)
                out[labels.removeprefix("http_requests_total")] = float(value)
        return out

    before = counts()
    http.post("/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2})
    http.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    http.post("/v1/embeddings", json={"input": ["a", "b"]})
    http.get("/v1/models")
    http.get("/health")
    http.get("/no/such/route")
    after = counts()
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    # One per HTTP request whatever it carries; /metrics and /health are not counted.
    assert delta == {
        '{handler="/v1/completions",method="POST",status="2xx"}': 1,
        '{handler="/v1/completions",method="POST",status="4xx"}': 1,
        '{handler="/v1/embeddings",method="POST",status="2xx"}': 1,
        '{handler="/v1/models",method="GET",status="2xx"}': 1,
        '{handler="none",method="GET",status="4xx"}': 1,
    }


def test_one_too_long_prompt_fails_the_whole_list(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": ["ok", "x " * 600], "max_tokens": 4})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400
    assert "maximum context length is 512 tokens" in error["message"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"prompt": []}, 400),
        ({"prompt": 5}, 400),
        ({"prompt": "x", "max_tokens": 0}, 400),
        ({"prompt": "x", "max_tokens": "many"}, 400),
        ({"prompt": "x", "n": 0}, 400),
        ({"prompt": "x", "temperature": -1}, 400),
        ({"prompt": "x", "stop": 3}, 400),
        ({"prompt": "x", "model": "other"}, 404),
        ({"prompt": ["fine", "has POISON in it"]}, 400),
    ],
    ids=[
        "empty-list",
        "int-prompt",
        "zero-max-tokens",
        "str-max-tokens",
        "zero-n",
        "negative-temperature",
        "bad-stop",
        "unknown-model",
        "poison",
    ],
)
def test_bad_requests_get_vllm_error_json(
    http: httpx.Client, body: dict[str, Any], status: int
) -> None:
    r = http.post("/v1/completions", json=body)
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_invalid_json_is_400(http: httpx.Client) -> None:
    r = http.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400


def test_runtime_faults_via_admin(sim: SimulatorProcess, http: httpx.Client) -> None:
    body = {"prompt": "x", "max_tokens": 2}
    try:
        sim.set_faults(error_429=1.0, retry_after=3)
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
        sim.set_faults(error_429=0.0, error_503=1.0)
        assert http.post("/v1/completions", json=body).status_code == 503
        sim.set_faults(error_503=0.0, error_500=1.0)
        assert http.post("/v1/completions", json=body).status_code == 500
        sim.set_faults(error_500=0.0, drop=1.0)
        with pytest.raises(httpx.TransportError):
            http.post("/v1/completions", json=body)
        sim.set_faults(drop=0.0, stream_error=1.0)
        events = _events(
            http.post(
                "/v1/completions",
                json={"prompt": "x", "max_tokens": 10, "ignore_eos": True, "stream": True},
            ).text
        )
        assert events[-2]["error"]["code"] == 500
        assert events[-1] == "[DONE]"
        state = sim.set_faults(stream_error=0.0)
        assert state["injected"]["429"] == 1
        assert state["injected"]["drop"] == 1
        assert http.post("/admin/faults", json={"error_500": 2}).status_code == 400
        assert http.post("/admin/faults", json={"nonsense": 1}).status_code == 400
    finally:
        sim.set_faults(error_500=0, error_429=0, error_503=0, drop=0, stream_error=0)
    assert http.post("/v1/completions", json=body).status_code == 200


def test_api_key_queue_cap_and_no_admin_by_default() -> None:
    with (
        run_simulator(
            "--speed", "0.5", "--max-num-seqs", "1", "--max-num-queued-reqs", "2", api_key="sekret"
        ) as sim,
        httpx.Client(base_url=sim.url, timeout=30) as http,
    ):
        assert http.post("/v1/completions", json={"prompt": "x"}).status_code == 401
        assert http.get("/health").status_code == 200  # health stays open, like vLLM
        auth = {"Authorization": "Bearer sekret"}
        assert http.get("/v1/models", headers=auth).status_code == 200
        assert http.get("/admin/faults", headers=auth).status_code == 404
        r = http.post(
            "/v1/completions", headers=auth, json={"prompt": ["a", "b", "c", "d"], "max_tokens": 1}
        )
        assert r.status_code == 503
        assert "sekret" not in sim.log_tail()


def test_refuses_public_bind_without_api_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmbatch_server", "sim", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "refusing to bind non-loopback host" in result.stderr
