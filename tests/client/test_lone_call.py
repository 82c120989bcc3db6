"""A lone realtime call is sent from its caller's own task (``Engine.send_inline``):
no hand-over to a sender task, no wake-up from one. In flight, its caller's
cancellation, its deadline and the client's close each end its HTTP exchange and
settle it once; a server that hands it back puts it in the queue, where a sender
sends it again."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

URL = "http://127.0.0.1:9/v1"
REALTIME = llmbatch.Priority.REALTIME


class Recording:
    """A FakeServer that answers completions after ``delay`` seconds (None: never);
    ``sent`` is set when one arrives, ``cancelled`` when an exchange is cancelled."""

    def __init__(self, delay: float | None = 0.0) -> None:
        self.fake = FakeServer()
        self.delay = delay
        self.calls = 0
        self.senders: list[int] = []
        """The task each completion request was sent from."""
        self.cancelled = anyio.Event()
        self.sent = anyio.Event()

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/completions"):
            self.calls += 1
            self.senders.append(anyio.get_current_task().id)
            self.sent.set()
            try:
                if self.delay is None:
                    await anyio.sleep_forever()
                await anyio.sleep(self.delay)
            except anyio.get_cancelled_exc_class():
                self.cancelled.set()
                raise
        response: MockResponse = self.fake(request)
        return response


def client(server: Recording, **options: Any) -> llmbatch.Client:
    return llmbatch.Client(URL, transport=MockTransport(server), **options)


async def settled(c: llmbatch.Client, server: Recording) -> None:
    """One call answered and the client's loop asleep again: a call now finds it idle
    (just after opening, trio may not have run the loop yet)."""
    delay, server.delay = server.delay, 0.0
    await c.complete("warm", max_tokens=2)
    await anyio.sleep(0.05)
    server.delay = delay
    server.sent = anyio.Event()


async def test_cancelling_the_caller_cancels_its_exchange_and_settles_it_once() -> None:
    server = Recording(delay=None)
    async with client(server) as c:
        await settled(c, server)
        with anyio.move_on_after(0.2) as scope:
            await c.complete("hang", max_tokens=2, priority="realtime")
        assert scope.cancelled_caught
        with anyio.fail_after(5):
            await server.cancelled.wait()  # the exchange, not only the wait, ended
        tier = c.stats().tiers[REALTIME]
        assert (tier.in_flight, tier.cancelled, tier.failed, tier.done) == (0, 1, 0, 0)
        # Its seat is free: the next realtime call goes (and is answered).
        server.delay = 0.0
        assert (await c.complete("again", max_tokens=2, priority="realtime")).text


async def test_its_deadline_ends_the_exchange() -> None:
    server = Recording(delay=None)
    with anyio.fail_after(10):
        async with client(server) as c:
            await settled(c, server)
            with pytest.raises(llmbatch.DeadlineExceeded):
                await c.complete("hang", max_tokens=2, priority="realtime", timeout=0.2)
            await server.cancelled.wait()
            assert c.stats().tiers[REALTIME].in_flight == 0


async def test_closing_with_cancel_ends_it_as_the_client_closing() -> None:
    server = Recording(delay=None)
    errors: list[BaseException] = []

    async def ask(c: llmbatch.Client) -> None:
        try:
            await c.complete("hang", max_tokens=2, priority="realtime")
        except llmbatch.RequestCancelled as exc:
            errors.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with client(server, on_close="cancel") as c:
                tg.start_soon(ask, c)
                await server.sent.wait()
    assert len(errors) == 1
    assert "client closed" in str(errors[0])
    assert server.cancelled.is_set()


@pytest.mark.parametrize(("priority", "inline"), [("realtime", True), ("normal", False)])
async def test_a_lone_realtime_call_goes_from_its_callers_own_task(
    priority: str, inline: bool
) -> None:
    server = Recording()
    async with client(server) as c:
        await settled(c, server)
        answer = await c.complete("hi", max_tokens=2, priority=priority)
        caller = anyio.get_current_task().id
    assert answer.text
    # Other tiers wait for the engine's turn, so that what is queued in one go shares
    # a batch: a sender task sends it.
    assert (server.senders[-1] == caller) is inline


async def test_overlapping_realtime_calls_each_go_from_their_own_task() -> None:
    server = Recording(delay=None)
    callers: list[int] = []

    async def ask(c: llmbatch.Client, prompt: str) -> None:
        callers.append(anyio.get_current_task().id)
        await c.complete(prompt, max_tokens=2, priority="realtime")

    async with client(server) as c:
        await settled(c, server)
        server.senders.clear()
        async with anyio.create_task_group() as tg:
            for prompt in ("a", "b", "c"):
                tg.start_soon(ask, c, prompt)
            await anyio.wait_all_tasks_blocked()
            in_flight = c.stats().tiers[REALTIME].in_flight
            tg.cancel_scope.cancel()
    assert in_flight == 3
    assert sorted(server.senders) == sorted(callers)


async def test_a_call_the_server_hands_back_is_sent_again_from_the_queue() -> None:
    """A 503 that says the server's queue is full hands the request back to the
    client's queue (not a failure): a sender sends it again, and the caller that
    sent it from its own task is answered from there."""
    fake = FakeServer()
    refusals = 1
    senders: list[int] = []

    async def handler(request: HTTPRequest) -> MockResponse:
        nonlocal refusals
        if request.url.endswith("/completions"):
            senders.append(anyio.get_current_task().id)
            if b"refused once" in request.body and refusals:
                refusals -= 1
                return MockResponse(status=503, json={"error": {"message": "queue is full"}})
        response: MockResponse = fake(request)
        return response

    retry = llmbatch.RetryPolicy(initial_backoff=0.0, max_backoff=0.0)
    async with llmbatch.Client(URL, transport=MockTransport(handler), retry=retry) as c:
        await c.complete("warm", max_tokens=2)
        await anyio.sleep(0.05)
        with anyio.fail_after(10):
            answer = await c.complete("refused once", max_tokens=2, priority="realtime")
        caller = anyio.get_current_task().id
        tier = c.stats().tiers[REALTIME]
    assert answer.text == "echo:refused once:0"
    assert senders[1:] == [caller, senders[2]]  # refused inline, sent again by a sender
    assert senders[2] != caller
    assert (tier.done, tier.failed, tier.retried) == (1, 0, 1)
