"""Cancellation storms: 10,000 callers cancelled at random points (before queueing,
while queued, in flight, mid-stream, or just as their answer lands). Afterwards the
queues are empty, nothing is in flight, every connection is back, the server is
idle, ``stats()`` adds up, and the client still works; the only tasks left are the
client's idle senders (at most one per in-flight seat), and none once it closes."""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sniffio
from fake_server import FakeServer

import llmbatch
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport
from llmbatch_server.testing import run_simulator

pytestmark = pytest.mark.anyio

N = 10_000
TIERS = ("realtime", "normal", "batch")
RUNNING_ZERO = r"vllm:num_requests_running\{[^}]*\} 0\.?0*\n"


def give_up_after(rng: random.Random) -> float:
    """When a caller gives up: at once, at some point during the storm (queued, in
    flight, mid-stream, as its answer lands), or never."""
    return rng.choice([0.0, 0.001, rng.uniform(0, 1.0), rng.uniform(0, 3.0), 60.0])


def live_tasks() -> int:
    """Tasks alive in this event loop now (asyncio or trio)."""
    if sniffio.current_async_library() == "asyncio":
        import asyncio

        return len(asyncio.all_tasks())
    import trio

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    return count(root)


class SlowFakeServer:
    """FakeServer behind a random delay, counting exchanges still open (the mock's
    equivalent of connections out of the pool)."""

    def __init__(self, seed: int) -> None:
        self.fake = FakeServer()
        self.rng = random.Random(seed)
        self.open = 0
        self.served = 0

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        self.open += 1
        try:
            if not request.url.endswith("/models"):
                await anyio.sleep(self.rng.choice([0.0, 0.001, 0.005, 0.02]))
            response: MockResponse = self.fake(request)
            self.served += 1
            return response
        finally:
            self.open -= 1


@pytest.mark.slow_on_trio("4 s of a thousand cancellations; trio's own run stays in CI")
async def test_cancellation_storm_on_a_mock_transport() -> None:
    rng = random.Random(11)
    server = SlowFakeServer(seed=12)
    callers: Counter[str] = Counter()
    limits = llmbatch.Limits(max_in_flight=64, reserved_realtime=8, max_queued=500)
    before = live_tasks()
    async with llmbatch.Client(
        "http://127.0.0.1:9/v1", transport=MockTransport(server), limits=limits
    ) as client:
        baseline = live_tasks()

        async def caller(i: int) -> None:
            kind = rng.choice(["complete", "complete", "chat", "stream"])
            tier: Any = TIERS[i % 3]
            with anyio.move_on_after(give_up_after(rng)) as scope:
                if kind == "complete":
                    await client.complete(f"q{i}", priority=tier, max_tokens=2)
                elif kind == "chat":
                    await client.chat([{"role": "user", "content": f"c{i}"}], priority=tier)
                else:
                    async for _ in client.stream(f"s{i}", priority=tier, max_tokens=2):
                        await anyio.lowlevel.checkpoint()
            callers["cancelled" if scope.cancelled_caught else "answered"] += 1

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(N):
                    tg.start_soon(caller, i)
        await wait_until(lambda: server.open == 0)
        stats = client.stats()
        assert live_tasks() <= baseline + limits.max_in_flight, "the storm left tasks behind"
        assert (await client.complete("after the storm", max_tokens=2)).text
    assert live_tasks() <= before, "tasks outlived the client"
    check_stats(stats, callers, expected_requests=N)
    assert server.open == 0, "an exchange was left open"
    print(f"\nmock storm: {dict(callers)}, exchanges served {server.served}")


@pytest.mark.asyncio_only(
    "checks aiohttp's connector for held connections; the mock storm above covers trio"
)
async def test_cancellation_storm_on_a_real_server() -> None:
    rng = random.Random(7)
    callers: Counter[str] = Counter()
    limits = llmbatch.Limits(max_connections=16)
    timeout = llmbatch.Timeout(pool=10)
    with run_simulator("--speed", "100") as sim:
        before = live_tasks()
        async with llmbatch.Client(sim.base_url, limits=limits, timeout=timeout) as client:
            baseline = live_tasks()

            async def caller(i: int) -> None:
                with anyio.move_on_after(give_up_after(rng)) as scope:
                    await client.complete(f"q{i}", priority=TIERS[i % 3], max_tokens=4)  # type: ignore[arg-type]
                callers["cancelled" if scope.cancelled_caught else "answered"] += 1

            async def mapper(m: int) -> None:
                # A map whose consumer walks away part-way through.
                with anyio.move_on_after(rng.choice([0.01, 0.05, 0.2])):
                    async for _ in client.map_unordered([f"m{m}-{j}" for j in range(300)]):
                        pass

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for m in range(5):
                        tg.start_soon(mapper, m)
                    for i in range(N):
                        tg.start_soon(caller, i)
            stats = client.stats()
            seats = limits.max_in_flight
            assert live_tasks() <= baseline + seats, "the storm left tasks behind"
            # Connections are back in the pool: none is held by a response...
            connector = client._runtime.fleet.health.server(0).transport._session.connector  # type: ignore[union-attr,attr-defined]
            assert len(connector._acquired) == 0
            # ...and the whole pool serves a burst wider than it.
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for j in range(64):
                        tg.start_soon(client.complete, f"after {j}")
        assert live_tasks() <= before, "tasks outlived the client"
        # The server saw the callers go and dropped their work (another process:
        # there is no event to wait on, so poll it, bounded).
        with anyio.fail_after(10):
            while not re.search(RUNNING_ZERO, sim.metrics()):  # noqa: ASYNC110
                await anyio.sleep(0.05)
    check_stats(stats, callers, expected_requests=None)
    assert callers["answered"] > 1000
    assert callers["cancelled"] > 1000
    print(f"\nsimulator storm: {dict(callers)}, batches sent {stats.batches_sent}")


def check_stats(
    stats: llmbatch.Stats, callers: Counter[str], *, expected_requests: int | None
) -> None:
    for tier in stats.tiers.values():
        assert tier.queued == 0, "a request is still queued"
        assert tier.in_flight == 0, "a request is still in flight"
        assert tier.failed == 0
    done = sum(t.done for t in stats.tiers.values())
    cancelled = sum(t.cancelled for t in stats.tiers.values())
    assert callers["answered"] + callers["cancelled"] == N
    # A caller cancelled just as its answer landed counts as done, never twice.
    assert callers["answered"] <= done
    if expected_requests is not None:
        assert cancelled <= callers["cancelled"]
        assert done + cancelled == expected_requests
    else:
        assert done + cancelled >= N  # plus the items of the abandoned maps


async def wait_until(condition: Any, timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds (bounded): the mock server's counter has no
    event to wait on."""
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.001)
