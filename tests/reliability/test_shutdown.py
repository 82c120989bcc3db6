"""Graceful shutdown: leaving ``async with`` drains queued work by default (bounded by
``drain_timeout``) or cancels it with ``on_close="cancel"``, and no caller, whatever
it was waiting on, is left waiting forever."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import anyio
import anyio.lowlevel
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport
from llmbatch_server.testing import run_simulator

pytestmark = pytest.mark.anyio

OnClose = Literal["drain", "cancel"]


def slow_server(delay: float | None) -> Callable[[HTTPRequest], Any]:
    """A FakeServer whose generation takes ``delay`` seconds (None: never answers)."""
    fake = FakeServer()

    async def handler(request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            pass
        elif delay is None:
            await anyio.sleep_forever()
        else:
            await anyio.sleep(delay)
        response: MockResponse = fake(request)
        return response

    return handler


async def ask_all(
    client: llmbatch.Client, tg: anyio.abc.TaskGroup, n: int, outcomes: Counter[str]
) -> None:
    """Start ``n`` callers in ``tg`` (which outlives the client) and return once every
    one has submitted its request; count how each ends."""
    started = 0

    async def ask(i: int) -> None:
        nonlocal started
        started += 1  # complete() submits before its first await
        try:
            await client.complete(f"q{i}", max_tokens=2)
            outcomes["ok"] += 1
        except llmbatch.LLMBatchError as exc:
            outcomes[type(exc).__name__] += 1

    for i in range(n):
        tg.start_soon(ask, i)
    # One checkpoint is not enough: trio runs new tasks in no set order relative to
    # this one, so some callers may not have started yet.
    while started < n:
        await anyio.lowlevel.checkpoint()


async def test_exit_drains_queued_work_by_default() -> None:
    """A real server: 200 callers still queued when the body ends all get answers."""
    with run_simulator("--speed", "20") as sim:
        outcomes: Counter[str] = Counter()
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                async with llmbatch.Client(sim.base_url) as client:
                    await ask_all(client, tg, 200, outcomes)
                    assert client.stats().tiers[llmbatch.Priority.NORMAL].done == 0
    assert outcomes == {"ok": 200}


async def test_exit_with_cancel_fails_pending_callers_promptly() -> None:
    """A real server generating slowly: ``on_close="cancel"`` ends every caller with
    RequestCancelled (queued and in flight alike) instead of waiting for answers."""
    with run_simulator("--speed", "0.5") as sim:
        outcomes: Counter[str] = Counter()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                async with llmbatch.Client(sim.base_url, on_close="cancel") as client:
                    await ask_all(client, tg, 50, outcomes)
                    await anyio.sleep(0.2)  # let some reach the server
                    assert client.stats().tiers[llmbatch.Priority.NORMAL].in_flight > 0
    assert outcomes == {"RequestCancelled": 50}


async def test_drain_is_bounded_by_drain_timeout() -> None:
    """A server that never answers: draining gives up after ``drain_timeout`` and every
    caller gets RequestCancelled."""
    outcomes: Counter[str] = Counter()
    transport = MockTransport(slow_server(None))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with llmbatch.Client(
                "http://127.0.0.1:9/v1", transport=transport, drain_timeout=0.2
            ) as client:
                await ask_all(client, tg, 30, outcomes)
    assert outcomes == {"RequestCancelled": 30}


async def test_an_error_in_the_body_cancels_instead_of_draining() -> None:
    outcomes: Counter[str] = Counter()
    transport = MockTransport(slow_server(None))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            with pytest.raises(KeyError):
                async with llmbatch.Client("http://127.0.0.1:9/v1", transport=transport) as c:
                    await ask_all(c, tg, 10, outcomes)
                    raise KeyError("the application failed")
    assert outcomes == {"RequestCancelled": 10}


@pytest.mark.parametrize("on_close", ["drain", "cancel"])
async def test_callers_waiting_for_queue_room_are_not_stranded(on_close: OnClose) -> None:
    """Callers blocked by backpressure (the tier's queue full) when the client closes
    must end too, not wait on a queue nobody serves any more."""
    outcomes: Counter[str] = Counter()
    limits = llmbatch.Limits(max_queued=2, max_in_flight=2, reserved_realtime=0)
    transport = MockTransport(slow_server(0.5))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with llmbatch.Client(
                "http://127.0.0.1:9/v1",
                transport=transport,
                limits=limits,
                on_close=on_close,
                drain_timeout=0.2,
            ) as client:
                await ask_all(client, tg, 12, outcomes)
                await anyio.sleep(0.05)
                # 2 in flight; the rest queued client-side (2 in the queue, 8 waiting for room).
                assert client.stats().tiers[llmbatch.Priority.NORMAL].queued == 10
    assert sum(outcomes.values()) == 12
    assert set(outcomes) <= {"ok", "RequestCancelled"}


async def test_streams_and_maps_end_when_the_client_closes() -> None:
    outcomes: Counter[str] = Counter()
    map_results: list[llmbatch.Result[Any]] = []
    transport = MockTransport(slow_server(None))

    async def stream(client: llmbatch.Client) -> None:
        try:
            async for _ in client.stream("tell me", max_tokens=4):
                pass
            outcomes["stream ok"] += 1
        except llmbatch.RequestCancelled:
            outcomes["stream cancelled"] += 1

    async def run_map(client: llmbatch.Client) -> None:
        map_results.extend(await client.map([f"m{i}" for i in range(20)], max_tokens=2))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with llmbatch.Client(
                "http://127.0.0.1:9/v1", transport=transport, on_close="cancel"
            ) as client:
                tg.start_soon(stream, client)
                tg.start_soon(run_map, client)
                await anyio.sleep(0.1)
    assert outcomes == {"stream cancelled": 1}
    assert len(map_results) == 20
    assert all(isinstance(r.error, llmbatch.RequestCancelled) for r in map_results)


async def test_a_closed_client_refuses_work_but_keeps_its_stats() -> None:
    async with llmbatch.Client(
        "http://127.0.0.1:9/v1", transport=MockTransport(FakeServer())
    ) as client:
        await client.complete("one", max_tokens=2)
    with pytest.raises(llmbatch.ClientClosedError):
        await client.complete("two", max_tokens=2)
    with pytest.raises(llmbatch.ClientClosedError):
        await client.map(["three"])
    with pytest.raises(llmbatch.ClientClosedError):
        async with client:
            pass
    assert client.stats().tiers[llmbatch.Priority.NORMAL].done == 1
