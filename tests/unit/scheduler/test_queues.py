"""The tier queues on their own: grouping, lazy removal, requeue order, isolation."""

from __future__ import annotations

from factories import make_request as make

from llmbatch import BatchPolicy
from llmbatch._calls.request import State
from llmbatch._scheduler.queues import TierQueue

POLICY = BatchPolicy(max_batch_size=3, max_wait=1.0, max_batch_tokens=10_000, send_when_idle=True)


def test_compatible_requests_share_a_group_in_arrival_order() -> None:
    tier = TierQueue(POLICY)
    a, b, other = make(prompt="a"), make(prompt="b"), make(temperature=0.5)
    for request in (a, b, other):
        tier.enqueue(request, 0.0)
    assert len(tier.groups) == 2
    first = next(iter(tier.groups.values()))
    assert list(first.items) == [a, b]
    assert (first.live, tier.size) == (2, 3)
    assert first.tokens == a.est_tokens + b.est_tokens
    assert a.state is State.QUEUED


def test_unqueue_is_lazy_and_pop_skips_what_left() -> None:
    tier = TierQueue(POLICY)
    a, b = make(prompt="a"), make(prompt="b")
    tier.enqueue(a, 0.0)
    group = tier.enqueue(b, 0.0)
    tier.unqueue(a)
    assert a.state is State.FINISHED
    assert (group.live, tier.size) == (1, 1)
    assert list(group.items) == [a, b]  # still there, skipped at the head
    assert tier.pop(group) is b
    assert not tier.groups  # an empty group is dropped


def test_requeued_requests_go_back_to_the_head_in_their_order() -> None:
    tier = TierQueue(POLICY)
    late = make(prompt="late")
    tier.enqueue(late, 5.0)
    a, b = make(prompt="a"), make(prompt="b")
    a.enqueued_at = b.enqueued_at = 1.0
    tier.requeue([a, b])
    group = next(iter(tier.groups.values()))
    assert list(group.items) == [a, b, late]
    assert group.head().enqueued_at == 1.0  # its batch timer runs from its first arrival


def test_a_requeued_group_of_its_own_goes_first() -> None:
    tier = TierQueue(POLICY)
    tier.enqueue(make(prompt="x"), 0.0)
    hot = make(temperature=0.9)
    tier.requeue([hot])
    assert next(iter(tier.groups.values())).head() is hot


def test_triggers_size_wait_and_idle() -> None:
    tier = TierQueue(BatchPolicy(max_batch_size=3, max_wait=1.0, send_when_idle=False))
    tier.enqueue(make(), 0.0)
    tier.enqueue(make(), 0.0)
    assert next(tier.ready_groups(0.5, flush=False, idle=False), None) is None
    assert next(tier.ready_groups(0.5, flush=True, idle=False), None) is not None
    assert (
        next(tier.ready_groups(1.0, flush=False, idle=False), None) is not None
    )  # waited max_wait
    assert tier.next_trigger() == 1.0
    tier.enqueue(make(), 0.0)
    assert next(tier.ready_groups(0.0, flush=False, idle=False), None) is not None  # full


def test_isolation_moves_only_what_might_not_fit_into_groups_of_its_own() -> None:
    tier = TierQueue(POLICY)
    safe, risky = make(prompt="short"), make(prompt="long")
    risky.might_not_fit = True
    tier.enqueue(safe, 0.0)
    tier.enqueue(risky, 0.0)
    tier.isolate()
    assert len(tier.groups) == 2
    assert {g.live for g in tier.groups.values()} == {1}
    assert tier.size == 2
