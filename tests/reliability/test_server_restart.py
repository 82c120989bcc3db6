"""A real simulator process killed (SIGKILL) and restarted during a ``map``."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

import llmbatch
from llmbatch_server.testing import run_simulator

pytestmark = pytest.mark.anyio


async def test_map_survives_a_server_restart() -> None:
    retry = llmbatch.RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.5)
    with run_simulator("--speed", "20") as sim:
        seen: list[int] = []
        async with llmbatch.Client(sim.base_url, retry=retry) as client:
            with anyio.fail_after(120):
                async for index, result in client.map_unordered(
                    [f"item {i}" for i in range(3000)], max_tokens=4, ignore_eos=True
                ):
                    assert result.ok, result.error
                    seen.append(index)
                    if len(seen) == 300:
                        await anyio.to_thread.run_sync(sim.kill)
                        await anyio.sleep(0.5)  # down for a while, then back on the same port
                        await anyio.to_thread.run_sync(sim.restart)
            retried = client.stats().tiers[llmbatch.Priority.BATCH].retried
    assert sorted(seen) == list(range(3000))  # nothing lost, nothing duplicated
    assert retried > 0


async def test_server_down_past_the_retry_budget_fails_clearly() -> None:
    retry = llmbatch.RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02)
    with run_simulator("--zero-latency") as sim:
        async with llmbatch.Client(sim.base_url, retry=retry) as client:
            await anyio.to_thread.run_sync(sim.kill)
            with anyio.fail_after(30):  # nothing hangs
                results = await client.map([f"item {i}" for i in range(50)], max_tokens=2)
                with pytest.raises(llmbatch.ConnectError) as info:
                    await client.complete("alone", priority="realtime", max_tokens=2)
    assert all(isinstance(r.error, llmbatch.ConnectError) for r in results)
    assert info.value.attempts == 3
