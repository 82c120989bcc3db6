"""Rate limits shared through Redis: an engine-side task leases blocks of the shared
budget and credits the scheduler's :class:`~llmbatch._scheduler.buckets.LeasedBucket`s.

A bulk lease is enough for three batches like the last one (at least a quarter of a
second of the whole budget, at most half a second, and no more than each sharer's
part of the bulk horizon), asked for when the local bucket holds less than half a
lease. The script may grant it up to two seconds before it is usable, so a process
waits for its turn locally instead of asking twice. Realtime asks for just what its
batch lacks and goes ahead of bulk leases granted but not yet usable (see the script).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import anyio

from llmbatch._clock import Clock
from llmbatch._config import RateLimit
from llmbatch._redis.link import RedisLink, SharedBudgetUnreachable
from llmbatch._redis.scripts import RATE_LEASE, rate_keys
from llmbatch._scheduler.buckets import LeasedBucket, TokenBucket

__all__ = ["RateBuckets", "RateLeaser"]

#: A rate limit's request bucket and token bucket (None: not limited that way).
RateBuckets = tuple[TokenBucket | None, TokenBucket | None]

logger = logging.getLogger("llmbatch")

#: Seconds of the whole budget in the smallest bulk lease (less only when so many
#: processes share the budget that their leases would not fit in the bulk horizon).
BLOCK = 0.25
#: Seconds of the whole budget in the largest bulk lease (a larger one would only be
#: usable once the shared bucket is nearly full, and refill beyond full is lost).
MOST = 0.5
#: A bulk lease covers this many batches like the last one, within BLOCK..MOST.
BATCHES_PER_LEASE = 3
#: Seconds of the budget only realtime may lease (bulk leaves it in the bucket).
REALTIME_RESERVE = 0.25
#: Bulk leases may be granted this long before they are usable, so a process waits
#: for its turn without asking twice; realtime goes ahead of them (borrowing up to
#: this much of later budget).
BULK_HORIZON = 2.0
#: Realtime leases may be granted this long before they are usable.
REALTIME_HORIZON = 1.0
#: A process counts as sharing the budget for this long after its last lease.
SHARER_WINDOW = 10.0
#: Seconds between attempts while Redis cannot be reached.
RETRY_UNREACHABLE = 1.0


class RateLeaser:
    """Keeps one process's leased buckets filled from the shared budget."""

    def __init__(
        self,
        link: RedisLink,
        limit: RateLimit,
        buckets: RateBuckets,
        *,
        member: str,
        wake: Callable[[], None],
        clock: Clock,
    ) -> None:
        assert limit.key is not None
        self._link = link
        self._limit = limit
        self._keys = rate_keys(limit.key)
        self._member = member
        self._wake = wake
        self._now = clock
        self._rates = self._caps = self._blocks = self._most = (0.0, 0.0)
        self._buckets: list[tuple[int, LeasedBucket]] = []
        self._due = anyio.Event()
        self.retarget(limit, buckets)
        self.sharers = 1
        """Processes seen sharing the budget at the last lease."""
        self.reachable: bool | None = None
        """Whether the last call reached Redis (None: not tried yet)."""
        self._mismatch_told = False
        self.refusals = 0
        """Lease calls the budget refused (come back later)."""

    def retarget(self, limit: RateLimit, buckets: RateBuckets) -> None:
        """Lease at ``limit``'s rates into ``buckets`` from now on (a budget learnt
        from a provider's answers changed)."""
        self._limit = limit
        rates = (
            (limit.requests_per_minute or 0.0) / 60.0,
            (limit.tokens_per_minute or 0.0) / 60.0,
        )
        self._rates = rates
        # One second's worth caps a burst (at least one request, as for local limits).
        self._caps = (max(1.0, rates[0]), rates[1])
        self._blocks = (max(1.0, round(rates[0] * BLOCK)), rates[1] * BLOCK)
        self._most = (max(1.0, round(rates[0] * MOST)), rates[1] * MOST)
        self._buckets = []
        for index, bucket in enumerate(buckets):
            if bucket is None:
                continue
            assert isinstance(bucket, LeasedBucket)
            bucket.low = self._blocks[index] / 2
            bucket.notify = self._poke
            self._buckets.append((index, bucket))
        self._poke()

    def _poke(self) -> None:
        self._due.set()

    async def run(self) -> None:
        """Lease whenever a bucket runs low or a batch waits; runs until cancelled."""
        while True:
            if self.reachable is False:
                with anyio.move_on_after(RETRY_UNREACHABLE):
                    await self._due.wait()
            else:
                await self._due.wait()
            self._due = anyio.Event()
            await self._lease()

    async def _lease(self) -> None:
        """Lease until every bucket has enough, waiting where the budget says."""
        ticket = False
        while True:
            now = self._now()
            wants = [0.0, 0.0]
            realtime = self._realtime_waits()
            for index, bucket in self._buckets:
                wants[index] = self._want(index, bucket, now)
            if not any(wants) and self.reachable is not False:
                return
            try:
                reply = await self._link.run(
                    RATE_LEASE, self._keys, self._args(wants, realtime, ticket)
                )
            except SharedBudgetUnreachable as exc:
                self._unreachable(exc)
                return
            if self.reachable is not True:
                self._recovered()
            retry = self._credit(reply)
            ticket = False
            if retry is None:
                continue
            if realtime:
                await anyio.sleep(retry)
                continue
            # Refused: come back at the slot given, or at once for a realtime batch.
            ticket = True
            with anyio.move_on_after(retry):
                while not self._realtime_waits():
                    await self._due.wait()
                    self._due = anyio.Event()
                ticket = False

    def _realtime_waits(self) -> bool:
        return any(b.wanted_realtime and b.wanted > 0 for _, b in self._buckets)

    def _want(self, index: int, bucket: LeasedBucket, now: float) -> float:
        """What to lease for one bucket now (0: nothing)."""
        if not bucket.leasing:
            return 0.0
        if bucket.wanted_realtime and bucket.wanted > 0:
            return bucket.wanted
        # Small enough that every sharer's lease fits in the bulk horizon (a lease
        # beyond it is refused, and costs a second round trip).
        fits = self._rates[index] * BULK_HORIZON / self.sharers
        lease = min(
            self._most[index],
            max(1.0 if index == 0 else 0.0, fits),
            max(self._blocks[index], BATCHES_PER_LEASE * bucket.batch_cost),
        )
        bucket.low = lease / 2
        if bucket.wanted > 0:
            return max(bucket.wanted, lease)
        if bucket.available(now) < bucket.low:
            return lease
        return 0.0

    def _args(self, wants: list[float], realtime: bool, ticket: bool = False) -> list[object]:
        return [
            self._member,
            "1" if realtime else "0",
            self._rates[0],
            self._caps[0],
            wants[0],
            self._rates[1],
            self._caps[1],
            wants[1],
            REALTIME_RESERVE,
            BULK_HORIZON,
            REALTIME_HORIZON,
            SHARER_WINDOW,
            "1" if ticket else "0",
        ]

    def _credit(self, reply: list[str]) -> float | None:
        """Credit what was granted; the seconds to wait before asking again if a
        budget refused (None: ask again now if still short)."""
        self.sharers = max(1, int(reply[0]))
        now = self._now()
        retry: float | None = None
        credited = False
        for index, bucket in self._buckets:
            granted, seconds = float(reply[1 + 2 * index]), float(reply[2 + 2 * index])
            if granted > 0:
                bucket.credit(granted, now + seconds)
                credited = True
            elif self._want(index, bucket, now) > 0:
                retry = seconds if retry is None else min(retry, seconds)
        if retry is not None and not credited:
            self.refusals += 1
        if reply[5] == "1" and not self._mismatch_told:
            self._mismatch_told = True
            logger.warning(
                "processes sharing rate limit key %r use different rates; each leases at "
                "its own, so the shared total follows whichever leases",
                self._limit.key,
            )
        if credited:
            self._wake()
        return retry

    def _unreachable(self, exc: SharedBudgetUnreachable) -> None:
        if self.reachable is False:
            return
        self.reachable = False
        if self._limit.on_redis_error == "local":
            now = self._now()
            for index, bucket in self._buckets:
                share = self._rates[index] / self.sharers
                bucket.fall_back(share, max(1.0, share) if index == 0 else share, now)
            what = (
                f"goes on alone at this process's share (1/{self.sharers}) (on_redis_error='local')"
            )
        else:
            what = "holds every batch until Redis answers (on_redis_error='wait')"
        logger.warning(
            "Redis at %s cannot be reached (%s): the rate limit shared as %r %s; "
            "retrying every %.0fs",
            self._link.where,
            exc,
            self._limit.key,
            what,
            RETRY_UNREACHABLE,
        )
        self._wake()

    def _recovered(self) -> None:
        if self.reachable is False:
            logger.warning(
                "Redis at %s answers again: sharing the rate limit %r again",
                self._link.where,
                self._limit.key,
            )
            now = self._now()
            for _, bucket in self._buckets:
                bucket.resume(now)
        self.reachable = True

    async def aclose(self) -> None:
        """Give back what this process leased and did not use (best effort)."""
        if self.reachable is not True:
            return
        now = self._now()
        wants = [0.0, 0.0]
        for index, bucket in self._buckets:
            if bucket.leasing:
                wants[index] = -max(0.0, bucket.available(now))
        if any(wants):
            with anyio.move_on_after(1.0, shield=True):
                with contextlib.suppress(SharedBudgetUnreachable):
                    await self._link.run(RATE_LEASE, self._keys, self._args(wants, False))
