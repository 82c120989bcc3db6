"""``stream_chunks()``: every event of a stream as an openai-shaped chunk, with the same
tiers, retries, cancellation, deadlines and options as ``stream()``.

The decoder and the chunk objects are tested on bytes and dicts alone; the client
through MockTransport and the fake server, under asyncio and trio. Against the real
simulator: tests/client/test_client_http.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    Choice,
    Client,
    CompletionChunk,
    FunctionCallDelta,
    RetryPolicy,
    ServerError,
    ToolCallDelta,
    Usage,
)
from llmbatch._chunks import make_chunk
from llmbatch._servers.wire import StreamDecoder
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)
CHAT = [{"role": "user", "content": "hi"}]


def sse(*events: dict[str, Any]) -> list[bytes]:
    lines: list[bytes] = []
    for event in events:
        lines += [b"data: " + json.dumps(event).encode(), b""]
    return lines


def text_event(text: str, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [choice],
    }


USAGE_EVENT = {
    "id": "cmpl-9",
    "object": "text_completion",
    "created": 7,
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
}
ERROR_EVENT = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}


# -- the decoder and the chunks, without I/O ------------------------------------------


def test_the_decoder_makes_one_chunk_per_event_in_any_chunking() -> None:
    body = b"\n".join(
        [*sse(text_event("Hel"), text_event("lo", "stop"), USAGE_EVENT), b"data: [DONE]", b""]
    )
    for size in (1, 7, len(body)):
        decoder = StreamDecoder()
        chunks: list[Any] = []
        for start in range(0, len(body), size):
            chunks += decoder.feed(body[start : start + size])
        assert [type(c) for c in chunks] == [CompletionChunk] * 3
        assert [c.text for c in chunks] == ["Hel", "lo", ""]
        assert [c.finish_reason for c in chunks] == [None, "stop", None]
        assert [c.usage for c in chunks] == [None, None, Usage(2, 3, 5)]
        assert chunks[2].choices == ()
        assert decoder.done
        assert (decoder.text, decoder.finish_reason, decoder.usage) == (
            "Hello",
            "stop",
            (2, 3, 5, False),
        )


def test_the_decoder_hands_out_text_alone_for_stream() -> None:
    decoder = StreamDecoder(chunks=False)
    lines = sse(text_event("Hel"), USAGE_EVENT)
    assert [decoder.feed_line(line) for line in lines] == ["Hel", None, "", None]


def test_an_error_event_raises_the_typed_error() -> None:
    decoder = StreamDecoder(chat=True)
    with pytest.raises(ServerError, match="engine died") as info:
        decoder.feed_line(sse(ERROR_EVENT)[0])
    assert info.value.status_code == 500


def test_a_chat_chunk_reads_role_content_and_tool_call_pieces() -> None:
    event = {
        "id": "chat-1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "role": "assistant",
                    "content": "Hi",
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call-1",
                            "type": "function",
                            "function": {"name": "f", "arguments": ""},
                        },
                        {"index": 1, "function": {"arguments": '{"q"'}},
                        {"index": 2},
                    ],
                },
                "finish_reason": None,
            }
        ],
    }
    chunk = make_chunk(ChatCompletionChunk, event, "Hi")
    assert (chunk.id, chunk.model, chunk.created, chunk.object) == (
        "chat-1",
        "m",
        5,
        "chat.completion.chunk",
    )
    assert chunk.system_fingerprint == "fp"
    assert chunk.finish_reason is None
    delta = chunk.choices[0].delta
    assert (delta.role, delta.content, chunk.text) == ("assistant", "Hi", "Hi")
    assert delta.tool_calls == (
        ToolCallDelta(index=0, id="call-1", type="function", function=FunctionCallDelta("f", "")),
        ToolCallDelta(index=1, function=FunctionCallDelta(arguments='{"q"')),
        ToolCallDelta(index=2),
    )


def test_a_lazy_chunk_equals_the_constructed_one_and_pickles() -> None:
    lazy = make_chunk(CompletionChunk, USAGE_EVENT, "")
    eager = CompletionChunk(id="cmpl-9", model="m", created=7, choices=(), usage=Usage(2, 3, 5))
    assert lazy == eager
    assert hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager)
    assert lazy.to_dict() == eager.to_dict() == lazy.model_dump()
    assert lazy.to_dict()["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "estimated": False,
    }
    assert pickle.loads(pickle.dumps(lazy)) == eager

    raw = {"index": 0, "delta": {"content": "yo"}, "finish_reason": "stop"}
    chat = make_chunk(ChatCompletionChunk, {"id": "c", "model": "m", "choices": [raw]}, "yo")
    built = ChatCompletionChunk(
        id="c",
        model="m",
        choices=[ChatChunkChoice(delta=ChatDelta(content="yo"), finish_reason="stop")],
    )
    assert chat == built
    assert (built.text, built.finish_reason, built.usage) == ("yo", "stop", None)
    assert pickle.loads(pickle.dumps(chat)) == built
    completion = CompletionChunk(
        id="c", model="m", choices=[Choice(text="a"), Choice(text="b", index=1)]
    )
    assert completion.text == "ab"


def test_chunks_are_immutable_and_safe_on_odd_types() -> None:
    odd = make_chunk(
        CompletionChunk,
        {
            "id": 3,
            "created": True,
            "choices": [{"text": None, "finish_reason": 5}, "x"],
            "usage": "no",
        },
        "",
    )
    assert (odd.id, odd.model, odd.created, odd.usage) == ("", "", 0, None)
    assert odd.choices == (Choice(text="", finish_reason=None),)
    for field in ("id", "text", "choices"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(odd, field, "changed")


# -- the client, on MockTransport ------------------------------------------------------


def client(handler: Any, **kw: Any) -> Client:
    kw.setdefault("retry", FAST_RETRY)
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(handler), **kw)


def answering(lines_per_attempt: Sequence[list[bytes]]) -> tuple[Any, list[HTTPRequest]]:
    """A handler that answers the stream's attempts with these SSE bodies in turn."""
    fake = FakeServer()
    sent: list[HTTPRequest] = []

    def handler(request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            return fake(request)
        sent.append(request)
        return MockResponse(lines=lines_per_attempt[min(len(sent), len(lines_per_attempt)) - 1])

    return handler, sent


class StallingResponse(MockResponse):
    """Sends its lines, then nothing more until the client hangs up."""

    hung_up: anyio.Event

    async def iter_lines(self) -> AsyncIterator[bytes]:
        for line in self.content.split(b"\n"):
            yield line
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.hung_up.set()


def stalling(lines: list[bytes]) -> tuple[Any, anyio.Event]:
    fake = FakeServer()
    hung_up = anyio.Event()

    def handler(request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            return fake(request)
        response = StallingResponse(lines=lines)
        response.hung_up = hung_up
        return response

    return handler, hung_up


@pytest.mark.anyio
async def test_completion_chunks_add_up_to_the_answer() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        chunks = [chunk async for chunk in c.stream_chunks("tell me", max_tokens=4)]
        answer = await c.complete("tell me", max_tokens=4)
    assert all(isinstance(chunk, CompletionChunk) for chunk in chunks)
    assert "".join(chunk.text for chunk in chunks) == answer.text == "echo:tell me:0"
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == answer.text
    assert [chunk.finish_reason for chunk in chunks] == [None, "length", None]
    last = chunks[-1]
    assert last.choices == ()
    assert last.usage == answer.usage
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert {chunk.id for chunk in chunks} == {"cmpl-1"}
    assert chunks[0].object == "text_completion"
    assert fake.bodies[0]["stream_options"] == {"include_usage": True}


@pytest.mark.anyio
async def test_chat_chunks_carry_role_content_finish_and_usage() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        chunks = [chunk async for chunk in c.stream_chunks(CHAT, max_tokens=4)]
        answer = await c.chat(CHAT, max_tokens=4)
    assert all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer.text
    assert "".join(chunk.text for chunk in chunks) == "re:hi"
    assert [chunk.finish_reason for chunk in chunks] == [None, None, "stop", None]
    assert chunks[-1].usage == answer.usage
    assert (chunks[0].id, chunks[0].model, chunks[0].created) == (
        "chat-1",
        "fake-model",
        1700000000,
    )
    assert chunks[0].object == "chat.completion.chunk"
    # stream() reads the same events and yields only their text.
    async with client(fake) as c:
        assert [d async for d in c.stream(CHAT, max_tokens=4)] == ["re:", "hi"]


@pytest.mark.anyio
async def test_tool_call_pieces_pass_through() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    async with client(FakeServer()) as c:
        chunks = [chunk async for chunk in c.stream_chunks(CHAT, tools=tools)]
    pieces = [
        call
        for chunk in chunks
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or ()
    ]
    assert pieces[0] == ToolCallDelta(
        index=0, id="call-0-0", type="function", function=FunctionCallDelta("lookup", "")
    )
    assert "".join(p.function.arguments or "" for p in pieces if p.function) == '{"q": "hi"}'
    assert chunks[-2].finish_reason == "tool_calls"
    assert "".join(chunk.text for chunk in chunks) == ""


@pytest.mark.anyio
async def test_an_error_event_mid_stream_is_raised_from_the_loop_unretried() -> None:
    handler, sent = answering([sse(text_event("Hel"), ERROR_EVENT)])
    received: list[str] = []
    async with client(handler) as c:
        with pytest.raises(ServerError, match="engine died") as info:
            async for chunk in c.stream_chunks("x"):
                received.append(chunk.text)
        stats = c.stats()
    assert received == ["Hel"]
    assert len(sent) == 1  # a chunk had been handed over: no retry
    assert info.value.attempts == 1
    assert stats.tiers[llmbatch.Priority.REALTIME].failed == 1


@pytest.mark.anyio
async def test_retried_only_until_the_first_chunk() -> None:
    role = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    reply = {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
    }
    # An error before anything was handed over is retried, for both methods.
    handler, sent = answering([sse(ERROR_EVENT), sse(role, reply)])
    async with client(handler) as c:
        chunks = [chunk async for chunk in c.stream_chunks(CHAT)]
    assert (len(sent), [chunk.text for chunk in chunks]) == (2, ["", "ok"])
    # After a chunk without text: stream_chunks has handed it over, stream() has not.
    failing = sse(role, ERROR_EVENT)
    handler, sent = answering([failing, failing, sse(role, reply)])
    async with client(handler) as c:
        with pytest.raises(ServerError):
            async for _ in c.stream_chunks(CHAT):
                pass
        assert len(sent) == 1
        assert [d async for d in c.stream(CHAT)] == ["ok"]
    assert len(sent) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("leave", ["aclosing", "break"])
async def test_leaving_the_loop_early_cancels_the_request(leave: str) -> None:
    handler, hung_up = stalling(sse(text_event("Hel")))
    async with client(handler) as c:
        with anyio.fail_after(5):
            if leave == "aclosing":
                async with contextlib.aclosing(c.stream_chunks("x")) as chunks:
                    async for _ in chunks:
                        break
            else:  # the generator is closed when it is collected, at once on CPython
                async for _ in c.stream_chunks("x"):
                    break
            await hung_up.wait()
            await anyio.wait_all_tasks_blocked()
        tier = c.stats().tiers[llmbatch.Priority.REALTIME]
    assert (tier.in_flight, tier.cancelled, tier.done) == (0, 1, 0)


@pytest.mark.anyio
async def test_a_deadline_mid_stream_is_raised_from_the_loop() -> None:
    handler, hung_up = stalling(sse(text_event("Hel")))
    received: list[str] = []
    async with client(handler) as c:
        with anyio.fail_after(5), pytest.raises(llmbatch.DeadlineExceeded):
            async for chunk in c.stream_chunks("x", timeout=0.05):
                received.append(chunk.text)
        with anyio.fail_after(5):
            await hung_up.wait()
    assert received == ["Hel"]


@pytest.mark.anyio
async def test_options_defaults_and_tier_are_those_of_stream() -> None:
    fake = FakeServer()
    transport = MockTransport(fake)
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=transport,
        retry=FAST_RETRY,
        priority_scheduling=True,
        default_headers={"x-app": "a"},
    ) as c:
        view = c.with_options(model="other", default_headers={"x-team": "b"})
        async for _ in view.stream_chunks("x", max_tokens=2, extra_body={"top_k": 3}, top_p=0.5):
            pass
        async for _ in c.with_options(priority="batch").stream_chunks(CHAT, extra_query={"v": "1"}):
            pass
        fake.intercept = lambda body: MockResponse(status=500, json={"error": {"message": "boom"}})
        with pytest.raises(ServerError) as info:
            async for _ in c.stream_chunks("x", max_retries=1):
                pass
        with pytest.raises(ServerError) as view_info:
            async for _ in c.with_options(max_retries=0).stream_chunks("x"):
                pass
        with pytest.raises(llmbatch.InvalidTypeError, match="stream_chunks"):
            async for _ in c.stream_chunks("x", temprature=1):
                pass
    first, second = fake.bodies[:2]
    assert first["model"] == "other"
    assert (first["priority"], second["priority"]) == (0, 2)  # realtime by default
    assert (first["top_k"], first["top_p"], first["max_tokens"]) == (3, 0.5, 2)
    assert "messages" in second
    assert (info.value.attempts, view_info.value.attempts) == (2, 1)
    requests = [r for r in transport.requests if r.method == "POST"]
    assert (requests[0].headers["x-app"], requests[0].headers["x-team"]) == ("a", "b")
    assert "x-team" not in requests[1].headers
    assert requests[1].url.endswith("/chat/completions?v=1")


@pytest.mark.anyio
async def test_a_closed_client_and_bad_input_fail_when_iteration_starts() -> None:
    c = client(FakeServer())
    async with c:
        with pytest.raises(llmbatch.InvalidRequestError):
            async for _ in c.stream_chunks(""):
                pass
        with pytest.raises(llmbatch.InvalidTypeError, match="stream_options"):
            async for _ in c.stream_chunks("x", stream_options=1):  # type: ignore[call-overload]
                pass
        chunks = [
            chunk async for chunk in c.stream_chunks("x", stream_options={"include_usage": False})
        ]
    assert chunks[-1].usage is not None  # usage is always asked for
    closed = c.stream_chunks("x")  # nothing runs until iterated
    with pytest.raises(llmbatch.ClientClosedError):
        await closed.__anext__()
