"""Calls and results faithful to the OpenAI API: every parameter passes through,
unknown keywords are a TypeError, ``extra_body``/``extra_headers``/``extra_query``
behave as in openai-python, ``model=`` per call, ``n`` for chat, tool calls and
logprobs come back, and results have the OpenAI shape."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch import BatchPolicy, ChatChoice, ChatCompletion, ChatMessage, Client, Timings, Usage
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

TOGETHER = {"normal": BatchPolicy(max_batch_size=8, max_wait=0.05, send_when_idle=False)}


class Wire(FakeServer):
    """The fake server, keeping each request as sent (URL and headers too)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[HTTPRequest] = []

    def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.method == "POST":
            self.requests.append(request)
        return super().__call__(request)


def client(wire: FakeServer, **options: Any) -> Client:
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(wire), **options)


async def test_openai_and_vllm_parameters_reach_the_server_as_given() -> None:
    wire = Wire()
    async with client(wire) as c:
        await c.complete(
            "hi", max_tokens=3, seed=7, logprobs=2, user="u1", top_k=5, min_p=0.1, ignore_eos=True
        )
    body = wire.bodies[0]
    assert {k: body[k] for k in ("seed", "logprobs", "user", "top_k", "min_p", "ignore_eos")} == {
        "seed": 7,
        "logprobs": 2,
        "user": "u1",
        "top_k": 5,
        "min_p": 0.1,
        "ignore_eos": True,
    }


async def test_extra_body_headers_and_query_behave_as_in_openai_python() -> None:
    wire = Wire()
    async with client(wire) as c:
        await c.complete(
            "hi",
            extra_body={"top_k": 5, "custom_field": {"a": 1}},
            extra_headers={"X-Tenant": "acme"},
            extra_query={"api-version": "2"},
        )
    request = wire.requests[0]
    body = json.loads(request.body or b"{}")
    assert body["top_k"] == 5
    assert body["custom_field"] == {"a": 1}  # anything goes in extra_body
    assert "extra_body" not in body
    assert "extra_headers" not in body
    assert request.headers["X-Tenant"] == "acme"
    assert request.url.endswith("/v1/completions?api-version=2")


async def test_only_requests_with_the_same_extras_and_model_share_a_batch() -> None:
    wire = Wire()
    async with client(wire, batching=TOGETHER) as c:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: c.complete("a"))
            tg.start_soon(lambda: c.complete("b"))
            tg.start_soon(lambda: c.complete("c", extra_headers={"X-Tenant": "acme"}))
            tg.start_soon(lambda: c.complete("d", model="other-model"))
    by_model = sorted((b["model"], sorted(_prompts(b))) for b in wire.bodies)
    assert by_model == [
        ("fake-model", ["a", "b"]),
        ("fake-model", ["c"]),
        ("other-model", ["d"]),
    ]


def _prompts(body: dict[str, Any]) -> list[str]:
    prompt = body["prompt"]
    return prompt if isinstance(prompt, list) else [prompt]


async def test_chat_n_tools_logprobs_and_the_openai_shape() -> None:
    wire = Wire()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    async with client(wire) as c:
        several = await c.chat([{"role": "user", "content": "hi"}], n=3, logprobs=True)
        called = await c.chat([{"role": "user", "content": "weather?"}], tools=tools)
    assert several.object == "chat.completion"
    assert several.system_fingerprint == "fp-fake"
    assert [choice.index for choice in several.choices] == [0, 1, 2]
    assert all(choice.message.content == "re:hi" for choice in several.choices)
    assert several.choices[2].logprobs == {"content": [{"token": "re", "logprob": -0.5}]}
    assert several.text == "re:hi"
    assert called.finish_reason == "tool_calls"
    (call,) = called.message.tool_calls or ()
    assert (call.id, call.type, call.function.name) == ("call-0-0", "function", "lookup")
    assert json.loads(call.function.arguments) == {"q": "weather?"}
    assert called.text == ""


async def test_completion_results_have_the_openai_shape() -> None:
    wire = Wire()
    async with client(wire) as c:
        answer = await c.complete("hi", n=2, max_tokens=2)
    assert answer.object == "text_completion"
    assert answer.id == "cmpl-1"
    assert [(choice.index, choice.text) for choice in answer.choices] == [
        (0, "echo:hi:0"),
        (1, "echo:hi:1"),
    ]
    assert answer.usage.completion_tokens == 4
    data = answer.to_dict()
    assert set(data) == {
        "id",
        "model",
        "created",
        "choices",
        "usage",
        "timings",
        "system_fingerprint",
    }


def test_a_chat_completion_can_still_be_built_as_in_0_1() -> None:
    old = ChatCompletion(
        id="c",
        model="m",
        message=ChatMessage(role="assistant", content="hi"),
        finish_reason="stop",
        usage=Usage(),
        timings=Timings(queued=0, latency=0, batch_size=1, attempts=1),
    )
    assert old.choices == (
        ChatChoice(message=ChatMessage(role="assistant", content="hi"), finish_reason="stop"),
    )
    assert old.text == "hi"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('c.complete("hi", maxtokens=5)', "did you mean 'max_tokens'?"),
        ('c.chat([{"role": "user", "content": "hi"}], tool=[])', "did you mean 'tools'?"),
        ('c.complete("hi", tools=[])', "unexpected keyword argument 'tools'"),  # chat only
    ],
)
async def test_an_unknown_keyword_is_a_type_error_naming_the_nearest(
    call: str, message: str
) -> None:
    wire = Wire()
    async with client(wire) as c:
        with pytest.raises(TypeError, match=message) as info:
            await eval(call, {"c": c})
    assert isinstance(info.value, llmbatch.InvalidRequestError)
    assert wire.bodies == []
