"""The DynamicBatcher's rules, on explicit time: no sleeps, exact triggers."""

from __future__ import annotations

from collections import Counter

import pytest
from factories import make_request as make

from llmbatch import BatchPolicy, Limits, Priority, QueueFull, RateLimit
from llmbatch._calls.request import State
from llmbatch._scheduler import Scheduler
from llmbatch._scheduler.buckets import TokenBucket

RT, NORMAL, BULK = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def scheduler(
    policy: BatchPolicy | None = None, rate_limit: RateLimit | None = None, **limits: object
) -> Scheduler:
    """Triggers tested on their own: idle dispatch is off unless the policy says so."""
    policy = policy or BatchPolicy(
        max_batch_size=4, max_wait=1.0, max_batch_tokens=10_000, send_when_idle=False
    )
    return Scheduler(
        policies={p: policy for p in Priority},
        limits=Limits(**limits),  # type: ignore[arg-type]
        rate_limit=rate_limit,
    )


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
    s = scheduler(
        BatchPolicy(max_batch_size=100, max_wait=10.0, max_batch_tokens=250, send_when_idle=False)
    )
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
    doomed = make(timeout=0.5)
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


def test_full_queue_raises_queue_full_for_nowait_callers() -> None:
    s = scheduler(max_queued=2)
    s.add(make())
    s.add(make())
    with pytest.raises(QueueFull):
        s.add(make(), nowait=True)
    s.add(make(RT), nowait=True)  # tiers have their own queues
    assert s.queued(NORMAL) == 2


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


def test_idle_tier_sends_at_once_then_batches_while_busy() -> None:
    """Like Nagle's algorithm: nothing in flight, no reason to wait; while the tier
    has requests in flight, newcomers wait for company."""
    s = scheduler(BatchPolicy(max_batch_size=4, max_wait=1.0))
    first = make()
    assert s.add(first)
    (batch,) = s.poll(0.0).batches
    assert batch.requests == (first,)
    s.add(make(at=0.1))
    s.add(make(at=0.2))
    poll = s.poll(0.2)
    assert poll.batches == []
    assert poll.next_wakeup == pytest.approx(1.1)
    s.finish(first)
    (together,) = s.poll(0.3).batches  # idle again: the two waiting go at once
    assert len(together.requests) == 2


def test_callers_beyond_the_queue_wait_in_order_and_are_admitted_one_per_place() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=1, max_wait=0.0),
        max_queued=2,
        max_in_flight=1,
        reserved_realtime=0,
    )
    requests = [make(at=float(i)) for i in range(6)]
    for r in requests:
        s.add(r)
    assert [r.state for r in requests] == [State.QUEUED] * 2 + [State.WAITING] * 4
    assert s.queued(NORMAL) == 6
    sent = []
    for step in range(6):
        (batch,) = s.poll(10.0 + step).batches
        sent.extend(batch.requests)
        # Exactly one waiting caller was admitted per place freed, oldest first.
        admitted = [r for r in requests if r.state == State.QUEUED]
        assert len(admitted) == min(2, 5 - step)
        s.finish(batch.requests[0])
    assert sent == requests
    assert requests[2].enqueued_at == 10.0  # its batch timer started at admission


def test_a_caller_that_leaves_the_wait_for_room_gives_up_its_turn() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=1, max_wait=0.0),
        max_queued=1,
        max_in_flight=1,
        reserved_realtime=0,
    )
    a, b, c = make(), make(), make()
    for r in (a, b, c):
        s.add(r)
    assert s.remove(b)
    assert not s.remove(b)
    assert s.queued(NORMAL) == 2
    (first,) = s.poll(0.0).batches
    s.finish(first.requests[0])
    (second,) = s.poll(0.0).batches
    assert [first.requests, second.requests] == [(a,), (c,)]


def test_deadlines_expire_waiting_and_in_flight_requests_too() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=1, max_wait=0.0),
        max_queued=1,
        max_in_flight=1,
        reserved_realtime=0,
    )
    flying, queued, waiting = make(timeout=1.0), make(timeout=2.0), make(timeout=3.0)
    for r in (flying, queued, waiting):
        s.add(r)
    (batch,) = s.poll(0.0).batches
    assert batch.requests == (flying,)
    assert s.poll(0.5).next_wakeup == pytest.approx(1.0)
    assert s.poll(1.0).expired == [flying]  # still flying: the engine cancels it
    assert s.poll(2.0).expired == [queued]
    assert s.poll(3.0).expired == [waiting]
    assert s.queued(NORMAL) == 0


def test_requests_per_minute_spaces_batches_in_tier_order() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=1, max_wait=0.0),
        rate_limit=RateLimit(requests_per_minute=60),  # one a second, burst of one
        max_in_flight=100,
    )
    for tier in (BULK, NORMAL, BULK):
        s.add(make(tier))
    first = s.poll(0.0)
    assert [b.priority for b in first.batches] == [NORMAL]
    assert first.next_wakeup == pytest.approx(1.0)
    s.add(make(RT, at=0.5))
    assert s.poll(0.5).batches == []
    assert [b.priority for b in s.poll(1.0).batches] == [RT]  # realtime first
    assert [b.priority for b in s.poll(2.0).batches] == [BULK]
    assert [b.priority for b in s.poll(3.0).batches] == [BULK]


def test_tokens_per_minute_lets_an_oversize_batch_go_and_the_debt_delays_the_next() -> None:
    s = scheduler(
        BatchPolicy(max_batch_size=1, max_wait=0.0),
        rate_limit=RateLimit(tokens_per_minute=600),  # 10 tokens/s, bucket of 10
        max_in_flight=100,
    )
    big, small = make(max_tokens=28), make(max_tokens=8)  # 30 and 10 estimated tokens
    s.add(big)
    s.add(small)
    poll = s.poll(0.0)
    assert [b.requests for b in poll.batches] == [(big,)]
    assert poll.next_wakeup == pytest.approx(3.0)  # -20 tokens back to +10
    assert s.poll(2.9).batches == []
    assert [b.requests for b in s.poll(3.0).batches] == [(small,)]


def test_token_bucket_reserve_returns_the_wait_for_the_debt() -> None:
    bucket = TokenBucket(rate=2.0, capacity=2.0)
    assert bucket.reserve(0.0, 1) == 0.0
    assert bucket.reserve(0.0, 3) == pytest.approx(1.0)  # level -2 → 0 after 1 s
    assert bucket.wait_time(1.0, 1) == pytest.approx(0.5)
    assert bucket.wait_time(1.5, 1) == 0.0


def test_a_stream_never_shares_a_batch() -> None:
    s = scheduler(BatchPolicy(max_batch_size=8, max_wait=0.0))
    for _ in range(3):
        s.add(make(RT, stream=True))
    s.add(make(RT))  # same parameters, not streamed: never in a stream's batch
    batches = s.poll(0.0).batches
    assert sorted(len(b.requests) for b in batches) == [1, 1, 1, 1]
    for batch in batches:
        assert len({r.spec.stream for r in batch.requests}) == 1


def test_add_asks_for_a_poll_only_when_something_new_is_due() -> None:
    s = scheduler(BatchPolicy(max_batch_size=3, max_wait=1.0, send_when_idle=False))
    assert s.add(make())  # a new group: a new timer
    s.poll(0.0)
    assert not s.add(make())  # the group's timer covers it
    assert s.add(make())  # the batch is full
    s.poll(0.0)
    assert s.add(make(timeout=0.5))  # a deadline before the planned wake-up


def test_finishing_a_batch_at_once_returns_what_finishing_each_request_does() -> None:
    def ledger(s: Scheduler) -> tuple[object, ...]:
        r = s.seats[0]
        return (
            s.in_flight,
            s.in_flight_tokens,
            dict(s.in_flight_by_tier),
            r.in_flight,
            r.in_flight_tokens,
            r.bulk_in_flight,
            r.bulk_in_flight_tokens,
        )

    one_by_one, at_once = scheduler(max_in_flight=64), scheduler(max_in_flight=64)
    for s in (one_by_one, at_once):
        for priority in (BULK, BULK, BULK, RT, RT):
            s.add(make(priority))
    batches = [one_by_one.poll(5.0).batches, at_once.poll(5.0).batches]
    assert ledger(one_by_one) == ledger(at_once) != ledger(scheduler())
    for batch in batches[0]:
        for request in batch.requests:
            one_by_one.finish(request)
    for batch in batches[1]:
        at_once.finish_batch(batch.requests, batch.priority, batch.replica)
        at_once.finish_batch(batch.requests, batch.priority, batch.replica)  # once only
    assert ledger(one_by_one) == ledger(at_once) == ledger(scheduler())


def _paced(tokens_per_second: float, slice_tokens: float) -> Scheduler:
    s = scheduler(BatchPolicy(max_batch_size=64, max_wait=0.0), max_in_flight=256)
    s.set_pace(tokens_per_second, slice_tokens)
    return s


def test_paced_bulk_goes_in_whole_slices_at_the_pace() -> None:
    s = _paced(100.0, 40.0)
    for _ in range(6):
        s.add(make(NORMAL, prompt="x" * 76))  # 20 prompt tokens each
    (batch,) = s.poll(0.0).batches
    assert len(batch.requests) == 2  # a slice of 40 tokens
    poll = s.poll(0.0)
    assert poll.batches == []
    assert poll.next_wakeup == pytest.approx(0.4)  # a whole slice again: 40 at 100/s
    assert s.poll(0.2).batches == []  # one prompt's worth saved: not a slice yet
    (batch,) = s.poll(0.4).batches
    assert len(batch.requests) == 2
    (batch,) = s.poll(5.0).batches
    assert len(batch.requests) == 2  # a full slice, no more: the bucket holds 40


def test_realtime_is_never_paced() -> None:
    s = _paced(1.0, 20.0)
    for _ in range(4):
        s.add(make(RT, prompt="x" * 76))
    assert [len(b.requests) for b in s.poll(0.0).batches] == [4]


def test_a_prompt_larger_than_a_slice_goes_alone_once_the_bucket_is_full() -> None:
    s = _paced(100.0, 40.0)
    s.add(make(NORMAL, prompt="x" * 400))  # 101 tokens
    s.add(make(NORMAL, prompt="x" * 76))
    (batch,) = s.poll(0.0).batches
    assert len(batch.requests) == 1
    assert s.poll(0.8).batches == []  # the bucket repays its debt of 61 tokens first
    (batch,) = s.poll(1.01).batches
    assert len(batch.requests) == 1


def test_unpaced_again_sends_everything_queued() -> None:
    s = _paced(1.0, 20.0)
    for _ in range(4):
        s.add(make(NORMAL, prompt="x" * 76))
    assert [len(b.requests) for b in s.poll(0.0).batches] == [1]
    s.set_pace(None)
    assert [len(b.requests) for b in s.poll(0.0).batches] == [3]


def test_a_batch_is_kept_to_one_engine_steps_prompt_tokens() -> None:
    # Prompts of 20 estimated tokens ("x" * 76: 76 // 4 + 1), a step of 50: two a
    # batch, where 64 would have been one long prefill.
    s = scheduler(BatchPolicy(max_batch_size=64, max_wait=0.0), max_in_flight=256)
    s.set_batch_prefill(50.0)
    for _ in range(5):
        s.add(make(BULK, prompt="x" * 76))
    assert [len(b.requests) for b in s.poll(0.0).batches] == [2, 2, 1]
    s.set_batch_prefill(None)
    for _ in range(5):
        s.add(make(BULK, prompt="x" * 76))
    assert [len(b.requests) for b in s.poll(1.0).batches] == [5]


def test_a_prompt_larger_than_a_step_still_goes_alone() -> None:
    s = scheduler(BatchPolicy(max_batch_size=64, max_wait=0.0), max_in_flight=256)
    s.set_batch_prefill(50.0)
    s.add(make(BULK, prompt="x" * 400))  # 101 tokens
    s.add(make(BULK, prompt="x" * 76))
    assert [len(b.requests) for b in s.poll(0.0).batches] == [1, 1]
