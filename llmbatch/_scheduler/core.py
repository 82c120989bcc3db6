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
   parameters) share a batch, and the groups with a batch ready take turns: one
   that has just sent goes behind the others, so no group waits on another that
   never empties.
4. A group becomes a batch when it reaches ``max_batch_size`` or ``max_batch_tokens``,
   when its oldest request has waited ``max_wait``, when its tier has nothing in
   flight (``send_when_idle``), or when the scheduler is flushing (shutdown drain).
5. Tiers go in order realtime > normal > batch, except that a lower tier owed its
   ``min_share`` of dispatched sequences goes first, so nothing starves.
6. A batch is sent only within the in-flight limits (sequences and estimated tokens).
   Realtime may use every seat up to ``Limits.max_in_flight``; normal and batch
   work together only up to the *bulk limit* (``set_bulk_limit``: the admission
   controller's output, which leaves seats for realtime), and the same fraction of
   tokens. A batch that does not fit whole is trimmed to what fits. Where a
   server's bulk is paced (``set_pace``: prompt tokens a second, a slice at once),
   a normal or batch batch goes only once its pace has saved a whole slice, and
   takes at most that many prompt tokens (a larger request goes alone).
7. A batch is sent only when the rate limits allow it; when they do not, nothing
   else is sent either, so the budget goes to the tiers in order.
8. While a server is unavailable (its seats not ``sendable``) nothing is sent to
   it; deadlines still fire. A batch that met the outage comes back (``requeue``) at
   the head of its group, in its original order, and goes to whichever server
   takes it first.
9. With several servers, the limits of rule 6 hold per server (its :class:`Seats`,
   with its own bulk limit), and a batch goes to one server (``Batch.replica``),
   chosen by prefix affinity balanced by load (``routing``).
10. Tenants (``tenant=`` on calls): within a tier, the group whose tenant has been
    served the fewest tokens for its weight goes next (``tenants``: a virtual token
    counter), and a batch fills up with the same family's requests of other
    tenants, fewest-served first; each request is charged to its own tenant. A
    tenant with ``TenantLimits`` enters its tier's queue only within them; the rest
    of its requests are held, in order, until it has room (or refused at once).

The parts are modules of their own: ``queues`` (tiers and groups), ``seats`` (one
server's ledger), ``routing`` and ``budgets`` (rate limits, shared in-flight
allowance, tier credit); this one composes them behind :meth:`Scheduler.poll`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from llmbatch._calls.request import Request, State
from llmbatch._config import (
    DEFAULT_BATCH_POLICIES,
    BatchPolicy,
    Limits,
    Priority,
    RateLimit,
    TenantLimits,
)
from llmbatch._exceptions import LLMBatchError, QueueFull
from llmbatch._scheduler.budgets import RateBudget, SharedAllowance, settle_credit
from llmbatch._scheduler.queues import Group, TierQueue
from llmbatch._scheduler.routing import Router
from llmbatch._scheduler.seats import Seats
from llmbatch._scheduler.spending import SpendingHold
from llmbatch._scheduler.tenants import TenantBook
from llmbatch._stats import RateStats

__all__ = ["TIERS", "Batch", "Poll", "Scheduler"]

TIERS = (Priority.REALTIME, Priority.NORMAL, Priority.BATCH)
_WAITING, _QUEUED, _IN_FLIGHT, _FINISHED, _HELD = (
    State.WAITING,
    State.QUEUED,
    State.IN_FLIGHT,
    State.FINISHED,
    State.HELD,
)


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
    refused: list[tuple[Request, LLMBatchError]] = field(default_factory=list)
    """Held requests a spending limit can no longer take, with their errors."""


#: The share of a learnt rate limit the client spends: the provider's buckets and the
#: client's refill alike, so requests that arrive a little early or a little bunched
#: (the network, a batch's answers) would otherwise meet an empty bucket.
LEARNT_SHARE = 0.95


class Scheduler:
    """Tier queues plus the in-flight ledger. Not thread-safe; one event loop owns it."""

    def __init__(
        self,
        *,
        policies: Mapping[Priority, BatchPolicy] = DEFAULT_BATCH_POLICIES,
        limits: Limits,
        rate_limit: RateLimit | None = None,
        tenants: Mapping[str, TenantLimits] | None = None,
    ) -> None:
        self.limits = limits
        self._tiers = {p: TierQueue(policies.get(p, DEFAULT_BATCH_POLICIES[p])) for p in TIERS}
        self._credit = dict.fromkeys(TIERS, 0.0)
        """Sequences each tier is owed toward its minimum share."""
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.in_flight_by_tier = dict.fromkeys(TIERS, 0)
        self.seats: list[Seats] = [Seats(0, limits)]
        """Every server's seats; index 0 is the first server. Removed ones stay
        (inactive) so indexes held by in-flight requests remain valid."""
        self._router = Router(self.seats)
        # (deadline, seq, request) for every request with a deadline that has not left
        # the scheduler; entries of finished requests are dropped lazily.
        self._deadlines: list[tuple[float, int, Request]] = []
        stated = rate_limit is not None and rate_limit.stated
        self.rate: RateBudget | None = RateBudget(rate_limit) if stated and rate_limit else None
        """The rate limits (None: none set, nor learnt)."""
        self._rate_stated = stated
        self.rate_shared = rate_limit if rate_limit is not None and rate_limit.redis_url else None
        """Where rate limits are shared with other processes (Redis and a key), if
        anywhere: a learnt budget is leased from there too."""
        self._rate_in_force = rate_limit if stated else None
        """The budget ``rate`` holds, as numbers."""
        self._rate_said: tuple[str, str] | None = (
            ("stated", "rate_limit= given to the client") if stated else None
        )
        """The rate budget's source and evidence, for stats()."""
        self.on_rate_learnt: Callable[[RateLimit], None] | None = None
        """Told each budget learnt where it is shared (it leases the new rates)."""
        self.rate_learnt: tuple[int | None, int | None] | None = None
        """Requests and tokens a minute a server's answers stated, in force when no
        ``RateLimit`` was given (None: none learnt)."""
        self.shared: SharedAllowance | None = None
        """This client's share of an in-flight budget held with other processes
        (None: no such budget); see :meth:`share_in_flight`."""
        self._isolating = False
        """The server refused a prompt as too long: requests that might not fit go alone."""
        self._planned: float | None = None
        """The last poll's next wake-up: an add that needs an earlier one asks for a poll."""
        self.tenants = TenantBook(tenants)
        """Every active tenant's fair-share position, limits and held requests."""
        self.spending = SpendingHold()
        """Requests held until their spending limits have room."""

    # -- queue -----------------------------------------------------------------------

    def queued(self, priority: Priority) -> int:
        """Requests waiting client-side in ``priority``'s tier (for room, for a batch,
        or held back by their tenant's limits)."""
        tier = self._tiers[priority]
        held = self.tenants.held_count(priority) if self.tenants.holding else 0
        if self.spending.live:
            held += self.spending.count(priority)
        return tier.size + tier.waiting_live + held

    @property
    def idle(self) -> bool:
        """Nothing queued, waiting for room, held, or in flight."""
        return self.in_flight == 0 and not self.has_queued

    @property
    def has_queued(self) -> bool:
        """Something is queued, waiting for room or held (a freed seat may let it go)."""
        return (
            bool(self.tenants.holding)
            or self.spending.live > 0
            or any(t.size or t.waiting_live for t in self._tiers.values())
        )

    def add(self, request: Request, *, nowait: bool = False, must_wait: bool = False) -> bool:
        """Queue a request, or hold it until its tier has room (in arrival order), or
        until its tenant has room under its limits.

        With ``nowait``, a full tier raises :class:`QueueFull` instead, and a tenant
        at its limits :class:`TenantQuotaExceeded` (as it does for a tenant whose
        ``overflow`` is ``"raise"``, unless ``must_wait``: a map's items wait).
        Returns whether a poll is due now: the request started a group (a new timer),
        filled a batch, or carries a deadline earlier than the next planned wake-up.
        Otherwise the planned wake-up covers it, which spares the driver a poll per
        request.

        A request with spending limits first reserves what it may cost, or is held
        until they have room, or raises :class:`SpendingLimitReached` (nothing held)
        where they never will.
        """
        if request.spending and not request.reserved and not self.spending.enter(request):
            if request.deadline is not None:
                self._track_deadline(request)
            return False
        book = self.tenants
        name = request.spec.tenant
        if name is not None:
            owner = book.tenants.get(name) or book.get(name)
            held = owner.limits is not None and not book.enter(
                owner, request, request.created_at, nowait=nowait, must_wait=must_wait
            )
            owner.queued += 1
            request.owner = owner
            if held:
                if request.deadline is not None:
                    self._track_deadline(request)
                retry = book.next_retry()
                return retry is not None and (self._planned is None or retry < self._planned)
        tier = self._tiers[request.priority]
        if self._isolating and request.might_not_fit:
            request.travel_alone()
        due = False
        if request.deadline is not None:
            self._track_deadline(request)
            due = self._planned is None or request.deadline < self._planned
        if tier.size >= self.limits.max_queued or tier.waiting_live:
            if nowait:
                if request.quota is not None:
                    request.quota.release(request)
                if request.owner is not None:
                    request.owner.queued -= 1
                    request.owner = None
                raise QueueFull(
                    f"the {request.priority.value!r} queue is full "
                    f"({self.limits.max_queued} requests waiting)"
                )
            tier.waiting.append(request)
            tier.waiting_live += 1
            request.state = _WAITING
            return due
        group = tier.enqueue(request, request.created_at)
        if group.live == 1 and tier.tenanted:
            book.lift(group.tenant)
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
        elif state == _WAITING:
            self._tiers[request.priority].waiting_live -= 1
            request.state = _FINISHED
        elif state == _HELD:
            self.tenants.unhold(request)
        elif state == State.SPENDING:
            self.spending.unhold(request)
            return True
        else:
            return False
        if request.quota is not None:
            request.quota.release(request)
        owner = request.owner
        if owner is not None:
            owner.queued -= 1
            request.owner = None
        return True

    def queued_requests(self) -> Iterator[Request]:
        """Every request queued, waiting for room or held (for cancellation at close)."""
        for tier in self._tiers.values():
            for group in tier.groups.values():
                yield from (r for r in group.items if r.state == _QUEUED)
            yield from (r for r in tier.waiting if r.state == _WAITING)
        yield from list(self.tenants.held_requests())
        yield from list(self.spending.requests())

    def _admit(self, tier: TierQueue, now: float) -> None:
        """Move callers waiting for room into the queue, one per free place, in
        order within a tenant, the least-served tenant first."""
        room = self.limits.max_queued - tier.size
        waiting = tier.waiting
        served = self.tenants.virtual
        while room > 0 and tier.waiting_live:
            request = waiting.pop_next(served)
            if request is None:
                break
            tier.waiting_live -= 1
            tier.enqueue(request, now)  # its batch timer starts now
            room -= 1

    def _enqueue_admitted(self, request: Request, now: float) -> None:
        """A request its tenant held back has room now: into its tier's queue (or
        the wait for room there), its batch timer starting now."""
        tier = self._tiers[request.priority]
        if self._isolating and request.might_not_fit:
            request.travel_alone()
        if tier.size >= self.limits.max_queued or tier.waiting_live:
            tier.waiting.append(request)
            tier.waiting_live += 1
            request.state = _WAITING
            return
        group = tier.enqueue(request, now)
        if group.live == 1 and tier.tenanted:
            self.tenants.lift(group.tenant)

    def _fairest(self, ready: Iterator[Group], tenanted: int) -> Group | None:
        """Of the ready groups, the one whose tenant has been served least for its
        weight (with ``tenanted``: named tenants are queued), then the one that has
        sent the fewest tokens itself; the first in turn order among equals."""
        best: Group | None = None
        if not tenanted:
            for group in ready:
                if best is None or group.served < best.served:
                    best = group
            return best
        virtual = self.tenants.virtual
        best_key = (0.0, 0.0)
        for group in ready:
            key = (virtual(group.tenant), group.served)
            if best is None or key < best_key:
                best, best_key = group, key
        return best

    def _track_deadline(self, request: Request) -> None:
        assert request.deadline is not None
        heapq.heappush(self._deadlines, (request.deadline, request.seq, request))
        live = self.in_flight + sum(t.size + t.waiting_live for t in self._tiers.values())
        if len(self._deadlines) > 64 + 2 * live:
            # Answered requests linger here until their deadline; drop them so memory
            # follows the live requests, not the request rate times the timeout.
            self._deadlines = [e for e in self._deadlines if e[2].state != _FINISHED]
            heapq.heapify(self._deadlines)

    def learn_rate(
        self,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        *,
        source: str = "learnt",
        evidence: str = "",
    ) -> None:
        """A server's answers state its rate limits (a hosted provider's headers): they
        pace what is sent, as a ``RateLimit`` of those numbers would, unless one was
        given (then it is kept as given). A change of the numbers takes effect at once.
        ``source`` and ``evidence``: where they come from, for stats()."""
        learnt = (requests_per_minute or None, tokens_per_minute or None)
        if self._rate_stated or learnt == self.rate_learnt or learnt == (None, None):
            return
        self.rate_learnt = learnt
        spent = f"paced at {LEARNT_SHARE:.0%} of it"
        self._rate_said = (source, f"{evidence}; {spent}" if evidence else spent)
        rpm, tpm = (None if x is None else max(1, int(x * LEARNT_SHARE)) for x in learnt)
        shared = self.rate_shared
        limit = (
            RateLimit(requests_per_minute=rpm, tokens_per_minute=tpm)
            if shared is None
            else replace(shared, requests_per_minute=rpm, tokens_per_minute=tpm)
        )
        fresh = RateBudget(limit, refunds=False)
        self._rate_in_force = limit
        old = self.rate
        if old is not None:
            fresh.keep_spent(old)
        self.rate = fresh
        if shared is not None and self.on_rate_learnt is not None:
            self.on_rate_learnt(_at_speed(limit, fresh.speed))

    def rate_answered(self, now: float, *, refused: bool) -> None:
        """Whether a 429 came since the last call: a learnt budget slows down for it
        (another process or app spends the same key) and speeds up again while none
        comes (:meth:`RateBudget.refused`). A stated ``RateLimit`` is kept as given."""
        rate = self.rate
        if self._rate_stated or rate is None:
            return
        if refused:
            rate.refused(now)
        else:
            rate.recover(now)

    def take_rate_cut(self) -> bool:
        """Whether a leased learnt budget met 429s since last asked (to tell the
        processes sharing it, which slow down together)."""
        rate = self.rate
        if rate is None or not rate.cut_pending:
            return False
        rate.cut_pending = False
        return True

    def set_rate_speed(self, speed: float) -> None:
        """The share of a leased learnt budget its sharers spend now (kept in Redis,
        cut for 429s and raised while none come): leased at that rate from now on."""
        rate, limit = self.rate, self._rate_in_force
        if self._rate_stated or rate is None or not rate.leased or limit is None:
            return
        if speed == rate.speed:
            return
        rate.speed = speed
        if self.on_rate_learnt is not None:
            self.on_rate_learnt(_at_speed(limit, speed))

    def rate_stats(self) -> RateStats | None:
        """The rate budget in force, where it comes from (None: none)."""
        limit, said = self._rate_in_force, self._rate_said
        if limit is None or said is None:
            return None
        return RateStats(
            requests_per_minute=limit.requests_per_minute,
            tokens_per_minute=limit.tokens_per_minute,
            source=said[0],
            evidence=said[1],
        )

    def learn_remaining(self, now: float, requests: float | None, tokens: float | None) -> None:
        """A server's answer said what is left of its per-second budget (a second's
        worth of requests and tokens; None: not said): a learnt budget holds no more
        than its share of that, so another process or app spending the same key is
        seen. A stated ``RateLimit`` is kept as given."""
        rate = self.rate
        if self._rate_stated or rate is None:
            return
        rate.clamp(
            now,
            None if requests is None else requests * LEARNT_SHARE,
            None if tokens is None else tokens * LEARNT_SHARE,
        )

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
                if request.quota is not None:
                    request.quota.release(request)
                owner = request.owner
                if owner is not None:
                    owner.in_flight -= 1
                    request.owner = None
        if not count:
            return
        self.in_flight -= count
        self.in_flight_tokens -= tokens
        self.in_flight_by_tier[priority] -= count
        self.seats[replica].book(priority, -count, -tokens)

    def set_bulk_limit(self, sequences: int, replica: int = 0) -> None:
        """Cap normal and batch work on ``replica`` at ``sequences`` in flight (and the
        same share of its token limit); realtime keeps every seat up to
        ``Limits.max_in_flight``."""
        self.seats[replica].set_bulk_limit(sequences)

    def set_batch_prefill(self, tokens: float | None, replica: int = 0) -> None:
        """Keep each batch to ``replica`` within ``tokens`` estimated prompt tokens
        (None: no cap)."""
        self.seats[replica].batch_prefill = math.inf if tokens is None else max(1.0, tokens)

    def set_pace(
        self, tokens_per_second: float | None, slice_tokens: float = 0.0, replica: int = 0
    ) -> None:
        """Pace normal and batch prompt tokens to ``replica`` (None: unpaced)."""
        self.seats[replica].set_pace(tokens_per_second, slice_tokens)

    def add_replica(self, models: frozenset[str] | None = None, *, active: bool = True) -> Seats:
        """A new server's seats: it takes batches at once, or (``active=False``) once
        :meth:`activate` says (a server still being read while the client runs)."""
        seats = Seats(len(self.seats), self.limits)
        seats.active = active
        self.seats.append(seats)
        self.set_models(seats.index, models)
        return seats

    def activate(self, replica: int) -> None:
        """``replica`` takes batches from now on."""
        self.seats[replica].active = True
        self._router.models_changed()

    def set_models(self, replica: int, models: frozenset[str] | None) -> None:
        """The models ``replica`` serves (None: unknown, any)."""
        self.seats[replica].models = models
        self._router.models_changed()

    def remove_replica(self, replica: int) -> None:
        """Send nothing more to ``replica``; what it has in flight finishes there."""
        self.seats[replica].active = False
        self._router.models_changed()

    def share_in_flight(
        self, *, limits_tokens: bool, on_full: Callable[[], None]
    ) -> SharedAllowance:
        """From now on send only what a budget shared with other processes allows
        (nothing, until its holder grants some); ``on_full`` is called when work
        waits for it alone."""
        self.shared = SharedAllowance(limits_tokens=limits_tokens, on_full=on_full)
        return self.shared

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
        quotas = [(r, r.quota) for r in live if r.quota is not None]
        owners = [(r, r.owner) for r in live if r.owner is not None]
        for request in requests:
            self.finish(request)
        for request, tenant in quotas:
            tenant.readmit(request)  # still its tenant's, queued again
        for request, owner in owners:
            owner.queued += 1
            request.owner = owner
        if self._isolating:
            for request in live:
                if request.might_not_fit:
                    request.travel_alone()
        by_tier: dict[Priority, list[Request]] = {}
        for request in live:
            by_tier.setdefault(request.priority, []).append(request)
        for priority, group in by_tier.items():
            self._tiers[priority].requeue(group)

    # -- dispatch --------------------------------------------------------------------

    def poll(self, now: float, *, flush: bool = False) -> Poll:
        """Expire, admit, form and pick batches, route each to a server, and reserve
        their in-flight capacity there. (A server's ``sendable`` says whether it
        takes batches: not while it is unavailable, one while it may be back.)"""
        expired = self._expire(now) if self._deadlines else []
        refused: list[tuple[Request, LLMBatchError]] = []
        if self.spending.live:
            going, spent = self.spending.release()
            refused.extend(spent)
            for request in going:
                self.add(request, must_wait=True)
        book = self.tenants
        if book.holding:
            for request in book.admissible(now):
                self._enqueue_admitted(request, now)
        if book.tenants:
            book.sweep(now)
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
            candidates: dict[Priority, tuple[Group, Seats]] = {}
            for p, tier in self._tiers.items():
                if not tier.groups or p in blocked:
                    continue
                if not self._has_seat(p):
                    if p is not Priority.REALTIME:
                        self._note_blocked(limit_blocked)
                    continue
                idle = self.in_flight_by_tier[p] == 0
                if len(self.seats) == 1:
                    group = self._fairest(tier.ready_groups(now, flush, idle), tier.tenanted)
                    if group is None:
                        continue
                    seats = self._router.route(p, group)[0]
                    if seats is None:  # no seat where its model is served
                        continue
                    candidates[p] = (group, seats)
                else:
                    ready = tier.ready_groups(now, flush, idle)
                    if tier.tenanted:
                        ready = iter(sorted(ready, key=lambda g: book.virtual(g.tenant)))
                    picked = self._router.pick(p, tier, ready)
                    if picked is not None:
                        candidates[p] = picked
            if not candidates:
                break
            owed = [p for p in candidates if self._credit[p] >= 1.0]
            chosen = owed[0] if owed else next(p for p in TIERS if p in candidates)
            group, seats = candidates[chosen]
            count, tokens, mixed = self._plan(chosen, group, seats, now)
            if count == 0:
                # A single request larger than the free token room, or than its
                # pace lets go yet: wait for room, or for the pace.
                blocked.add(chosen)
                paced = self._pace_wait(chosen, seats, now)
                if paced is not None and (rate_wakeup is None or paced < rate_wakeup):
                    rate_wakeup = paced
                continue
            wait = 0.0 if self.rate is None else self.rate.wait(now, tokens, chosen)
            if wait > 0:
                # Nothing overtakes the tier the budget is owed to. (An infinite wait
                # ends with a lease of the shared budget, which wakes the driver.)
                if wait != math.inf:
                    rate_wakeup = now + wait
                break
            if self.rate is not None:
                self.rate.take(tokens)
            batch = self._commit(chosen, group, count, tokens, seats, mixed, now)
            if seats.pace is not None and chosen is not Priority.REALTIME:
                seats.pace.take(sum(r.prefill_tokens for r in batch.requests))
            batches.append(batch)
            settle_credit(
                self._credit, self.limits.min_share, chosen, count, candidates, owed=chosen in owed
            )
            tier = self._tiers[chosen]
            if tier.waiting_live:
                self._admit(tier, now)
        self._planned = self._next_wakeup(now, rate_wakeup)
        return Poll(batches, expired, self._planned, frozenset(limit_blocked), refused)

    def _has_seat(self, priority: Priority) -> bool:
        """Some server takes batches now and has a seat for ``priority``, and the
        shared in-flight budget (if any) has one too."""
        shared = self.shared
        if shared is not None and self.in_flight >= shared.seats:
            shared.on_full()
            return False
        return any(seats.has_seat(priority) for seats in self.seats)

    def seat_demand(self) -> tuple[int, int]:
        """Sequences and tokens this client would have in flight now if the shared
        budget allowed: what is in flight plus what is queued, up to what its own
        limits (and the adaptive bulk limit) would let it send."""
        own_seats = own_tokens = 0
        reserved = self.limits.reserved_realtime
        for seats in self.seats:
            if seats.active:
                own_seats += min(seats.ceiling, seats.bulk_cap + reserved)
                own_tokens += seats.token_ceiling
        queued = queued_tokens = 0
        for tier in self._tiers.values():
            queued += tier.size + tier.waiting_live
            queued_tokens += sum(group.tokens for group in tier.groups.values())
        return (
            min(own_seats, self.in_flight + queued),
            min(own_tokens, self.in_flight_tokens + queued_tokens),
        )

    def _note_blocked(self, blocked: set[int]) -> None:
        """Note the servers whose bulk limit alone holds back bulk work: seats free
        there, none for bulk (evidence for the controller that more would be used)."""
        blocked.update(seats.index for seats in self.seats if seats.bulk_held_back())

    @staticmethod
    def _pace_wait(priority: Priority, seats: Seats, now: float) -> float | None:
        """When ``seats``' pace will have saved a slice (None: the pace is not what
        holds ``priority`` back)."""
        pace = seats.pace
        if pace is None or priority is Priority.REALTIME:
            return None
        wait = pace.wait_time(now, pace.capacity)
        return now + wait if wait > 0 else None

    def _plan(
        self, priority: Priority, group: Group, seats: Seats, now: float
    ) -> tuple[int, int, list[Request] | None]:
        """How many requests the next batch takes and their tokens: the group's oldest,
        or, when other tenants' groups of its family are queued too, a mix of them
        (returned in the order taken)."""
        policy = self._tiers[priority].policy
        room_seqs, room_tokens = seats.room(priority)
        # Prompt tokens its pace lets go now: nothing until the bucket holds a whole
        # slice (else every poll would send the one prompt it had saved for, and one
        # request a prompt is what the API server can least afford), then up to what
        # it holds; a first request larger than a slice then goes alone.
        pace = seats.pace if priority is not Priority.REALTIME else None
        paced = first = math.inf
        if pace is not None:
            paced = pace.level if pace.wait_time(now, pace.capacity) == 0 else 0.0
            first = math.inf if paced else 0.0
        busy = seats.in_flight > 0
        if self.shared is not None:
            shared_seqs, shared_tokens = self.shared.room(self.in_flight, self.in_flight_tokens)
            room_seqs = int(min(room_seqs, shared_seqs))
            if shared_tokens < room_tokens:
                room_tokens, busy = int(shared_tokens), self.in_flight > 0
        limit = min(policy.max_batch_size, room_seqs, group.head().spec.max_batch)
        tier = self._tiers[priority]
        step = seats.batch_prefill
        most: float = policy.max_batch_tokens
        if self.rate is not None:
            most = min(most, self.rate.batch_room())
        if tier.tenanted and len(tier.families[group.family]) > 1:
            return self._plan_mixed(
                tier, group, limit, room_tokens, busy, (paced, first), step, most
            )
        measure = pace is not None or step != math.inf
        count = tokens = prefill = 0
        for request in group.items:
            if request.state != _QUEUED:
                continue
            if count >= limit:
                break
            cost = request.est_tokens
            over_batch = count and tokens + cost > most
            # An oversize request may go alone, but only onto an otherwise idle server.
            over_room = tokens + cost > room_tokens and (count or busy)
            prompt = request.prefill_tokens if measure else 0
            over_pace = prefill + prompt > (paced if count else first)
            # A batch is at most one engine step's prompts, so not one long prefill.
            over_step = count and prefill + prompt > step
            if over_batch or over_room or over_pace or over_step:
                break
            count += 1
            tokens += cost
            prefill += prompt
        return count, tokens, None

    def _plan_mixed(
        self,
        tier: TierQueue,
        first: Group,
        limit: int,
        room_tokens: int,
        busy: bool,
        paced: tuple[float, float],
        step: float = math.inf,
        most: float = math.inf,
    ) -> tuple[int, int, list[Request]]:
        """A batch from ``first``'s family: each place goes to the tenant served least
        for its weight so far (counting what this batch already gives it), ``first``
        winning ties; within a tenant, oldest first. ``paced``: the prompt tokens its
        pace lets go, for a second request on and for the first; ``most``: the most
        estimated tokens a batch may take beside the policy's (a rate budget's)."""
        policy = tier.policy
        book = self.tenants
        members = tier.families[first.family]
        heads: list[tuple[float, int, Iterator[Request], Request, float]] = []
        for order, group in enumerate((first, *(g for g in members.values() if g is not first))):
            members_queued: Iterator[Request] = (r for r in group.items if r.state == _QUEUED)
            head = next(members_queued, None)
            if head is not None:
                tenant = book.get(group.tenant)
                heads.append((tenant.served, order, members_queued, head, tenant.weight))
        heapq.heapify(heads)
        taken: list[Request] = []
        tokens = prefill = 0
        pace_room, pace_first = paced
        while heads and len(taken) < limit:
            served, order, queued, request, weight = heads[0]
            cost = request.est_tokens
            over_batch = taken and tokens + cost > min(most, policy.max_batch_tokens)
            over_room = tokens + cost > room_tokens and (taken or busy)
            measure = pace_room != math.inf or step != math.inf
            prompt = request.prefill_tokens if measure else 0
            over_pace = prefill + prompt > (pace_room if taken else pace_first)
            over_step = taken and prefill + prompt > step
            if over_batch or over_room or over_pace or over_step:
                break
            taken.append(request)
            tokens += cost
            prefill += prompt
            following = next(queued, None)
            if following is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (served + cost / weight, order, queued, following, weight))
        return len(taken), tokens, taken

    def _commit(
        self,
        priority: Priority,
        group: Group,
        count: int,
        tokens: int,
        seats: Seats,
        mixed: list[Request] | None,
        now: float,
    ) -> Batch:
        tier = self._tiers[priority]
        key = group.head().group_key
        if mixed is None:
            taken = tuple(tier.pop(group) for _ in range(count))
            self.tenants.charge(group.tenant, tokens, now)
            if group.tenant is not None:
                owner = taken[0].owner
                owner.queued -= count
                owner.in_flight += count
            tier.served(group, key, tokens)
        else:
            taken = tuple(mixed)
            charged: dict[str | None, int] = {}
            by_group: dict[str, tuple[Group, int]] = {}
            groups = tier.groups
            for request in taken:
                member = groups[request.group_key]
                tier.pop(member)
                cost = request.est_tokens
                spent = by_group.get(request.group_key)
                by_group[request.group_key] = (member, cost + (0 if spent is None else spent[1]))
                tenant = request.spec.tenant
                charged[tenant] = charged.get(tenant, 0) + cost
                owner = request.owner
                if owner is not None:
                    owner.queued -= 1
                    owner.in_flight += 1
            for tenant, spent_tokens in charged.items():
                self.tenants.charge(tenant, spent_tokens, now)
            for member, spent_tokens in by_group.values():
                if member is group:
                    tier.served(group, key, spent_tokens)
                else:
                    member.served += spent_tokens
        index = seats.index
        for request in taken:
            request.state = _IN_FLIGHT
            request.replica = index
        self.in_flight += count
        self.in_flight_tokens += tokens
        self.in_flight_by_tier[priority] += count
        seats.book(priority, count, tokens)
        if seats.sendable:
            seats.sendable -= 1
        if len(self.seats) > 1:
            self._router.remember(seats, taken)
        return Batch(priority, taken, index)

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
        if self.tenants.holding:
            retry = self.tenants.next_retry()
            if retry is not None and retry > now and (wakeup is None or retry < wakeup):
                wakeup = retry
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


def _at_speed(limit: RateLimit, speed: float) -> RateLimit:
    """``limit`` spent at ``speed`` of itself (a shared learnt budget slowed by 429s)."""
    if speed == 1.0:
        return limit
    rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
    return replace(
        limit,
        requests_per_minute=None if rpm is None else max(1.0, rpm * speed),
        tokens_per_minute=None if tpm is None else max(1.0, tpm * speed),
    )
