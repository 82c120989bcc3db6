"""Scheduler invariants under random workloads (hypothesis), on a fake clock.

The scheduler is pure: time is the ``now`` passed to :meth:`Scheduler.poll`, so a
test drives it exactly, the way the engine does, without sleeping. Each test keeps
its own model of what should be queued and in flight and checks the scheduler
against it after every step:

- every submitted request ends exactly once (dispatched, expired or removed);
- no request is in two batches; batches respect size, token budget, tier and
  compatibility;
- queue, in-flight and realtime-reservation limits are never exceeded; callers
  beyond a full queue are admitted in arrival order, one per freed place;
- tiers go in order, and lower tiers get (no less and not much more than) their
  minimum share while higher tiers keep the scheduler busy;
- deadlines fire: nothing past its deadline stays queued, nothing expires early,
  and the wake-up time never lets a deadline or a batch timer slip.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from factories import make_request as build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmbatch import SLO, BatchPolicy, Limits, Priority, QueueFull
from llmbatch._calls.request import Request, State
from llmbatch._control.admission import AdmissionController
from llmbatch._scheduler import Poll, Scheduler

RT, NORMAL, BULK = Priority.REALTIME, Priority.NORMAL, Priority.BATCH
TIERS = (RT, NORMAL, BULK)

policy_st = st.builds(
    BatchPolicy,
    max_batch_size=st.integers(1, 6),
    max_wait=st.sampled_from([0.0, 0.05, 0.5]),
    max_batch_tokens=st.integers(60, 800),
    send_when_idle=st.booleans(),
)
limits_st = st.integers(1, 8).flatmap(
    lambda seqs: st.builds(
        Limits,
        max_in_flight=st.just(seqs),
        max_in_flight_tokens=st.integers(100, 1500),
        reserved_realtime=st.integers(0, seqs - 1),
        max_queued=st.integers(1, 12),
    )
)
request_st = st.tuples(
    st.sampled_from(TIERS),
    st.integers(1, 400),  # max_tokens: sometimes larger than the free token room
    st.sampled_from([None, 0.5]),  # temperature: two compatibility classes
    st.one_of(st.none(), st.floats(0.01, 2.0)),  # relative deadline
)
op_st = st.one_of(
    st.tuples(st.just("add"), request_st),
    st.tuples(st.just("tick"), st.floats(0.0, 0.6)),
    st.tuples(st.just("finish"), st.integers(0, 8)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
)


def make_request(
    now: float,
    tier: Priority,
    max_tokens: int = 4,
    temperature: float | None = None,
    timeout: float | None = None,
) -> Request:
    """A request created at ``now`` (its deadline ``now + timeout``)."""
    return build(
        tier,
        at=now,
        prompt="hello there",
        max_tokens=max_tokens,
        temperature=temperature,
        timeout=timeout,
    )


@dataclass
class Model:
    """What the test believes: who waits for room, who is queued, who is in flight,
    who has ended."""

    policies: dict[Priority, BatchPolicy]
    limits: Limits
    waiting: dict[Priority, list[Request]] = field(default_factory=lambda: {p: [] for p in TIERS})
    queued: dict[Priority, list[Request]] = field(default_factory=lambda: {p: [] for p in TIERS})
    in_flight: list[Request] = field(default_factory=list)
    ended: dict[int, str] = field(default_factory=dict)
    #: Every request ever added, kept alive so that ``id()`` stays unique.
    added: list[Request] = field(default_factory=list)

    def add(self, request: Request) -> None:
        self.added.append(request)
        tier = request.priority
        if self.waiting[tier] or len(self.queued[tier]) >= self.limits.max_queued:
            self.waiting[tier].append(request)
        else:
            self.queued[tier].append(request)

    def tier_idle(self, tier: Priority) -> bool:
        return not any(r.priority is tier for r in self.in_flight)

    def ready_groups(self, tier: Priority, now: float, flush: bool) -> list[list[Request]]:
        """The tier's compatible groups that have hit a batch trigger, by the
        documented rules (size, max_wait, token budget, idle tier, flush)."""
        policy = self.policies[tier]
        groups = _groups(self.queued[tier])
        if policy.send_when_idle and self.tier_idle(tier):
            return groups
        return [
            group
            for group in groups
            if flush
            or len(group) >= policy.max_batch_size
            or group[0].enqueued_at + policy.max_wait <= now
            or sum(r.est_tokens for r in group) >= policy.max_batch_tokens
        ]

    def seq_room(self, tier: Priority) -> int:
        room = self.limits.max_in_flight - len(self.in_flight)
        if tier is not RT:
            bulk = sum(1 for r in self.in_flight if r.priority is not RT)
            room = min(room, self.limits.max_in_flight - self.limits.reserved_realtime - bulk)
        return room


def check_poll(s: Scheduler, model: Model, poll: Poll, now: float, flush: bool) -> None:
    """Every per-poll invariant; updates ``model`` with what the poll did."""
    limits = model.limits
    for request in poll.expired:
        assert request.deadline is not None
        assert request.deadline <= now, "expired early"
        if request in model.in_flight:
            # Still flying: the engine fails it and cancels its exchange; its seat is
            # returned when the exchange ends, as for any in-flight request.
            assert model.ended[id(request)] == "dispatched"
            model.ended[id(request)] = "expired in flight"
            continue
        assert id(request) not in model.ended, "a request ended twice"
        tier = request.priority
        where = model.waiting[tier] if request in model.waiting[tier] else model.queued[tier]
        where.remove(request)
        model.ended[id(request)] = "expired"
    for tier in TIERS:
        # Admission: callers waiting for room enter the queue in arrival order.
        # (Some may have been dispatched in the same poll.)
        admitted = [r for r in model.waiting[tier] if r.state in (State.QUEUED, State.IN_FLIGHT)]
        assert admitted == model.waiting[tier][: len(admitted)], "admitted out of order"
        del model.waiting[tier][: len(admitted)]
        model.queued[tier].extend(admitted)
        for request in admitted:
            assert request.enqueued_at == now, "an admitted request's timer did not restart"
    for batch in poll.batches:
        policy = model.policies[batch.priority]
        assert 1 <= len(batch.requests) <= policy.max_batch_size
        assert len({r.spec.compat_key for r in batch.requests}) == 1, "incompatible batch"
        assert all(r.priority is batch.priority for r in batch.requests), "mixed tiers"
        if len(batch.requests) > 1:
            assert batch.tokens <= policy.max_batch_tokens, "batch token budget exceeded"
        for request in batch.requests:
            assert id(request) not in model.ended, "a request was in two batches"
            assert request in model.queued[batch.priority], "dispatched a request not queued"
            model.queued[batch.priority].remove(request)
            model.ended[id(request)] = "dispatched"
            model.in_flight.append(request)
    # In-flight limits. One request larger than the token room may go, but only
    # alone onto an idle server.
    bulk = [r for r in model.in_flight if r.priority is not RT]
    assert s.in_flight == len(model.in_flight) <= limits.max_in_flight
    assert s.in_flight_tokens == sum(r.est_tokens for r in model.in_flight)
    if s.in_flight_tokens > limits.max_in_flight_tokens:
        assert len(model.in_flight) == 1, "token limit exceeded by more than one request"
    assert len(bulk) <= limits.max_in_flight - limits.reserved_realtime, "reservation used"
    bulk_token_cap = int(
        limits.max_in_flight_tokens
        * (limits.max_in_flight - limits.reserved_realtime)
        / limits.max_in_flight
    )
    if sum(r.est_tokens for r in bulk) > max(1, bulk_token_cap):
        assert len(bulk) == 1, "bulk token share exceeded by more than one request"
    # Queues match the model and respect max_queued; nobody waits while there is room.
    for tier in TIERS:
        assert len(model.queued[tier]) <= limits.max_queued
        assert s.queued(tier) == len(model.queued[tier]) + len(model.waiting[tier])
        if model.waiting[tier]:
            assert len(model.queued[tier]) == limits.max_queued, "a caller waits with room free"
    # Deadlines fire: nothing past its deadline is still waiting, queued or flying.
    for tier in TIERS:
        for request in model.queued[tier] + model.waiting[tier]:
            assert request.deadline is None or request.deadline > now, "deadline did not fire"
    for request in model.in_flight:
        if model.ended[id(request)] == "dispatched":
            assert request.deadline is None or request.deadline > now, "in-flight deadline missed"
    # The wake-up time never lets a deadline or a batch timer slip.
    if poll.next_wakeup is not None:
        assert poll.next_wakeup > now
    for tier in TIERS:
        live = model.queued[tier] + model.waiting[tier]
        live += [r for r in model.in_flight if model.ended[id(r)] == "dispatched"]
        for request in live:
            if request.deadline is not None:
                assert poll.next_wakeup is not None
                assert poll.next_wakeup <= request.deadline
        # A tier that still holds a closed batch is waiting for room, and a finished
        # request wakes the driver; otherwise its next batch timer must be covered.
        if not model.ready_groups(tier, now, flush):
            max_wait = model.policies[tier].max_wait
            for group in _groups(model.queued[tier]):
                trigger = group[0].enqueued_at + max_wait
                assert poll.next_wakeup is not None
                assert poll.next_wakeup <= trigger
    # Batches that closed were sent unless there was no room: a tier with a ready
    # batch, free sequence room and nothing in flight (so no token excuse) was served.
    if not s.in_flight:
        for tier in TIERS:
            if model.seq_room(tier) > 0:
                assert not model.ready_groups(tier, now, flush), f"{tier} ready batch not sent"


def _groups(requests: list[Request]) -> list[list[Request]]:
    groups: dict[tuple[object, ...], list[Request]] = {}
    for request in requests:
        groups.setdefault(request.spec.compat_key, []).append(request)
    return list(groups.values())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policies=st.fixed_dictionaries({p: policy_st for p in TIERS}),
    limits=limits_st,
    ops=st.lists(op_st, max_size=80),
)
def test_every_request_ends_exactly_once_within_limits(
    policies: dict[Priority, BatchPolicy], limits: Limits, ops: list[tuple[str, object]]
) -> None:
    s = Scheduler(policies=policies, limits=limits)
    model = Model(policies, limits)
    now = 0.0
    for op, arg in ops:
        if op == "add":
            request = make_request(now, *arg)  # type: ignore[misc]
            tier = request.priority
            full = model.waiting[tier] or len(model.queued[tier]) >= limits.max_queued
            if full and request.seq % 2:  # half the callers would rather not wait
                with pytest.raises(QueueFull):
                    s.add(request, nowait=True)
                continue
            s.add(request, nowait=not full)
            model.add(request)
        elif op == "tick":
            now += arg  # type: ignore[operator]
        elif op == "finish":
            for _ in range(min(int(arg), len(model.in_flight))):  # type: ignore[call-overload]
                s.finish(model.in_flight.pop(0))
        else:  # a caller went away: its request leaves the queue at once
            waiting = [r for t in TIERS for r in model.queued[t] + model.waiting[t]]
            if waiting:
                victim = waiting[int(arg) % len(waiting)]  # type: ignore[call-overload]
                assert s.remove(victim)
                assert not s.remove(victim)
                tier = victim.priority
                where = model.waiting[tier] if victim in model.waiting[tier] else model.queued[tier]
                where.remove(victim)
                model.ended[id(victim)] = "removed"
            elif model.in_flight:
                assert not s.remove(model.in_flight[0])  # dispatched: not in a queue
        check_poll(s, model, s.poll(now), now, flush=False)
    # Shutdown drain: flushing sends or expires everything still queued.
    for _ in range(1000):
        if s.idle:
            break
        while model.in_flight:
            s.finish(model.in_flight.pop())
        check_poll(s, model, s.poll(now, flush=True), now, flush=True)
        now += 0.25
    assert s.idle
    assert set(model.ended) == {id(r) for r in model.added}, "a request never ended"


@settings(max_examples=150, deadline=None)
@given(
    policies=st.fixed_dictionaries({p: policy_st for p in TIERS}),
    seqs=st.integers(1, 8),
    reserved=st.integers(0, 7),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.sampled_from(TIERS), st.sampled_from([None, 0.5])),
            st.tuples(st.just("tick"), st.floats(0.0, 0.3), st.none()),
            st.tuples(st.just("finish"), st.integers(0, 4), st.none()),
        ),
        max_size=80,
    ),
)
def test_tiers_go_in_order_when_no_share_is_owed(
    policies: dict[Priority, BatchPolicy],
    seqs: int,
    reserved: int,
    ops: list[tuple[str, object, object]],
) -> None:
    """With no minimum shares, a lower tier is served only when every higher tier
    has no closed batch or no room (token room is ample here, so seats decide)."""
    limits = Limits(
        max_in_flight=seqs,
        reserved_realtime=min(reserved, seqs - 1),
        max_in_flight_tokens=10**9,
        min_share={},
        max_queued=1000,
    )
    policies = {
        p: BatchPolicy(
            max_batch_size=pol.max_batch_size,
            max_wait=pol.max_wait,
            max_batch_tokens=10**6,
            send_when_idle=pol.send_when_idle,
        )
        for p, pol in policies.items()
    }
    s = Scheduler(policies=policies, limits=limits)
    model = Model(policies, limits)
    now = 0.0
    for op, a, b in ops:
        if op == "add":
            request = make_request(now, a, temperature=b)  # type: ignore[arg-type]
            s.add(request)
            model.add(request)
        elif op == "tick":
            now += a  # type: ignore[operator]
        else:
            for _ in range(min(int(a), len(model.in_flight))):  # type: ignore[call-overload]
                s.finish(model.in_flight.pop(0))
        poll = s.poll(now)
        ranks = [batch.priority.rank for batch in poll.batches]
        assert ranks == sorted(ranks), f"tiers out of order within one poll: {ranks}"
        check_poll(s, model, poll, now, flush=False)
        for served in {batch.priority for batch in poll.batches}:
            for higher in TIERS[: served.rank]:
                assert model.seq_room(higher) == 0 or not model.ready_groups(
                    higher, now, flush=False
                ), f"{served} served while {higher} had a closed batch and room"


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.fixed_dictionaries({p: st.integers(1, 16) for p in TIERS}),
    seqs=st.integers(1, 48),
    normal_share=st.floats(0.05, 0.4),
    batch_share=st.floats(0.05, 0.3),
    finish_all=st.booleans(),
)
def test_minimum_shares_hold_under_saturation(
    sizes: dict[Priority, int],
    seqs: int,
    normal_share: float,
    batch_share: float,
    finish_all: bool,
) -> None:
    """All three tiers always have closed batches: normal and batch each get their
    minimum share of the dispatched sequences, and realtime keeps the rest (a lower
    tier is not handed much more than it is owed)."""
    limits = Limits(
        max_in_flight=seqs,
        reserved_realtime=0,
        max_in_flight_tokens=10**9,
        min_share={NORMAL: normal_share, BULK: batch_share},
        max_queued=10_000,
    )
    policies = {p: BatchPolicy(max_batch_size=sizes[p], max_wait=0.0) for p in TIERS}
    s = Scheduler(policies=policies, limits=limits)
    served: Counter[Priority] = Counter()
    in_flight: list[Request] = []
    step = 0
    while sum(served.values()) < 150 * max(sizes.values()):
        now = float(step)
        for tier in TIERS:
            # Enough queued that any tier alone could fill every free seat.
            while s.queued(tier) < seqs + 2 * sizes[tier]:
                s.add(make_request(now, tier))
        for batch in s.poll(now).batches:
            served[batch.priority] += len(batch.requests)
            in_flight.extend(batch.requests)
        # Free all seats, or only the oldest batch's worth (a server finishing
        # requests one by one).
        for _ in range(len(in_flight) if finish_all else min(len(in_flight), 1)):
            s.finish(in_flight.pop(0))
        step += 1
    total = sum(served.values())
    # One batch of any tier may be in transit either way when the run stops.
    slack = 2 * max(sizes.values())
    shares = {NORMAL: normal_share, BULK: batch_share}
    for tier, share in shares.items():
        assert served[tier] >= share * total - slack, (tier, dict(served))
    realtime_share = 1.0 - normal_share - batch_share
    assert served[RT] >= realtime_share * total - 2 * slack, dict(served)


def test_default_shares_with_default_batch_sizes() -> None:
    """The shipped defaults (realtime 8, normal 16, batch 64 per batch; shares 0.2 and
    0.1): with every tier saturated, realtime keeps the majority of the seats."""
    s = Scheduler(limits=Limits(reserved_realtime=0, max_in_flight=64))
    served: Counter[Priority] = Counter()
    for step in range(1500):
        for tier in TIERS:
            while s.queued(tier) < 128:
                s.add(make_request(float(step), tier))
        batches = s.poll(float(step), flush=True).batches
        for batch in batches:
            served[batch.priority] += len(batch.requests)
            for request in batch.requests:
                s.finish(request)
    total = sum(served.values())
    assert served[NORMAL] / total >= 0.2 - 0.01
    assert served[BULK] / total >= 0.1 - 0.01
    assert served[RT] / total >= 0.7 - 0.02, {p.value: n / total for p, n in served.items()}


@settings(max_examples=150, deadline=None)
@given(
    seqs=st.integers(2, 64),
    reserved=st.integers(1, 16),
    slo=st.sampled_from([SLO(tpot=0.05), SLO(ttft=0.2), SLO(ttft=0.2, tpot=0.05)]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("bulk"), st.integers(1, 40)),
            st.tuples(st.just("sample"), st.floats(0.001, 1.0)),
            st.tuples(st.just("overload"), st.just(0)),
            st.tuples(st.just("finish"), st.integers(0, 30)),
            st.tuples(st.just("realtime"), st.just(0)),
        ),
        max_size=120,
    ),
)
def test_with_an_slo_realtime_is_never_kept_waiting_and_limits_hold(
    seqs: int, reserved: int, slo: SLO, ops: list[tuple[str, float]]
) -> None:
    """The controller sets the bulk limit from whatever the server reports; whatever
    it decides, bulk work stays within it and the ceiling, and a realtime request
    arriving while the server is up and no other realtime runs goes at once."""
    limits = Limits(
        max_in_flight=seqs, reserved_realtime=min(reserved, seqs - 1), max_queued=10_000
    )
    controller = AdmissionController(
        ceiling=seqs, max_reserve=limits.reserved_realtime, slo=slo, interval=0.0
    )
    policies = {p: BatchPolicy(max_batch_size=4, max_wait=0.0) for p in TIERS}
    s = Scheduler(policies=policies, limits=limits)
    s.set_bulk_limit(controller.limit)
    in_flight: list[Request] = []
    served: Counter[Priority] = Counter()
    now = 0.0
    for op, value in ops:
        now += 0.1
        if op == "bulk":
            for i in range(int(value)):
                s.add(make_request(now, NORMAL if i % 3 else BULK))
        elif op == "sample":
            controller.on_step_time(value)
            controller.on_ttft(value)
        elif op == "overload":
            controller.on_overload()
        elif op == "finish":
            for _ in range(min(int(value), len(in_flight))):
                s.finish(in_flight.pop(0))
        controller.on_blocked()
        controller.on_realtime_in_flight(now, s.in_flight_by_tier[RT])
        controller.update(now)
        s.set_bulk_limit(controller.limit)
        realtime = make_request(now, RT) if op == "realtime" else None
        rt_before = s.in_flight_by_tier[RT]
        if realtime is not None:
            s.add(realtime)
        poll = s.poll(now)
        for batch in poll.batches:
            served[batch.priority] += len(batch.requests)
            in_flight.extend(batch.requests)
        bulk = sum(1 for r in in_flight if r.priority is not RT)
        bulk_sent = sum(len(b.requests) for b in poll.batches if b.priority is not RT)
        assert 1 <= controller.limit <= seqs
        # Within the limit, unless it just shrank below what was already in flight (then
        # nothing more went).
        assert bulk <= controller.limit or bulk_sent == 0
        assert len(in_flight) <= seqs
        if realtime is not None and rt_before == 0:
            # The reserve (at least one seat) held a seat: the realtime request went in
            # this very poll. (A burst beyond the reserve in place when bulk was sent
            # waits for the next free seat: running work is never evicted.)
            assert realtime in in_flight, "realtime kept waiting while the server was up"


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 12), st.booleans()),
            st.tuples(st.just("poll"), st.just(0), st.just(False)),
            st.tuples(st.just("requeue"), st.integers(1, 8), st.just(False)),
            st.tuples(st.just("isolate"), st.just(0), st.just(False)),
            st.tuples(st.just("finish"), st.integers(1, 8), st.just(False)),
        ),
        max_size=80,
    ),
)
def test_requeued_and_isolated_requests_are_sent_exactly_once_in_order(
    ops: list[tuple[str, int, bool]],
) -> None:
    """A batch that met an outage comes back at the head of its queue in its order;
    once isolation is on, a request that might not fit is sent alone; every request
    is sent and finished exactly once in the end."""
    limits = Limits(max_in_flight=8, reserved_realtime=0, max_queued=1000)
    s = Scheduler(
        policies={p: BatchPolicy(max_batch_size=4, max_wait=0.0) for p in TIERS}, limits=limits
    )
    added: list[Request] = []
    in_flight: list[Request] = []
    finished: Counter[int] = Counter()
    isolated = False
    now = 0.0

    def poll() -> None:
        for batch in s.poll(now).batches:
            if isolated:
                risky = [r for r in batch.requests if r.might_not_fit]
                assert not risky or len(batch.requests) == 1, "a risky prompt shared a batch"
            in_flight.extend(batch.requests)

    for op, count, risky in ops:
        now += 0.1
        if op == "add":
            for _ in range(count):
                request = make_request(now, NORMAL)
                request.might_not_fit = risky
                s.add(request)
                added.append(request)
        elif op == "requeue":
            batch, in_flight[:] = in_flight[:count], in_flight[count:]
            s.requeue(batch)
            for request in batch:
                assert request.state == State.QUEUED
        elif op == "isolate":
            isolated = True
            s.isolate_risky()
        elif op == "finish":
            for request in in_flight[:count]:
                s.finish(request)
                finished[request.seq] += 1
            del in_flight[:count]
        poll()
    for _ in range(1000):  # drain
        if s.idle:
            break
        for request in in_flight:
            s.finish(request)
            finished[request.seq] += 1
        in_flight.clear()
        poll()
    assert s.idle
    assert finished == Counter(r.seq for r in added), "a request was lost or sent twice"
