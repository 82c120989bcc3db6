"""The Lua scripts on a real Redis: what a lease grants, when, and to whom."""

from __future__ import annotations

import itertools
import socket
from collections.abc import AsyncIterator

import anyio
import pytest

from llmbatch._redis.link import RedisLink, SharedBudgetUnreachable
from llmbatch._redis.scripts import RATE_LEASE, SEAT_LEASE, rate_keys, seat_keys
from llmbatch_server.redis_process import RedisProcess

pytestmark = pytest.mark.anyio
_keys = (f"test-{n}" for n in itertools.count())


@pytest.fixture
async def link(redis_server: RedisProcess) -> AsyncIterator[RedisLink]:
    """A connection to the module's Redis, closed after the test."""
    link = RedisLink(redis_server.url)
    yield link
    await link.aclose()


class Rate:
    """Leases of one request budget: ``rate`` per second, a bucket of ``cap``."""

    def __init__(
        self, link: RedisLink, rate: float = 10.0, cap: float = 10.0, horizon: float = 0.25
    ) -> None:
        self.link, self.rate, self.cap, self.horizon = link, rate, cap, horizon
        self.keys = rate_keys(next(_keys))

    async def lease(
        self, want: float, *, member: str = "a", realtime: bool = False, ticket: bool = False
    ) -> tuple[int, float, float]:
        """(sharers, granted, seconds)"""
        reply = await self.link.run(
            RATE_LEASE,
            self.keys,
            [member, "1" if realtime else "0", self.rate, self.cap, want, 0, 0, 0,
             0.25, self.horizon, 1.0, 10.0, "1" if ticket else "0"],
        )  # fmt: skip
        return int(reply[0]), float(reply[1]), float(reply[2])


async def test_a_full_bucket_grants_at_once_then_spaces_leases_at_the_rate(link: RedisLink) -> None:
    rate = Rate(link)
    granted = [await rate.lease(2.5) for _ in range(3)]  # 7.5 of 10, above the reserve
    assert [g[1] for g in granted] == [2.5, 2.5, 2.5]
    assert all(g[2] == 0.0 for g in granted)
    # Bulk leaves the realtime reserve (2.5): the next block is usable in ~0.25 s
    # (within the bulk horizon), so it is granted for later.
    _, got, usable_in = await rate.lease(2.5)
    assert got == 2.5
    assert 0.15 < usable_in <= 0.26
    # The queue is now a whole horizon ahead: refused, told when to come back.
    _, got, back_in = await rate.lease(2.5, member="b")
    assert got == 0
    assert 0.1 < back_in < 0.6


async def test_realtime_takes_the_reserve_that_bulk_leaves(link: RedisLink) -> None:
    rate = Rate(link)
    for _ in range(4):
        await rate.lease(2.5)  # bulk has queued as far as it may
    _, refused, _ = await rate.lease(1, member="bulk")
    assert refused == 0
    _, got, usable_in = await rate.lease(1, member="rt", realtime=True)
    assert got == 1
    assert usable_in <= 0.11


async def test_realtime_goes_ahead_of_bulk_leases_granted_for_later(link: RedisLink) -> None:
    rate = Rate(link, horizon=2.0)
    grants: list[tuple[float, float]] = []  # (usable in, amount)
    while True:  # bulk queues leases as far ahead as the horizon lets it
        _, got, seconds = await rate.lease(2.5)
        if not got:
            break
        grants.append((seconds, got))
    assert len(grants) == 3 + 8  # 7.5 now (the reserve left), then 2 s of the rate
    assert grants[-1][0] == pytest.approx(2.0, abs=0.05)
    # Realtime does not wait behind them: the reserve is usable at once, then more at
    # the rate, borrowed from later budget (the bulk leases after it wait longer).
    realtime = [await rate.lease(1, member="rt", realtime=True) for _ in range(4)]
    assert [r[1] for r in realtime] == [1, 1, 1, 1]
    assert realtime[1][2] <= 0.01
    assert realtime[3][2] == pytest.approx(0.15, abs=0.05)
    grants += [(r[2], r[1]) for r in realtime]
    # What is usable by any time t stays within one bucket, the rate, and what
    # realtime may borrow (the bulk horizon's worth).
    for t, _ in grants:
        usable_by_t = sum(amount for at, amount in grants if at <= t)
        assert usable_by_t <= 10 + 10 * t + 10 * 2.0 + 1e-6
    _, got, _ = await rate.lease(2.5, member="b")
    assert got == 0  # the queue of bulk leases is two seconds (and realtime's) ahead


async def test_realtime_alone_gets_one_bucket_at_once(link: RedisLink) -> None:
    rate = Rate(link, horizon=2.0)
    usable = [(await rate.lease(2.5, member="rt", realtime=True))[2] for _ in range(5)]
    # Nothing to borrow from without bulk leases queued: a burst is one bucket (10).
    assert usable[:4] == [0.0] * 4
    assert usable[4] == pytest.approx(0.25, abs=0.02)


async def test_refused_bulk_comes_back_in_order_and_a_ticket_is_served_first(
    link: RedisLink,
) -> None:
    rate = Rate(link)
    for _ in range(4):
        await rate.lease(2.5)
    backs = [(await rate.lease(2.5, member=m))[2] for m in ("b", "c", "d")]
    assert backs == sorted(backs)
    assert backs[2] - backs[0] == pytest.approx(0.5, abs=0.02)
    # A newcomer without a ticket queues behind them instead of jumping ahead.
    _, got, back = await rate.lease(2.5, member="e")
    assert got == 0
    assert back > backs[2]


async def test_giving_back_makes_the_budget_usable_again(link: RedisLink) -> None:
    rate = Rate(link)
    for _ in range(4):
        await rate.lease(2.5)
    await rate.lease(-5)  # a closing process gives back what it did not use
    _, got, usable_in = await rate.lease(2.5, member="b")
    assert got == 2.5
    assert usable_in <= 0.01


async def test_sharers_are_counted(link: RedisLink) -> None:
    rate = Rate(link)
    for member in ("a", "b", "c"):
        sharers, _, _ = await rate.lease(0, member=member)
    assert sharers == 3


class Seats:
    def __init__(self, link: RedisLink, cap: int = 64, lease: float = 10.0) -> None:
        self.link, self.cap, self.lease = link, cap, lease
        self.keys = seat_keys(next(_keys))

    async def renew(self, member: str, want: int, in_flight: int = 0) -> tuple[int, int, bool, int]:
        """(held, allowed, contended, members)"""
        reply = await self.link.run(
            SEAT_LEASE, self.keys, [member, want, 0, in_flight, 0, self.cap, 0, self.lease]
        )
        return int(reply[0]), int(reply[1]), reply[4] == "1", int(reply[5])


async def test_seats_are_split_fairly_and_never_over_the_budget(link: RedisLink) -> None:
    seats = Seats(link)
    held, allowed, contended, _ = await seats.renew("a", 100)
    assert (held, allowed, contended) == (64, 64, False)
    # b arrives: its fair half is held by a, so it gets nothing yet, and everyone
    # hears that someone holds less than its share.
    held, allowed, contended, members = await seats.renew("b", 100)
    assert (held, allowed, contended, members) == (0, 0, True, 2)
    # a still has 40 in flight: it holds them, and is allowed only its half.
    held, allowed, _, _ = await seats.renew("a", 100, in_flight=40)
    assert (held, allowed) == (40, 32)
    held, allowed, _, _ = await seats.renew("b", 100)
    assert (held, allowed) == (24, 24)  # what a left free, never more
    held, allowed, _, _ = await seats.renew("a", 100, in_flight=30)
    held_b, allowed_b, contended, _ = await seats.renew("b", 100, in_flight=24)
    assert (held, allowed, held_b, allowed_b, contended) == (32, 32, 32, 32, False)


async def test_small_wants_are_met_whole_and_the_rest_is_shared(link: RedisLink) -> None:
    seats = Seats(link, cap=10)
    await seats.renew("small", 2)
    await seats.renew("x", 100)
    await seats.renew("y", 100)
    allowed = [(await seats.renew(m, w))[1] for m, w in (("small", 2), ("x", 100), ("y", 100))]
    assert allowed == [2, 4, 4]


async def test_a_lease_not_renewed_frees_its_seats(link: RedisLink) -> None:
    seats = Seats(link, cap=8, lease=0.5)
    await seats.renew("dead", 8, in_flight=8)
    assert (await seats.renew("live", 8))[1] == 0
    await anyio.sleep(0.6)  # past the dead one's lease (Redis's clock decides)
    held, allowed, _, members = await seats.renew("live", 8)
    assert (held, allowed, members) == (8, 8, 1)


async def test_leaving_gives_every_seat_back(link: RedisLink) -> None:
    seats = Seats(link, cap=8)
    await seats.renew("a", 8)
    await seats.renew("a", 0)  # nothing wanted, nothing in flight: gone
    assert (await seats.renew("b", 8))[:2] == (8, 8)


async def test_an_unreachable_redis_is_one_typed_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    link = RedisLink(f"redis://:secret@127.0.0.1:{port}/0")
    with pytest.raises(SharedBudgetUnreachable) as caught:
        await link.run(RATE_LEASE, rate_keys("x"), ["a", "0", 1, 1, 0, 0, 0, 0, 0, 0, 0, 10, "0"])
    assert "secret" not in str(caught.value)
    assert link.failures == 1
    assert link.where == f"redis://:***@127.0.0.1:{port}/0"
    await link.aclose()
