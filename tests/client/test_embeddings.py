"""Embeddings through the batching client, against a real simulator process: texts
from many calls share /v1/embeddings requests, in order, isolated, decoded."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

import llmbatch
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator(
        "--zero-latency", "--max-model-len", "256", "--embedding-dim", "64"
    ) as server:
        yield server


async def test_one_text_and_a_list_give_the_same_vectors(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        one = await client.embed("the quick brown fox")
        many = await client.embed([f"text {i}" for i in range(50)] + ["the quick brown fox"])
        stats = client.stats()
    assert one.object == "embedding"
    assert len(one.embedding) == 64
    assert math.isclose(math.fsum(v * v for v in one.embedding), 1.0, rel_tol=1e-6)
    assert len(many) == 51
    assert many[-1].embedding == one.embedding  # same text, same vector, in input order
    assert stats.batches_sent < 51  # the list went out in batches
    assert one.usage.prompt_tokens > 0
    assert one.usage.completion_tokens == 0


async def test_map_over_inputs_fails_a_too_long_text_alone(sim: SimulatorProcess) -> None:
    items = [{"input": f"short text {i}", "metadata": i} for i in range(40)]
    items[17] = {"input": "word " * 400, "metadata": 17}  # far past 256 tokens
    async with llmbatch.Client(sim.base_url) as client:
        results = await client.map(items)
    assert [r.metadata for r in results] == list(range(40))
    assert [i for i, r in enumerate(results) if not r.ok] == [17]
    assert isinstance(results[17].error, llmbatch.LLMBatchError)
    assert all(isinstance(r.unwrap(), llmbatch.Embedding) for r in results if r.ok)


async def test_base64_vectors_are_decoded(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        plain = await client.embed("hello")
        packed = await client.embed("hello", encoding_format="base64")
    assert len(packed.embedding) == len(plain.embedding)
    assert all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)
        for a, b in zip(plain.embedding, packed.embedding, strict=True)
    )


async def test_a_list_fails_as_a_whole_with_its_first_error(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        with pytest.raises(llmbatch.InvalidRequestError, match="input must not be empty"):
            await client.embed(["fine", ""])
        with pytest.raises(TypeError, match="did you mean 'dimensions'"):
            await client.embed("x", dimension=8)
