"""The fleet and the engine on their seams, assembled as the runtime assembles them
but with a clock the test moves and a fake transport: what ``Fleet.open`` reads and
refuses, and what one turn of the engine's loop does with what is queued."""

from __future__ import annotations

import anyio
import pytest
from assembled import Parts
from factories import make_request
from fake_server import FakeServer

from llmbatch import (
    DeadlineExceeded,
    Priority,
    Replica,
    ServerInfoError,
    UnknownModelError,
)
from llmbatch._calls.request import Request
from llmbatch.transports import MockResponse

pytestmark = pytest.mark.anyio


def _urls(n: int) -> list[Replica]:
    return [Replica(f"http://s{i}:8000/v1") for i in range(n)]


async def test_open_reads_the_model_list_and_joins_every_server() -> None:
    parts = Parts(FakeServer(model="llama", max_model_len=2048))
    model, context = await parts.fleet.open(_urls(2), None)
    assert (model, context) == ("llama", 2048)
    assert len(parts.fleet.health.live()) == 2
    assert {r.url for r in parts.transport.requests} == {
        "http://s0:8000/v1/models",
        "http://s1:8000/v1/models",
    }


async def test_open_refuses_a_model_no_server_serves_in_its_words() -> None:
    parts = Parts(FakeServer(model="llama"))
    with pytest.raises(UnknownModelError, match="serves 'llama'"):
        await parts.fleet.open(_urls(1), "mistral")


async def test_open_refuses_an_empty_model_list_when_no_model_is_named() -> None:
    parts = Parts(lambda request: MockResponse(json={"object": "list", "data": []}))
    with pytest.raises(ServerInfoError, match="lists no models"):
        await parts.fleet.open(_urls(1), None)


async def _turn(parts: Parts, *waiting_for: Request) -> None:
    """One turn of the engine's loop; then, once ``waiting_for`` are settled, the
    tasks it started (senders, the health policy's watchers) are cancelled."""
    settled = anyio.Event()
    left = [len(waiting_for)]

    def one_done(request: Request) -> None:
        left[0] -= 1
        if left[0] == 0:
            settled.set()

    for request in waiting_for:
        request.on_done(one_done)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            parts.engine._turn(tg)
            if waiting_for:
                await settled.wait()
            tg.cancel_scope.cancel()


def _queue(parts: Parts, *requests: Request) -> None:
    for request in requests:
        request.created_at = parts.now[0]
        assert parts.engine.submit(request) is None


async def test_a_turn_sends_what_is_due_and_its_callers_get_their_answers() -> None:
    fake = FakeServer()
    parts = Parts(fake)
    await parts.fleet.open(_urls(1), None)
    requests = [make_request(Priority.REALTIME, prompt=p, model="fake-model") for p in "abc"]
    _queue(parts, *requests)
    await _turn(parts, *requests)
    assert all(r.done and r.error is None for r in requests)
    posts = [r for r in parts.transport.requests if r.method == "POST"]
    assert 1 <= len(posts) <= 3
    assert parts.engine.snapshot().tiers[Priority.REALTIME].done == 3


async def test_a_turn_fails_a_request_whose_deadline_passed_in_the_queue() -> None:
    parts = Parts(FakeServer())
    await parts.fleet.open(_urls(1), None)
    late = make_request(Priority.BATCH, at=parts.now[0], timeout=1.0, model="fake-model")
    # A bulk batch waits for company: it is still queued when its deadline passes.
    _queue(parts, late)
    parts.now[0] += 5.0
    await _turn(parts)
    assert isinstance(late.error, DeadlineExceeded)
    assert not [r for r in parts.transport.requests if r.method == "POST"]


async def test_a_closed_engine_cancels_what_is_submitted() -> None:
    parts = Parts(FakeServer())
    await parts.fleet.open(_urls(1), None)
    parts.engine.closed = True
    request = make_request(model="fake-model")
    parts.engine.submit(request)
    assert request.done
    assert "closed" in str(request.error)


async def test_abandoning_a_queued_request_takes_it_out_of_the_queue() -> None:
    parts = Parts(FakeServer())
    await parts.fleet.open(_urls(1), None)
    request = make_request(Priority.BATCH, model="fake-model")
    _queue(parts, request)
    parts.engine.abandon(request)
    assert request.done
    await _turn(parts)
    assert not [r for r in parts.transport.requests if r.method == "POST"]
