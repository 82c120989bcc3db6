"""The dispatcher's exchange on its seam: a batch of requests in, one HTTP exchange
(or more) through a fake transport, every request settled once or handed back.
No client, no engine loop: the dispatcher is built as the fleet builds it."""

from __future__ import annotations

import time

import anyio
import pytest
from factories import make_request
from fake_server import POISON, FailsFirstPost, FakeServer

from llmbatch import Limits, Replica, RetryPolicy
from llmbatch._calls.outcome import Outcomes
from llmbatch._calls.request import Flight, Request
from llmbatch._control.retry import Retries
from llmbatch._exceptions import BadRequestError, ServerError
from llmbatch._observers import Observers
from llmbatch._recorder import StatsRecorder
from llmbatch._scheduler import Scheduler
from llmbatch._servers.dispatcher import Dispatcher
from llmbatch._servers.server import Server
from llmbatch._transports.base import HTTPRequest
from llmbatch.transports import MockResponse, MockTransport

pytestmark = pytest.mark.anyio

LIMITS = Limits(max_in_flight=16, reserved_realtime=2)
QUICK = RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.002)


def _dispatcher(handler: object, retry: RetryPolicy = QUICK) -> tuple[Dispatcher, MockTransport]:
    transport = MockTransport(handler)  # type: ignore[arg-type]
    scheduler = Scheduler(limits=LIMITS)
    server = Server(
        Replica("http://fake:8000/v1"),
        headers={},
        transport=transport,
        seats=scheduler.seats[0],
        limits=LIMITS,
        retry=retry,
        slo=None,
    )
    recorder = StatsRecorder(time.monotonic())
    observers = Observers()
    dispatcher = Dispatcher(
        server=server,
        retries=Retries(retry, uniform=lambda a, b: a),
        stats=recorder,
        outcomes=Outcomes(recorder, observers),
        observers=observers,
    )
    return dispatcher, transport


def _requests(*prompts: str) -> list[Request]:
    return [make_request(prompt=p, model="fake-model") for p in prompts]


async def _send(dispatcher: Dispatcher, requests: list[Request]) -> list[Request]:
    # The dispatcher enters the flight's scope itself (the engine may cancel it).
    return await dispatcher.send(requests, Flight(requests, anyio.CancelScope()))


def _posts(transport: MockTransport) -> list[HTTPRequest]:
    return [r for r in transport.requests if r.method == "POST"]


async def test_a_batch_is_one_post_and_each_request_gets_its_own_answer() -> None:
    fake = FakeServer()
    dispatcher, transport = _dispatcher(fake)
    requests = _requests("one", "two", "three")
    assert await _send(dispatcher, requests) == []
    assert len(_posts(transport)) == 1
    assert fake.bodies[0]["prompt"] == ["one", "two", "three"]
    assert all(r.done and r.error is None for r in requests)
    texts = [r.value.choices[0].text for r in requests]  # type: ignore[attr-defined]
    assert len(set(texts)) == 3  # each its own choice, by index


async def test_a_bad_prompt_fails_alone_and_the_rest_are_answered() -> None:
    fake = FakeServer()
    dispatcher, transport = _dispatcher(fake)
    requests = _requests("a", "b", f"c {POISON}", "d")
    await _send(dispatcher, requests)
    bad = requests[2]
    assert isinstance(bad.error, BadRequestError)
    assert [r.error for r in requests if r is not bad] == [None, None, None]
    # The batch of four was refused, then split until the bad prompt went alone.
    assert len(_posts(transport)) > 2
    assert f"c {POISON}" in [body["prompt"] for body in fake.bodies]  # alone: no list


async def test_a_retryable_failure_is_retried_and_counted_on_the_request() -> None:
    handler = FailsFirstPost(status=500)
    dispatcher, transport = _dispatcher(handler)
    requests = _requests("x", "y")
    await _send(dispatcher, requests)
    assert len(_posts(transport)) == 2
    assert all(r.error is None and r.retried == 1 for r in requests)


async def test_a_failure_past_the_attempts_fails_every_request_of_the_batch() -> None:
    answered = MockResponse(status=500, json={"error": {"message": "boom"}})
    dispatcher, transport = _dispatcher(lambda request: answered)
    requests = _requests("x", "y")
    assert await _send(dispatcher, requests) == []
    assert len(_posts(transport)) == QUICK.attempts
    assert all(isinstance(r.error, ServerError) for r in requests)
    assert requests[0].error is not requests[1].error  # each caller its own error


async def test_requests_whose_callers_left_are_not_sent() -> None:
    fake = FakeServer()
    dispatcher, _transport = _dispatcher(fake)
    requests = _requests("kept", "gone")
    requests[1].abandoned = True
    await _send(dispatcher, requests)
    assert [body["prompt"] for body in fake.bodies] == ["kept"]
    assert requests[0].error is None
    assert not requests[1].done  # its outcome belongs to whoever abandoned it


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_a_refusal_is_not_retried(status: int) -> None:
    refused = MockResponse(status=status, json={"error": {"message": "no", "type": "x"}})
    dispatcher, _transport = _dispatcher(lambda request: refused)
    (request,) = _requests("p")
    await _send(dispatcher, [request])
    assert request.error is not None
    assert request.error.status_code == status  # type: ignore[attr-defined]
    assert request.retried == 0


async def test_a_server_that_says_not_to_retry_is_not_retried() -> None:
    refused = MockResponse(
        status=500, json={"error": {"message": "no"}}, headers={"x-should-retry": "false"}
    )
    dispatcher, transport = _dispatcher(lambda request: refused)
    (request,) = _requests("p")
    await _send(dispatcher, [request])
    assert isinstance(request.error, ServerError)
    assert request.error.should_retry is False
    assert len(_posts(transport)) == 1


async def test_conversations_sent_one_by_one_each_count_against_the_rate_limits() -> None:
    from llmbatch import RateLimit
    from llmbatch._calls.spec import check_call
    from llmbatch._calls.validate import check_messages
    from llmbatch._scheduler.budgets import RateBudget

    budget = RateBudget(RateLimit(requests_per_minute=600))  # 10 a second, 10 held
    dispatcher, _ = _dispatcher(FakeServer(chat_batch=False))
    dispatcher._rate = lambda: budget
    dispatcher.chat_batch = False  # the server has no batch route: one request each
    spec = check_call("chat", "chat", {"model": "fake-model"})
    requests = []
    for i in range(3):
        messages, tokens = check_messages(
            [{"role": "user", "content": f"q{i}"}], n=1, max_tokens=16
        )
        requests.append(Request(spec, None, messages, tokens, 0.0))
    assert budget.requests is not None
    before = budget.requests.level
    await _send(dispatcher, requests)
    assert all(r.error is None for r in requests)
    # The scheduler charged the batch as one request; the two others are charged here.
    assert before - budget.requests.level == pytest.approx(2, abs=0.2)
