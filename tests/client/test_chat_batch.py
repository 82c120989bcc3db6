"""Chat batches: one /v1/chat/completions/batch request where the server has the
route, one request per conversation where it does not, and fault isolation either
way."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fake_server import POISON, FakeServer

from llmbatch import BadRequestError, BatchPolicy, Client, NotFoundError, RetryPolicy
from llmbatch.transports import MockResponse, MockTransport

pytestmark = pytest.mark.anyio

TOGETHER = {"normal": BatchPolicy(max_batch_size=8, max_wait=0.05, send_when_idle=False)}
NO_RETRY = RetryPolicy(attempts=1)


def convo(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def ask_all(client: Client, texts: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def one(text: str) -> None:
        try:
            out[text] = (await client.chat(convo(text), max_tokens=4)).text
        except Exception as exc:
            out[text] = exc

    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    return out


def client(fake: FakeServer) -> Client:
    return Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(fake), batching=TOGETHER, retry=NO_RETRY
    )


async def test_conversations_that_arrive_together_share_one_batch_request() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        out = await ask_all(c, ["a", "b", "c"])
        usage_total = c.stats().prompt_tokens
    assert out == {"a": "re:a", "b": "re:b", "c": "re:c"}
    assert fake.paths == ["/chat/completions/batch"]
    # In the order the callers started, which trio does not fix: compare as a set.
    sent = [conversation[-1]["content"] for conversation in fake.bodies[0]["messages"]]
    assert sorted(sent) == ["a", "b", "c"]
    assert usage_total == 9  # the batch's usage (3 per conversation), shared out exactly


async def test_a_server_without_the_route_gets_single_requests_from_then_on() -> None:
    fake = FakeServer(chat_batch=False)
    async with client(fake) as c:
        first = await ask_all(c, ["a", "b"])
        second = await ask_all(c, ["c", "d"])
    assert first == {"a": "re:a", "b": "re:b"}
    assert second == {"c": "re:c", "d": "re:d"}
    # One probe of the batch route, then only single requests.
    assert fake.paths.count("/chat/completions/batch") == 1
    assert fake.paths.count("/chat/completions") == 4


async def test_an_unknown_model_on_the_batch_route_is_not_taken_for_a_missing_route() -> None:
    fake = FakeServer()
    missing_model = MockResponse(
        status=404, json={"error": {"message": "The model `m` does not exist.", "code": 404}}
    )
    fake.intercept = lambda body: missing_model
    async with client(fake) as c:
        out = await ask_all(c, ["a", "b"])
        fleet = c._runtime.fleet
        assert fleet is not None
        assert fleet.health.sender(0).chat_batch is None  # still worth trying later
    assert all(isinstance(e, NotFoundError) for e in out.values())


async def test_a_bad_conversation_fails_alone_by_bisection() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        out = await ask_all(c, ["a", f"x {POISON}", "c", "d"])
    assert isinstance(out[f"x {POISON}"], BadRequestError)
    assert {k: v for k, v in out.items() if "x" not in k} == {"a": "re:a", "c": "re:c", "d": "re:d"}


async def test_calls_the_batch_route_cannot_take_go_one_by_one() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        async with anyio.create_task_group() as tg:
            for text in ("a", "b"):
                tg.start_soon(
                    lambda t=text: c.chat(convo(t), max_tokens=4, tools=[{"type": "function"}])
                )
    assert fake.paths == ["/chat/completions", "/chat/completions"]


async def test_a_server_refusing_the_priority_field_is_sent_none_from_then_on() -> None:
    """vLLM on --scheduling-policy fcfs refuses a non-zero priority with a 400."""
    fake = FakeServer()

    def fcfs(body: dict[str, Any]) -> MockResponse | None:
        if body.get("priority"):
            return MockResponse(
                status=400,
                json={
                    "error": {
                        "message": "Got priority 1 but Priority scheduling is not enabled.",
                        "code": 400,
                    }
                },
            )
        return None

    fake.intercept = fcfs
    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(fake), priority_scheduling=True
    ) as c:
        first = await c.complete("a")
        second = await c.chat(convo("b"))
        stats = c.stats()
    assert (first.text, second.text) == ("echo:a:0", "re:b")
    assert [b.get("priority") for b in fake.bodies] == [1, None, None]
    assert stats.bisections == 0
