"""The DynamicBatcher: admission, tier queues, batch formation, dispatch order, rate
limits and deadlines.

Pure, synchronous logic with time passed in (``now``), so every trigger, budget,
fairness rule and rate is tested exactly without sleeping. The async driver in
``_engine.py`` calls :meth:`Scheduler.poll` whenever something changes or the
returned wake-up time arrives, and sends the batches it gets. This is the one owner
of time-based rules: batch timers, request deadlines (queued or in flight) and the
rate-limit buckets.

Rules, in order of precedence:

1. A request whose deadline has passed is expired, wherever it is (``Poll.expired``).
2. A tier's queue holds ``Limits.max_queued`` requests; callers beyond that wait in
   arrival order and are admitted one per freed place (``nowait=True`` callers get
   :class:`QueueFull` instead).
3. Within a tier, only compatible requests (same endpoint kind, model and sampling
   parameters) share a batch; the group whose oldest request waited longest goes
   first.
4. A group becomes a batch when it reaches ``max_batch_size`` or ``max_batch_tokens``,
   when its oldest request has waited ``max_wait``, when its tier has nothing in
   flight (``send_when_idle``), or when the scheduler is flushing (shutdown drain).
5. Tiers go in order realtime > normal > batch, except that a lower tier owed its
   ``min_share`` of dispatched sequences goes first, so nothing starves.
6. A batch is sent only within the in-flight limits (sequences and estimated tokens).
   Realtime may use every seat up to ``Limits.max_in_flight``; normal and batch
   work together only up to the *bulk limit* (``set_bulk_limit``: the admission
   controller's output, which leaves seats for realtime), and the same fraction of
   tokens. A batch that does not fit whole is trimmed to what fits.
7. A batch is sent only when the rate limits allow it; when they do not, nothing
   else is sent either, so the budget goes to the tiers in order.
8. While a server is unavailable (its replica not ``sendable``) nothing is sent to
   it; deadlines still fire. A batch that met the outage comes back (``requeue``) at
   the head of its group, in its original order, and goes to whichever replica
   takes it first.
9. With several servers (replicas), the limits of rule 6 hold per replica, each
   with its own bulk limit, and a batch goes to one replica (``Batch.replica``).
   A recurring prompt prefix has a home: the replica its first batch went to. Its
   batches go home while home has a seat and is not far busier than the least busy
   replica; otherwise, and for prompts without a home, to the less busy of two
   replicas picked at random (power of two choices). When a seat frees, the oldest
   ready group at home there goes first, ahead of older groups at home elsewhere.
   Only replicas that serve the batch's model (or may: they have not said), and
   are sendable (available, or allowed a trial batch), are considered.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from llmbatch._buckets import LeasedBucket, TokenBucket
from llmbatch._config import DEFAULT_BATCH_POLICIES, BatchPolicy, Limits, Priority, RateLimit
from llmbatch._exceptions import QueueFull
from llmbatch._request import Request, State

__all__ = ["Batch", "Poll", "Replica", "Scheduler"]

TIERS = (Priority.REALTIME, Priority.NORMAL, Priority.BATCH)
_WAITING, _QUEUED, _IN_FLIGHT, _FINISHED = (
    State.WAITING,
    State.QUEUED,
    State.IN_FLIGHT,
    State.FINISHED,
)
#: Prefix affinity yields to load when the affinity replica runs this many more
#: sequences than the least busy one *and* this many times as many (both must hold,
#: so small counts never override affinity and large ones do).
AFFINITY_SLACK_SEQUENCES = 32
AFFINITY_SLACK_RATIO = 1.5
#: Ready groups of a tier looked at for one whose prefix belongs where a seat is free.
ROUTE_SCAN = 32
#: Seconds a group at home where a seat is free may overtake an older group: past
#: that the older one goes first, wherever there is room (so a replica home to more
#: work than it can run is helped, and nobody waits without bound).
AFFINITY_PATIENCE = 1.0
#: Prefix keys remembered for affinity (least recently used dropped first).
AFFINITY_MEMORY = 65_536


@dataclass(frozen=True, slots=True)
class Batch:
    """Compatible requests of one tier that go out together."""

    priority: Priority
    requests: tuple[Request, ...]
    replica: int = 0
    """Which server it goes to (an index into the scheduler's replicas)."""

    @property
    def tokens(self) -> int:
        return sum(r.est_tokens for r in self.requests)


@dataclass(frozen=True, slots=True)
class Poll:
    """What the driver should do now, and when to ask again."""

    batches: list[Batch] = field(default_factory=list)
    expired: list[Request] = field(default_factory=list)
    """Requests past their deadline: out of the queues; in-flight ones still flying."""
    next_wakeup: float | None = None
    blocked_replicas: frozenset[int] = frozenset()
    """The replicas whose bulk limit held it back (seats free, but not for bulk)."""


class _Group:
    """Compatible queued requests of one tier, oldest first.

    Removal is lazy (a cancelled request stays in ``items`` until it reaches the
    head), so a storm of cancellations costs O(1) each; ``live`` and ``tokens``
    count only requests still queued.
    """

    __slots__ = ("items", "live", "tokens")

    def __init__(self) -> None:
        self.items: deque[Request] = deque()
        self.live = 0
        self.tokens = 0

    def head(self) -> Request:
        items = self.items
        while items[0].state != _QUEUED:
            items.popleft()
        return items[0]


class _Tier:
    """One tier: its compatible groups in arrival order, and callers waiting for room."""

    __slots__ = ("credit", "groups", "policy", "size", "waiting", "waiting_live")

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.groups: OrderedDict[str, _Group] = OrderedDict()
        self.size = 0
        self.waiting: deque[Request] = deque()
        self.waiting_live = 0
        self.credit = 0.0

    def enqueue(self, request: Request, now: float) -> _Group:
        key = request.group_key
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group()
        group.items.append(request)
        group.live += 1
        group.tokens += request.est_tokens
        self.size += 1
        request.state = _QUEUED
        request.enqueued_at = now
        return group

    def requeue(self, requests: tuple[Request, ...] | list[Request]) -> None:
        """Put requests back at the head of their group, in their order; their batch
        timers keep running from when they first arrived."""
        for request in reversed(requests):
            key = request.group_key
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = _Group()
                self.groups.move_to_end(key, last=False)
            group.items.appendleft(request)
            group.live += 1
            group.tokens += request.est_tokens
            self.size += 1
            request.state = _QUEUED

    def isolate(self) -> None:
        """Move queued requests that might not fit the context into groups of their own.

        The groups they leave are rebuilt rather than lazily skipped: lazy removal
        tells a dead entry by its state, and these stay queued (elsewhere)."""
        for key, group in list(self.groups.items()):
            moved = [r for r in group.items if r.state == _QUEUED and r.might_not_fit]
            if not moved:
                continue
            group.items = deque(
                r for r in group.items if r.state == _QUEUED and not r.might_not_fit
            )
            group.live = len(group.items)
            group.tokens = sum(r.est_tokens for r in group.items)
            if not group.live:
                del self.groups[key]
            for request in moved:
                request.travel_alone()
                alone = self.groups[request.group_key] = _Group()
                alone.items.append(request)
                alone.live = 1
                alone.tokens = request.est_tokens  # (its batch timer keeps running)

    def unqueue(self, request: Request) -> None:
        """Take a queued request out (lazily: its group skips it later)."""
        key = request.group_key
        group = self.groups[key]
        group.live -= 1
        group.tokens -= request.est_tokens
        self.size -= 1
        request.state = _FINISHED
        if group.live == 0:
            del self.groups[key]

    def pop(self, group: _Group) -> Request:
        request = group.head()
        group.items.popleft()
        group.live -= 1
        group.tokens -= request.est_tokens
        self.size -= 1
        if group.live == 0:
            del self.groups[request.group_key]
        return request

    def ready_group(self, now: float, flush: bool, idle: bool) -> _Group | None:
        """The oldest group that has hit a trigger, if any."""
        return next(self.ready_groups(now, flush, idle), None)

    def ready_groups(self, now: float, flush: bool, idle: bool) -> Iterator[_Group]:
        """Every group that has hit a trigger, oldest first."""
        policy = self.policy
        if flush or (idle and policy.send_when_idle):
            yield from self.groups.values()
            return
        for group in self.groups.values():
            if (
                group.live >= policy.max_batch_size
                or group.head().enqueued_at + policy.max_wait <= now
                or group.tokens >= policy.max_batch_tokens
            ):
                yield group

    def next_trigger(self) -> float | None:
        wait = self.policy.max_wait
        return min((g.head().enqueued_at + wait for g in self.groups.values()), default=None)


class Replica:
    """One server's in-flight ledger: its seats, its bulk limit, who holds them."""

    __slots__ = (
        "active",
        "bulk_cap",
        "bulk_in_flight",
        "bulk_in_flight_tokens",
        "bulk_token_cap",
        "ceiling",
        "in_flight",
        "in_flight_tokens",
        "index",
        "models",
        "sendable",
        "token_ceiling",
    )

    def __init__(self, index: int, limits: Limits) -> None:
        self.index = index
        self.ceiling = limits.max_in_flight
        self.token_ceiling = limits.max_in_flight_tokens
        self.bulk_cap = 0
        self.bulk_token_cap = 0
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.bulk_in_flight = 0
        self.bulk_in_flight_tokens = 0
        self.models: frozenset[str] | None = None
        """The models it serves (None: unknown, so any)."""
        self.sendable: int | None = None
        """None: send freely; 0: send nothing (unavailable); n: at most n more batches
        (a trial while it may be back)."""
        self.active = True
        """False once removed: it takes nothing new, and its in-flight work drains."""
        self.set_bulk_limit(limits.max_in_flight - limits.reserved_realtime)

    def set_bulk_limit(self, sequences: int) -> None:
        sequences = max(1, min(sequences, self.ceiling))
        self.bulk_cap = sequences
        share = sequences / self.ceiling
        self.bulk_token_cap = max(1, int(self.token_ceiling * share))

    def room(self, priority: Priority) -> tuple[int, int]:
        """Free seats and tokens for a batch of ``priority`` (negative: over)."""
        seqs = self.ceiling - self.in_flight
        tokens = self.token_ceiling - self.in_flight_tokens
        if priority is not Priority.REALTIME:
            seqs = min(seqs, self.bulk_cap - self.bulk_in_flight)
            tokens = min(tokens, self.bulk_token_cap - self.bulk_in_flight_tokens)
        return seqs, tokens

    def open_to(self, model: str | None) -> bool:
        """Takes new batches now, for ``model`` (None: any model)."""
        return (
            self.active
            and self.sendable != 0
            and (model is None or self.models is None or model in self.models)
        )


class Scheduler:
    """Tier queues plus the in-flight ledger. Not thread-safe; one event loop owns it."""

    def __init__(
        self,
        *,
        policies: Mapping[Priority, BatchPolicy] = DEFAULT_BATCH_POLICIES,
        limits: Limits,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.limits = limits
        self._tiers = {p: _Tier(policies.get(p, DEFAULT_BATCH_POLICIES[p])) for p in TIERS}
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.in_flight_by_tier = dict.fromkeys(TIERS, 0)
        self.replicas: list[Replica] = [Replica(0, limits)]
        """Every server's ledger; index 0 is the first server. Removed ones stay
        (inactive) so indexes held by in-flight requests remain valid."""
        self._random = random.Random(0)
        self._listed: frozenset[str] = frozenset()
        """Every model some active replica lists."""
        self._unlisted = False
        """Some active replica has not said what it serves (so it may serve any)."""
        self._affinity: OrderedDict[int, int] = OrderedDict()
        """Prefix key -> the replica that last served a prompt with that prefix."""
        # (deadline, seq, request) for every request with a deadline that has not left
        # the scheduler; entries of finished requests are dropped lazily.
        self._deadlines: list[tuple[float, int, Request]] = []
        self._request_bucket: TokenBucket | None = None
        self._token_bucket: TokenBucket | None = None
        if rate_limit is not None:
            shared = rate_limit.redis_url is not None
            # At most one second's worth in the bucket caps any burst (a shared
            # budget caps it in Redis; the leaser fills these buckets).
            if rate_limit.requests_per_minute:
                rate = rate_limit.requests_per_minute / 60.0
                self._request_bucket = (
                    LeasedBucket() if shared else TokenBucket(rate, max(1.0, rate))
                )
            if rate_limit.tokens_per_minute:
                rate = rate_limit.tokens_per_minute / 60.0
                self._token_bucket = LeasedBucket() if shared else TokenBucket(rate, rate)
        self.shared_seats: int | None = None
        """Sequences a shared in-flight budget allows this client (None: no such budget)."""
        self.shared_tokens: int | None = None
        """Estimated tokens it allows in flight (None: no shared token limit)."""
        self.on_shared_full: Callable[[], None] | None = None
        """Called when work waits only for the shared in-flight budget."""
        self._isolating = False
        """The server refused a prompt as too long: requests that might not fit go alone."""
        self._planned: float | None = None
        """The last poll's next wake-up: an add that needs an earlier one asks for a poll."""

    # -- queue -----------------------------------------------------------------------

    def queued(self, priority: Priority) -> int:
        """Requests waiting client-side in ``priority``'s tier (for room, or for a batch)."""
        tier = self._tiers[priority]
        return tier.size + tier.waiting_live

    @property
    def idle(self) -> bool:
        """Nothing queued, waiting for room, or in flight."""
        return self.in_flight == 0 and not self.has_queued

    @property
    def has_queued(self) -> bool:
        """Something is queued or waiting for room (a freed seat may let it go)."""
        return any(t.size or t.waiting_live for t in self._tiers.values())

    def add(self, request: Request, *, nowait: bool = False) -> bool:
        """Queue a request, or hold it until its tier has room (in arrival order).

        With ``nowait``, a full tier raises :class:`QueueFull` instead. Returns whether
        a poll is due now: the request started a group (a new timer), filled a batch,
        or carries a deadline earlier than the next planned wake-up. Otherwise the
        planned wake-up covers it, which spares the driver a poll per request.
        """
        tier = self._tiers[request.priority]
        if self._isolating and request.might_not_fit:
            request.travel_alone()
        due = False
        if request.deadline is not None:
            self._track_deadline(request)
            due = self._planned is None or request.deadline < self._planned
        if tier.size >= self.limits.max_queued or tier.waiting_live:
            if nowait:
                raise QueueFull(
                    f"the {request.priority.value!r} queue is full "
                    f"({self.limits.max_queued} requests waiting)"
                )
            tier.waiting.append(request)
            tier.waiting_live += 1
            request.state = _WAITING
            return due
        group = tier.enqueue(request, request.created_at)
        policy = tier.policy
        return (
            due
            or group.live == 1
            or group.live == policy.max_batch_size
            or group.tokens - request.est_tokens < policy.max_batch_tokens <= group.tokens
        )

    def remove(self, request: Request) -> bool:
        """Take a request out of its queue or the wait for room (its caller went away);
        False if it was in neither."""
        state = request.state
        if state == _QUEUED:
            self._tiers[request.priority].unqueue(request)
            return True
        if state == _WAITING:
            self._tiers[request.priority].waiting_live -= 1
            request.state = _FINISHED
            return True
        return False

    def queued_requests(self) -> Iterator[Request]:
        """Every request queued or waiting for room (for cancellation at close)."""
        for tier in self._tiers.values():
            for group in tier.groups.values():
                yield from (r for r in group.items if r.state == _QUEUED)
            yield from (r for r in tier.waiting if r.state == _WAITING)

    def _admit(self, tier: _Tier, now: float) -> None:
        """Move callers waiting for room into the queue, one per free place, in order."""
        room = self.limits.max_queued - tier.size
        waiting = tier.waiting
        while room > 0 and tier.waiting_live:
            request = waiting.popleft()
            if request.state != _WAITING:
                continue  # its caller went away while it waited
            tier.waiting_live -= 1
            tier.enqueue(request, now)  # its batch timer starts now
            room -= 1

    def _track_deadline(self, request: Request) -> None:
        assert request.deadline is not None
        heapq.heappush(self._deadlines, (request.deadline, request.seq, request))
        live = self.in_flight + sum(t.size + t.waiting_live for t in self._tiers.values())
        if len(self._deadlines) > 64 + 2 * live:
            # Answered requests linger here until their deadline; drop them so memory
            # follows the live requests, not the request rate times the timeout.
            self._deadlines = [e for e in self._deadlines if e[2].state != _FINISHED]
            heapq.heapify(self._deadlines)

    # -- in-flight ledger ------------------------------------------------------------

    def finish(self, request: Request) -> None:
        """Return one dispatched request's in-flight capacity."""
        self.finish_batch((request,), request.priority, request.replica)

    def finish_batch(self, requests: Sequence[Request], priority: Priority, replica: int) -> None:
        """Return the in-flight capacity of a dispatched batch's requests, which share
        ``priority`` and ``replica``: the ledger moves once per batch, not per request."""
        count = tokens = 0
        for request in requests:
            if request.state == _IN_FLIGHT:
                request.state = _FINISHED
                count += 1
                tokens += request.est_tokens
        if not count:
            return
        self.in_flight -= count
        self.in_flight_tokens -= tokens
        self.in_flight_by_tier[priority] -= count
        ledger = self.replicas[replica]
        ledger.in_flight -= count
        ledger.in_flight_tokens -= tokens
        if priority is not Priority.REALTIME:
            ledger.bulk_in_flight -= count
            ledger.bulk_in_flight_tokens -= tokens

    def set_bulk_limit(self, sequences: int, replica: int = 0) -> None:
        """Cap normal and batch work on ``replica`` at ``sequences`` in flight (and the
        same share of its token limit); realtime keeps every seat up to
        ``Limits.max_in_flight``."""
        self.replicas[replica].set_bulk_limit(sequences)

    def add_replica(self, models: frozenset[str] | None = None) -> int:
        """A new server's ledger (sendable at once); returns its index."""
        replica = Replica(len(self.replicas), self.limits)
        self.replicas.append(replica)
        self.set_models(replica.index, models)
        return replica.index

    def set_models(self, replica: int, models: frozenset[str] | None) -> None:
        """The models ``replica`` serves (None: unknown, any)."""
        self.replicas[replica].models = models
        active = [r for r in self.replicas if r.active]
        self._listed = frozenset().union(*(r.models for r in active if r.models is not None))
        self._unlisted = any(r.models is None for r in active)

    def remove_replica(self, replica: int) -> None:
        """Send nothing more to ``replica``; what it has in flight finishes there."""
        self.replicas[replica].active = False
        self.set_models(replica, self.replicas[replica].models)

    def isolate_risky(self) -> None:
        """The server refused a prompt as too long: from now on, requests that might not
        fit (queued, waiting, requeued or new) are sent alone, so none can fail a whole
        batch again."""
        self._isolating = True
        for tier in self._tiers.values():
            tier.isolate()
            for request in tier.waiting:
                if request.state == _WAITING and request.might_not_fit:
                    request.travel_alone()

    def requeue(self, requests: tuple[Request, ...] | list[Request]) -> None:
        """In-flight requests whose exchange met an outage go back to the head of
        their queues, to be sent when the server is back (nothing is lost)."""
        live = [r for r in requests if r.state == _IN_FLIGHT and not r.done]
        for request in requests:
            self.finish(request)
        if self._isolating:
            for request in live:
                if request.might_not_fit:
                    request.travel_alone()
        by_tier: dict[Priority, list[Request]] = {}
        for request in live:
            by_tier.setdefault(request.priority, []).append(request)
        for priority, group in by_tier.items():
            self._tiers[priority].requeue(group)

    # -- routing ---------------------------------------------------------------------

    def _pick(
        self, priority: Priority, tier: _Tier, ready: Iterator[_Group]
    ) -> tuple[_Group, Replica] | None:
        """The group to send next and its replica: the oldest ready group whose
        prefix is at home on a replica with a seat; else, for the replica the oldest
        ready group would be balanced to, a group at home there even if not yet
        ready (a smaller batch, but its prefix stays where it is cached); else that
        oldest ready group.

        Among replicas that are all busy, seats free a few at a time; taking the
        group that belongs where the seat freed (rather than always the oldest) is
        what keeps each prefix on one replica under saturation. A replica takes
        another's prefix only when none of its own is queued, or when that prefix's
        work has waited ``AFFINITY_PATIENCE`` longer than its own."""
        fallback: tuple[_Group, Replica] | None = None
        oldest: float | None = None
        for scanned, group in enumerate(ready):
            if scanned >= ROUTE_SCAN:
                break
            head = group.head()
            if oldest is None:
                oldest = head.enqueued_at
            elif head.enqueued_at - oldest > AFFINITY_PATIENCE:
                break  # younger groups may not overtake the oldest by more than this
            replica, affine = self._route(priority, group)
            if replica is None:
                continue
            if affine:
                return group, replica
            if fallback is None:
                fallback = group, replica
        if fallback is not None and oldest is not None:
            replica = fallback[1]
            for scanned, group in enumerate(tier.groups.values()):
                if scanned >= ROUTE_SCAN:
                    break
                head = group.head()
                if (
                    head.enqueued_at - oldest <= AFFINITY_PATIENCE
                    and self._home(head) == replica.index
                    and replica.open_to(self._model(head))
                ):
                    return group, replica
        return fallback

    def _home(self, head: Request) -> int | None:
        """The replica where the longest of the request's prefixes is at home."""
        affinity = self._affinity
        for key in reversed(head.prefix):
            index = affinity.get(key)
            if index is not None:
                return index
        return None

    def _model(self, head: Request) -> str | None:
        """The model a replica must serve to take this request (None: any)."""
        model = head.spec.model
        if model not in self._listed and not self._unlisted:
            return None  # no replica may serve it: it goes anywhere, the server says why
        return model

    def _route(self, priority: Priority, group: _Group) -> tuple[Replica | None, bool]:
        """The replica the group's next batch goes to (None if none has a seat), and
        whether that is its prefix's home."""
        replicas = self.replicas
        head = group.head()
        if len(replicas) == 1:
            only = replicas[0]
            ok = only.open_to(None) and only.room(priority)[0] > 0
            return (only if ok else None), False
        open_ = [r for r in replicas if r.open_to(self._model(head)) and r.room(priority)[0] > 0]
        if not open_:
            return None, False
        home = self._home(head)
        if home is not None:
            preferred = replicas[home]
            least = min(r.in_flight for r in open_)
            if preferred in open_ and not _imbalanced(preferred.in_flight, least):
                return preferred, True
            # Its home is full, far busier, or away: balance instead.
        if len(open_) == 1:
            return open_[0], False
        a, b = self._random.sample(open_, 2)
        return (a if _load(a) <= _load(b) else b), False

    def _remember(self, replica: Replica, requests: tuple[Request, ...]) -> None:
        """The prefixes of these requests that have no home yet (or whose home was
        removed) are at home on ``replica`` from now on. A home does not move when a
        batch is balanced elsewhere: a prefix that followed every such batch would
        leave its cache behind each time."""
        affinity = self._affinity
        replicas = self.replicas
        index = replica.index
        for request in requests:
            for key in request.prefix:
                home = affinity.get(key)
                if home is None or not replicas[home].active:
                    affinity[key] = index
                else:
                    affinity.move_to_end(key)
        while len(affinity) > AFFINITY_MEMORY:
            affinity.popitem(last=False)

    # -- rate limits -----------------------------------------------------------------

    @property
    def rate_buckets(self) -> tuple[TokenBucket | None, TokenBucket | None]:
        """The request and token buckets (None: that limit is not set)."""
        return self._request_bucket, self._token_bucket

    def _rate_wait(self, now: float, tokens: int, priority: Priority) -> float:
        """Seconds until a batch of ``tokens`` may leave (``inf``: when a lease of the
        shared budget comes, which no timer can say)."""
        realtime = priority is Priority.REALTIME
        wait = 0.0
        if self._request_bucket is not None:
            wait = self._request_bucket.wait_time(now, 1, realtime)
        if self._token_bucket is not None:
            wait = max(wait, self._token_bucket.wait_time(now, tokens, realtime))
        return wait

    def _rate_take(self, tokens: int) -> None:
        if self._request_bucket is not None:
            self._request_bucket.take(1)
        if self._token_bucket is not None:
            self._token_bucket.take(tokens)

    def reserve_resend(self, now: float, tokens: int) -> float:
        """Charge an HTTP request that is not a new batch (a retry, a bisection half) to
        the rate limits; returns how long to wait before sending it."""
        wait = 0.0
        if self._request_bucket is not None:
            wait = self._request_bucket.reserve(now, 1)
        if self._token_bucket is not None:
            wait = max(wait, self._token_bucket.reserve(now, tokens))
        return wait

    def correct_tokens(self, charged: int, used: int) -> None:
        """A request charged ``charged`` tokens (its estimate) reported ``used``: the
        token budget gets the difference back (or pays what it lacked)."""
        if self._token_bucket is not None and charged != used:
            self._token_bucket.refund(charged - used)

    # -- dispatch --------------------------------------------------------------------

    def poll(self, now: float, *, flush: bool = False) -> Poll:
        """Expire, admit, form and pick batches, route each to a replica, and reserve
        their in-flight capacity there. (A replica's ``sendable`` says whether it
        takes batches: not while it is unavailable, one while it may be back.)"""
        expired = self._expire(now) if self._deadlines else []
        for tier in self._tiers.values():
            if tier.waiting_live:
                self._admit(tier, now)
        batches: list[Batch] = []
        rate_wakeup: float | None = None
        limit_blocked: set[int] = set()
        # Tiers whose next request does not fit the free token room this poll; without
        # this, the loop would pick the same tier again forever.
        blocked: set[Priority] = set()
        while True:
            candidates: dict[Priority, tuple[_Group, Replica]] = {}
            for p, tier in self._tiers.items():
                if not tier.groups or p in blocked:
                    continue
                if not self._has_seat(p):
                    if p is not Priority.REALTIME:
                        self._note_blocked(limit_blocked)
                    continue
                idle = self.in_flight_by_tier[p] == 0
                if len(self.replicas) == 1:
                    group = tier.ready_group(now, flush, idle)
                    if group is None:
                        continue
                    replica = self._route(p, group)[0]
                    if replica is None:  # no seat where its model is served
                        continue
                    candidates[p] = (group, replica)
                else:
                    picked = self._pick(p, tier, tier.ready_groups(now, flush, idle))
                    if picked is not None:
                        candidates[p] = picked
            if not candidates:
                break
            owed = [p for p in candidates if self._tiers[p].credit >= 1.0]
            chosen = owed[0] if owed else next(p for p in TIERS if p in candidates)
            group, replica = candidates[chosen]
            count, tokens = self._plan(chosen, group, replica)
            if count == 0:
                # A single request larger than the free token room: wait for room.
                blocked.add(chosen)
                continue
            wait = self._rate_wait(now, tokens, chosen)
            if wait > 0:
                # Nothing overtakes the tier the budget is owed to. (An infinite wait
                # ends with a lease of the shared budget, which wakes the driver.)
                if wait != math.inf:
                    rate_wakeup = now + wait
                break
            self._rate_take(tokens)
            batches.append(self._commit(chosen, group, count, tokens, replica))
            self._settle_credit(chosen, count, candidates, owed=chosen in owed)
            tier = self._tiers[chosen]
            if tier.waiting_live:
                self._admit(tier, now)
        self._planned = self._next_wakeup(now, rate_wakeup)
        return Poll(batches, expired, self._planned, frozenset(limit_blocked))

    def _has_seat(self, priority: Priority) -> bool:
        """Some replica takes batches now and has a seat for ``priority``, and the
        shared in-flight budget (if any) has one too."""
        if self.shared_seats is not None and self.in_flight >= self.shared_seats:
            if self.on_shared_full is not None:
                self.on_shared_full()
            return False
        return any(r.active and r.sendable != 0 and r.room(priority)[0] > 0 for r in self.replicas)

    def _shared_room(self) -> tuple[float, float]:
        """Seats and tokens the shared in-flight budget leaves (inf: no such budget)."""
        seats = math.inf if self.shared_seats is None else self.shared_seats - self.in_flight
        tokens = (
            math.inf if self.shared_tokens is None else self.shared_tokens - self.in_flight_tokens
        )
        return seats, tokens

    def seat_demand(self) -> tuple[int, int]:
        """Sequences and tokens this client would have in flight now if the shared
        budget allowed: what is in flight plus what is queued, up to what its own
        limits (and the adaptive bulk limit) would let it send."""
        own_seats = own_tokens = 0
        for replica in self.replicas:
            if replica.active:
                reserved = self.limits.reserved_realtime
                own_seats += min(replica.ceiling, replica.bulk_cap + reserved)
                own_tokens += replica.token_ceiling
        queued = queued_tokens = 0
        for tier in self._tiers.values():
            queued += tier.size + tier.waiting_live
            queued_tokens += sum(group.tokens for group in tier.groups.values())
        return (
            min(own_seats, self.in_flight + queued),
            min(own_tokens, self.in_flight_tokens + queued_tokens),
        )

    def _note_blocked(self, blocked: set[int]) -> None:
        """Note the replicas whose bulk limit alone holds back bulk work: seats free
        there, none for bulk (evidence for the controller that more would be used)."""
        for replica in self.replicas:
            if (
                replica.active
                and replica.sendable != 0
                and replica.bulk_in_flight >= replica.bulk_cap
                and replica.in_flight < replica.ceiling
            ):
                blocked.add(replica.index)

    def _plan(self, priority: Priority, group: _Group, replica: Replica) -> tuple[int, int]:
        """How many of the group's oldest requests the next batch takes, and their tokens."""
        policy = self._tiers[priority].policy
        room_seqs, room_tokens = replica.room(priority)
        busy = replica.in_flight > 0
        if self.shared_seats is not None:
            shared_seqs, shared_tokens = self._shared_room()
            room_seqs = int(min(room_seqs, shared_seqs))
            if shared_tokens < room_tokens:
                room_tokens, busy = int(shared_tokens), self.in_flight > 0
        limit = min(policy.max_batch_size, room_seqs, group.head().spec.max_batch)
        count = tokens = 0
        for request in group.items:
            if request.state != _QUEUED:
                continue
            if count >= limit:
                break
            cost = request.est_tokens
            over_batch = count and tokens + cost > policy.max_batch_tokens
            # An oversize request may go alone, but only onto an otherwise idle server.
            over_room = tokens + cost > room_tokens and (count or busy)
            if over_batch or over_room:
                break
            count += 1
            tokens += cost
        return count, tokens

    def _commit(
        self, priority: Priority, group: _Group, count: int, tokens: int, replica: Replica
    ) -> Batch:
        tier = self._tiers[priority]
        taken = tuple(tier.pop(group) for _ in range(count))
        index = replica.index
        for request in taken:
            request.state = _IN_FLIGHT
            request.replica = index
        self.in_flight += count
        self.in_flight_tokens += tokens
        self.in_flight_by_tier[priority] += count
        replica.in_flight += count
        replica.in_flight_tokens += tokens
        if priority is not Priority.REALTIME:
            replica.bulk_in_flight += count
            replica.bulk_in_flight_tokens += tokens
        if replica.sendable:
            replica.sendable -= 1
        if len(self.replicas) > 1:
            self._remember(replica, taken)
        return Batch(priority, taken, index)

    def _settle_credit(
        self, chosen: Priority, sent: int, waiting: Mapping[Priority, object], *, owed: bool
    ) -> None:
        """Tiers with a share that had a ready batch but were passed over accrue what
        they are owed (share / (1 - share) sequences per sequence sent).

        A tier served because it was owed pays for every sequence it sent, even past
        its credit: forgiving the rest handed lower tiers a whole batch per sequence
        owed, and two owed tiers could then pass the turn between them and starve
        realtime. The debt is bounded by one batch, and credit by what one batch of
        another tier earns, since a tier is served as soon as it is owed."""
        if owed:
            self._tiers[chosen].credit -= sent
        for priority in waiting:
            share = self.limits.min_share.get(priority, 0.0)
            if priority is chosen or share <= 0:
                continue
            self._tiers[priority].credit += sent * share / (1.0 - share)

    def _expire(self, now: float) -> list[Request]:
        expired: list[Request] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            request = heapq.heappop(deadlines)[2]
            if request.state == _IN_FLIGHT:
                if not request.done:
                    expired.append(request)
            elif self.remove(request):
                expired.append(request)
        return expired

    def _next_wakeup(self, now: float, rate_wakeup: float | None) -> float | None:
        wakeup = rate_wakeup
        for tier in self._tiers.values():
            if tier.groups:
                trigger = tier.next_trigger()
                if trigger is not None and trigger > now and (wakeup is None or trigger < wakeup):
                    wakeup = trigger
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].state == _FINISHED:
            heapq.heappop(deadlines)
        if deadlines and (wakeup is None or deadlines[0][0] < wakeup):
            wakeup = deadlines[0][0]
        return wakeup


def _load(replica: Replica) -> float:
    """How busy a replica is: its share of its seats in use."""
    return replica.in_flight / replica.ceiling


def _imbalanced(preferred: int, least: int) -> bool:
    """The affinity replica runs too many more sequences than the least busy one."""
    return preferred - least > AFFINITY_SLACK_SEQUENCES and preferred > AFFINITY_SLACK_RATIO * least
