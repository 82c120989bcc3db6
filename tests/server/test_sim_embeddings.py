"""``POST /v1/embeddings``: vLLM's embedding route on the simulator."""

from __future__ import annotations

import array
import base64
import math
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmbatch_server.testing import SimulatorProcess, run_simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--speed", "200", "--max-model-len", "64", "--poison", "POISON") as s:
        yield s


@pytest.fixture(scope="module")
def http(sim: SimulatorProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        yield client


def _embed(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/embeddings", json=body)


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def test_one_text_gets_a_deterministic_unit_vector(http: httpx.Client) -> None:
    r = _embed(http, input="The quick brown fox", model="llmbatch-sim")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert body["id"].startswith("embd-")
    assert body["model"] == "llmbatch-sim"
    (item,) = body["data"]
    assert (item["index"], item["object"]) == (0, "embedding")
    assert len(item["embedding"]) == 384
    assert _norm(item["embedding"]) == pytest.approx(1.0)
    again = _embed(http, input="The quick brown fox").json()["data"][0]["embedding"]
    assert again == item["embedding"]
    count = http.post("/tokenize", json={"prompt": "The quick brown fox"}).json()["count"]
    assert body["usage"] == {
        "prompt_tokens": count,
        "total_tokens": count,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def test_a_list_of_texts_and_token_ids(http: httpx.Client) -> None:
    texts = ["alpha", "beta", "alpha"]
    body = _embed(http, input=texts).json()
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert vectors[0] == vectors[2]
    cosine = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    assert abs(cosine) < 0.3  # unrelated inputs: nearly orthogonal
    ids = _embed(http, input=[[5, 6, 7], [8, 9]]).json()
    assert ids["usage"]["prompt_tokens"] == 5  # token ids are taken as given
    flat = _embed(http, input=[5, 6, 7]).json()
    assert flat["data"][0]["embedding"] == ids["data"][0]["embedding"]


def test_base64_is_float32_of_the_same_vector(http: httpx.Client) -> None:
    floats = _embed(http, input="same").json()["data"][0]["embedding"]
    encoded = _embed(http, input="same", encoding_format="base64").json()["data"][0]["embedding"]
    decoded = array.array("f", base64.b64decode(encoded)).tolist()
    assert decoded == pytest.approx(floats, abs=1e-6)


def test_openai_client_reads_the_answer(sim: SimulatorProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=sim.base_url, api_key="unused")
    # openai-python asks for base64 and decodes it itself.
    result = client.embeddings.create(model="llmbatch-sim", input=["one", "two"])
    assert [len(d.embedding) for d in result.data] == [384, 384]
    assert result.usage.prompt_tokens == result.usage.total_tokens > 0


def test_normalize_false_and_truncation(http: httpx.Client) -> None:
    raw = _embed(http, input="raw", normalize=False).json()["data"][0]["embedding"]
    assert _norm(raw) != pytest.approx(1.0)
    long_text = "word " * 100  # more than --max-model-len 64
    cut = _embed(http, input=long_text, truncate_prompt_tokens=10).json()
    assert cut["usage"]["prompt_tokens"] == 10
    whole = _embed(http, input=long_text, truncate_prompt_tokens=-1).json()
    assert whole["usage"]["prompt_tokens"] == 64


@pytest.mark.parametrize(
    ("body", "status", "pattern"),
    [
        ({"input": "word " * 100}, 400, "maximum context length is 64 tokens"),
        ({"input": ["ok", "word " * 100]}, 400, "for embedding generation"),
        ({"input": "x", "dimensions": 8}, 400, "does not support matryoshka"),
        ({"input": "x", "model": "other"}, 404, "does not exist"),
        ({"input": []}, 400, "input"),
        ({"input": 3}, 400, "input"),
        ({"input": ["fine", "POISON"]}, 400, "simulated bad input"),
        ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"input": "x", "encoding_format": "bytes"}, 400, "not supported by the simulator"),
        ({"input": "x", "truncate_prompt_tokens": 65}, 400, "greater than max_model_len"),
    ],
    ids=[
        "too-long",
        "one-too-long",
        "dimensions",
        "unknown-model",
        "empty",
        "int",
        "poison",
        "bad-encoding",
        "bytes-encoding",
        "truncate-too-far",
    ],
)
def test_errors(http: httpx.Client, body: dict[str, Any], status: int, pattern: str) -> None:
    r = http.post("/v1/embeddings", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["code"] == status
    assert re.search(pattern, error["message"] + str(error["param"]))


def test_embeddings_run_through_the_engine(sim: SimulatorProcess, http: httpx.Client) -> None:
    def prompt_tokens() -> float:
        match = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", sim.metrics(), re.M)
        assert match
        return float(match.group(1))

    before, cache_before = prompt_tokens(), sim.prefix_cache()
    body = _embed(http, input=["count me", "and me too"]).json()
    assert prompt_tokens() - before == body["usage"]["prompt_tokens"]
    # Embeddings do not use the prefix cache: no lookups counted.
    assert sim.prefix_cache() == cache_before


def test_embedding_dim_option() -> None:
    with run_simulator("--speed", "200", "--embedding-dim", "8") as sim:
        r = httpx.post(sim.base_url + "/embeddings", json={"input": "x"}, timeout=30)
        assert len(r.json()["data"][0]["embedding"]) == 8
