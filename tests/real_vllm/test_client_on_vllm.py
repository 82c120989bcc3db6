"""The ``llmbatch`` client end to end against a real vLLM.

Skips cleanly while the client's public API is not all there yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

llmbatch = pytest.importorskip("llmbatch")
for _name in ("Client", "Result", "LLMBatchError"):
    if not hasattr(llmbatch, _name):
        pytest.skip(f"llmbatch.{_name} is not available yet", allow_module_level=True)

if TYPE_CHECKING:
    from conftest import RunningServer  # tests/real_vllm/conftest.py

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]


def client(server: RunningServer, **options: Any) -> Any:
    return llmbatch.Client(base_url=server.base_url, model=None, **options)


async def test_complete_realtime(vllm_server: RunningServer) -> None:
    async with client(vllm_server) as c:
        completion = await c.complete("Hello", priority="realtime", max_tokens=16)
    assert isinstance(completion.text, str)
    assert completion.finish_reason in ("length", "stop")
    assert 0 < completion.usage.completion_tokens <= 16


async def test_map_keeps_order(vllm_server: RunningServer) -> None:
    prompts = [f"Count to {i}:" for i in range(40)]
    async with client(vllm_server) as c:
        results = await c.map(prompts, max_tokens=8)
    assert len(results) == len(prompts)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert all(isinstance(r.value.text, str) for r in results)


async def test_map_isolates_a_too_long_prompt(vllm_server: RunningServer) -> None:
    """vLLM fails a whole list on one long prompt; the client must fail only that item."""
    too_long = "hello world " * vllm_server.max_model_len
    prompts = ["a", "b", too_long, "c", "d"]
    async with client(vllm_server) as c:
        results = await c.map(prompts, max_tokens=4)
    assert [r.ok for r in results] == [True, True, False, True, True]
    assert isinstance(results[2].error, llmbatch.LLMBatchError)


async def test_stream_yields_text(vllm_server: RunningServer) -> None:
    async with client(vllm_server) as c:
        deltas = [delta async for delta in c.stream("Once upon a time", max_tokens=12)]
    assert deltas
    assert all(isinstance(d, str) for d in deltas)


async def test_priority_scheduling_with_suggested_limits(vllm_server: RunningServer) -> None:
    """The settings the launcher prints are accepted by the client as they are."""
    from llmbatch_server.launcher import build_argv, suggested_client_settings

    settings = suggested_client_settings(build_argv(model=vllm_server.model, profile="latency"))
    limits = llmbatch.Limits(**settings["limits"])
    async with client(
        vllm_server, limits=limits, priority_scheduling=settings["priority_scheduling"]
    ) as c:
        realtime = await c.complete("hi", priority="realtime", max_tokens=4)
        batch = await c.map(["x", "y"], priority="batch", max_tokens=4)
    assert realtime.text is not None
    assert all(r.ok for r in batch)


async def test_cost_counts_the_prefix_caches_tokens_at_their_price(
    vllm_server: RunningServer,
) -> None:
    """vLLM reports the prompt tokens its prefix cache served
    (``--enable-prompt-tokens-details``): a prompt sent twice costs less the second
    time, at ``cached_input``, and a spending limit settles at what was counted."""
    prompt = "The quick brown fox jumps over the lazy dog. " + "lorem ipsum dolor " * 40
    price = llmbatch.Price(input=1.0, output=2.0, cached_input=0.5)
    async with client(vllm_server, prices={"*": price}, max_cost=1.0) as c:
        first = await c.complete(prompt, max_tokens=4)
        second = await c.complete(prompt, max_tokens=4)
        stats = c.stats()
    cost = stats.cost
    assert cost.answers == 2
    assert cost.cached_tokens >= 128  # at least some blocks of the second were cached
    prompt_tokens = first.usage.prompt_tokens + second.usage.prompt_tokens
    completion_tokens = first.usage.completion_tokens + second.usage.completion_tokens
    assert cost.prompt_tokens == prompt_tokens
    expected = (
        (prompt_tokens - cost.cached_tokens) * 1.0
        + cost.cached_tokens * 0.5
        + completion_tokens * 2.0
    ) / 1e6
    assert cost.dollars == pytest.approx(expected, rel=1e-12)
    assert stats.spending is not None
    assert stats.spending.spent == pytest.approx(expected, rel=1e-12)
    assert stats.spending.reserved == 0.0
