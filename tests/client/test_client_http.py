"""The client against a real HTTP server: the simulator, as a subprocess on 127.0.0.1.

Runs on asyncio (aiohttp and httpx transports), asyncio+uvloop and trio (httpx).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import llmbatch
from llmbatch import BadRequestError, Client, RetryPolicy

testing = pytest.importorskip("llmbatch_server.testing")

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.05)
BACKENDS = [
    pytest.param((("asyncio", {}), "aiohttp"), id="asyncio-aiohttp"),
    pytest.param((("asyncio", {}), "httpx"), id="asyncio-httpx"),
    pytest.param((("asyncio", {"use_uvloop": True}), "aiohttp"), id="uvloop-aiohttp"),
    pytest.param((("trio", {}), "httpx"), id="trio-httpx"),
]


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with testing.run_simulator("--speed", "200", "--poison", "POISON", "--enable-admin") as server:
        yield server


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> tuple[tuple[str, dict[str, Any]], str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def anyio_backend(backend: tuple[tuple[str, dict[str, Any]], str]) -> tuple[str, dict[str, Any]]:
    return backend[0]


@pytest.fixture
def transport(backend: tuple[tuple[str, dict[str, Any]], str]) -> str:
    return backend[1]


async def test_complete_map_chat_stream(sim: Any, transport: str) -> None:
    async with Client(sim.base_url, transport=transport, retry=FAST_RETRY) as client:  # type: ignore[arg-type]
        assert client.model
        assert client.max_model_len
        one = await client.complete("Hello there", priority="realtime", max_tokens=8)
        assert one.text
        assert one.usage.completion_tokens <= 8
        prompts = [f"prompt {i}" for i in range(100)]
        results = await client.map(prompts, max_tokens=4, ignore_eos=True)
        assert all(r.ok for r in results)
        assert all(r.unwrap().usage.completion_tokens == 4 for r in results)
        chat = await client.chat([{"role": "user", "content": "hi"}], max_tokens=6)
        assert chat.text
        deltas = [d async for d in client.stream("Tell me a story", max_tokens=12)]
        assert len(deltas) >= 2
        stats = client.stats()
    # 100 bulk prompts went out in far fewer HTTP requests than prompts.
    assert stats.mean_batch_size > 4
    assert stats.tiers[llmbatch.Priority.BATCH].done == 100


async def test_poisoned_prompt_is_isolated_by_bisection(sim: Any, transport: str) -> None:
    prompts = [f"item {i}" for i in range(40)]
    prompts[7] = "POISON item"
    prompts[29] = "also POISON"
    async with Client(sim.base_url, transport=transport, retry=FAST_RETRY) as client:  # type: ignore[arg-type]
        results = await client.map(prompts, max_tokens=2)
    failed = {r.index for r in results if not r.ok}
    assert failed == {7, 29}
    for index in failed:
        assert isinstance(results[index].error, BadRequestError)
    assert sum(r.ok for r in results) == 38


async def test_too_long_prompt_fails_at_the_call(sim: Any, transport: str) -> None:
    async with Client(sim.base_url, transport=transport) as client:  # type: ignore[arg-type]
        assert client.max_model_len is not None
        with pytest.raises(llmbatch.InvalidRequestError):
            await client.complete("x " * (client.max_model_len * 16), max_tokens=1)
        assert (await client.complete("fine", max_tokens=1)).text is not None
