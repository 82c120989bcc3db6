"""The frontier's arithmetic (``closedloop/frontier.py``): the bound, the oracle,
the line a plot draws, medians of rounds, and the controller's verdict."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch_bench.closedloop.frontier import (
    BATCH_SIZES,
    CAPS,
    CONTESTED,
    FASTEST,
    P99_SLACK,
    RESERVE,
    Point,
    by_chance,
    contested,
    from_runs,
    frontier,
    grid,
    judge,
    median_points,
    oracle,
    slo_bound,
)

points = st.lists(
    st.builds(
        Point,
        label=st.sampled_from([f"s{i}" for i in range(12)]),
        realtime_p99=st.floats(0.01, 10.0),
        bulk=st.floats(0.0, 1000.0),
    ),
    min_size=1,
    max_size=20,
)


def test_the_grid_brackets_cpu_and_gpu_engines() -> None:
    settings = grid()
    assert len(settings) == len(CAPS) * len(BATCH_SIZES)
    assert (settings[0].cap, settings[-1].cap) == (1, 256)
    assert settings[0].max_in_flight == 1 + RESERVE
    assert settings[0].label == "cap 1, batch 8"


def test_the_bound_is_the_first_token_then_fifteen_more() -> None:
    assert slo_bound(0.1, 0.02) == pytest.approx(0.1 + 15 * 0.02)
    with pytest.raises(ValueError, match="tokens"):
        slo_bound(0.1, 0.02, tokens=0)


@pytest.mark.parametrize("tpot", [0.001, 0.0125, 0.02, 0.5])
def test_a_per_token_slo_is_judged_at_the_first_token_the_client_derives(tpot: float) -> None:
    from llmbatch._control.admission import derived_ttft as client
    from llmbatch_bench.closedloop.frontier import derived_ttft

    assert derived_ttft(tpot) == client(tpot)


def test_the_oracle_is_the_most_bulk_that_meets_the_bound() -> None:
    statics = [Point("a", 0.5, 100.0), Point("b", 0.9, 300.0), Point("c", 1.5, 900.0)]
    assert oracle(statics, 1.0) == statics[1]
    assert oracle(statics, 0.4) is None


@given(points, st.floats(0.01, 10.0))
def test_no_point_within_the_bound_has_more_bulk_than_the_oracle(
    statics: list[Point], bound: float
) -> None:
    best = oracle(statics, bound)
    meeting = [p for p in statics if p.realtime_p99 <= bound]
    if best is None:
        assert not meeting
    else:
        assert best.realtime_p99 <= bound
        assert all(p.bulk <= best.bulk for p in meeting)


@given(points)
def test_the_frontier_is_every_point_no_other_beats(statics: list[Point]) -> None:
    line = frontier(statics)
    # Along the line, realtime gets slower only as bulk grows.
    for slower, faster in itertools.pairwise(reversed(line)):
        assert faster.realtime_p99 <= slower.realtime_p99
        assert faster.bulk < slower.bulk
    for point in statics:
        beaten = any(
            q.realtime_p99 <= point.realtime_p99 and q.bulk >= point.bulk and q != point
            for q in statics
        )
        assert point in line or beaten


def test_medians_are_taken_per_setting_over_rounds() -> None:
    rounds = [
        [Point("a", 1.0, 10.0), Point("b", 2.0, 20.0)],
        [Point("a", 3.0, 30.0), Point("b", 2.0, 40.0)],
        [Point("a", 2.0, 20.0), Point("b", 9.0, 30.0)],
    ]
    assert median_points(rounds) == [Point("a", 2.0, 20.0), Point("b", 2.0, 30.0)]


STATICS = [Point("cap 1", 0.8, 100.0), Point("cap 4", 0.95, 150.0), Point("cap 16", 2.0, 400.0)]


@pytest.mark.parametrize(
    ("controller", "unreachable", "met", "says"),
    [
        (Point("slo", 1.05, 140.0), False, True, "p99 1.05x the bound, bulk 0.93x cap 4's"),
        (Point("slo", 1.2, 150.0), False, False, "1.20x the bound"),
        (Point("slo", 0.9, 100.0), False, False, "bulk is 0.67x the oracle's (cap 4)"),
        (Point("slo", 0.9, 150.0), True, False, "said the SLO is unreachable, but cap 4 met it"),
    ],
)
def test_where_a_static_setting_meets_the_slo_the_controller_must_too(
    controller: Point, unreachable: bool, met: bool, says: str
) -> None:
    verdict = judge(controller, STATICS, 1.0, unreachable=unreachable)
    assert verdict.met is met
    assert says in verdict.reason
    assert verdict.oracle == STATICS[1]


@pytest.mark.parametrize(
    ("controller", "unreachable", "met"),
    [
        (Point("slo", 0.85, 50.0), True, True),  # said so, and as fast as the best static
        (Point("slo", 0.85, 50.0), False, False),  # did not say so
        (Point("slo", 1.5, 50.0), True, False),  # said so, but slower than 1.1x the best
    ],
)
def test_where_none_meets_it_the_client_must_say_so_and_stay_fast(
    controller: Point, unreachable: bool, met: bool
) -> None:
    verdict = judge(controller, STATICS, 0.5, unreachable=unreachable)
    assert verdict.oracle is None
    assert verdict.bulk_share is None
    assert verdict.met is met


@given(points, st.floats(0.01, 10.0), st.floats(0.01, 10.0), st.floats(0.0, 1000.0))
def test_a_met_verdict_keeps_its_promises(
    statics: list[Point], bound: float, p99: float, bulk: float
) -> None:
    verdict = judge(Point("slo", p99, bulk), statics, bound, unreachable=False)
    if verdict.met:
        assert verdict.oracle is not None
        assert verdict.bulk_share is not None
        assert p99 <= 1.1 * bound
        assert verdict.bulk_share >= 0.9


def _run(label: str, p99: float | None, bulk: float, *, unreachable: bool = False) -> dict:  # type: ignore[type-arg]
    latency = {"realtime": {"n": 30, "p50": 0.01, "p95": 0.02, "p99": p99, "max": p99}}
    return {
        "scenario": "frontier",
        "label": label,
        "latency": latency if p99 is not None else {},
        "prompts_per_s": bulk,
        "extra": {"bound_s": 0.1, "slo_unreachable": unreachable},
    }


def test_runs_are_read_back_as_medians_with_the_controllers_word() -> None:
    runs = [
        {"scenario": "frontier", "label": "realtime alone, streamed (idle)", "extra": {}},
        _run("static cap 1, batch 8", 0.04, 10.0),
        _run("static cap 8, batch 8", 0.09, 50.0),
        _run("controller, SLO", 0.08, 40.0),
        _run("controller, SLO", 0.2, 44.0, unreachable=True),
        _run("static cap 8, batch 8", 0.13, 70.0),
        _run("static cap 1, batch 8", 0.05, 12.0),
        _run("static cap 64, batch 8", None, 90.0),  # no realtime answer at all
    ]
    found = from_runs(runs, "controller, SLO")
    assert found is not None
    # cap 64 ran once: the fewest rounds of any setting, the controller's two.
    assert (found.bound, found.rounds, found.confirmed, found.unreachable) == (0.1, 1, 2, True)
    assert [(p.label, p.realtime_p99, p.bulk) for p in found.statics] == [
        ("static cap 1, batch 8", pytest.approx(0.045), 11.0),
        ("static cap 8, batch 8", pytest.approx(0.11), 60.0),
        ("static cap 64, batch 8", float("inf"), 90.0),
    ]
    assert found.controller == Point("controller, SLO", pytest.approx(0.14), 42.0)
    # cap 8's median p99 (0.11 s) is over the bound: cap 1 is the oracle, and the
    # controller said "unreachable" where it was not.
    verdict = found.verdict()
    assert verdict is not None
    assert verdict.oracle is not None
    assert (verdict.oracle.label, verdict.met) == ("static cap 1, batch 8", False)
    assert "unreachable" in verdict.reason


def test_without_the_bound_there_is_nothing_to_read() -> None:
    assert from_runs([{"scenario": "slo", "label": "x", "extra": {}}], "controller, SLO") is None


def test_the_confirming_rounds_run_the_settings_near_the_bound() -> None:
    statics = [
        Point("cap 1", 0.3, 10.0),
        Point("cap 8", 0.9, 50.0),
        Point("cap 16", 1.4, 80.0),
        Point("cap 64", 5.0, 120.0),
        Point("cap 256", float("inf"), 130.0),
    ]
    assert contested(statics, 1.0) == ["cap 1", "cap 8", "cap 16"]
    # None near: the fastest, the best static p99 the controller is then held to.
    assert contested(statics, 0.1) == ["cap 1", "cap 8", "cap 16"]
    assert contested(statics[3:], 0.1) == ["cap 64"]
    with pytest.raises(ValueError, match="bound"):
        contested(statics, 0.0)


@given(points, st.floats(0.01, 10.0))
def test_no_confirmed_round_could_have_changed_a_verdict_left_out(
    statics: list[Point], bound: float
) -> None:
    chosen = set(contested(statics, bound))
    for point in statics:
        if point.realtime_p99 <= CONTESTED * bound:
            assert point.label in chosen
    if not any(p.realtime_p99 <= CONTESTED * bound for p in statics):
        assert len(chosen) <= FASTEST
        fastest = min(p.realtime_p99 for p in statics)
        assert any(p.label in chosen for p in statics if p.realtime_p99 == fastest)


def test_confirming_rounds_are_counted_apart_and_unreachable_is_a_majority() -> None:
    runs = [
        _run("static cap 1, batch 8", 0.04, 10.0),
        _run("static cap 64, batch 8", 0.9, 90.0),
        _run("controller, SLO", 0.08, 40.0, unreachable=True),
        _run("static cap 64, batch 8", 0.8, 90.0),
        _run("static cap 1, batch 8", 0.05, 12.0),
        _run("controller, SLO", 0.2, 44.0),
        # Confirming rounds: cap 1 and the controller again.
        _run("static cap 1, batch 8", 0.2, 11.0),
        _run("controller, SLO", 0.07, 42.0),
        _run("controller, SLO", 0.09, 41.0),
        _run("static cap 1, batch 8", 0.05, 12.0),
    ]
    found = from_runs(runs, "controller, SLO")
    assert found is not None
    assert (found.rounds, found.confirmed) == (2, 4)
    assert "medians of 2 rounds (4 for the controller" in found.medians_of
    # Said in one round of four: not what its rounds' median says.
    assert not found.unreachable
    assert found.controller == Point("controller, SLO", pytest.approx(0.085), 41.5)
    said_twice = [*runs, _run("controller, SLO", 0.07, 40.0, unreachable=True)]
    found = from_runs(said_twice, "controller, SLO")
    assert found is not None
    assert found.unreachable is False  # two of five
    found = from_runs([*said_twice, _run("controller, SLO", 0.07, 40.0, unreachable=True)],
                      "controller, SLO")  # fmt: skip
    assert found is not None
    assert found.unreachable is True  # three of six


def test_settings_alike_make_their_best_low_by_chance() -> None:
    # Seven settings whose rounds spread alike (1.0 to 1.6 of some bound): the best
    # of their medians of four is below what one of them measures, and a setting
    # like them misses 1.1x of that best in a share of draws that is no skill's.
    spread = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    rounds = {f"s{i}": [spread[(i + k) % 7] for k in range(4)] for i in range(7)}
    chance = by_chance(rounds, 4)
    assert chance is not None
    assert (chance.settings, chance.rounds, chance.pooled) == (7, 28, 1.3)
    assert chance.best_low <= chance.best < chance.pooled
    assert chance.best <= chance.best_high
    assert 0.2 < chance.within < 0.9
    assert by_chance(rounds, 4) == chance  # seeded: the same rounds read the same
    assert "7 settings" in chance.describe(1.0)
    # Rounds that do not spread leave nothing to chance.
    steady = by_chance({"a": [1.0, 1.0], "b": [1.0, 1.0, 1.0]}, 2)
    assert steady is not None
    assert (steady.best, steady.within) == (1.0, 1.0)


def test_chance_needs_several_settings_and_finite_rounds() -> None:
    assert by_chance({"a": [1.0, 2.0]}, 4) is None
    assert by_chance({"a": [1.0], "b": [float("inf")]}, 4) is None
    assert by_chance({"a": [1.0], "b": []}, 4) is None
    assert by_chance({"a": [1.0], "b": [2.0]}, 0) is None
    with pytest.raises(ValueError, match="draws"):
        by_chance({"a": [1.0], "b": [2.0]}, 1, draws=0)


@given(
    st.lists(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=6), min_size=2, max_size=8),
    st.integers(1, 6),
)
def test_the_best_by_chance_is_within_the_rounds(rounds: list[list[float]], n: int) -> None:
    chance = by_chance({f"s{i}": r for i, r in enumerate(rounds)}, n, draws=200)
    assert chance is not None
    pool = [x for r in rounds for x in r]
    assert min(pool) <= chance.best_low <= chance.best <= chance.best_high <= max(pool)
    assert 0.0 <= chance.within <= 1.0
    if chance.best_low * P99_SLACK >= max(pool):
        assert chance.within == 1.0  # any setting drawn from them is within


def test_the_sweep_reads_chance_only_where_no_static_setting_met_the_bound() -> None:
    slow = [
        _run("static cap 1, batch 8", 0.12, 10.0),
        _run("static cap 8, batch 8", 0.13, 50.0),
        _run("controller, SLO", 0.14, 40.0, unreachable=True),
        _run("static cap 8, batch 8", 0.12, 50.0),
        _run("static cap 1, batch 8", 0.13, 10.0),
        _run("controller, SLO", 0.12, 40.0, unreachable=True),
    ]
    found = from_runs(slow, "controller, SLO")
    assert found is not None
    assert found.p99s["static cap 1, batch 8"] == [0.12, 0.13]
    chance = found.chance()
    assert chance is not None
    assert (chance.settings, chance.rounds) == (2, 4)
    fast = [_run("static cap 1, batch 8", 0.05, 10.0)] * 2
    met = from_runs([*slow, *fast], "controller, SLO")
    assert met is not None
    assert met.chance() is None  # cap 1's median is within the bound now
