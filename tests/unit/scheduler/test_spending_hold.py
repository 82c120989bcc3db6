"""The scheduler's spending hold, on explicit time: a request reserves what it may
cost as it is queued, waits while only reservations stand in its way, goes when
they settle for less, is refused once the spend alone leaves no room; a held
request's caller may leave, and its deadline still holds."""

from __future__ import annotations

import pytest
from factories import make_request

from llmbatch import BatchPolicy, Limits, Priority, SpendingLimitReached
from llmbatch._calls.request import Request, State
from llmbatch._scheduler import Scheduler
from llmbatch._spending.ledger import SpendingLedger, settle

NORMAL = Priority.NORMAL


def scheduler() -> Scheduler:
    policy = BatchPolicy(max_batch_size=8, max_wait=0.0, max_batch_tokens=10_000)
    return Scheduler(policies={p: policy for p in Priority}, limits=Limits())


def make(ledger: SpendingLedger, cost: float, **kw: object) -> Request:
    request = make_request(**kw)  # type: ignore[arg-type]
    request.spending = (ledger,)
    request.est_cost = cost
    return request


def test_a_request_waits_for_reservations_then_goes_when_they_settle_for_less() -> None:
    s, ledger = scheduler(), SpendingLedger(1.0, "client")
    first, second = make(ledger, 0.6), make(ledger, 0.6)
    s.add(first)
    assert first.reserved
    assert ledger.reserved == pytest.approx(0.6)
    s.add(second)
    assert second.state == State.SPENDING
    assert s.queued(NORMAL) == 2
    (batch,) = s.poll(0.0).batches
    assert batch.requests == (first,)  # the held one waits
    s.finish(first)
    assert s.poll(0.1).batches == []  # nothing settled yet: still held
    settle(first, 0.2)
    (batch,) = s.poll(0.2).batches
    assert batch.requests == (second,)
    assert ledger.reserved == pytest.approx(0.6)


def test_once_the_spend_alone_leaves_no_room_the_held_are_refused() -> None:
    s, ledger = scheduler(), SpendingLedger(1.0, "map")
    first, second = make(ledger, 0.6), make(ledger, 0.6)
    s.add(first)
    s.add(second)
    s.poll(0.0)
    s.finish(first)
    settle(first, 0.5)
    poll = s.poll(0.1)
    assert poll.batches == []
    ((refused, error),) = poll.refused
    assert refused is second
    assert isinstance(error, SpendingLimitReached)
    assert (error.scope, error.spent, error.estimate) == ("map", 0.5, 0.6)
    assert s.idle


def test_a_request_no_room_can_take_is_refused_as_it_is_added() -> None:
    s, ledger = scheduler(), SpendingLedger(1.0, "client")
    ledger.spend(0.9)
    with pytest.raises(SpendingLimitReached):
        s.add(make(ledger, 0.2))
    assert s.idle


def test_a_held_requests_caller_may_leave_and_its_deadline_holds() -> None:
    s, ledger = scheduler(), SpendingLedger(1.0, "client")
    blocker = make(ledger, 0.9)
    left, doomed = make(ledger, 0.5), make(ledger, 0.5, timeout=1.0)
    for request in (blocker, left, doomed):
        s.add(request)
    assert s.remove(left)
    assert left.state == State.FINISHED
    assert not left.reserved
    s.poll(0.0)
    poll = s.poll(1.0)
    assert poll.expired == [doomed]
    assert s.queued(NORMAL) == 0
    assert list(s.queued_requests()) == []
