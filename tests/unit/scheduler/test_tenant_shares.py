"""Tenants in the pure scheduler: fair shares by tokens served (weighted), batches that
mix tenants, and each tenant's limits (held, refused, released)."""

from __future__ import annotations

from collections import Counter

import pytest
from factories import make_request
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch import (
    BatchPolicy,
    InvalidRequestError,
    Limits,
    Priority,
    QueueFull,
    TenantLimits,
    TenantQuotaExceeded,
)
from llmbatch._calls.request import Request, State
from llmbatch._scheduler import Scheduler
from llmbatch._scheduler.tenants import FORGET_AFTER

BULK = Priority.BATCH
READY = BatchPolicy(max_batch_size=4, max_wait=0.0, send_when_idle=True)


def scheduler(
    max_in_flight: int = 64,
    tenants: dict[str, TenantLimits] | None = None,
    policy: BatchPolicy = READY,
) -> Scheduler:
    return Scheduler(
        policies={p: policy for p in Priority},
        limits=Limits(max_in_flight=max_in_flight, reserved_realtime=0, max_queued=100_000),
        tenants=tenants,
    )


def req(
    tenant: str | None, *, at: float = 0.0, max_tokens: int = 10, mixed: bool = False
) -> Request:
    """A batch-tier request of ``tenant``; ``mixed``: the tenant is not sent as
    ``user``, so tenants with the same parameters share a family."""
    return make_request(BULK, at=at, max_tokens=max_tokens, tenant=tenant, tenant_as_user=not mixed)


def drain(s: Scheduler, now: float) -> list[Request]:
    """One poll's requests, finished at once."""
    sent: list[Request] = []
    for batch in s.poll(now).batches:
        sent.extend(batch.requests)
        s.finish_batch(batch.requests, batch.priority, batch.replica)
    return sent


# -- fair shares -----------------------------------------------------------------------


def test_a_batch_mixes_tenants_whose_calls_are_otherwise_alike() -> None:
    s = scheduler()
    for tenant in ("a", "b", "c"):
        s.add(req(tenant, mixed=True))
    (batch,) = s.poll(0.0).batches
    assert sorted(r.spec.tenant for r in batch.requests) == ["a", "b", "c"]


def test_tenants_sent_as_user_batch_apart() -> None:
    """One HTTP request carries one ``user``: tenants sent as users never share one."""
    s = scheduler()
    for tenant in ("a", "b", "c"):
        s.add(req(tenant))
    batches = s.poll(0.0).batches
    assert sorted(len(b.requests) for b in batches) == [1, 1, 1]
    assert [r.spec.params["user"] for b in batches for r in b.requests] == ["a", "b", "c"]


@pytest.mark.parametrize("mixed", [True, False])
def test_a_late_tenant_gets_half_the_tier_at_once(mixed: bool) -> None:
    """A has 2,000 queued; B arrives after A's first 100 and gets every other place
    (equal weights), whether they share batches or not."""
    s = scheduler(max_in_flight=4)
    for _i in range(2000):
        s.add(req("a", at=0.0, mixed=mixed))
    sent: list[Request] = []
    now = 0.0
    while len(sent) < 100:
        now += 1
        sent += drain(s, now)
    for _i in range(100):
        s.add(req("b", at=now, mixed=mixed))
    after: list[Request] = []
    while sum(r.spec.tenant == "b" for r in after) < 100:
        now += 1
        after += drain(s, now)
    # B's 100 took about 200 places (half the tier), not 2,000 (behind A).
    assert len(after) <= 200 + 8


def test_weights_split_the_tier_by_tokens() -> None:
    s = scheduler(max_in_flight=8, tenants={"gold": TenantLimits(weight=3.0)})
    for _i in range(4000):
        s.add(req("gold", mixed=True))
        s.add(req("free", mixed=True))
    served: Counter[str | None] = Counter()
    for step in range(200):
        for r in drain(s, float(step)):
            served[r.spec.tenant] += r.est_tokens
    share = served["gold"] / (served["gold"] + served["free"])
    assert share == pytest.approx(0.75, abs=0.02)


def test_a_tenant_back_from_idle_gets_no_credit_for_its_idle_time() -> None:
    """B was served early, then idle while A was served 1,000 requests; back, B gets
    half the tier, not all of it until it has caught up."""
    s = scheduler(max_in_flight=4)
    for _i in range(8):
        s.add(req("b", mixed=True))
    drain(s, 0.0), drain(s, 1.0)
    for _i in range(3000):
        s.add(req("a", mixed=True))
    now = 1.0
    for _ in range(250):
        now += 1
        drain(s, now)
    for _i in range(400):
        s.add(req("b", at=now, mixed=True))
    window: Counter[str | None] = Counter()
    for _ in range(50):
        now += 1
        for r in drain(s, now):
            window[r.spec.tenant] += 1
    assert abs(window["a"] - window["b"]) <= 4, window


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=2, max_size=4),
    max_tokens=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    mixed=st.booleans(),
    seats=st.integers(1, 16),
)
def test_backlogged_tenants_stay_within_a_bound_of_their_weighted_share(
    weights: list[float], max_tokens: list[int], mixed: bool, seats: int
) -> None:
    """Every tenant has a backlog (of its own request size); after every poll while
    all still have one, the tokens each has been sent, over its weight, differ
    between any two by at most one batch of the largest request, plus one request
    (VTC's bound, with batches)."""
    names = [f"t{i}" for i in range(len(weights))]
    s = scheduler(
        max_in_flight=seats,
        tenants={n: TenantLimits(weight=w) for n, w in zip(names, weights, strict=True)},
    )
    backlog = 200
    for _ in range(backlog):
        for n, mt in zip(names, max_tokens, strict=False):
            s.add(req(n, max_tokens=mt, mixed=mixed))
    largest = max(make_request(max_tokens=mt).est_tokens for mt in max_tokens)
    bound = READY.max_batch_size * largest / min(weights) + largest
    served: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    step = 0
    while all(sent[n] < backlog - READY.max_batch_size * seats for n in names):
        step += 1
        for r in drain(s, float(step)):
            assert r.spec.tenant is not None
            served[r.spec.tenant] += r.est_tokens
            sent[r.spec.tenant] += 1
        virtual = [served[n] / w for n, w in zip(names, weights, strict=True)]
        assert max(virtual) - min(virtual) <= bound, (virtual, bound)
    assert step > 2


def test_without_tenants_groups_keep_their_turn_order() -> None:
    s = scheduler(max_in_flight=4)
    for _i in range(8):
        s.add(make_request(BULK, max_tokens=4))
        s.add(make_request(BULK, max_tokens=5))
    batches = s.poll(0.0, flush=True).batches
    assert [b.requests[0].spec.max_tokens for b in batches][:1] == [4]


# -- limits ----------------------------------------------------------------------------


def test_a_tenant_never_holds_more_than_its_max_in_flight() -> None:
    s = scheduler(tenants={"agent": TenantLimits(max_in_flight=2)})
    requests = [req("agent") for _ in range(7)]
    for r in requests:
        s.add(r)
    held = [r for r in requests if r.state == State.HELD]
    assert len(held) == 5
    assert s.queued(BULK) == 7
    done: list[Request] = []
    for step in range(10):
        batches = s.poll(float(step)).batches
        out = [r for b in batches for r in b.requests]
        assert len(out) <= 2
        for b in batches:
            s.finish_batch(b.requests, b.priority, b.replica)
        done += out
    assert done == requests  # each once, in order
    assert s.idle


def test_overflow_raise_refuses_at_once_naming_the_tenant() -> None:
    s = scheduler(tenants={"agent": TenantLimits(max_in_flight=1, overflow="raise")})
    s.add(req("agent"))
    with pytest.raises(TenantQuotaExceeded) as caught:
        s.add(req("agent"))
    error = caught.value
    assert isinstance(error, QueueFull)
    assert (error.tenant, error.limit, error.allowed, error.held) == (
        "agent",
        "max_in_flight",
        1,
        1,
    )
    assert "agent" in str(error)
    # A map's items wait instead.
    waiting = req("agent")
    s.add(waiting, must_wait=True)
    assert waiting.state == State.HELD


def test_nowait_raises_for_a_tenant_that_would_wait() -> None:
    s = scheduler(tenants={"*": TenantLimits(max_in_flight_tokens=40)})
    first = req("x", max_tokens=20)
    s.add(first)
    with pytest.raises(TenantQuotaExceeded) as caught:
        s.add(req("x", max_tokens=20), nowait=True)
    assert caught.value.limit == "max_in_flight_tokens"
    assert caught.value.held == first.est_tokens
    s.add(req("y", max_tokens=20), nowait=True)  # another tenant has its own quota


def test_star_applies_to_named_tenants_never_to_calls_without_one() -> None:
    s = scheduler(tenants={"*": TenantLimits(max_in_flight=1)})
    plain = [make_request(BULK) for _ in range(5)]
    for r in plain:
        s.add(r)
    assert not any(r.state == State.HELD for r in plain)
    named = [req("n") for _ in range(3)]
    for r in named:
        s.add(r)
    assert [r.state == State.HELD for r in named] == [False, True, True]


def test_a_request_larger_than_the_whole_quota_fails_at_once() -> None:
    s = scheduler(tenants={"small": TenantLimits(max_in_flight_tokens=30)})
    with pytest.raises(InvalidRequestError) as caught:
        s.tenants.check_size(req("small", max_tokens=100))
    assert caught.value.field == "max_tokens"
    s.tenants.check_size(req("small", max_tokens=10))
    s.tenants.check_size(req("other", max_tokens=100))


def test_requests_per_minute_pace_a_tenant() -> None:
    s = scheduler(tenants={"slow": TenantLimits(requests_per_minute=60)})
    for _ in range(5):
        s.add(req("slow"))
    sent = [len(drain(s, t / 2)) for t in range(10)]  # every half second
    assert sum(sent) == 5
    assert max(sent) == 1
    assert sent[:4] == [1, 0, 1, 0]
    assert s.poll(10.0).next_wakeup is None


def test_a_held_request_can_be_cancelled_or_expire() -> None:
    s = scheduler(tenants={"t": TenantLimits(max_in_flight=1)})
    first, second, third = req("t"), req("t"), req("t")
    for r in (first, second, third):
        s.add(r)
    assert s.remove(second)
    assert second.state == State.FINISHED
    out = drain(s, 0.0) + drain(s, 1.0) + drain(s, 2.0)
    assert out == [first, third]
    expiring = make_request(BULK, tenant="t", timeout=1.0, at=3.0)
    blocker = req("t", at=3.0)
    s.add(blocker)
    s.add(expiring)
    assert s.poll(3.0).batches
    assert s.poll(4.5).expired == [expiring]


def test_an_outage_requeues_without_losing_the_tenant_count() -> None:
    s = scheduler(tenants={"t": TenantLimits(max_in_flight=2)})
    requests = [req("t") for _ in range(3)]
    for r in requests:
        s.add(r)
    (batch,) = s.poll(0.0).batches
    s.requeue(batch.requests)
    assert s.tenants.tenants["t"].admitted == 2
    (again,) = s.poll(1.0).batches
    assert list(again.requests) == requests[:2]


def test_idle_tenants_are_forgotten() -> None:
    s = scheduler(tenants={"*": TenantLimits(max_in_flight=4)})
    for i in range(1000):
        s.add(req(f"conversation-{i}", mixed=True))
    now = 0.0
    while not s.idle:
        now += 1
        drain(s, now)
    assert len(s.tenants.tenants) >= 1000
    s.poll(now + FORGET_AFTER + 1)
    s.poll(now + 2 * FORGET_AFTER + 2)
    assert len(s.tenants.tenants) == 0


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "add", "cancel", "poll", "finish"]),
            st.sampled_from(["a", "b", "c", None]),
            st.integers(1, 30),
            st.booleans(),
        ),
        min_size=1,
        max_size=120,
    ),
    seats=st.integers(1, 8),
)
def test_limited_tenants_lose_nothing_and_never_exceed_their_limits(
    ops: list[tuple[str, str | None, int, bool]], seats: int
) -> None:
    """Adds (some mixing, some not), cancellations, polls and finishes in any order:
    each request ends once (sent or cancelled), a limited tenant never holds more
    than its limits queued and in flight, and a flush sends everything left."""
    limits = {
        "a": TenantLimits(max_in_flight=2),
        "b": TenantLimits(max_in_flight_tokens=60, weight=2.0),
        "c": TenantLimits(max_in_flight=1, tokens_per_minute=6000),
    }
    s = scheduler(max_in_flight=seats, tenants=limits)
    live: list[Request] = []
    in_flight: list[Request] = []
    ended: Counter[int] = Counter()
    now = 0.0

    def check() -> None:
        counts = s.tenants.counts()
        for name in ("a", "b", "c"):
            queued = sum(r.spec.tenant == name for r in live)
            flying = sum(r.spec.tenant == name for r in in_flight)
            assert counts.get(name, (0, 0)) == (queued, flying)
        for name, tenant_limits in limits.items():
            mine = [r for r in live + in_flight if r.spec.tenant == name]
            holding = [r for r in mine if r.state in (State.QUEUED, State.IN_FLIGHT)]
            if tenant_limits.max_in_flight is not None:
                assert len(holding) <= tenant_limits.max_in_flight
            if tenant_limits.max_in_flight_tokens is not None and len(holding) > 1:
                assert sum(r.est_tokens for r in holding) <= tenant_limits.max_in_flight_tokens

    def poll(flush: bool = False) -> None:
        for batch in s.poll(now, flush=flush).batches:
            for r in batch.requests:
                live.remove(r)
                in_flight.append(r)
                ended[r.seq] += 1

    for op, tenant, max_tokens, mixed in ops:
        now += 0.25
        if op == "add":
            r = req(tenant, at=now, max_tokens=max_tokens, mixed=mixed)
            if tenant == "b" and r.est_tokens > 60:
                with pytest.raises(InvalidRequestError):
                    s.tenants.check_size(r)
                continue
            s.add(r)
            live.append(r)
        elif op == "cancel" and live:
            r = live.pop(max_tokens % len(live))
            assert s.remove(r)
            ended[r.seq] += 1
        elif op == "poll":
            poll()
        elif op == "finish" and in_flight:
            r = in_flight.pop(0)
            s.finish(r)
        check()
    for _ in range(200):
        if not live:
            break
        now += 1.0
        poll(flush=True)
        while in_flight:
            s.finish(in_flight.pop())
        check()
    while in_flight:
        s.finish(in_flight.pop())
    assert not live
    assert all(n == 1 for n in ended.values())
    assert s.idle
    assert all(t.admitted == 0 for t in s.tenants.tenants.values())


def test_a_tenant_waiting_for_room_is_not_held_behind_anothers_waiting_calls() -> None:
    """The tier's queue is full of A's calls and thousands more of A's wait for room;
    B's calls, arriving later, take the places that free first."""
    s = Scheduler(
        policies={p: READY for p in Priority},
        limits=Limits(max_in_flight=4, reserved_realtime=0, max_queued=50),
    )
    for _ in range(2000):
        s.add(req("a", mixed=True))
    drain(s, 0.0)
    late = [req("b", at=1.0, mixed=True) for _ in range(10)]
    for r in late:
        s.add(r)
    assert all(r.state == State.WAITING for r in late)
    sent: list[Request] = []
    now = 1.0
    while not all(r.state == State.FINISHED for r in late):
        now += 1
        sent += drain(s, now)
    assert len(sent) <= 2 * len(late) + 8  # B took every other place, at least


def test_tiers_stay_above_tenants() -> None:
    """A heavy tenant with a large weight in the batch tier never goes before realtime
    calls without a tenant, and the batch tier still gets its minimum share."""
    s = Scheduler(
        policies={p: READY for p in Priority},
        limits=Limits(max_in_flight=4, reserved_realtime=0, max_queued=100_000),
        tenants={"heavy": TenantLimits(weight=100.0)},
    )
    for _ in range(400):
        s.add(req("heavy", mixed=True))
    for _ in range(400):
        s.add(make_request(Priority.REALTIME))
    served: Counter[Priority] = Counter()
    for step in range(100):
        for r in drain(s, float(step)):
            served[r.priority] += 1
    assert served[Priority.REALTIME] > served[BULK]
    assert served[BULK] >= 0.1 * sum(served.values()) - 8  # batch's minimum share
