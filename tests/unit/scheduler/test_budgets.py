"""The scheduler's side of shared budgets, on explicit time: leased buckets that only
leases fill, and a shared in-flight count. No Redis here (tests/redis has it)."""

from __future__ import annotations

import math

import pytest
from factories import make_request as make

from llmbatch import BatchPolicy, Limits, Priority, RateLimit
from llmbatch._scheduler import Scheduler
from llmbatch._scheduler.buckets import LeasedBucket, TokenBucket
from llmbatch._scheduler.budgets import RateBudget

RT, NORMAL = Priority.REALTIME, Priority.NORMAL
SHARED = RateLimit(requests_per_minute=600, redis_url="redis://127.0.0.1:1", key="k")
ONE = BatchPolicy(max_batch_size=1, max_wait=0.0, send_when_idle=False)


def scheduler(rate_limit: RateLimit | None = SHARED, **limits: object) -> Scheduler:
    return Scheduler(
        policies={p: ONE for p in Priority},
        limits=Limits(**limits),  # type: ignore[arg-type]
        rate_limit=rate_limit,
    )


def test_a_leased_bucket_starts_empty_and_asks_when_a_batch_waits() -> None:
    asked: list[bool] = []
    bucket = LeasedBucket()
    bucket.notify = lambda: asked.append(True)
    assert bucket.wait_time(0.0, 1) == math.inf
    assert bucket.wanted == 1
    assert asked == [True]
    assert not bucket.wanted_realtime
    bucket.wait_time(0.0, 3, realtime=True)
    assert bucket.wanted == 3
    assert bucket.wanted_realtime


def test_a_lease_is_usable_from_its_time_and_counts_as_coming() -> None:
    bucket = LeasedBucket()
    bucket.wait_time(0.0, 2)
    bucket.credit(5, usable_at=0.3)
    assert bucket.wanted == 0
    assert bucket.wait_time(0.1, 2) == pytest.approx(0.2)  # a timer, not a new lease
    assert bucket.available(0.1) == 5
    assert bucket.wait_time(0.3, 2) == 0.0
    bucket.take(2)
    assert bucket.level == 3


def test_taking_below_the_low_mark_asks_for_the_next_lease_early() -> None:
    asked: list[bool] = []
    bucket = LeasedBucket()
    bucket.low = 2.5
    bucket.notify = lambda: asked.append(True)
    bucket.credit(5, usable_at=0.0)
    bucket.wait_time(0.0, 1)
    bucket.take(1)
    bucket.take(1)
    assert asked == []
    bucket.take(1)  # 2 left < 2.5
    assert asked == [True]


def test_a_retry_goes_at_once_and_its_debt_holds_back_the_next_batch() -> None:
    bucket = LeasedBucket()
    bucket.credit(1, usable_at=0.0)
    assert bucket.reserve(0.0, 2) == 0.0
    assert bucket.level == -1
    assert bucket.wait_time(0.0, 1) == math.inf
    assert bucket.wanted == 2  # the debt and the batch


def test_falling_back_refills_by_time_and_resuming_keeps_what_was_added() -> None:
    bucket = LeasedBucket()
    bucket.fall_back(rate=2.0, capacity=2.0, now=0.0)
    assert not bucket.leasing
    assert bucket.wait_time(0.0, 1) == pytest.approx(0.5)  # a local budget: a timer
    assert bucket.wait_time(1.0, 1) == 0.0
    bucket.resume(1.0)
    assert bucket.leasing
    assert bucket.level == 2.0


def test_refunds_cap_at_a_local_buckets_capacity_and_may_charge_more() -> None:
    bucket = TokenBucket(rate=10.0, capacity=10.0)
    bucket.take(8)
    bucket.refund(20)
    assert bucket.level == 10.0
    bucket.refund(-15)
    assert bucket.level == -5.0


def _buckets(s: Scheduler) -> tuple[TokenBucket | None, TokenBucket | None]:
    assert s.rate is not None
    return s.rate.buckets


def test_a_shared_rate_limit_gives_the_scheduler_leased_buckets() -> None:
    s = scheduler(RateLimit(tokens_per_minute=6000, redis_url="redis://h", key="k"))
    requests, tokens = _buckets(s)
    assert requests is None
    assert isinstance(tokens, LeasedBucket)
    local = _buckets(scheduler(RateLimit(requests_per_minute=60)))[0]
    assert type(local) is TokenBucket


def test_without_a_lease_nothing_leaves_and_no_timer_is_set() -> None:
    s = scheduler()
    s.add(make(NORMAL))
    poll = s.poll(0.0)
    assert poll.batches == []
    assert poll.next_wakeup is None
    bucket = _buckets(s)[0]
    assert isinstance(bucket, LeasedBucket)
    bucket.credit(1, usable_at=0.0)
    assert len(s.poll(0.0).batches) == 1


def test_a_waiting_realtime_batch_is_what_the_leased_bucket_asks_for() -> None:
    s = scheduler()
    s.add(make(NORMAL))
    s.add(make(RT))
    assert s.poll(0.0).batches == []
    bucket = _buckets(s)[0]
    assert isinstance(bucket, LeasedBucket)
    assert bucket.wanted_realtime
    bucket.credit(1, usable_at=0.0)
    (batch,) = s.poll(0.0).batches
    assert batch.priority is RT  # realtime first with the leased budget too


def test_usage_corrects_the_token_charge() -> None:
    s = scheduler(RateLimit(tokens_per_minute=600))  # 10 tokens/s, bucket of 10
    bucket = _buckets(s)[1]
    assert bucket is not None
    s.add(make(NORMAL, max_tokens=8))  # estimated ~9-10 tokens
    (batch,) = s.poll(0.0).batches
    charged = batch.tokens
    assert bucket.level == pytest.approx(10 - charged)
    assert s.rate is not None
    s.rate.correct(charged, 3)  # the answer used 3
    assert bucket.level == pytest.approx(7)


def test_the_shared_in_flight_count_caps_what_is_sent() -> None:
    s = scheduler(None, max_in_flight=8, reserved_realtime=0)
    full: list[bool] = []
    shared = s.share_in_flight(limits_tokens=False, on_full=lambda: full.append(True))
    for _ in range(5):
        s.add(make(NORMAL))
    assert s.poll(0.0).batches == []
    assert full
    shared.grant(3)
    assert len(s.poll(0.0).batches) == 3
    assert s.in_flight == 3
    assert s.seat_demand() == (5, s.in_flight_tokens + 2 * make().est_tokens)


def test_the_shared_token_count_trims_a_batch() -> None:
    big = BatchPolicy(max_batch_size=10, max_wait=0.0, send_when_idle=False)
    s = Scheduler(policies={p: big for p in Priority}, limits=Limits(reserved_realtime=0))
    shared = s.share_in_flight(limits_tokens=True, on_full=lambda: None)
    cost = make().est_tokens
    shared.grant(100, 3 * cost)
    for _ in range(5):
        s.add(make(NORMAL))
    (batch,) = s.poll(0.0).batches
    assert len(batch.requests) == 3


def test_seat_demand_is_bounded_by_the_clients_own_limits() -> None:
    s = scheduler(None, max_in_flight=4, reserved_realtime=1)
    for _ in range(10):
        s.add(make(NORMAL))
    assert s.seat_demand()[0] == 4


class _SendingLink:
    """Stands in for Redis in the seat leaser: records what each renewal reports and,
    like a real round trip, lets the scheduler send while the call is on its way."""

    where = "redis://stub"

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.reported: list[int] = []

    async def run(self, script: str, keys: list[str], args: list[object]) -> list[str]:
        self.reported.append(int(args[3]))  # type: ignore[call-overload]
        self.scheduler.poll(0.0)  # the scheduler sends up to its allowance meanwhile
        held = max(int(args[3]), 2)  # type: ignore[call-overload]
        return [str(held), "2", "0", "0", "1", "2"]


@pytest.mark.anyio
async def test_a_renewal_keeps_held_what_may_be_sent_while_it_is_on_its_way() -> None:
    from llmbatch import SharedInFlight
    from llmbatch._redis.in_flight import SeatLeaser

    s = scheduler(None, max_in_flight=8, reserved_realtime=0)
    link = _SendingLink(s)
    config = SharedInFlight(redis_url="redis://127.0.0.1:1", key="k", max_in_flight=8)
    leaser = SeatLeaser(
        link,  # type: ignore[arg-type]
        config,
        s,
        member="me",
        wake=lambda: None,
        clock=lambda: 0.0,
    )
    for _ in range(10):
        s.add(make(NORMAL))
    assert s.shared is not None
    s.shared.grant(2)
    s.poll(0.0)
    s.shared.grant(6)  # the last renewal allowed 6; 2 are in flight, 4 about to go
    await leaser._renew()
    assert s.in_flight == 6
    # What the script was told is in use covers what was in flight when it ran.
    assert link.reported == [6]
    assert s.shared.seats == 2  # the smaller share applies from the reply on


def test_a_bulk_lease_covers_three_batches_within_its_bounds() -> None:
    from llmbatch._redis.rate import RateLeaser

    limit = RateLimit(tokens_per_minute=600_000, redis_url="redis://127.0.0.1:1", key="k")
    bucket = LeasedBucket()
    leaser = RateLeaser(
        None,  # type: ignore[arg-type]  # no call is made here
        limit,
        (None, bucket),
        member="me",
        wake=lambda: None,
        clock=lambda: 0.0,
    )
    # 10,000 tokens a second: leases of 2,500 (a quarter second) to 5,000 (a half).
    bucket.wait_time(0.0, 1000)  # a batch of 1,000 tokens waits
    assert leaser._want(1, bucket, 0.0) == 3000
    bucket.wait_time(0.0, 400)
    assert leaser._want(1, bucket, 0.0) == 2500
    bucket.wait_time(0.0, 3000)
    assert leaser._want(1, bucket, 0.0) == 5000
    # Eight processes' leases must fit in the two-second horizon: 2,500 each, but
    # never less than the waiting batch needs.
    leaser.sharers = 8
    assert leaser._want(1, bucket, 0.0) == 3000
    bucket.wait_time(0.0, 500)
    assert leaser._want(1, bucket, 0.0) == 2500
    # Nothing waits: the next lease is asked for once less than half of one is left.
    bucket.credit(bucket.wanted, usable_at=0.0)
    assert bucket.wait_time(0.0, 500) == 0.0
    bucket.take(500)
    assert bucket.low == 1250
    assert leaser._want(1, bucket, 0.0) == 2500


def test_a_shared_allowance_starts_at_nothing_and_says_when_it_grew() -> None:
    from llmbatch._scheduler.budgets import SharedAllowance

    allowance = SharedAllowance(limits_tokens=True, on_full=lambda: None)
    assert (allowance.seats, allowance.tokens) == (0, 0)
    assert allowance.grant(4, 100)
    assert not allowance.grant(4, 100)
    assert not allowance.grant(2, 50)  # shrinking is not growing
    assert allowance.room(1, 20) == (1, 30)
    seats_only = SharedAllowance(limits_tokens=False, on_full=lambda: None)
    seats_only.grant(3, 999)
    assert seats_only.room(1, 10**9) == (2, float("inf"))


def test_credit_accrues_to_passed_over_tiers_by_their_share() -> None:
    from llmbatch._scheduler.budgets import settle_credit

    credits = dict.fromkeys(Priority, 0.0)
    share = {Priority.NORMAL: 0.2, Priority.BATCH: 0.0}
    settle_credit(credits, share, Priority.REALTIME, 8, list(Priority), owed=False)
    assert credits[Priority.NORMAL] == pytest.approx(2.0)  # 8 x 0.2 / 0.8
    assert credits[Priority.BATCH] == 0.0  # no share, no credit
    settle_credit(credits, share, Priority.NORMAL, 3, [Priority.NORMAL], owed=True)
    assert credits[Priority.NORMAL] == pytest.approx(-1.0)  # pays for all it sent


def test_a_learnt_budget_pays_what_the_provider_counted_beyond_the_estimate() -> None:
    from llmbatch._scheduler.budgets import RateBudget

    stated = RateBudget(RateLimit(tokens_per_minute=6_000))  # 100 a second, 100 held
    learnt = RateBudget(RateLimit(tokens_per_minute=6_000), refunds=False)
    for budget in (stated, learnt):
        assert budget.tokens is not None
        budget.tokens.take(40)  # charged 40: 24 of prompt (estimated) + max_tokens 16
    # The provider counted 30 of prompt (its chat template's too) and, as it charges
    # max_tokens whatever the answer's length, 46; the answer used 5 of its 16.
    stated.correct(40, 35, counted=46)
    learnt.correct(40, 35, counted=46)
    assert stated.tokens is not None
    assert learnt.tokens is not None
    assert stated.tokens.level == 65  # a stated budget refunds what was not used
    assert learnt.tokens.level == 54  # a learnt one pays the provider's count
    learnt.correct(40, 20, counted=30)  # an overestimate: nothing back
    assert learnt.tokens.level == 54


def test_a_shared_key_without_numbers_leases_what_is_learnt() -> None:
    # RateLimit(redis_url, key) alone: no budget until a provider's answers state one;
    # then it is a leased one at the learnt rates, and the leaser is told of each.
    told: list[RateLimit] = []
    s = scheduler(RateLimit(redis_url="redis://127.0.0.1:1", key="k"))
    s.on_rate_learnt = told.append
    assert s.rate is None
    assert s.rate_stats() is None
    s.learn_rate(6000, 90_000, evidence="the rate-limit headers of http://h/v1")
    assert s.rate is not None
    requests, tokens = s.rate.buckets
    assert isinstance(requests, LeasedBucket)
    assert isinstance(tokens, LeasedBucket)
    assert [(t.requests_per_minute, t.tokens_per_minute, t.key) for t in told] == [
        (5700, 85_500, "k")
    ]
    stats = s.rate_stats()
    assert stats is not None
    assert (stats.requests_per_minute, stats.tokens_per_minute, stats.source) == (
        5700,
        85_500,
        "learnt",
    )
    assert stats.evidence == "the rate-limit headers of http://h/v1; paced at 95% of it"
    # New numbers keep the leased stock: what the shared budget granted stays granted.
    requests.credit(7.0, 0.0)
    s.learn_rate(3000, 90_000, source="shared", evidence="learnt by another process")
    assert s.rate.requests is requests
    assert told[-1].requests_per_minute == 2850
    stats = s.rate_stats()
    assert stats is not None
    assert stats.source == "shared"


def test_a_stated_budget_is_not_replaced_by_what_is_learnt_and_says_it_was_stated() -> None:
    told: list[RateLimit] = []
    s = scheduler(SHARED)
    s.on_rate_learnt = told.append
    s.learn_rate(6000, None)
    assert told == []
    stats = s.rate_stats()
    assert stats is not None
    assert (stats.requests_per_minute, stats.source) == (600, "stated")


BIG = BatchPolicy(max_batch_size=64, max_wait=0.0, send_when_idle=False)


def test_a_batch_takes_no_more_than_a_second_of_the_token_budget() -> None:
    # 600 tokens a minute: 10 a second. Requests of 8 estimated tokens (a short
    # prompt and max_tokens=6) go one to a batch, so that no batch sent on a full
    # bucket is over the provider's per-second limit; before, all four went as one
    # batch of 32 once the bucket was full.
    s = Scheduler(
        policies={p: BIG for p in Priority},
        limits=Limits(),
        rate_limit=RateLimit(tokens_per_minute=600),
    )
    requests = [make(NORMAL, prompt="hi", max_tokens=6) for _ in range(4)]
    for request in requests:
        s.add(request)
    assert requests[0].est_tokens == 7
    sizes = [len(batch.requests) for batch in s.poll(0.0).batches]
    assert sizes == [1]
    # A single request larger than a second's worth still goes, alone.
    lone = Scheduler(
        policies={p: BIG for p in Priority},
        limits=Limits(),
        rate_limit=RateLimit(tokens_per_minute=60),
    )
    lone.add(make(NORMAL, prompt="hi", max_tokens=6))
    assert len(lone.poll(0.0).batches) == 1


def test_a_learnt_budget_charges_what_the_provider_counts_once_it_has_seen_it() -> None:
    # The provider counts 30 tokens where the client estimates 20 (a chat template's
    # tokens): after a few answers every charge is scaled to its count, and a batch
    # holds what a second's worth pays for in those terms.
    budget = RateBudget(RateLimit(tokens_per_minute=60_000), refunds=False)
    assert budget.charge(20) == 20
    assert budget.batch_room() == pytest.approx(1000)
    for _ in range(30):
        budget.correct(20, 25, counted=30)
    assert budget.count_scale == pytest.approx(1.5, abs=0.01)
    assert budget.charge(20) == 30
    assert budget.batch_room() == pytest.approx(1000 / 1.5, rel=0.01)
    # A stated budget (refunds) charges the estimate and gives back what was unused.
    stated = RateBudget(RateLimit(tokens_per_minute=60_000))
    stated.correct(20, 25, counted=30)
    assert stated.count_scale == 1.0


def test_a_shared_budget_lets_a_batch_take_half_a_second_of_it() -> None:
    # Processes sharing a budget send in turns of half a second (the most a lease
    # holds), not one whole second's worth each at once: those met at the provider.
    shared = RateBudget(RateLimit(tokens_per_minute=60_000, redis_url="redis://h", key="k"))
    local = RateBudget(RateLimit(tokens_per_minute=60_000))
    assert shared.batch_room() == pytest.approx(500)
    assert local.batch_room() == pytest.approx(1000)


def test_a_learnt_budget_slows_down_for_429s_and_speeds_up_while_none_come() -> None:
    # Another app spends the same key: 429s come though the client keeps to what it
    # learnt. The 429s of one burst cut the rate once; it comes back a step a second
    # from 3 s after the last.
    budget = RateBudget(RateLimit(requests_per_minute=600, tokens_per_minute=60_000), refunds=False)
    requests, tokens = budget.buckets
    assert requests is not None
    assert tokens is not None
    budget.refused(10.0)
    budget.refused(10.5)  # the same burst
    assert budget.speed == pytest.approx(0.75)
    assert (requests.rate, tokens.rate) == (pytest.approx(7.5), pytest.approx(750))
    assert tokens.capacity == pytest.approx(750)  # a second's worth of the new rate
    assert budget.batch_room() == pytest.approx(750)
    budget.refused(11.2)  # another burst
    assert budget.speed == pytest.approx(0.5625)
    budget.recover(13.0)  # too soon
    assert budget.speed == pytest.approx(0.5625)
    for second in range(15, 40):
        budget.recover(float(second))
    assert budget.speed == 1.0
    assert tokens.rate == pytest.approx(1000)
    # Never below a tenth; a stated budget (refunds) is kept as given.
    for at in range(50, 80, 2):
        budget.refused(float(at))
    assert budget.speed == pytest.approx(0.1)
    stated = RateBudget(RateLimit(tokens_per_minute=60_000))
    stated.refused(1.0)
    assert stated.speed == 1.0
