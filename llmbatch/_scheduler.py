"""The DynamicBatcher: tier queues, batch formation and dispatch order.

Pure, synchronous logic with time passed in (``now``), so every trigger, budget and
fairness rule is tested exactly without sleeping. The async driver in
``_engine.py`` calls :meth:`Scheduler.poll` whenever something changes or the
returned wake-up time arrives, and sends the batches it gets.

Rules, in order of precedence:

1. A queued request whose deadline has passed leaves the queue (``Poll.expired``).
2. Within a tier, only compatible requests (same endpoint kind, model and sampling
   parameters) share a batch; the group whose oldest request waited longest goes
   first.
3. A group becomes a batch when it reaches ``max_batch_size`` or ``max_batch_tokens``,
   or when its oldest request has waited ``max_wait`` (``0`` for realtime: coalesce
   only what already waits), or when the scheduler is flushing (shutdown drain).
4. Tiers go in order realtime > normal > batch, except that a lower tier owed its
   ``min_share`` of dispatched sequences goes first, so nothing starves.
5. A batch is sent only within the in-flight limits (sequences and estimated tokens);
   ``reserved_realtime`` sequences (and the same fraction of tokens) are usable by
   realtime alone. A batch that does not fit whole is trimmed to what fits.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmbatch._config import DEFAULT_BATCH_POLICIES, BatchPolicy, Limits, Priority
from llmbatch._exceptions import QueueFull
from llmbatch._request import Request

__all__ = ["Batch", "Poll", "Scheduler"]

TIERS = (Priority.REALTIME, Priority.NORMAL, Priority.BATCH)


@dataclass(frozen=True, slots=True)
class Batch:
    """Compatible requests of one tier that go out together."""

    priority: Priority
    requests: tuple[Request, ...]

    @property
    def tokens(self) -> int:
        return sum(r.est_tokens for r in self.requests)


@dataclass(frozen=True, slots=True)
class Poll:
    """What the driver should do now, and when to ask again."""

    batches: list[Batch] = field(default_factory=list)
    expired: list[Request] = field(default_factory=list)
    next_wakeup: float | None = None


class _Group:
    """Compatible requests of one tier, oldest first, with their token sum."""

    __slots__ = ("items", "tokens")

    def __init__(self) -> None:
        self.items: deque[Request] = deque()
        self.tokens = 0


class _Tier:
    """One tier's queue: compatible groups in arrival order of their oldest member."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.groups: OrderedDict[tuple[object, ...], _Group] = OrderedDict()
        self.size = 0
        self.credit = 0.0

    def add(self, request: Request) -> _Group:
        key = request.spec.compat_key
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group()
        group.items.append(request)
        group.tokens += request.est_tokens
        self.size += 1
        request.queued = True
        return group

    def remove(self, request: Request) -> bool:
        key = request.spec.compat_key
        group = self.groups.get(key)
        if group is None:
            return False
        try:
            group.items.remove(request)
        except ValueError:
            return False
        group.tokens -= request.est_tokens
        self.size -= 1
        request.queued = False
        if not group.items:
            del self.groups[key]
        return True

    def pop(self, group: _Group) -> Request:
        request = group.items.popleft()
        group.tokens -= request.est_tokens
        self.size -= 1
        request.queued = False
        if not group.items:
            del self.groups[request.spec.compat_key]
        return request

    def ready_group(self, now: float, flush: bool) -> _Group | None:
        """The oldest group that has hit a trigger, if any."""
        policy = self.policy
        for group in self.groups.values():
            if (
                flush
                or len(group.items) >= policy.max_batch_size
                or group.items[0].enqueued_at + policy.max_wait <= now
                or group.tokens >= policy.max_batch_tokens
            ):
                return group
        return None

    def next_trigger(self) -> float | None:
        heads = [g.items[0].enqueued_at + self.policy.max_wait for g in self.groups.values()]
        return min(heads, default=None)


class Scheduler:
    """Tier queues plus the in-flight ledger. Not thread-safe; one event loop owns it."""

    def __init__(
        self,
        *,
        policies: Mapping[Priority, BatchPolicy] = DEFAULT_BATCH_POLICIES,
        limits: Limits,
    ) -> None:
        self.limits = limits
        self._tiers = {p: _Tier(policies.get(p, DEFAULT_BATCH_POLICIES[p])) for p in TIERS}
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.in_flight_by_tier = dict.fromkeys(TIERS, 0)
        self._bulk_in_flight = 0
        self._bulk_in_flight_tokens = 0
        bulk_fraction = (limits.max_in_flight - limits.reserved_realtime) / limits.max_in_flight
        self._bulk_seq_cap = limits.max_in_flight - limits.reserved_realtime
        self._bulk_token_cap = max(1, int(limits.max_in_flight_tokens * bulk_fraction))
        # (deadline, seq, request); entries of requests that already left the queue are
        # dropped lazily when they reach the top.
        self._deadlines: list[tuple[float, int, Request]] = []
        self._seq = 0

    # -- queue -----------------------------------------------------------------------

    def queued(self, priority: Priority) -> int:
        return self._tiers[priority].size

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight."""
        return self.in_flight == 0 and all(t.size == 0 for t in self._tiers.values())

    def has_room(self, priority: Priority) -> bool:
        return self._tiers[priority].size < self.limits.max_queued

    def add(self, request: Request) -> bool:
        """Queue a request, or raise :class:`QueueFull` if its tier is at ``max_queued``.

        Returns whether a poll is due now: the request started a group (a new
        ``max_wait`` timer), filled a batch, or its tier waits for nothing. Otherwise
        the running timer covers it, which spares the driver a poll per request.
        """
        tier = self._tiers[request.priority]
        if tier.size >= self.limits.max_queued:
            raise QueueFull(
                f"the {request.priority.value!r} queue is full "
                f"({self.limits.max_queued} requests waiting)"
            )
        group = tier.add(request)
        if request.deadline is not None:
            self._seq += 1
            heapq.heappush(self._deadlines, (request.deadline, self._seq, request))
            if len(self._deadlines) > 64 + 2 * sum(t.size for t in self._tiers.values()):
                # Dispatched requests linger here until their deadline; drop them so
                # memory follows the queue, not the request rate times the timeout.
                self._deadlines = [e for e in self._deadlines if e[2].queued]
                heapq.heapify(self._deadlines)
        policy = tier.policy
        return (
            len(group.items) == 1
            or len(group.items) >= policy.max_batch_size
            or group.tokens >= policy.max_batch_tokens
            or policy.max_wait == 0
            or request.deadline is not None
        )

    def remove(self, request: Request) -> bool:
        """Take a queued request out (its caller went away); False if not queued."""
        return request.queued and self._tiers[request.priority].remove(request)

    def queued_requests(self) -> Iterable[Request]:
        for tier in self._tiers.values():
            for group in tier.groups.values():
                yield from group.items

    # -- in-flight ledger ------------------------------------------------------------

    def finish(self, request: Request) -> None:
        """Return one dispatched request's in-flight capacity."""
        self.in_flight -= 1
        self.in_flight_tokens -= request.est_tokens
        self.in_flight_by_tier[request.priority] -= 1
        if request.priority is not Priority.REALTIME:
            self._bulk_in_flight -= 1
            self._bulk_in_flight_tokens -= request.est_tokens

    def _room(self, priority: Priority) -> tuple[int, int]:
        seqs = self.limits.max_in_flight - self.in_flight
        tokens = self.limits.max_in_flight_tokens - self.in_flight_tokens
        if priority is not Priority.REALTIME:
            seqs = min(seqs, self._bulk_seq_cap - self._bulk_in_flight)
            tokens = min(tokens, self._bulk_token_cap - self._bulk_in_flight_tokens)
        return seqs, tokens

    # -- dispatch --------------------------------------------------------------------

    def poll(self, now: float, *, flush: bool = False) -> Poll:
        """Expire, form and pick batches; reserve their in-flight capacity."""
        expired = self._expire(now)
        batches: list[Batch] = []
        # Tiers whose next request does not fit the free token room this poll; without
        # this, the loop would pick the same tier again forever.
        blocked: set[Priority] = set()
        while True:
            candidates = {
                p: group
                for p, tier in self._tiers.items()
                if p not in blocked
                and (group := tier.ready_group(now, flush)) is not None
                and self._room(p)[0] > 0
            }
            if not candidates:
                break
            owed = [p for p in candidates if self._tiers[p].credit >= 1.0]
            chosen = owed[0] if owed else next(p for p in TIERS if p in candidates)
            batch = self._take(chosen, candidates[chosen])
            if batch is None:
                # A single request larger than the free token room: wait for room.
                blocked.add(chosen)
                continue
            batches.append(batch)
            self._settle_credit(chosen, len(batch.requests), candidates, owed=chosen in owed)
        return Poll(batches, expired, self._next_wakeup(now))

    def _take(self, priority: Priority, group: _Group) -> Batch | None:
        tier = self._tiers[priority]
        room_seqs, room_tokens = self._room(priority)
        taken: list[Request] = []
        tokens = 0
        while group.items and len(taken) < min(tier.policy.max_batch_size, room_seqs):
            cost = group.items[0].est_tokens
            over_batch = taken and tokens + cost > tier.policy.max_batch_tokens
            # An oversize request may go alone, but only onto an otherwise idle tier.
            over_room = tokens + cost > room_tokens and (taken or self.in_flight > 0)
            if over_batch or over_room:
                break
            taken.append(tier.pop(group))
            tokens += cost
        if not taken:
            return None
        self.in_flight += len(taken)
        self.in_flight_tokens += tokens
        self.in_flight_by_tier[priority] += len(taken)
        if priority is not Priority.REALTIME:
            self._bulk_in_flight += len(taken)
            self._bulk_in_flight_tokens += tokens
        return Batch(priority, tuple(taken))

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
        while self._deadlines and self._deadlines[0][0] <= now:
            request = heapq.heappop(self._deadlines)[2]
            if self.remove(request):
                expired.append(request)
        return expired

    def _next_wakeup(self, now: float) -> float | None:
        times = [t for tier in self._tiers.values() if (t := tier.next_trigger()) is not None]
        times = [t for t in times if t > now]
        if self._deadlines:
            times.append(self._deadlines[0][0])
        return min(times, default=None)
