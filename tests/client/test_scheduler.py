"""The DynamicBatcher's rules, on explicit time: no sleeps, exact triggers."""

from __future__ import annotations

from collections import Counter

import pytest

from llmbatch import BatchPolicy, Limits, Priority, QueueFull
from llmbatch._request import Request, validate
from llmbatch._scheduler import Scheduler

RT, NORMAL, BULK = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def make(
    priority: Priority = NORMAL,
    *,
    at: float = 0.0,
    prompt: str = "hello",
    max_tokens: int = 10,
    deadline: float | None = None,
    temperature: float | None = None,
) -> Request:
    spec = validate(
        kind="completion",
        priority=priority,
        model="m",
        prompt=prompt,
        params={"max_tokens": max_tokens, "temperature": temperature},
        timeout=None,
        stream=False,
        max_model_len=None,
    )
    request = Request(spec, created_at=at, deadline=deadline)
    request.enqueued_at = at
    return request


def scheduler(policy: BatchPolicy | None = None, **limits: object) -> Scheduler:
    policy = policy or BatchPolicy(max_batch_size=4, max_wait=1.0, max_batch_tokens=10_000)
    return Scheduler(policies={p: policy for p in Priority}, limits=Limits(**limits))  # type: ignore[arg-type]


def test_batch_closes_on_size_before_wait() -> None:
    s = scheduler()
    for _ in range(3):
        s.add(make())
    assert s.poll(0.5).batches == []
    s.add(make(at=0.5))
    (batch,) = s.poll(0.5).batches
    assert len(batch.requests) == 4


def test_batch_closes_on_max_wait_from_first_item() -> None:
    s = scheduler()
    s.add(make(at=0.0))
    s.add(make(at=0.9))
    poll = s.poll(0.99)
    assert poll.batches == []
    assert poll.next_wakeup == pytest.approx(1.0)
    (batch,) = s.poll(1.0).batches
    assert len(batch.requests) == 2


def test_batch_closes_on_token_budget() -> None:
    # Each request: ~2 prompt tokens + 100 max_tokens = 102 estimated tokens.
    s = scheduler(BatchPolicy(max_batch_size=100, max_wait=10.0, max_batch_tokens=250))
    s.add(make(max_tokens=100))
    s.add(make(max_tokens=100))
    assert s.poll(0.0).batches == []
    s.add(make(max_tokens=100))
    batches = s.poll(0.0).batches
    # The budget closes the group; the batch holds only what fits in 250 tokens.
    assert [len(b.requests) for b in batches] == [2]
    assert batches[0].tokens <= 250


def test_zero_wait_dispatches_at_once_and_coalesces_what_waits() -> None:
    s = scheduler(BatchPolicy(max_batch_size=8, max_wait=0.0))
    for _ in range(3):
        s.add(make(RT))
    (batch,) = s.poll(0.0).batches
    assert len(batch.requests) == 3


def test_only_compatible_requests_share_a_batch() -> None:
    s = scheduler(BatchPolicy(max_batch_size=8, max_wait=0.0))
    s.add(make(temperature=0.0))
    s.add(make(temperature=0.7))
    s.add(make(temperature=0.0))
    batches = s.poll(0.0).batches
    assert sorted(len(b.requests) for b in batches) == [1, 2]
    for batch in batches:
        assert len({r.spec.compat_key for r in batch.requests}) == 1


def test_tiers_dispatch_in_order() -> None:
    s = scheduler(BatchPolicy(max_batch_size=1, max_wait=0.0))
    s.add(make(BULK))
    s.add(make(NORMAL))
    s.add(make(RT))
    order = [b.priority for b in s.poll(0.0).batches]
    assert order == [RT, NORMAL, BULK]


def test_in_flight_limit_and_realtime_reserve() -> None:
    s = scheduler(BatchPolicy(max_batch_size=1, max_wait=0.0), max_in_flight=4, reserved_realtime=1)
    bulk = [make(BULK) for _ in range(10)]
    for r in bulk:
        s.add(r)
    sent = s.poll(0.0).batches
    assert len(sent) == 3  # one slot stays reserved for realtime
    s.add(make(RT))
    (rt,) = s.poll(0.0).batches
    assert rt.priority is RT
    assert s.in_flight == 4
    assert s.poll(0.0).batches == []  # full
    s.finish(sent[0].requests[0])
    (again,) = s.poll(0.0).batches
    assert again.priority is BULK


def test_in_flight_token_limit() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=1, max_wait=0.0), max_in_flight_tokens=300, reserved_realtime=0
    )
    for _ in range(5):
        s.add(make(max_tokens=100))
    assert len(s.poll(0.0).batches) == 2  # 2 x 102 fits, a third would not
    assert s.in_flight_tokens <= 300


def test_oversize_request_goes_alone_only_when_idle() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=4, max_wait=0.0), max_in_flight_tokens=50, reserved_realtime=0
    )
    big = make(max_tokens=500)
    s.add(big)
    (batch,) = s.poll(0.0).batches
    assert batch.requests == (big,)
    s.add(make(max_tokens=500))
    assert s.poll(0.0).batches == []  # must wait until the first leaves
    s.finish(big)
    assert len(s.poll(0.0).batches) == 1


def test_no_starvation_under_sustained_realtime_load() -> None:
    """Realtime always has ready work; normal and batch still get their min share."""
    s = scheduler(BatchPolicy(max_batch_size=1, max_wait=0.0), max_in_flight=1, reserved_realtime=0)
    for _ in range(1000):
        s.add(make(NORMAL))
        s.add(make(BULK))
    served: Counter[Priority] = Counter()
    for step in range(1000):
        s.add(make(RT, at=float(step)))
        (batch,) = s.poll(float(step)).batches
        served[batch.priority] += 1
        s.finish(batch.requests[0])
    assert served[NORMAL] >= 0.2 * 1000 * 0.9
    assert served[BULK] >= 0.1 * 1000 * 0.9
    assert served[RT] >= 0.6 * 1000


def test_realtime_first_when_lower_tiers_are_not_owed() -> None:
    s = scheduler(BatchPolicy(max_batch_size=1, max_wait=0.0), max_in_flight=1, reserved_realtime=0)
    s.add(make(BULK))
    s.add(make(RT))
    (batch,) = s.poll(0.0).batches
    assert batch.priority is RT


def test_deadline_expires_queued_request() -> None:
    s = scheduler()
    doomed = make(deadline=0.5)
    s.add(doomed)
    s.add(make())
    poll = s.poll(0.4)
    assert poll.expired == []
    assert poll.next_wakeup == pytest.approx(0.5)
    poll = s.poll(0.5)
    assert poll.expired == [doomed]
    assert s.queued(NORMAL) == 1


def test_remove_takes_a_cancelled_request_out_at_once() -> None:
    s = scheduler()
    a, b = make(), make()
    s.add(a)
    s.add(b)
    assert s.remove(a)
    assert not s.remove(a)
    (batch,) = s.poll(5.0).batches
    assert batch.requests == (b,)
    assert s.idle is False
    s.finish(b)
    assert s.idle


def test_full_queue_raises_queue_full() -> None:
    s = scheduler(max_queued=2)
    s.add(make())
    s.add(make())
    assert not s.has_room(NORMAL)
    with pytest.raises(QueueFull):
        s.add(make())
    assert s.has_room(RT)  # tiers have their own queues


def test_flush_sends_everything_regardless_of_triggers() -> None:
    s = scheduler()
    s.add(make())
    assert s.poll(0.0).batches == []
    assert len(s.poll(0.0, flush=True).batches) == 1


def test_request_too_big_for_the_free_token_room_waits_without_spinning() -> None:
    # Regression: poll() looped forever when a ready tier's next request did not fit
    # the free token room while another request was in flight.
    s = scheduler(max_in_flight=6, max_in_flight_tokens=600, reserved_realtime=2)
    for _ in range(3):
        s.add(make(BULK, max_tokens=150))
    (first,) = s.poll(0.0, flush=True).batches
    assert len(first.requests) == 2  # the bulk token cap (400) holds two
    s.add(make(NORMAL, max_tokens=150, temperature=0.5))
    assert s.poll(0.0, flush=True).batches == []
    for request in first.requests:
        s.finish(request)
    assert len(s.poll(0.0, flush=True).batches) == 2
