"""A real simulator process SIGKILLed during a ``map``: restarted on the same port,
the map completes with nothing lost or duplicated; kept down past the outage
tolerance, every item fails with a clear ServerOutageError and nothing hangs; with
the patience turned off, with a ConnectError after exactly its budgeted attempts."""

from __future__ import annotations

import os
import signal
from collections import Counter

import anyio
import anyio.to_thread
import pytest

import llmbatch
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow_on_trio(
        "servers killed and restarted for real, seconds each; the logic is backend-free"
    ),
]

N = 3000


def sigkill(sim: SimulatorProcess) -> None:
    """Kill the server the hard way (no graceful shutdown) and reap it."""
    assert sim.pid is not None
    os.kill(sim.pid, signal.SIGKILL)
    sim.kill()  # reaps it (already dead)


async def test_map_survives_a_server_killed_and_restarted() -> None:
    # Enough budget to outlast the restart: up to ~0.5 s a wait, 30 attempts.
    retry = llmbatch.RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.5)
    with run_simulator("--speed", "20") as sim:
        port = sim.port
        seen: Counter[int] = Counter()
        in_flight_at_kill = 0
        async with llmbatch.Client(sim.base_url, retry=retry) as client:
            with anyio.fail_after(120):
                async for index, result in client.map_unordered(
                    [f"item {i}" for i in range(N)], max_tokens=4, ignore_eos=True
                ):
                    assert result.ok, result.error
                    seen[index] += 1
                    if sum(seen.values()) == 300:
                        in_flight_at_kill = client.stats().tiers[llmbatch.Priority.BATCH].in_flight
                        sigkill(sim)
                        await anyio.sleep(0.5)  # down for a while...
                        await anyio.to_thread.run_sync(sim.restart)  # ...then back
            stats = client.stats()
        assert sim.port == port  # the same address, as after a real crash and restart
    assert in_flight_at_kill > 0, "the kill did not catch requests in flight"
    assert sorted(seen) == list(range(N)), "an item was lost"
    assert set(seen.values()) == {1}, "an item was delivered twice"
    batch = stats.tiers[llmbatch.Priority.BATCH]
    assert batch.done == N
    assert batch.failed == 0
    assert batch.retried > 0


async def killed_for_good(
    retry: llmbatch.RetryPolicy,
) -> tuple[list[llmbatch.Result[object]], list[BaseException], llmbatch.Stats, int]:
    """Kill the server during a 200-item map and never restart it; then a complete,
    a chat and a stream. Returns the map's results, the three calls' errors, the
    stats, and the port."""
    with run_simulator("--speed", "5") as sim:
        async with llmbatch.Client(sim.base_url, retry=retry) as client:
            with anyio.fail_after(30):  # nothing hangs
                async with anyio.create_task_group() as tg:
                    results: list[llmbatch.Result[object]] = []

                    async def run_map() -> None:
                        results.extend(
                            await client.map([f"item {i}" for i in range(200)], max_tokens=50)
                        )

                    tg.start_soon(run_map)
                    # stats() is a snapshot API with no event to wait on: poll it, bounded.
                    with anyio.fail_after(10):
                        while client.stats().tiers[llmbatch.Priority.BATCH].in_flight == 0:  # noqa: ASYNC110
                            await anyio.sleep(0.005)
                    sigkill(sim)
                errors: list[BaseException] = []
                for call in (
                    lambda: client.complete("alone", priority="realtime", max_tokens=2),
                    lambda: client.chat([{"role": "user", "content": "hi"}], max_tokens=2),
                    lambda: _drain(client.stream("story", max_tokens=2)),
                ):
                    try:
                        await call()
                    except llmbatch.LLMBatchError as exc:
                        errors.append(exc)
            stats = client.stats()
        return results, errors, stats, sim.port


async def _drain(deltas: object) -> None:
    async for _ in deltas:  # type: ignore[attr-defined]
        pass


async def test_server_down_past_the_outage_tolerance_fails_clearly() -> None:
    retry = llmbatch.RetryPolicy(
        attempts=3, initial_backoff=0.01, max_backoff=0.02, outage_tolerance=2.0
    )
    results, errors, stats, port = await killed_for_good(retry)
    assert len(results) == 200
    for result in results:
        assert isinstance(result.error, llmbatch.ServerOutageError), result.error
    assert len(errors) == 3
    for error in errors:
        assert isinstance(error, llmbatch.ServerOutageError), error
        assert f"127.0.0.1:{port}" in str(error)  # says which server
        assert "outage tolerance of 2s" in str(error)
        assert "cannot connect" in str(error) or "dropped" in str(error)  # and why
    assert stats.tiers[llmbatch.Priority.BATCH].failed == 200
    for tier in stats.tiers.values():
        assert tier.queued == 0
        assert tier.in_flight == 0


async def test_without_patience_a_dead_server_fails_after_the_retry_budget() -> None:
    """outage_tolerance=0: 0.1's behaviour, each request fails on its own attempts."""
    retry = llmbatch.RetryPolicy(
        attempts=3, initial_backoff=0.01, max_backoff=0.02, outage_tolerance=0
    )
    results, errors, stats, port = await killed_for_good(retry)
    assert len(results) == 200
    for result in results:
        assert isinstance(result.error, llmbatch.ConnectError | llmbatch.RemoteProtocolError)
        assert result.error.attempts <= 3
    assert [type(e) for e in errors] == [llmbatch.ConnectError] * 3
    error = errors[0]
    assert isinstance(error, llmbatch.ConnectError)
    assert error.attempts == 3
    assert "cannot connect" in str(error)
    assert f"127.0.0.1:{port}" in str(error)  # says where it tried
    assert error.request_id is not None
    assert stats.tiers[llmbatch.Priority.BATCH].failed == 200
