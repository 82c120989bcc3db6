"""The evidence the admission controller's beliefs need: readings that persist, a
capacity stated or learnt and unlearnt. Pure, on made-up time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmbatch._control.evidence import MIN_SAMPLES, MIN_SPAN, MIN_STEPS, Capacity, Persistence


def test_a_reading_is_believed_after_three_samples_spanning_five_steps() -> None:
    seen = Persistence()
    step = 0.02
    assert not seen.observe(0.00, True, step, 12)
    assert not seen.observe(0.05, True, step, 30)
    assert not seen.observe(0.06, True, step, 20)  # three samples, but 3 steps
    assert seen.observe(0.10, True, step, 14)  # 5 steps
    assert seen.describe("waiting", step) == "waiting 12-30 over 4 samples in 0.10 s, 5 steps"
    assert not seen.observe(0.11, False, step)  # it emptied: unlearnt
    assert (seen.unlearnt, seen.dismissed) == (1, 0)


def test_a_reading_that_does_not_last_is_dismissed() -> None:
    seen = Persistence()
    for start in (0.0, 1.0, 2.0):
        seen.observe(start, True, 0.02, 8)
        seen.observe(start + 0.01, False, 0.02)
    assert (seen.confirmed, seen.dismissed, seen.unlearnt) == (False, 3, 0)


def test_without_a_step_time_the_span_is_half_a_second() -> None:
    seen = Persistence()
    for i in range(MIN_SAMPLES + 5):
        believed = seen.observe(i * 0.1, True, None)
        assert believed == (i >= MIN_SAMPLES - 1 and i * 0.1 >= MIN_SPAN)


@given(
    step=st.floats(0.001, 0.2),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=30),
)
def test_belief_needs_both_the_samples_and_the_span(step: float, gaps: list[float]) -> None:
    seen = Persistence()
    now = 0.0
    for n, gap in enumerate(gaps, 1):
        now += gap if n > 1 else 0.0
        believed = seen.observe(now, True, step)
        if believed:
            assert n >= MIN_SAMPLES
            assert now >= MIN_STEPS * step


def test_a_stated_capacity_stands_and_a_learnt_one_is_dropped_when_contradicted() -> None:
    stated = Capacity(16, "llama.cpp /props: total_slots 16")
    stated.learn(40, "x")
    assert not stated.contradict(40)
    assert (stated.seats, stated.source) == (16, "stated")

    learnt = Capacity()
    learnt.learn(8, "ran 8 while waiting 20 over 3 samples")
    assert (learnt.seats, learnt.source) == (8, "learnt")
    learnt.learn(6, "fewer ran later")  # the most it ran while queued
    assert learnt.seats == 8
    assert learnt.contradict(9)
    assert (learnt.seats, learnt.source, learnt.dropped) == (None, "none", 1)
    assert learnt.inference().evidence == "dropped: ran 9, more than the 8 learnt"
