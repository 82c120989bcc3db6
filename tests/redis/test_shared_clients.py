"""Clients sharing budgets through a real Redis, against a real simulator.

Several clients in one process stand for several processes here (each has its own
engine, leaser and Redis connection, and a member id of its own); the test that
needs a process to die runs one in a subprocess and SIGKILLs it. Counts are read
from the simulator's own /metrics."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

import llmbatch
from llmbatch import BatchPolicy, Client, RateLimit, SharedInFlight
from llmbatch_server.redis_process import RedisProcess
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow_on_trio("real Redis and simulators, seconds each; the logic is backend-free"),
]


def fresh(name: str) -> str:
    """A key no other test (or backend's run of this one) has used."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


ONE = {t: BatchPolicy(max_batch_size=1, max_wait=0.0) for t in ("realtime", "normal", "batch")}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency") as server:
        yield server


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimulatorProcess]:
    # 64 output tokens take ~0.3 s at this speed: sequences stay in flight a while.
    with run_simulator("--speed", "20") as server:
        yield server


async def open_clients(stack: AsyncExitStack, n: int, url: str, **options: Any) -> list[Client]:
    """``n`` open clients with the same options, closed when ``stack`` closes."""
    return [await stack.enter_async_context(Client(url, **options)) for _ in range(n)]


async def hammer(clients: list[Client], seconds: float, **params: object) -> None:
    """Every client maps far more prompts than it may send, for ``seconds``."""

    async def one(client: Client) -> None:
        with anyio.move_on_after(seconds):
            await client.map([f"p{i}" for i in range(100_000)], **params)  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(one, client)


async def test_clients_sharing_a_key_share_one_request_budget(
    sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    limit = RateLimit(requests_per_minute=1200, redis_url=redis_server.url, key=fresh("rpm"))
    async with AsyncExitStack() as stack:
        clients = await open_clients(stack, 3, sim.base_url, rate_limit=limit, batching=ONE)
        before, started = sim.post_count(), time.monotonic()
        await hammer(clients, 3.0, max_tokens=2)
        elapsed = time.monotonic() - started
        sent = sim.post_count() - before
        stats = [c.stats().shared for c in clients]
    # 20 a second between them, plus at most one bucket (20) at the start; each alone
    # would have sent that much.
    assert sent <= 20 * elapsed + 20 + 2
    assert sent >= 20 * elapsed * 0.8
    assert all(s is not None and s.rate_sharers == 3 and s.reachable for s in stats)
    round_trips = sum(s.round_trips for s in stats if s is not None)
    assert round_trips < sent  # blocks of budget, not a round trip per request


async def test_a_shared_token_budget_is_charged_by_usage(
    sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    # max_tokens 400 is charged up front; the simulator's answers stop after 8-127
    # tokens, and the difference comes back, so far more requests fit than the
    # up-front charge alone allows.
    limit = RateLimit(tokens_per_minute=60_000, redis_url=redis_server.url, key=fresh("tpm"))
    async with AsyncExitStack() as stack:
        clients = await open_clients(stack, 2, sim.base_url, rate_limit=limit, batching=ONE)
        started = time.monotonic()
        await hammer(clients, 2.0, max_tokens=400)
        elapsed = time.monotonic() - started
        used = sum(c.stats().prompt_tokens + c.stats().completion_tokens for c in clients)
        answered = sum(t.done for c in clients for t in c.stats().tiers.values())
    assert used <= 1000 * elapsed + 1000  # the budget plus one bucket
    assert answered * 402 > 1000 * elapsed * 1.5


async def test_realtime_goes_ahead_of_bulk_across_clients(
    sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    limit = RateLimit(requests_per_minute=600, redis_url=redis_server.url, key=fresh("tiers"))
    async with (
        Client(sim.base_url, rate_limit=limit, batching=ONE) as bulk,
        Client(sim.base_url, rate_limit=limit, batching=ONE) as interactive,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hammer, [bulk], 3.0)
            await anyio.sleep(1.0)  # bulk has queued as far ahead as it may
            waits = []
            for _ in range(5):
                started = time.monotonic()
                await interactive.complete("now", priority="realtime", max_tokens=2)
                waits.append(time.monotonic() - started)
            tg.cancel_scope.cancel()
    # At 10 a second, a realtime request waits for its own slot (0.1 s), not behind
    # the bulk queue (which would be up to half a second).
    assert sorted(waits)[2] < 0.2


async def test_clients_sharing_an_in_flight_budget_never_exceed_it(
    slow_sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    before = slow_sim.peak_sequences()
    assert before <= 12  # (a fresh simulator for this module)
    shared = SharedInFlight(max_in_flight=12, redis_url=redis_server.url, key=fresh("gpu"))
    async with AsyncExitStack() as stack:
        clients = await open_clients(stack, 3, slow_sim.base_url, shared_in_flight=shared)
        await hammer(clients, 3.0, max_tokens=64)
        allowed = [c.stats().shared.seats_allowed for c in clients]  # type: ignore[union-attr]
    assert slow_sim.peak_sequences() <= 12
    assert sum(a or 0 for a in allowed) <= 12
    assert all(a and a >= 3 for a in allowed)  # each got a share (4 when settled)


_HOLDER = """
import anyio, sys
from llmbatch import Client, SharedInFlight
async def main():
    shared = SharedInFlight(max_in_flight=8, redis_url=sys.argv[2], key=sys.argv[3], lease=1.5)
    async with Client(sys.argv[1], shared_in_flight=shared) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.map(["x"] * 100_000, max_tokens=64))
            while (client.stats().shared.seats_allowed or 0) < 8:
                await anyio.sleep(0.05)
            print("holding", flush=True)
anyio.run(main)
"""


async def test_a_killed_process_gives_its_share_back_within_the_lease(
    slow_sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    key = fresh("kill")
    # A plain Popen: the holder is started once, before anything here awaits.
    holder = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-c", _HOLDER, slow_sim.base_url, redis_server.url, key],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None
        with anyio.fail_after(20):
            line = await anyio.to_thread.run_sync(holder.stdout.readline)
        assert line.strip() == b"holding"
        shared = SharedInFlight(max_in_flight=8, redis_url=redis_server.url, key=key, lease=1.5)
        async with Client(slow_sim.base_url, shared_in_flight=shared) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(hammer, [client], 8.0)
                with anyio.fail_after(5):  # it has asked, and the holder holds its seats
                    while client.stats().shared.round_trips < 2:  # type: ignore[union-attr]  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                os.kill(holder.pid, signal.SIGKILL)
                killed = time.monotonic()
                with anyio.fail_after(5):
                    while client.stats().shared.seats_allowed != 8:  # type: ignore[union-attr]  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                returned = time.monotonic() - killed
                tg.cancel_scope.cancel()
        # The lease (1.5 s) since the holder's last renewal, then one renewal here.
        assert returned < 1.5 + 0.5
    finally:
        holder.kill()
        holder.wait()


def _dead_redis_url() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"redis://:hunter2@127.0.0.1:{sock.getsockname()[1]}/0"


async def test_unreachable_redis_fails_open_at_the_local_share_with_a_warning(
    sim: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    limit = RateLimit(requests_per_minute=600, redis_url=_dead_redis_url(), key="k")
    with caplog.at_level(logging.WARNING, logger="llmbatch"):
        async with Client(sim.base_url, rate_limit=limit) as client:
            with anyio.fail_after(10):
                answers = await client.map(["a", "b", "c"], max_tokens=2)
            stats = client.stats().shared
    assert all(a.ok for a in answers)
    assert stats is not None
    assert not stats.reachable
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("cannot be reached" in w and "on_redis_error='local'" in w for w in warnings)
    assert not any("hunter2" in w for w in warnings)


async def test_unreachable_redis_with_wait_holds_requests(
    sim: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    shared = SharedInFlight(
        max_in_flight=4, redis_url=_dead_redis_url(), key="k", on_redis_error="wait"
    )
    with caplog.at_level(logging.WARNING, logger="llmbatch"):
        async with Client(sim.base_url, shared_in_flight=shared, on_close="cancel") as client:
            with pytest.raises(llmbatch.DeadlineExceeded):
                await client.complete("held", max_tokens=2, timeout=1.5)
    assert sim.post_count() >= 0
    assert any("on_redis_error='wait'" in r.getMessage() for r in caplog.records)


async def test_a_restarted_redis_is_used_again(
    sim: SimulatorProcess, redis_server: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    limit = RateLimit(requests_per_minute=6000, redis_url=redis_server.url, key=fresh("restart"))
    with caplog.at_level(logging.WARNING, logger="llmbatch"):
        async with Client(sim.base_url, rate_limit=limit) as client:
            await client.map(["a"] * 20, max_tokens=2)
            await anyio.to_thread.run_sync(redis_server.restart)
            with anyio.fail_after(15):
                answers = await client.map(["b"] * 200, max_tokens=2)
            assert len(answers) == 200
            stats = client.stats().shared
    assert stats is not None
    assert stats.reachable


def test_a_shared_budget_without_the_redis_package_fails_at_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    limit = RateLimit(requests_per_minute=60, redis_url="redis://127.0.0.1:1", key="k")
    with pytest.raises(ImportError, match=r"pip install 'llmbatch\[redis\]'"):
        Client("http://127.0.0.1:1/v1", rate_limit=limit)


async def test_clients_sharing_a_tenants_rate_share_one_budget(
    sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    """A tenant's ``requests_per_minute`` held in Redis: three clients mapping for the
    same tenant send the tenant's budget between them (a prompt is one request for
    tenants, however batched), while another tenant of the same clients is not held."""
    key = fresh("tenant-rpm")
    tenants = {
        "team": llmbatch.TenantLimits(requests_per_minute=1200, redis_url=redis_server.url, key=key)
    }
    async with AsyncExitStack() as stack:
        clients = await open_clients(stack, 3, sim.base_url, tenants=tenants)
        started = time.monotonic()
        await hammer(clients, 2.0, max_tokens=2, tenant="team")
        elapsed = time.monotonic() - started
        done = sum(c.stats().tenants["team"].done for c in clients)
        free = await clients[0].map([f"f{i}" for i in range(500)], tenant="other", max_tokens=2)
    # 20 a second between them, plus at most one second's bucket at the start.
    assert done <= 20 * elapsed + 20 + 2
    assert done >= 20 * elapsed * 0.7
    assert all(r.ok for r in free)


async def test_clients_sharing_a_tenants_in_flight_limit_hold_it_together(
    slow_sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    """A tenant's ``max_in_flight`` held in Redis: three clients mapping for it never
    have more than its 4 prompts running at the server between them (counted there),
    and all of them get work done."""
    tenant = fresh("agent")
    tenants = {
        tenant: llmbatch.TenantLimits(max_in_flight=4, redis_url=redis_server.url, key=tenant)
    }
    async with AsyncExitStack() as stack:
        clients = await open_clients(stack, 3, slow_sim.base_url, tenants=tenants)

        async def one(client: Client) -> None:
            results = await client.map([f"p{i}" for i in range(12)], tenant=tenant, max_tokens=16)
            assert all(r.ok for r in results)

        async with anyio.create_task_group() as tg:
            for client in clients:
                tg.start_soon(one, client)
        done = [c.stats().tenants[tenant].done for c in clients]
    assert done == [12, 12, 12]
    assert slow_sim.peak_running(user=tenant) <= 4
    assert slow_sim.peak_running(user=tenant) >= 2  # shared, not one process alone
