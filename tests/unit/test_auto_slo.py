"""The default SLO (``slo="auto"``), pure on made-up time: dormant without realtime
(so bulk-only work is exactly as with ``slo=None``), a quiet spell to learn the idle
latency, the target at a multiple of it, standing down where the latency does not
follow the load, and a fresh measurement after the refresh."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch._control.admission import AdmissionController
from llmbatch._control.auto import (
    ACTIVE_WINDOW,
    MULTIPLE,
    QUIET_AFTER_DRAIN,
    QUIET_SAMPLES,
    QUIET_SETTLE,
    REFRESH,
    AutoTarget,
    Phase,
)


def measured(auto: AutoTarget, *, now: float, loaded: float, idle: float) -> None:
    """Realtime seen under a loaded step; bulk drains; idle samples come in."""
    auto.on_realtime(now)
    assert auto.update(now, loaded, bulk_in_flight=40) is None
    assert auto.phase is Phase.MEASURING
    assert auto.holds_bulk
    auto.on_step_time(loaded)  # bulk still on the server: not an idle sample
    auto.update(now + 1, loaded, bulk_in_flight=1)
    assert auto.holds_bulk
    for _ in range(QUIET_SAMPLES):
        auto.on_step_time(idle)
        auto.on_realtime_ttft(4 * idle)
    auto.update(now + 1 + QUIET_SETTLE, idle, bulk_in_flight=1)


def test_no_target_until_realtime_is_seen() -> None:
    auto = AutoTarget()
    for t in range(100):
        assert auto.update(float(t), 0.3, bulk_in_flight=250) is None
    assert auto.phase is Phase.DORMANT
    assert not auto.holds_bulk
    assert "no realtime call seen yet" in auto.reason


def test_the_target_is_a_multiple_of_the_quiet_latency() -> None:
    auto = AutoTarget()
    measured(auto, now=10.0, loaded=0.3, idle=0.025)
    assert auto.phase is Phase.ACTIVE
    assert not auto.holds_bulk
    assert auto.slo is not None
    assert (auto.slo.tpot, auto.slo.ttft) == (
        pytest.approx(MULTIPLE * 0.025),
        pytest.approx(MULTIPLE * 0.1),
    )
    assert "3x the idle latency" in auto.reason
    # The loaded sample taken before the drain did not count.
    assert auto.idle_step == pytest.approx(0.025)


def test_it_goes_dormant_after_realtime_stops_and_wakes_without_measuring_again() -> None:
    auto = AutoTarget()
    measured(auto, now=0.0, loaded=0.3, idle=0.025)
    assert auto.update(2.0 + ACTIVE_WINDOW + 1, 0.3, 200) is None
    assert auto.phase is Phase.DORMANT
    auto.on_realtime(100.0)
    assert auto.update(100.0, 0.3, 200) is not None  # the reference is still fresh
    assert auto.phase is Phase.ACTIVE


def test_the_idle_latency_is_measured_again_after_the_refresh() -> None:
    auto = AutoTarget()
    measured(auto, now=0.0, loaded=0.3, idle=0.025)
    auto.on_realtime(REFRESH + 5)
    auto.update(REFRESH + 5, 0.3, 200)
    assert auto.phase is Phase.MEASURING


def test_it_stands_down_where_the_latency_does_not_follow_the_load() -> None:
    auto = AutoTarget()
    measured(auto, now=0.0, loaded=0.30, idle=0.28)  # a hosted endpoint, say
    assert auto.phase is Phase.STOOD_DOWN
    assert auto.slo is None
    assert "does not follow this client's load" in auto.reason
    auto.on_realtime(60.0)
    assert auto.update(60.0, 0.3, 10) is None  # until the next refresh


def test_it_gives_up_when_nothing_is_measured_in_the_quiet() -> None:
    auto = AutoTarget()
    auto.on_realtime(0.0)
    auto.update(0.0, 0.3, bulk_in_flight=100)
    assert auto.holds_bulk
    auto.update(12.0, 0.3, bulk_in_flight=1)  # drained after 12 s
    assert auto.holds_bulk
    auto.update(12.0 + QUIET_AFTER_DRAIN + 1, None, bulk_in_flight=1)
    assert auto.phase is Phase.STOOD_DOWN
    assert not auto.holds_bulk
    assert "no step time measured" in auto.reason
    auto.on_realtime(100.0)
    auto.update(100.0, 0.3, bulk_in_flight=100)
    assert not auto.holds_bulk  # not held again before the next try ...
    auto.on_realtime(REFRESH + 20)
    auto.update(REFRESH + 20, 0.3, bulk_in_flight=100)
    assert auto.holds_bulk  # ... which comes


def test_samples_taken_before_bulk_started_are_the_reference_without_a_quiet() -> None:
    """A realtime call answered before bulk work (or between jobs) is idle already:
    no bulk is held back to measure what is known."""
    auto = AutoTarget()
    auto.update(0.0, None, bulk_in_flight=0)
    for _ in range(QUIET_SAMPLES):
        auto.on_step_time(0.02)
    auto.on_realtime(QUIET_SETTLE)
    assert auto.update(QUIET_SETTLE, 0.02, bulk_in_flight=0) is not None
    assert auto.phase is Phase.ACTIVE
    assert not auto.holds_bulk
    assert auto.idle_step == pytest.approx(0.02)


def test_samples_read_just_after_the_drain_are_not_idle_ones() -> None:
    """The first reads after bulk went quiet span its last loaded steps."""
    auto = AutoTarget()
    auto.on_realtime(0.0)
    auto.update(0.0, 0.3, bulk_in_flight=200)
    auto.update(9.0, 0.3, bulk_in_flight=1)  # drained
    for _ in range(QUIET_SAMPLES):
        auto.on_step_time(0.25)  # spans the last loaded steps
        auto.on_realtime_ttft(8.0)  # waited out the drain
    auto.update(9.5, 0.25, bulk_in_flight=1)
    assert auto.holds_bulk
    for _ in range(QUIET_SAMPLES):
        auto.on_step_time(0.023)
        auto.on_realtime_ttft(0.05)
    auto.update(9.0 + QUIET_SETTLE, 0.023, bulk_in_flight=1)
    assert auto.phase is Phase.ACTIVE
    assert (auto.idle_step, auto.idle_ttft) == (pytest.approx(0.023), pytest.approx(0.05))


series = st.lists(
    st.tuples(
        st.floats(0.001, 0.5),  # step time
        st.integers(0, 300),  # running
        st.integers(0, 300),  # waiting
        st.sampled_from(["answer", "overload", "blocked", "none"]),
    ),
    max_size=60,
)


@settings(deadline=None)  # a long series on a busy machine outlasts the default 200 ms
@given(events=series)
def test_bulk_only_work_is_exactly_as_without_an_slo(
    events: list[tuple[float, int, int, str]],
) -> None:
    """No realtime call: the default's controller moves exactly as ``slo=None``'s."""
    default = AdmissionController(ceiling=256, max_reserve=16, slo="auto")
    off = AdmissionController(ceiling=256, max_reserve=16, slo=None)
    now = 0.0
    for step, running, waiting, event in events:
        for controller in (default, off):
            controller.on_step_time(step)
            controller.on_load(now, waiting=waiting, running=running, kv_cache_usage=0.5)
            if event == "answer":
                controller.on_answer()
                controller.on_bulk_answer(32)
            elif event == "overload":
                controller.on_overload()
            elif event == "blocked":
                controller.on_blocked()
            controller.on_realtime_in_flight(now, 0)
            controller.update(now, bulk_in_flight=controller.limit)
        assert default.limit == off.limit
        assert default.slo is None
        now += 0.6


def test_the_controller_holds_bulk_while_it_measures_then_follows_the_target() -> None:
    controller = AdmissionController(ceiling=256, max_reserve=8, slo="auto")
    controller.update(0.0, bulk_in_flight=247)
    assert controller.limit == 255  # dormant: as without an SLO
    controller.on_step_time(0.3)
    controller.on_realtime_in_flight(1.0, 1)
    controller.update(1.0, bulk_in_flight=247)
    assert controller.limit == 1  # measuring
    assert controller.state().slo_auto is not None
    assert controller.state().slo_auto.startswith("measuring")  # type: ignore[union-attr]
    controller.update(1.6, bulk_in_flight=1)  # drained
    for t in (2.0, 2.5, 3.0, 3.5, 4.0):  # the first read is before the settle
        controller.on_step_time(0.025)
        controller.update(t + 0.2, bulk_in_flight=1)
    assert controller.slo is not None
    assert controller.slo.tpot == pytest.approx(0.075)
    names = [i.name for i in controller.inferences()]
    assert names[-1] == "slo_auto"
    assert controller.inferences()[-1].value == pytest.approx(0.075)


def test_a_step_taken_under_light_load_is_no_evidence_that_latency_ignores_load() -> None:
    auto = AutoTarget()
    auto.on_realtime(0.0)
    auto.update(0.0, 0.030, bulk_in_flight=4)  # hardly any bulk when realtime came
    auto.update(0.5, 0.030, bulk_in_flight=1)
    for _ in range(QUIET_SAMPLES):
        auto.on_step_time(0.029)
    auto.update(0.5 + QUIET_SETTLE, 0.029, bulk_in_flight=1)
    assert auto.phase is Phase.ACTIVE
    assert auto.loaded_step is None


def test_bulk_resumes_where_the_line_between_the_two_steps_meets_the_target() -> None:
    """Idle 23 ms at one sequence, 295 ms at 255: the 69 ms target lies 46/272 of the
    way, at 44 sequences (the simulator's step model at speed 1)."""
    auto = AutoTarget()
    auto.on_realtime(0.0)
    auto.update(0.0, 0.295, bulk_in_flight=255)
    auto.update(10.0, 0.295, bulk_in_flight=1)
    for _ in range(QUIET_SAMPLES):
        auto.on_step_time(0.023)
    auto.update(10.0 + QUIET_SETTLE, 0.023, bulk_in_flight=1)
    assert auto.phase is Phase.ACTIVE
    assert auto.start_limit() == pytest.approx(1 + (0.069 - 0.023) / (0.295 - 0.023) * 254)


def test_a_backlog_of_realtime_calls_running_at_once_is_no_quiet() -> None:
    auto = AutoTarget()
    auto.on_realtime(0.0)
    auto.update(0.0, 0.3, bulk_in_flight=200)
    auto.on_in_flight(9.0, bulk=1, realtime=30)  # the calls the drain held back
    auto.update(9.0, 0.3, bulk_in_flight=1)
    for t in (9.5, 10.5, 11.0):
        auto.on_step_time(0.054)  # 30 sequences' step
        auto.update(t, 0.054, bulk_in_flight=1)
    assert auto.holds_bulk
    auto.on_in_flight(11.2, bulk=1, realtime=1)
    for t in (11.5, 12.5, 13.0, 13.5):
        auto.on_step_time(0.023)
        auto.update(t, 0.023, bulk_in_flight=1)
    assert auto.phase is Phase.ACTIVE
    assert auto.idle_step == pytest.approx(0.023)
