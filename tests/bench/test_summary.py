"""Medians over interleaved rounds and the ratios built from them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from llmbatch_bench.metrics import Meter, Recorder, RunMetrics
from llmbatch_bench.summary import Summary, find_summary, median, ratio, summarize


def test_median_ignores_unmeasured_values() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert median([5.0, math.nan, None, 1.0, 3.0]) == 3.0
    assert math.isnan(median([]))
    assert math.isnan(median([math.nan, None]))


def test_ratio_is_nan_unless_both_sides_were_measured() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert math.isnan(ratio(1.0, 0.0))
    assert math.isnan(ratio(math.nan, 2.0))
    assert math.isnan(ratio(2.0, math.inf))


def round_of(label: str, cpu_us: float, *, repeat: int, failed: int = 0, rss: float = 50.0,
             latency: float = 0.001, scenario: str = "overhead",
             sent: int | None = None) -> RunMetrics:  # fmt: skip
    rec = Recorder()
    for _ in range(100):
        rec.success("single", latency, 1)
    for _ in range(failed):
        rec.failure("HTTP 500")
    meter = Meter(wall=2.0, cpu=cpu_us * 100 / 1e6, peak_rss_mb=rss)
    return rec.finish(
        scenario=scenario,
        contender="x",
        label=label,
        requested=100 + failed,
        meter=meter,
        extra={"repeat": repeat, **({"server_requests": sent} if sent is not None else {})},
    )


def test_summarize_groups_interleaved_rounds_by_label_in_first_seen_order() -> None:
    runs = [
        round_of("a", 10.0, repeat=0, latency=0.002),
        round_of("b", 50.0, repeat=0),
        round_of("a", 90.0, repeat=1, rss=70.0, latency=0.001),
        round_of("b", 40.0, repeat=1, failed=2),
        round_of("a", 12.0, repeat=2, latency=0.003),
        round_of("a", 1.0, repeat=0, scenario="chat"),
    ]
    summaries = summarize(runs)
    assert [(s.scenario, s.label, s.rounds) for s in summaries] == [
        ("overhead", "a", 3),
        ("overhead", "b", 2),
        ("chat", "a", 1),
    ]
    a = find_summary(summaries, "overhead", "a")
    assert a is not None
    assert a.cpu_us_per_prompt == pytest.approx(12.0)  # 90 is an outlier round
    assert (a.cpu_us_min, a.cpu_us_max) == pytest.approx((10.0, 90.0))
    assert a.p50_s == pytest.approx(0.002)
    assert a.peak_rss_mb == 70.0  # memory: the worst round
    assert a.ok == 300
    b = find_summary(summaries, "overhead", "b")
    assert b is not None
    assert (b.ok, b.failed) == (200, 2)
    assert b.cpu_us_per_prompt == pytest.approx(45.0)
    assert find_summary(summaries, "single", "a") is None


def test_latency_of_a_run_with_several_tiers_is_not_guessed() -> None:
    rec = Recorder()
    rec.success("batch", 1.0, 1)
    rec.success("realtime", 0.1, 1)
    run = rec.finish(scenario="s", contender="c", label="l", requested=2, meter=Meter(wall=1.0))
    (summary,) = summarize([run])
    assert math.isnan(summary.p50_s)


def test_summary_json_round_trip_maps_nan_to_null() -> None:
    rec = Recorder()
    rec.failure("boom")
    run = rec.finish(scenario="s", contender="c", label="l", requested=1, meter=Meter(wall=1.0))
    (summary,) = summarize([run])
    data = summary.to_json()
    assert data["cpu_us_per_prompt"] is None
    back = Summary.from_json(data)
    assert math.isnan(back.cpu_us_per_prompt)
    assert back.to_json() == data


def test_cpu_seconds_and_server_requests_are_medians_of_the_rounds() -> None:
    runs = [
        round_of("a", 10.0, repeat=0, sent=20),
        round_of("a", 30.0, repeat=1, sent=400, failed=1),
        round_of("a", 20.0, repeat=2, sent=21),
        round_of("b", 10.0, repeat=0),
    ]
    a, b = summarize(runs)
    assert a.cpu_s == pytest.approx(20.0 * 100 / 1e6)
    assert a.server_requests == 21
    assert a.per_round == 100  # 300 ok + 1 failed over 3 rounds
    assert math.isnan(b.server_requests)  # not counted: no verdict from it
    # A report written before these fields existed still loads.
    old = {k: v for k, v in a.to_json().items() if k not in ("cpu_s", "server_requests")}
    assert math.isnan(Summary.from_json(old).server_requests)


def test_the_collectors_time_a_prompt_is_the_median_of_the_rounds() -> None:
    def timed(cpu_us: float, gc_s: float | None, repeat: int) -> RunMetrics:
        run = round_of("map", cpu_us, repeat=repeat)
        extra = dict(run.extra) if gc_s is None else {**run.extra, "gc_s": gc_s}
        return dataclasses.replace(run, extra=extra)

    # 100 prompts a round: 0.0002 s is 2 µs a prompt.
    (summary,) = summarize([timed(10.0, 0.0002, 0), timed(11.0, 0.0009, 1), timed(12.0, 0.0003, 2)])
    assert summary.gc_us_per_prompt == pytest.approx(3.0)
    (untimed,) = summarize([timed(10.0, None, 0)])
    assert math.isnan(untimed.gc_us_per_prompt)
    assert untimed.to_json()["gc_us_per_prompt"] is None
    # A report written before the collector was timed still loads.
    old = {k: v for k, v in summary.to_json().items() if k != "gc_us_per_prompt"}
    assert math.isnan(Summary.from_json(old).gc_us_per_prompt)
