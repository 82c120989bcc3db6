"""Admission end to end: callers beyond a full queue are served in arrival order and
all finish; an idle tier sends at once; deadlines need no timer per request.

Timing is checked on trio's MockClock (virtual time that jumps when every task is
blocked), so nothing here sleeps for real."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch import BatchPolicy, Client, DeadlineExceeded, Limits
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio


def virtual_trio() -> Any:
    import trio.testing

    clock = trio.testing.MockClock(autojump_threshold=0)
    return pytest.param(("trio", {"clock": clock}), id="trio-virtual-time")


class SlowServer(FakeServer):
    """Answers after ``delay`` seconds of (virtual) time; records prompts in order.

    Only a completions POST carries prompts, and each is read from that request's own
    body: the client also sends ``GET /metrics`` once work has run a while, and reading
    "the last body" for it recorded the previous prompt twice."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.order: list[str] = []

    async def handle(self, request: HTTPRequest) -> MockResponse:
        if not request.url.endswith("/models"):
            await anyio.sleep(self.delay)
        if request.method == "POST" and request.url.endswith("/completions"):
            prompt = json.loads(request.body or b"{}")["prompt"]
            self.order += prompt if isinstance(prompt, list) else [prompt]
        return self(request)


@pytest.mark.parametrize("anyio_backend", ["asyncio", virtual_trio()])
async def test_callers_beyond_a_full_queue_are_served_in_arrival_order() -> None:
    server = SlowServer(delay=0.01)
    one_at_a_time = {"normal": BatchPolicy(max_batch_size=1, max_wait=0)}
    limits = Limits(max_queued=3, max_in_flight=1, reserved_realtime=0)
    arrived: list[str] = []
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server.handle),
        batching=one_at_a_time,
        limits=limits,
    ) as client:

        async def caller(i: int) -> None:
            arrived.append(f"p{i}")  # the order calls reach the client
            await client.complete(f"p{i}")

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(caller, i)
            await anyio.sleep(0.005)
            stats = client.stats().tiers[llmbatch.Priority.NORMAL]
            assert (stats.in_flight, stats.queued) == (1, 39)  # 3 queued + 36 waiting
    assert server.order == arrived


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_lone_request_does_not_wait_for_company() -> None:
    fake = FakeServer()
    patient = {"normal": BatchPolicy(max_batch_size=16, max_wait=10.0)}
    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(fake), batching=patient
    ) as c:
        start = anyio.current_time()
        await c.complete("alone")
        assert anyio.current_time() - start == 0  # not the 10 s max_wait

        # Without idle dispatch it waits for company up to max_wait.
    waiting = {"normal": BatchPolicy(max_batch_size=16, max_wait=10.0, send_when_idle=False)}
    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(fake), batching=waiting
    ) as c:
        start = anyio.current_time()
        await c.complete("alone")
        assert anyio.current_time() - start == pytest.approx(10.0)


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_map_item_deadlines_expire_on_time_without_a_task_each() -> None:
    server = SlowServer(delay=5.0)
    async with Client("http://127.0.0.1:1/v1", transport=MockTransport(server.handle)) as client:
        start = anyio.current_time()
        items: list[Any] = [{"prompt": f"p{i}", "timeout": 1.0 + i % 3} for i in range(300)]
        results = await client.map(items)
        elapsed = anyio.current_time() - start
    assert all(isinstance(r.error, DeadlineExceeded) for r in results)
    assert elapsed == pytest.approx(3.0)  # the longest deadline, not the 5 s server


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_stream_past_its_deadline_ends_while_still_queued() -> None:
    server = SlowServer(delay=100.0)
    limits = Limits(max_in_flight=1, reserved_realtime=0)
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server.handle),
        limits=limits,
        on_close="cancel",
    ) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.complete("occupies the only seat", priority="realtime"))
            await anyio.sleep(0.1)
            start = anyio.current_time()
            with pytest.raises(DeadlineExceeded):
                async for _ in client.stream("never sent", timeout=2.0):
                    pass
            assert anyio.current_time() - start == pytest.approx(2.0)
            tg.cancel_scope.cancel()


def test_an_slo_beside_a_static_setting_is_refused_naming_both() -> None:
    with pytest.raises(llmbatch.ConfigError, match="adaptive=False") as info:
        Client(
            "http://127.0.0.1:1/v1",
            limits=Limits(max_in_flight=12, reserved_realtime=4, adaptive=False),
            slo=llmbatch.SLO(tpot=0.05),
        )
    assert info.value.field == "slo"
    with pytest.raises(TypeError, match=r"Limits\.adaptive must be a bool"):
        Limits(adaptive="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_static_setting_holds_bulk_at_its_cap_on_a_real_server() -> None:
    """``Limits(adaptive=False)``: the server never holds more bulk than
    ``max_in_flight - reserved_realtime`` (its own peak counter), and ``stats()``
    says so, where the closed loop would have grown past it (the frontier's sweep
    rests on this)."""
    from llmbatch_server.testing import run_simulator

    with run_simulator("--speed", "50") as sim:
        limits = Limits(max_in_flight=7, reserved_realtime=4, adaptive=False)
        async with Client(sim.base_url, limits=limits) as client:
            results = await client.map(
                [f"static {i}" for i in range(120)], max_tokens=8, priority="batch"
            )
            server = client.stats().servers[0]
        peak = await anyio.to_thread.run_sync(sim.peak_sequences)
    assert all(r.ok for r in results)
    assert (server.bulk_limit, server.realtime_reserve) == (3, 4)
    assert 1 <= peak <= 3


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_realtime_call_not_streamed_is_judged_whole_against_the_slo() -> None:
    """A 16-token call answered in 1.9 s under SLO(ttft=0.5, tpot=0.1) is within
    what the SLO bounds for it (0.5 + 15 x 0.1 = 2.0 s), though 1.9 s over 16 tokens
    is over ``tpot``; one in 2.1 s is not (``stats()``'s counts; virtual time)."""
    server = SlowServer(delay=1.9)
    slo = llmbatch.SLO(ttft=0.5, tpot=0.1)
    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(server.handle), slo=slo
    ) as client:
        await client.complete("fast enough", priority="realtime", max_tokens=16)
        server.delay = 2.1
        await client.complete("too slow", priority="realtime", max_tokens=16)
        counted = client.stats().servers[0]
    assert (counted.slo_met, counted.slo_missed) == (1, 1)
