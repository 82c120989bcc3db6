"""What limits the scheduler beyond one server's seats: the rate limits, a share of
an in-flight budget held with other processes, and each tier's credit toward its
minimum share.

Pure, with time passed in. Budgets shared through Redis are filled from outside
(``llmbatch._redis``): the leasers set what is allowed; the scheduler only reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from llmbatch._config import Priority, RateLimit
from llmbatch._scheduler.buckets import LeasedBucket, TokenBucket

__all__ = ["RateBudget", "SharedAllowance", "settle_credit"]


#: A learnt budget's rate after 429s: cut to this share of itself (the 429s of one
#: burst, within CUT_SPACING seconds, count once), never below SLOWEST of the rate
#: learnt; raised by RAISE of it every second from RAISE_AFTER seconds after the last.
CUT = 0.75
CUT_SPACING = 1.0
SLOWEST = 0.1
RAISE = 0.05
RAISE_AFTER = 3.0

#: How fast the provider's count over the client's estimate is learnt (an EWMA weight
#: per answer), and the range it is held to.
COUNT_WEIGHT = 0.2
COUNT_RANGE = (0.5, 4.0)


class RateBudget:
    """The requests-per-minute and tokens-per-minute buckets (either may be unset)."""

    __slots__ = (
        "_base",
        "_cut_until",
        "_raise_at",
        "count_scale",
        "cut_pending",
        "leased",
        "refunds",
        "requests",
        "second",
        "speed",
        "tokens",
    )

    def __init__(self, rate_limit: RateLimit, *, refunds: bool = True) -> None:
        self.refunds = refunds
        """Whether a request's unused estimate is given back (a stated limit counts
        what was used; a provider's learnt one counts ``max_tokens`` as sent)."""
        self.count_scale = 1.0
        """Without refunds: the provider's count of a request's tokens over the
        client's estimate, learnt from the answers, by which every charge is scaled.
        A chat template's tokens, which the estimate does not see, would otherwise be
        paid only when each answer came back: a bucket's worth of requests sent at
        once would be that much over the provider's limit (on the simulator playing
        OpenAI's limiter, 13-15 of every burst of 60 were refused)."""
        shared = rate_limit.redis_url is not None
        self.second = (rate_limit.tokens_per_minute or math.inf) / 60.0 * (0.5 if shared else 1.0)
        """The most a batch may take of the token budget: a second's worth (``inf``:
        tokens are not limited), half of it where the budget is shared (the most a
        lease holds), so that processes sharing it send in turns of half a second."""
        self.requests: TokenBucket | None = None
        self.tokens: TokenBucket | None = None
        # At most one second's worth in a bucket caps any burst (a shared budget caps
        # it in Redis; the leaser fills these buckets).
        if rate_limit.requests_per_minute:
            rate = rate_limit.requests_per_minute / 60.0
            self.requests = LeasedBucket() if shared else TokenBucket(rate, max(1.0, rate))
        if rate_limit.tokens_per_minute:
            rate = rate_limit.tokens_per_minute / 60.0
            self.tokens = LeasedBucket() if shared else TokenBucket(rate, rate)
        self._base = tuple(0.0 if b is None else b.rate for b in self.buckets)
        self.speed = 1.0
        """Without refunds (a learnt budget): the share of its rate the client spends
        now, cut by 429s (others spend the same key) and raised while none comes."""
        self._cut_until = self._raise_at = -math.inf
        self.leased = shared
        """Its buckets are filled from a budget shared through Redis (leases)."""
        self.cut_pending = False
        """A leased budget met 429s not yet told to its sharers."""

    def refused(self, now: float) -> None:
        """A 429 came: slow down (once for the 429s of one burst). A leased budget's
        speed is the one its sharers keep in Redis: the 429 is told there
        (:attr:`cut_pending`), and the speed comes back from it."""
        if self.refunds:
            return
        if self.leased:
            self.cut_pending = True
            return
        if now < self._cut_until:
            return
        self._cut_until = now + CUT_SPACING
        self._raise_at = now + RAISE_AFTER
        self._set_speed(max(SLOWEST, self.speed * CUT))

    def recover(self, now: float) -> None:
        """No 429 came lately: speed up again, a step a second, up to the whole rate."""
        if self.refunds or self.leased or self.speed >= 1.0 or now < self._raise_at:
            return
        self._raise_at = now + 1.0
        self._set_speed(min(1.0, self.speed + RAISE))

    def _set_speed(self, speed: float) -> None:
        self.speed = speed
        for bucket, base in zip(self.buckets, self._base, strict=True):
            if bucket is None or isinstance(bucket, LeasedBucket) or not base:
                continue
            bucket.rate = base * speed
            bucket.capacity = max(1.0, bucket.rate) if bucket is self.requests else bucket.rate
            bucket.level = min(bucket.level, bucket.capacity)

    def keep_spent(self, old: RateBudget) -> None:
        """Take over what ``old`` (the budget this one replaces) has spent: a bucket
        keeps its level, within the new size; a leased one is kept whole (what it
        holds was granted by the shared budget); and what it learnt of the
        provider's count and of others spending the same key."""
        self.count_scale = old.count_scale
        self.cut_pending = old.cut_pending
        self._cut_until, self._raise_at = old._cut_until, old._raise_at
        if old.speed != 1.0:
            self._set_speed(old.speed)
        for name in ("requests", "tokens"):
            new_bucket, old_bucket = getattr(self, name), getattr(old, name)
            if new_bucket is None or old_bucket is None:
                continue
            if isinstance(new_bucket, LeasedBucket) and isinstance(old_bucket, LeasedBucket):
                setattr(self, name, old_bucket)
            else:
                new_bucket.level = min(new_bucket.capacity, old_bucket.level)
                new_bucket.updated = old_bucket.updated

    def clamp(self, now: float, requests: float | None, tokens: float | None) -> None:
        """A provider said what is left of its per-second budget (``requests`` and
        ``tokens`` a second's worth, None: not said): each bucket holds no more than
        that, so what another process or app spent on the same key is seen. A
        bucket in debt stays in debt."""
        for bucket, left in ((self.requests, requests), (self.tokens, tokens)):
            if bucket is not None and left is not None and not isinstance(bucket, LeasedBucket):
                bucket.clamp(now, left)

    @property
    def buckets(self) -> tuple[TokenBucket | None, TokenBucket | None]:
        """The request and token buckets (None: that limit is not set)."""
        return self.requests, self.tokens

    def batch_room(self) -> float:
        """The most estimated tokens one batch may take: what a second's worth of the
        budget pays for. Providers enforce a minute's limit per second; a larger batch,
        sent once the bucket is full, would be over their limit by the difference
        (a single request larger than that still goes alone)."""
        return self.second * self.speed / self.count_scale

    def charge(self, tokens: int) -> int:
        """What a batch the client estimates at ``tokens`` costs the token budget."""
        return tokens if self.count_scale == 1.0 else math.ceil(tokens * self.count_scale)

    def wait(self, now: float, tokens: int, priority: Priority) -> float:
        """Seconds until a batch of ``tokens`` may leave (``inf``: when a lease of the
        shared budget comes, which no timer can say)."""
        realtime = priority is Priority.REALTIME
        wait = 0.0
        if self.requests is not None:
            wait = self.requests.wait_time(now, 1, realtime)
        if self.tokens is not None:
            wait = max(wait, self.tokens.wait_time(now, self.charge(tokens), realtime))
        return wait

    def take(self, tokens: int) -> None:
        """A new batch of ``tokens`` left: one request and its tokens are spent."""
        if self.requests is not None:
            self.requests.take(1)
        if self.tokens is not None:
            self.tokens.take(self.charge(tokens))

    def reserve(self, now: float, tokens: int) -> float:
        """Charge an HTTP request that is not a new batch (a retry, a bisection half);
        returns how long to wait before sending it."""
        wait = 0.0
        if self.requests is not None:
            wait = self.requests.reserve(now, 1)
        if self.tokens is not None:
            wait = max(wait, self.tokens.reserve(now, self.charge(tokens)))
        return wait

    def correct(self, charged: int, used: int, counted: int | None = None) -> None:
        """A request charged ``charged`` tokens (its estimate) reported ``used``: the
        token budget gets the difference back (or pays what it lacked). Without
        refunds (a budget learnt from a provider's headers, which counts
        ``max_tokens`` whatever the answer's length), it pays only what its estimate
        lacked of what the provider counted: ``counted``, the usage's prompt tokens
        (a chat template's included) plus every choice's ``max_tokens``."""
        tokens = self.tokens
        if tokens is None:
            return
        if self.refunds:
            if charged != used:
                tokens.refund(charged - used)
            return
        paid = self.charge(charged)
        spent = max(used, counted or 0)
        if spent > paid:
            tokens.refund(paid - spent)
        if counted and charged > 0:
            low, high = COUNT_RANGE
            sample = min(high, max(low, counted / charged))
            self.count_scale += COUNT_WEIGHT * (sample - self.count_scale)


class SharedAllowance:
    """What an in-flight budget shared with other processes allows this client now.

    It starts at nothing: nothing goes out before the first lease says how much may.
    """

    __slots__ = ("on_full", "seats", "tokens")

    def __init__(self, *, limits_tokens: bool, on_full: Callable[[], None]) -> None:
        self.seats = 0
        """Sequences this client may have in flight."""
        self.tokens: int | None = 0 if limits_tokens else None
        """Estimated tokens it may have in flight (None: the budget has no token limit)."""
        self.on_full = on_full
        """Called when work waits only for this allowance."""

    def grant(self, seats: int, tokens: int | None = None) -> bool:
        """The budget allows ``seats`` (and ``tokens``) from now on; True if it grew."""
        grew = seats > self.seats
        self.seats = seats
        if self.tokens is not None and tokens is not None:
            grew = grew or tokens > self.tokens
            self.tokens = tokens
        return grew

    def room(self, in_flight: int, in_flight_tokens: int) -> tuple[float, float]:
        """Seats and tokens it leaves beside what is in flight (inf: not limited)."""
        tokens = math.inf if self.tokens is None else self.tokens - in_flight_tokens
        return self.seats - in_flight, tokens


def settle_credit(
    credits: dict[Priority, float],
    min_share: Mapping[Priority, float],
    chosen: Priority,
    sent: int,
    waiting: Iterable[Priority],
    *,
    owed: bool,
) -> None:
    """Tiers with a share that had a ready batch but were passed over accrue what
    they are owed (share / (1 - share) sequences per sequence sent).

    A tier served because it was owed pays for every sequence it sent, even past its
    credit: forgiving the rest handed lower tiers a whole batch per sequence owed,
    and two owed tiers could then pass the turn between them and starve realtime. The
    debt is bounded by one batch, and credit by what one batch of another tier earns,
    since a tier is served as soon as it is owed."""
    if owed:
        credits[chosen] -= sent
    for priority in waiting:
        share = min_share.get(priority, 0.0)
        if priority is chosen or share <= 0:
            continue
        credits[priority] += sent * share / (1.0 - share)
