"""The floor under an SLO's cuts: one bulk sequence, or a larger limit tried and found
faster for realtime. Pure, on made-up time."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch import SLO
from llmbatch._control import floor as floor_module
from llmbatch._control.admission import AdmissionController
from llmbatch._control.floor import HOLD, RETRY, SAMPLES, SETTLE, FloorTrial, TrialPhase


def at_floor(trial: FloorTrial, now: float, score: float, *, answers: int = SAMPLES) -> float:
    """The limit at one sequence, settled, with ``answers`` realtime answers there."""
    trial.update(now, 1.0, unreachable=False, began=8.0)
    now += SETTLE
    for _ in range(answers):
        now += 0.5
        trial.on_answer(now - 0.1, score, 1.0)
    return now


def test_a_larger_limit_found_faster_becomes_the_floor() -> None:
    trial = FloorTrial()
    now = at_floor(trial, 0.0, 3.0)
    assert trial.update(now, 1.0, unreachable=True, began=16.0) == 8.0  # capped
    assert trial.trying
    tried = now
    trial.on_answer(tried - 0.05, 3.0, 8.0)  # sent before the move: not counted
    for i in range(SAMPLES):
        trial.on_answer(tried + SETTLE + 0.1 * i, 0.6, 8.0)
    assert trial.update(tried + 3.0, 8.0, unreachable=False, began=16.0) is None
    assert trial.phase is TrialPhase.HELD
    assert trial.floor == 8.0
    assert "0.60x the SLO at 8 sequences, 3.00x at one" in trial.inference().evidence
    # The hold ends: one sequence is the floor again, to be looked at afresh.
    trial.update(tried + 3.0 + HOLD, 8.0, unreachable=False, began=16.0)
    assert trial.inference().source == "none"
    assert "watching" in trial.inference().evidence
    assert trial.floor == 1.0


def test_a_larger_limit_no_faster_is_left_and_not_tried_again_soon() -> None:
    trial = FloorTrial()
    now = at_floor(trial, 0.0, 1.5)
    assert trial.update(now, 1.0, unreachable=True, began=8.0) == 8.0
    for i in range(SAMPLES):
        trial.on_answer(now + SETTLE + 0.1 * i, 1.3, 8.0)  # faster, but not by a fifth
    assert trial.update(now + 3.0, 8.0, unreachable=True, began=8.0) == 1.0
    assert trial.phase is TrialPhase.REJECTED
    assert trial.floor == 1.0
    # Answers at one sequence come in again; no try before RETRY has passed ...
    later = at_floor(trial, now + 3.0, 1.5)
    assert trial.update(later, 1.0, unreachable=True, began=8.0) is None
    # ... and then one.
    again = at_floor(trial, now + 3.0 + RETRY, 1.5)
    assert trial.update(again, 1.0, unreachable=True, began=8.0) == 8.0
    assert trial.tries == 2


def test_a_try_stops_as_soon_as_two_answers_are_both_slower() -> None:
    trial = FloorTrial()
    now = at_floor(trial, 0.0, 1.2)
    trial.update(now, 1.0, unreachable=True, began=8.0)
    trial.on_answer(now + SETTLE, 2.0, 8.0)
    assert trial.update(now + SETTLE + 0.5, 8.0, unreachable=True, began=8.0) is None
    trial.on_answer(now + SETTLE + 0.2, 2.5, 8.0)
    assert trial.update(now + SETTLE + 1.0, 8.0, unreachable=True, began=8.0) == 1.0
    assert "over 2 answers" in trial.evidence


def test_a_try_without_answers_gives_up() -> None:
    trial = FloorTrial()
    now = at_floor(trial, 0.0, 2.0)
    trial.update(now, 1.0, unreachable=True, began=4.0)
    assert trial.update(now + 19.0, 4.0, unreachable=True, began=4.0) is None
    assert trial.update(now + 21.0, 4.0, unreachable=True, began=4.0) == 1.0
    assert "no realtime answer at 4 sequences" in trial.evidence


def test_nothing_is_tried_without_the_slo_out_of_reach_or_enough_answers() -> None:
    trial = FloorTrial()
    now = at_floor(trial, 0.0, 3.0, answers=SAMPLES - 1)
    assert trial.update(now, 1.0, unreachable=True, began=8.0) is None  # one answer short
    trial.on_answer(now, 3.0, 1.0)
    assert trial.update(now, 1.0, unreachable=False, began=8.0) is None  # reachable
    assert trial.update(now, 1.0, unreachable=True, began=1.0) is None  # cuts began at one
    assert trial.update(now, 1.0, unreachable=True, began=8.0) == 8.0


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.floats(0.0, 30.0),  # seconds to the event
            st.floats(0.0, 10.0),  # score
            st.sampled_from([1.0, 2.0, 4.0, 8.0, 32.0]),  # limit
            st.booleans(),  # unreachable
            st.booleans(),  # an answer (else an update)
        ),
        max_size=80,
    ),
    began=st.floats(1.0, 256.0),
)
def test_the_floor_and_every_move_stay_within_one_and_the_cap(
    events: list[tuple[float, float, float, bool, bool]], began: float
) -> None:
    trial = FloorTrial()
    now = 0.0
    for gap, score, limit, unreachable, answer in events:
        now += gap
        if answer:
            trial.on_answer(now - 0.1, score, limit)
            continue
        moved = trial.update(now, limit, unreachable=unreachable, began=began)
        assert moved is None or 1.0 <= moved <= min(floor_module.TRY_CAP, max(began, 1.0))
        assert 1.0 <= trial.floor <= floor_module.TRY_CAP
        assert (trial.floor > 1.0) == (trial.phase is TrialPhase.HELD)


def run_controller(score_at: Callable[[float, int], float], seconds: float) -> AdmissionController:
    """A server whose step time meets the SLO at any load but whose realtime answers
    take ``score_at(now, limit)`` times the SLO's TTFT; one realtime answer a tick."""
    controller = AdmissionController(ceiling=64, max_reserve=1, slo=SLO(ttft=0.1, tpot=0.05))
    now = 0.0
    while now < seconds:
        limit = controller.limit
        controller.on_load(now, waiting=0, running=limit, kv_cache_usage=0.1)
        controller.on_step_time(0.005)
        ttft = score_at(now, limit) * 0.1
        controller.on_ttft(ttft)
        controller.on_realtime_answer(ttft, None, sent=now - 0.2)
        controller.on_blocked()
        controller.update(now)
        now += 0.5
    return controller


def slow_start_then(now: float, limit: int) -> float:
    """Realtime slow at first (1.5x with bulk, the start's burst), 3x the SLO at one
    bulk sequence, 0.6x at eight once the start is over."""
    if limit <= 1:
        return 3.0
    return 1.5 if now < 10.0 else 0.6


def test_a_server_slower_at_one_sequence_is_held_at_the_limit_the_cuts_began_from() -> None:
    # A controller that only cut would sit at one sequence, its slowest setting, and
    # say the SLO is out of reach.
    early = run_controller(slow_start_then, 4.6)
    assert early.limit == 1
    assert early.slo_unreachable
    controller = run_controller(slow_start_then, 60.0)
    trial = controller.floor_trial
    assert trial.phase is TrialPhase.HELD
    assert trial.floor == 8.0
    assert trial.tries == 1
    assert controller.limit >= 8
    assert not controller.slo_unreachable
    floor = next(i for i in controller.inferences() if i.name == "slo_floor")
    assert floor.value == 8.0
    assert floor.source == "learnt"


def test_a_server_fastest_at_one_sequence_stays_there_and_says_the_slo_is_out_of_reach() -> None:
    controller = run_controller(lambda now, limit: 2.0 if limit <= 1 else 4.0, 40.0)
    trial = controller.floor_trial
    assert trial.tries == 1
    assert trial.phase is TrialPhase.REJECTED
    assert controller.limit == 1
    assert controller.slo_unreachable
