"""``POST /v1/chat/completions/batch``: vLLM's batched chat route on the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmbatch_server.testing import run_simulator

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "Count to three."}],
]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with (
        run_simulator("--speed", "200", "--max-model-len", "512", "--poison", "POISON") as sim,
        httpx.Client(base_url=sim.url, timeout=30) as client,
    ):
        yield client


def test_one_choice_per_conversation_indexed_by_conversation(http: httpx.Client) -> None:
    params = {"max_tokens": 12, "seed": 3}
    r = http.post("/v1/chat/completions/batch", json={"messages": CONVERSATIONS, **params})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    singles = [
        http.post("/v1/chat/completions", json={"messages": conv, **params}).json()
        for conv in CONVERSATIONS
    ]
    # Same model, same sampling parameters: each choice is what the conversation
    # alone would get, and the one usage adds up the conversations'.
    for choice, single in zip(body["choices"], singles, strict=True):
        assert choice["message"] == single["choices"][0]["message"]
        assert choice["finish_reason"] == single["choices"][0]["finish_reason"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert body["usage"][key] == sum(s["usage"][key] for s in singles)


def test_shared_max_tokens_and_ignore_eos_apply_to_every_conversation(http: httpx.Client) -> None:
    body = http.post(
        "/v1/chat/completions/batch",
        json={"messages": CONVERSATIONS, "max_completion_tokens": 5, "ignore_eos": True},
    ).json()
    assert [c["finish_reason"] for c in body["choices"]] == ["length"] * 3
    assert body["usage"]["completion_tokens"] == 15


def _bad(messages: Any = None, **extra: Any) -> dict[str, Any]:
    return {"messages": CONVERSATIONS if messages is None else messages, **extra}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (_bad(stream=True), 400, "stream"),
        (_bad(stream_options={"include_usage": True}), 400, "stream"),
        (_bad(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
        (_bad(tool_choice="auto"), 400, "tool_choice"),
        (_bad(n=2), 400, "n"),
        (_bad(n=0), 400, "n"),
        (_bad(use_beam_search=True), 400, "use_beam_search"),
        (_bad(messages=[]), 400, "messages"),
        (_bad(messages=[[]]), 400, "messages"),
        (_bad(messages=[{"role": "user", "content": "flat"}]), 400, "messages"),
        (_bad(messages=[CONVERSATIONS[0], [{"role": "user", "content": "x " * 600}]]), 400, None),
        (_bad(messages=[CONVERSATIONS[0], [{"role": "user", "content": "POISON"}]]), 400, None),
        (_bad(model="other"), 404, "model"),
    ],
    ids=[
        "stream",
        "stream-options",
        "tools",
        "tool-choice",
        "n-2",
        "n-0",
        "beam-search",
        "empty-list",
        "empty-conversation",
        "flat-messages",
        "one-too-long",
        "one-poisoned",
        "unknown-model",
    ],
)
def test_refusals_fail_the_whole_request(
    http: httpx.Client, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = http.post("/v1/chat/completions/batch", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param


def test_request_model_checks_come_before_the_model_check(http: httpx.Client) -> None:
    # vLLM validates the request body (pydantic) before it looks the model up.
    r = http.post("/v1/chat/completions/batch", json=_bad(n=2, model="other"))
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "Bad Request"


def test_too_long_conversation_uses_vllm_context_message(http: httpx.Client) -> None:
    r = http.post(
        "/v1/chat/completions/batch",
        json=_bad(messages=[CONVERSATIONS[0], [{"role": "user", "content": "x " * 600}]]),
    )
    assert "maximum context length is 512 tokens" in r.json()["error"]["message"]


def test_unknown_routes_answer_like_fastapi(http: httpx.Client) -> None:
    r = http.post("/v1/nothing-here", json={})
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    r = http.get("/v1/chat/completions/batch")
    assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"})


def test_no_chat_batch_makes_the_route_404() -> None:
    with (
        run_simulator("--speed", "200", "--no-chat-batch") as sim,
        httpx.Client(base_url=sim.url, timeout=30) as http,
    ):
        r = http.post("/v1/chat/completions/batch", json={"messages": CONVERSATIONS})
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
        single = http.post("/v1/chat/completions", json={"messages": CONVERSATIONS[0]})
        assert single.status_code == 200
