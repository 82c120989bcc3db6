"""The client against a real HTTP server: the simulator, as a subprocess on 127.0.0.1.

Runs on asyncio (aiohttp and httpx transports), asyncio+uvloop and trio (httpx).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import anyio
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


STORY = "Tell me a story"


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
async def test_stream_chunks_add_up_to_the_non_streamed_answer(
    sim: Any, transport: str, chat: bool
) -> None:
    prompt: Any = [{"role": "user", "content": STORY}] if chat else STORY
    options: dict[str, Any] = {"max_tokens": 12, "ignore_eos": True, "seed": 5}
    async with Client(sim.base_url, transport=transport, retry=FAST_RETRY) as client:  # type: ignore[arg-type]
        chunks = [chunk async for chunk in client.stream_chunks(prompt, **options)]
        if chat:
            answer: Any = await client.chat(prompt, **options)
        else:
            answer = await client.complete(prompt, **options)
    kind = llmbatch.ChatCompletionChunk if chat else llmbatch.CompletionChunk
    assert all(type(chunk) is kind for chunk in chunks)
    assert len(chunks) >= 13  # a chunk per token, then the usage
    assert "".join(chunk.text for chunk in chunks) == answer.text
    assert [c.finish_reason for c in chunks if c.finish_reason] == [answer.finish_reason]
    assert answer.finish_reason == "length"
    assert chunks[-1].choices == ()
    assert chunks[-1].usage == answer.usage
    assert answer.usage.completion_tokens == 12
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert len({chunk.id for chunk in chunks}) == 1
    assert {chunk.model for chunk in chunks} == {answer.model}
    if chat:
        assert chunks[0].choices[0].delta.role == "assistant"


def aborted(sim: Any) -> int:
    """Requests the simulator aborted because their client went away."""
    match = re.search(r'finished_reason="abort"\} (\d+)', sim.metrics())
    assert match is not None
    return int(match.group(1))


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[Any]:
    """~2 ms a token: at --speed 200 the simulator runs a stream to its end before it
    notices that the client has hung up."""
    with testing.run_simulator("--speed", "10") as server:
        yield server


async def test_leaving_stream_chunks_early_aborts_on_the_server(
    slow_sim: Any, transport: str
) -> None:
    before = await anyio.to_thread.run_sync(aborted, slow_sim)
    async with Client(slow_sim.base_url, transport=transport, retry=FAST_RETRY) as client:  # type: ignore[arg-type]
        # 2,000 tokens would take the simulator about five seconds.
        chunks = client.stream_chunks(STORY, max_tokens=2000, ignore_eos=True)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                assert chunk.text
                break
        with anyio.fail_after(3):
            # The simulator's counter has no event to wait on: poll it.
            while await anyio.to_thread.run_sync(aborted, slow_sim) == before:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        tier = client.stats().tiers[llmbatch.Priority.REALTIME]
    assert (tier.cancelled, tier.done) == (1, 0)


async def test_an_error_event_mid_stream_raises_the_typed_error(sim: Any, transport: str) -> None:
    received: list[str] = []
    await anyio.to_thread.run_sync(lambda: sim.set_faults(stream_error=1.0))
    try:
        async with Client(sim.base_url, transport=transport, retry=FAST_RETRY) as client:  # type: ignore[arg-type]
            with pytest.raises(llmbatch.ServerError, match="during generation") as info:
                async for chunk in client.stream_chunks(STORY, max_tokens=12, ignore_eos=True):
                    received.append(chunk.text)
    finally:
        await anyio.to_thread.run_sync(lambda: sim.set_faults(stream_error=0.0))
    assert len(received) == 3  # the simulator fails after three tokens
    assert info.value.attempts == 1  # chunks had been handed over: not retried


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


async def test_an_unknown_model_says_which_the_server_has(sim: Any, transport: str) -> None:
    async with Client(sim.base_url, transport=transport, retry=FAST_RETRY) as client:  # type: ignore[arg-type]
        with pytest.raises(llmbatch.NotFoundError) as info:
            await client.complete("Hello", model="gpt-4", max_tokens=2)
        with pytest.raises(llmbatch.NotFoundError) as streamed:
            async for _ in client.stream("Hello", model="gpt-4", max_tokens=2):
                pass
    for error in (info.value, streamed.value):
        assert f"({sim.base_url} serves 'llmbatch-sim')" in str(error)
        assert error.attempts == 1  # a 404 is not retried
