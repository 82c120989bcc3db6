"""What processes sharing a ``RateLimit`` key tell each other of a hosted provider,
through a real Redis, against a real simulator playing the provider: the limits its
headers state, and a 429's wait. Two clients in one process stand for two processes
(each has its own engine, Redis connection and member id)."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack

import anyio
import pytest

from llmbatch import Client, Limits, LLMBatchError, RateLimit
from llmbatch._redis.hosted import POLL, HostedSharing
from llmbatch._redis.link import RedisLink
from llmbatch._scheduler import Scheduler
from llmbatch_server.redis_process import RedisProcess
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow_on_trio("real Redis and a simulator, seconds each; the logic is backend-free"),
]


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def provider() -> Iterator[SimulatorProcess]:
    # A provider's limiter (OpenAI's headers on every answer), and 429s on demand.
    with run_simulator(
        "--zero-latency",
        "--rate-limit-rpm",
        "6000",
        "--rate-limit-tpm",
        "900000",
        "--retry-after",
        "1.5",
        "--enable-admin",
    ) as server:
        yield server


async def test_a_limit_one_process_learnt_paces_another_before_its_own_answers(
    redis_server: RedisProcess, provider: SimulatorProcess
) -> None:
    shared = RateLimit(redis_url=redis_server.url, key=fresh("hosted"))
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(Client(provider.base_url, rate_limit=shared))
        await first.complete("hi", max_tokens=2)
        with anyio.fail_after(2):
            while first.stats().rate is None:  # noqa: ASYNC110 (the engine's next turn)
                await anyio.sleep(0.01)
        rate = first.stats().rate
        assert rate is not None
        assert (rate.requests_per_minute, rate.tokens_per_minute, rate.source) == (
            5700,
            855_000,
            "learnt",
        )
        assert provider.base_url in rate.evidence
        second = await stack.enter_async_context(Client(provider.base_url, rate_limit=shared))
        with anyio.fail_after(5):
            while second.stats().rate is None:  # noqa: ASYNC110
                await anyio.sleep(POLL / 2)
        heard = second.stats().rate
        assert heard is not None
        assert (heard.requests_per_minute, heard.source) == (5700, "shared")
        assert "another process sharing the key" in heard.evidence
        # It leases from the shared budget: its first call goes once a lease came.
        await second.complete("hi", max_tokens=2)
        stats = second.stats().shared
        assert stats is not None
        assert stats.rate_sharers == 2


def heard(client: Client) -> bool:
    shared = client.stats().shared
    return shared is not None and bool(shared.cooldowns_heard)


async def test_a_429_one_process_met_holds_the_other_until_its_wait_ends(
    redis_server: RedisProcess, provider: SimulatorProcess
) -> None:
    shared = RateLimit(redis_url=redis_server.url, key=fresh("cooldown"))
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(Client(provider.base_url, rate_limit=shared))
        second = await stack.enter_async_context(Client(provider.base_url, rate_limit=shared))
        await second.complete("warm", max_tokens=1)  # learnt, leasing
        await anyio.to_thread.run_sync(lambda: provider.set_faults(error_429=1.0))
        met = time.monotonic()
        try:
            # Refused, and its retry would wait longer than it may.
            with pytest.raises(LLMBatchError):
                await first.complete("hi", max_tokens=1, timeout=0.5)
        finally:
            await anyio.to_thread.run_sync(lambda: provider.set_faults(error_429=0.0))
        with anyio.fail_after(3):
            while not heard(second):  # noqa: ASYNC110
                await anyio.sleep(POLL / 4)
        server = second.stats().server
        assert server is not None
        assert server.cooldown is not None
        assert server.cooldown > 0.5
        # Nothing it sends goes before the wait the other process was given ends.
        await second.complete("after", max_tokens=1)
        assert time.monotonic() - met >= 1.5 - POLL - 0.1


class Cooling:
    def __init__(self) -> None:
        self.cooldown_until = -math.inf


async def test_the_longest_wait_said_stands_and_one_heard_is_not_counted_twice(
    redis_server: RedisProcess,
) -> None:
    key = fresh("waits")
    sides: list[tuple[Cooling, HostedSharing, RedisLink]] = []
    for _ in range(2):
        server = Cooling()
        link = RedisLink(redis_server.url)
        sharing = HostedSharing(
            link,
            key,
            scheduler=Scheduler(limits=Limits()),
            servers=lambda server=server: (server,),  # type: ignore[misc]
            clock=time.monotonic,
            wake=lambda: None,
        )
        sides.append((server, sharing, link))
    (a, a_sharing, _), (b, b_sharing, _) = sides
    try:
        a.cooldown_until = time.monotonic() + 3.0
        await a_sharing.exchange()
        await b_sharing.exchange()
        assert b.cooldown_until == pytest.approx(a.cooldown_until, abs=0.1)
        assert b_sharing.heard_cooldowns == 1
        await b_sharing.exchange()
        assert b_sharing.heard_cooldowns == 1  # the same wait, heard again: not new
        # A shorter wait met later does not cut the longer one short.
        longer = a.cooldown_until
        a.cooldown_until = time.monotonic() + 1.0
        await a_sharing.exchange()
        fresh_side = Cooling()
        c_sharing = HostedSharing(
            sides[1][2],
            key,
            scheduler=Scheduler(limits=Limits()),
            servers=lambda: (fresh_side,),
            clock=time.monotonic,
            wake=lambda: None,
        )
        await c_sharing.exchange()
        assert fresh_side.cooldown_until == pytest.approx(longer, abs=0.1)
    finally:
        for _, _, link in sides:
            await link.aclose()


async def test_sharers_of_a_learnt_budget_slow_down_together_for_429s(
    redis_server: RedisProcess,
) -> None:
    """A third party on the key: the 429s one process meets slow every process
    leasing the learnt budget (once per burst, whoever met it), and the speed comes
    back a step a second from 3 s after the last cut (CUT, RAISE, RAISE_AFTER)."""
    key = fresh("speed")
    shared = RateLimit(redis_url=redis_server.url, key=key)
    sides: list[tuple[Scheduler, HostedSharing, list[RateLimit]]] = []
    for _ in range(2):
        scheduler = Scheduler(limits=Limits(), rate_limit=shared)
        leased: list[RateLimit] = []
        scheduler.on_rate_learnt = leased.append
        scheduler.learn_rate(6000, 90_000)
        sharing = HostedSharing(
            RedisLink(redis_server.url),
            key,
            scheduler=scheduler,
            servers=lambda: (),
            clock=time.monotonic,
            wake=lambda: None,
        )
        sides.append((scheduler, sharing, leased))
    (a, a_sharing, a_leased), (b, b_sharing, b_leased) = sides
    assert a_leased[-1].requests_per_minute == 5700  # 95 % of what was learnt
    assert a.rate is not None
    assert b.rate is not None
    a.rate_answered(time.monotonic(), refused=True)  # a burst of 429s at a
    await a_sharing.exchange()
    await b_sharing.exchange()
    assert (a.rate.speed, b.rate.speed) == (0.75, 0.75)
    assert b_leased[-1].requests_per_minute == pytest.approx(5700 * 0.75)
    assert b_leased[-1].tokens_per_minute == pytest.approx(85_500 * 0.75)
    assert (b_leased[-1].redis_url, b_leased[-1].key) == (redis_server.url, key)
    # b meets the same burst within the second: one cut for both, not two.
    b.rate_answered(time.monotonic(), refused=True)
    await b_sharing.exchange()
    await a_sharing.exchange()
    assert (a.rate.speed, b.rate.speed) == (0.75, 0.75)
    # No 429 since: from 3 s after the cut, a step a second.
    await anyio.sleep(3.1)
    await a_sharing.exchange()
    await b_sharing.exchange()
    assert a.rate.speed == pytest.approx(0.8)
    assert b.rate.speed == pytest.approx(0.8)
    await b_sharing.exchange()  # within the second: no second step
    assert b.rate.speed == pytest.approx(0.8)
