"""10,000 callers cancelled at random points; afterwards nothing is left behind."""

from __future__ import annotations

import asyncio
import random

import anyio
import pytest

import llmbatch
from llmbatch_server.testing import run_simulator

pytestmark = pytest.mark.anyio

N = 10_000


async def test_cancellation_storm() -> None:
    rng = random.Random(7)
    outcomes = {"ok": 0, "cancelled": 0}
    with run_simulator("--speed", "100") as sim:
        async with llmbatch.Client(sim.base_url) as client:
            baseline_tasks = len(asyncio.all_tasks())

            async def caller(i: int) -> None:
                tier = ("realtime", "normal", "batch")[i % 3]
                with anyio.move_on_after(rng.choice([0, 0.001, 0.01, 0.05, 0.2, 5])) as scope:
                    await client.complete(f"q{i}", priority=tier, max_tokens=4)
                outcomes["cancelled" if scope.cancelled_caught else "ok"] += 1

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for i in range(N):
                        tg.start_soon(caller, i)
            stats = client.stats()
            # The client's background work is back to what it was before the storm.
            assert len(asyncio.all_tasks()) <= baseline_tasks
            # And it still serves requests.
            assert (await client.complete("after", max_tokens=2)).text is not None
    assert outcomes["ok"] + outcomes["cancelled"] == N
    assert outcomes["cancelled"] > 1000
    assert outcomes["ok"] > 1000
    for tier in stats.tiers.values():
        assert tier.queued == 0
        assert tier.in_flight == 0
    done = sum(t.done for t in stats.tiers.values())
    cancelled = sum(t.cancelled for t in stats.tiers.values())
    failed = sum(t.failed for t in stats.tiers.values())
    assert failed == 0
    # Every caller is counted once: answered, or gone before its answer.
    assert done + cancelled >= N
    assert cancelled <= outcomes["cancelled"]
