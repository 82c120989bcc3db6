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
