"""vLLM's HTTP behaviour that llmbatch relies on, checked against a real vLLM.

Raw httpx on purpose: these tests pin down the server, not our client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from llmbatch_server.launcher import VLLMServer

if TYPE_CHECKING:
    from conftest import RunningServer  # tests/real_vllm/conftest.py

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

PROMPTS = ["Hello, world!", "The quick brown fox", "What is the capital of France?"]


async def complete(server: RunningServer, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        return await http.post("/completions", json={"model": server.model, **body})


async def test_health_and_models(vllm_server: RunningServer) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        root = vllm_server.base_url.removesuffix("/v1")
        assert (await http.get(f"{root}/health")).status_code == 200
        models = (await http.get(f"{vllm_server.base_url}/models")).json()["data"]
    assert models[0]["id"] == vllm_server.model
    assert models[0]["max_model_len"] == vllm_server.max_model_len


async def test_list_prompt_one_choice_per_prompt(vllm_server: RunningServer) -> None:
    response = await complete(vllm_server, prompt=PROMPTS, max_tokens=8, temperature=0)
    assert response.status_code == 200, response.text
    body = response.json()
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2]
    assert all(c["finish_reason"] in ("length", "stop") for c in body["choices"])
    usage = body["usage"]  # one usage for the whole request
    assert usage["completion_tokens"] <= 3 * 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_list_prompt_with_n_indexes_prompt_major(vllm_server: RunningServer) -> None:
    response = await complete(vllm_server, prompt=PROMPTS[:2], n=2, max_tokens=4, seed=1)
    assert response.status_code == 200, response.text
    assert sorted(c["index"] for c in response.json()["choices"]) == [0, 1, 2, 3]


async def test_streaming_list(vllm_server: RunningServer) -> None:
    body = {
        "model": vllm_server.model,
        "prompt": PROMPTS[:2],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=vllm_server.base_url, timeout=60) as http,
        http.stream("POST", "/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    text: dict[int, str] = {0: "", 1: ""}
    finished: set[int] = set()
    for chunk in chunks[:-1]:
        assert len(chunk["choices"]) == 1  # one choice per chunk, interleaved
        choice = chunk["choices"][0]
        assert choice["index"] not in finished
        text[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finished.add(choice["index"])
    assert finished == {0, 1}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] <= 12


@pytest.mark.parametrize("priority", [-10, 0, 10])
async def test_priority_accepted(vllm_server: RunningServer, priority: int) -> None:
    response = await complete(vllm_server, prompt=PROMPTS, max_tokens=2, priority=priority)
    assert response.status_code == 200, response.text


async def test_too_long_prompt_fails_whole_list(vllm_server: RunningServer) -> None:
    too_long = "hello world " * vllm_server.max_model_len
    response = await complete(vllm_server, prompt=[PROMPTS[0], too_long], max_tokens=4)
    assert response.status_code == 400
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)


@pytest.mark.asyncio_only("VLLMServer manages its process with asyncio's subprocesses")
async def test_graceful_stop_ends_process_group(
    make_server: Callable[..., VLLMServer],
    process_group_alive: Callable[[int], bool],
    process_group_gone: Callable[[int], bool],
) -> None:
    server = make_server()
    async with server:
        pgid = server.pid
        assert pgid is not None
        assert process_group_alive(pgid)
        started = time.monotonic()
    # TERM was enough for the leader: stop() returned before its KILL bound.
    assert time.monotonic() - started < server.stop_timeout
    # Stragglers got SIGKILL from stop(); the kernel needs a moment to reap them.
    assert process_group_gone(pgid)
