"""The scheduler's rate-limit buckets: one refilled by time (a local budget), one
refilled by leases from a budget shared through Redis.

Both are pure: time is passed in, and the leased bucket only says what it lacks
(``wanted``) and calls ``notify`` when it runs low; the engine-side leaser
(``llmbatch._redis.rate``) does the I/O and credits it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

__all__ = ["LeasedBucket", "TokenBucket"]

#: Bucket wake-ups this close to "now" count as now (float rounding).
EPSILON = 1e-9


class TokenBucket:
    """``rate`` units per second, holding at most ``capacity``.

    A take larger than the capacity is allowed once the bucket is full and leaves
    it in debt, so a request bigger than one second's budget still goes and the
    average rate holds.
    """

    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.level = capacity
        self.updated: float | None = None

    def _refill(self, now: float) -> None:
        if self.updated is not None and now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        if self.updated is None or now > self.updated:
            self.updated = now

    def wait_time(self, now: float, cost: float, realtime: bool = False) -> float:
        """Seconds until ``cost`` may be taken (0 if now). ``realtime`` says whose
        batch waits (a leased bucket asks for the realtime reserve)."""
        self._refill(now)
        need = min(cost, self.capacity)
        missing = need - self.level
        return 0.0 if missing <= EPSILON * max(1.0, need) else missing / self.rate

    def take(self, cost: float) -> None:
        self.level -= cost

    def reserve(self, now: float, cost: float) -> float:
        """Take ``cost`` now, into debt if need be; the seconds until the debt is paid."""
        self._refill(now)
        self.level -= cost
        return 0.0 if self.level >= 0 else -self.level / self.rate

    def refund(self, amount: float) -> None:
        """Give back ``amount`` charged but not used (negative: charge more)."""
        self.level = min(self.capacity, self.level + amount)

    def clamp(self, now: float, most: float) -> None:
        """Hold no more than ``most`` now (what the budget's owner says is left)."""
        self._refill(now)
        self.level = min(self.level, most)


class LeasedBucket(TokenBucket):
    """A bucket filled by leases of a shared budget instead of by time.

    ``credit`` adds a lease, usable from a given time (a shared budget may grant
    budget that becomes usable a little later). When a batch finds too little,
    ``wait_time`` returns ``inf`` (no timer can say when: a lease must come),
    records the shortfall in ``wanted`` and calls ``notify``; a take that leaves less
    than ``low`` calls it too, so the next lease is on its way before it is needed.

    While the shared budget cannot be reached the leaser may ``fall_back`` to a
    local rate (the bucket then refills by time like a :class:`TokenBucket`) and
    ``resume`` leasing later.
    """

    __slots__ = ("batch_cost", "low", "notify", "pending", "wanted", "wanted_realtime")

    def __init__(self) -> None:
        super().__init__(rate=0.0, capacity=math.inf)
        self.level = 0.0
        self.pending: list[tuple[float, float]] = []
        """Leases not yet usable: (usable from, amount), earliest first."""
        self.wanted = 0.0
        """What a waiting batch lacks beyond the level and the pending leases."""
        self.wanted_realtime = False
        """That batch is realtime (it may lease the reserve)."""
        self.batch_cost = 0.0
        """What the last batch that asked cost (the leaser sizes leases by it)."""
        self.low = 0.0
        self.notify: Callable[[], None] | None = None

    @property
    def leasing(self) -> bool:
        """Filled by leases (False while fallen back to a local rate)."""
        return self.rate == 0.0

    def available(self, now: float) -> float:
        """The level plus every pending lease."""
        self._refill(now)
        return self.level + sum(amount for _, amount in self.pending)

    def _refill(self, now: float) -> None:
        super()._refill(now)
        pending = self.pending
        while pending and pending[0][0] <= now:
            self.level += pending.pop(0)[1]

    def wait_time(self, now: float, cost: float, realtime: bool = False) -> float:
        self._refill(now)
        need = cost if self.leasing else min(cost, self.capacity)
        self.batch_cost = need
        level = self.level
        if need - level <= EPSILON * max(1.0, need):
            return 0.0
        for usable_at, amount in self.pending:
            level += amount
            if need - level <= EPSILON * max(1.0, need):
                return usable_at - now
        if not self.leasing:
            return (need - level) / self.rate
        self.wanted = need - level
        self.wanted_realtime = self.wanted_realtime or realtime
        self._ask()
        return math.inf

    def take(self, cost: float) -> None:
        self.level -= cost
        if self.leasing and self.level < self.low:
            self._ask()

    def reserve(self, now: float, cost: float) -> float:
        if not self.leasing:
            return super().reserve(now, cost)
        # A retry goes at once; the debt it leaves is paid by the next leases, which
        # hold back the batches after it, so the shared average still holds.
        self._refill(now)
        self.take(cost)
        return 0.0

    def credit(self, amount: float, usable_at: float) -> None:
        """Add a lease of ``amount``, usable from ``usable_at``."""
        bisect.insort(self.pending, (usable_at, amount))
        self.wanted = max(0.0, self.wanted - amount)
        if not self.wanted:
            self.wanted_realtime = False

    def fall_back(self, rate: float, capacity: float, now: float) -> None:
        """Refill by time at ``rate`` (the shared budget cannot be reached)."""
        self._refill(now)
        self.rate = rate
        self.capacity = capacity
        self.level = min(self.level, capacity)
        self.wanted = 0.0
        self.wanted_realtime = False

    def resume(self, now: float) -> None:
        """Back to leases: what the local rate added so far stays usable."""
        self._refill(now)
        self.rate = 0.0
        self.capacity = math.inf

    def _ask(self) -> None:
        if self.notify is not None:
            self.notify()
