"""Targets judged from made-up runs, and the report's tables, JSON and plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from llmbatch_bench.hotpath import plan as hotplan
from llmbatch_bench.metrics import Meter, Recorder, RunMetrics
from llmbatch_bench.plots import write_plots
from llmbatch_bench.report import render, write_json
from llmbatch_bench.summary import summarize
from llmbatch_bench.targets import Target, capacity, evaluate, judge


def run(
    scenario: str,
    label: str,
    *,
    ok: int = 100,
    wall: float = 1.0,
    cpu: float = 0.001,
    latency: float = 0.1,
    tier: str = "batch",
    failed: int = 0,
    requested: int | None = None,
    rss: float = 50.0,
    contender: str | None = None,
    repeat: int = 0,
    extra: dict[str, Any] | None = None,
) -> RunMetrics:
    rec = Recorder()
    for _ in range(ok):
        rec.success(tier, latency, 8, ttft=latency / 10 if tier == "realtime" else None)
    for _ in range(failed):
        rec.failure("HTTP 500")
    return rec.finish(
        scenario=scenario,
        contender=contender or label.split(" ")[0],
        label=label,
        requested=requested if requested is not None else ok + failed,
        meter=Meter(wall=wall, cpu=cpu, rss_before_mb=40.0, peak_rss_mb=rss),
        extra={"repeat": repeat, **(extra or {})},
    )


def us(scenario: str, label: str, per_prompt: list[float], ok: int = 1000,
       gc_us: float | None = None) -> list[RunMetrics]:  # fmt: skip
    """One run per round with the given CPU µs per prompt (``gc_us`` of it the
    collector's, when given)."""
    timed = {} if gc_us is None else {"gc_s": gc_us * ok / 1e6}
    return [
        run(scenario, label, ok=ok, cpu=v * ok / 1e6, repeat=i, extra=timed)
        for i, v in enumerate(per_prompt)
    ]


def single(label: str, latencies_us: list[float]) -> list[RunMetrics]:
    """One round per value, every call of it taking that long."""
    return [
        run("single", label, ok=50, latency=v / 1e6, tier="single", repeat=i)
        for i, v in enumerate(latencies_us)
    ]


def rounds(scenario: str, label: str, cpu_us: list[float], sent: list[int], ok: int = 2000
           ) -> list[RunMetrics]:  # fmt: skip
    """One run per round: CPU µs per call, and the requests the server counted."""
    return [
        run(scenario, label, ok=ok, cpu=c * ok / 1e6, repeat=i, extra={"server_requests": n})
        for i, (c, n) in enumerate(zip(cpu_us, sent, strict=True))
    ]


def full_set() -> list[RunMetrics]:
    return [
        run("sweep", "probe c=64", ok=800, extra={"concurrency": 64}),
        run("sweep", "probe c=256", ok=1000, extra={"concurrency": 256}),
        run("bulk", "llmbatch", ok=960, cpu=0.0096),
        run("bulk", "openai", ok=400, cpu=1.2),
        *_ceiling_runs("standard"),
        run("idle", "llmbatch", tier="realtime", latency=0.010),
        run("mixed", "llmbatch", tier="realtime", latency=0.014),
        run("idle", "aiohttp", tier="realtime", latency=0.010),
        run("mixed", "aiohttp", tier="realtime", latency=2.0),
        # Interleaved rounds; medians 12, 10, 2000 µs; one noisy round each.
        *us("overhead", hotplan.MAP, [12.0, 30.0, 11.0], gc_us=2.5),
        *us("overhead", hotplan.PROBE, [10.0, 9.0, 10.0]),
        *us("overhead", hotplan.OPENAI, [2000.0, 1900.0, 2500.0], ok=100),
        run("burst", hotplan.BARE, ok=100_000, cpu=1.0, rss=106.0),
        run("burst", hotplan.GATHER, ok=100_000, cpu=3.0, rss=250.0),
        run("burst", hotplan.MAP, ok=100_000, cpu=1.2, rss=90.0),
        *single(hotplan.RAW, [300.0, 310.0, 290.0]),
        *single(hotplan.SINGLE_REALTIME, [400.0, 420.0, 380.0]),
        *us("chat", hotplan.COMPLETIONS, [12.0, 12.0, 12.0]),
        *us("chat", hotplan.CHAT, [15.0, 16.0, 17.0]),
        # Medians: 4,000 vs 700 µs per call, 2,000 vs 32 requests.
        *rounds("dropin", hotplan.DROPIN_OPENAI, [4000.0, 3900.0, 4500.0], [2000] * 3),
        *rounds("dropin", hotplan.DROPIN, [700.0, 1200.0, 650.0], [32, 30, 40]),
        *rounds("embed", hotplan.COMPLETIONS, [20.0, 21.0], [160, 160], ok=10_000),
        *rounds("embed", hotplan.EMBED, [200.0, 210.0], [160, 161], ok=10_000),
        *rounds("embed", hotplan.EMBED_BASE64, [40.0, 42.0], [160, 160], ok=10_000),
        *rounds("embed", hotplan.OPENAI_EMBED, [2000.0, 2100.0], [1000, 1000], ok=1000),
    ]


def by_id(runs: list[RunMetrics]) -> dict[str, Target]:
    return {t.id: t for t in evaluate(runs)}


def test_judge_applies_the_comparison_and_skips_the_unmeasured() -> None:
    assert judge(20.0, "<=", 20.0) is True
    assert judge(20.0, "<", 20.0) is False
    assert judge(9.9, ">=", 10.0) is False
    assert judge(0.0, "==", 0.0) is True
    assert judge(math.nan, "<=", 1.0) is None
    assert judge(None, "<=", 1.0) is None


def test_capacity_is_the_best_sweep_point() -> None:
    best = capacity(full_set())
    assert best is not None
    assert best.label == "probe c=256"
    assert capacity([run("bulk", "llmbatch")]) is None


def test_every_target_met_with_medians_of_the_rounds() -> None:
    targets = by_id(full_set())
    assert targets["bulk_throughput"].value == pytest.approx(0.96)
    assert targets["realtime_p99_ratio"].value == pytest.approx(1.4)
    # The 30 µs round is noise: the median ignores it.
    assert targets["overhead_cpu"].value == pytest.approx(12.0)
    assert targets["overhead_vs_probe"].value == pytest.approx(1.2)
    assert targets["overhead_vs_openai"].value == pytest.approx(2000.0 / 12.0)
    assert targets["burst_complete"].value == 0
    assert targets["burst_cpu_ratio"].value == pytest.approx(2.5)
    assert targets["burst_rss"].value == pytest.approx(250.0)
    assert targets["single_added_p50"].value == pytest.approx(100.0)
    assert targets["single_added_p99"].value == pytest.approx(100.0)
    assert targets["chat_cpu_ratio"].value == pytest.approx(16.0 / 12.0)
    assert targets["dropin_requests"].value == pytest.approx(2000 / 32)
    assert targets["dropin_cpu"].value == pytest.approx(4000 / 700)
    assert targets["dropin_cpu"].detail == (
        "4,000 vs 700 µs per call (8.00 vs 1.40 s for 2,000 calls), medians of 3"
    )
    assert {t.id: t.met for t in targets.values() if t.met is not True} == {}
    # The baseline's queueing shows up beside ours.
    assert "aiohttp: p99 2000 ms loaded vs 10 ms idle = 200.00x" in (
        targets["realtime_p99_ratio"].detail
    )
    # llmbatch's own memory per waiting call, over the bare gather: 144 MB / 100k.
    assert "1.47 KB per call" in targets["burst_rss"].detail


def replace(runs: list[RunMetrics], scenario: str, label: str, new: list[RunMetrics]) -> None:
    runs[:] = [r for r in runs if (r.scenario, r.label) != (scenario, label)] + new


def test_misses_are_reported_with_their_values() -> None:
    runs = full_set()
    replace(runs, "bulk", "llmbatch", [run("bulk", "llmbatch", ok=900)])
    replace(runs, "overhead", hotplan.MAP, us("overhead", hotplan.MAP, [25.0, 24.0, 26.0]))
    gather = run("burst", hotplan.GATHER, ok=99_000, failed=10, requested=100_000, rss=400.0)
    replace(runs, "burst", hotplan.GATHER, [gather])
    replace(runs, "single", hotplan.SINGLE_REALTIME, single(hotplan.SINGLE_REALTIME, [500.0]))
    replace(runs, "chat", hotplan.CHAT, us("chat", hotplan.CHAT, [40.0]))
    replace(runs, "dropin", hotplan.DROPIN, rounds("dropin", hotplan.DROPIN, [1000.0], [500]))
    targets = by_id(runs)
    assert targets["bulk_throughput"].met is False
    assert targets["bulk_throughput"].value == pytest.approx(0.9)
    assert (targets["overhead_cpu"].value, targets["overhead_cpu"].met) == (25.0, False)
    assert targets["overhead_vs_probe"].value == pytest.approx(2.5)
    assert targets["overhead_vs_probe"].met is False
    assert targets["overhead_vs_openai"].value == pytest.approx(80.0)
    assert targets["overhead_vs_openai"].met is True
    assert targets["burst_complete"].value == 1000  # 10 failed + 990 unfinished
    assert targets["burst_complete"].met is False
    assert "99,000 ok, 10 failed, 990 unfinished of 100,000" in targets["burst_complete"].detail
    assert targets["burst_rss"].met is False
    assert targets["single_added_p50"].value == pytest.approx(200.0)
    assert targets["single_added_p50"].met is False
    assert targets["chat_cpu_ratio"].met is False
    assert (targets["dropin_requests"].value, targets["dropin_requests"].met) == (4.0, False)
    assert (targets["dropin_cpu"].value, targets["dropin_cpu"].met) == (4.0, False)
    assert targets["dropin_requests"].detail == (
        "2,000 vs 500 HTTP requests for 2,000 calls, medians of 1"
    )


def test_dropin_requests_on_a_server_that_does_not_count_them() -> None:
    runs = [
        *us("dropin", hotplan.DROPIN_OPENAI, [4000.0], ok=2000),
        *us("dropin", hotplan.DROPIN, [500.0], ok=2000),
    ]
    targets = by_id(runs)
    assert targets["dropin_requests"].met is None
    assert targets["dropin_requests"].detail == (
        "not counted: the server exports no http_requests_total"
    )
    assert (targets["dropin_cpu"].value, targets["dropin_cpu"].met) == (8.0, True)


def test_unmeasured_targets_are_none() -> None:
    targets = by_id([run("bulk", "llmbatch")])
    assert {t.id for t in targets.values() if t.met is not None} == set()
    assert targets["overhead_cpu"].detail == "needs the overhead scenario"
    assert all(math.isfinite(t.threshold) for t in targets.values())
    # JSON has no NaN: unmeasured values are null.
    assert all(t.to_json()["value"] is None for t in targets.values())


def report(runs: list[RunMetrics]) -> dict[str, Any]:
    return {
        "schema": "llmbatch-bench/1",
        "runs": [r.to_json() for r in runs],
        "summaries": [s.to_json() for s in summarize(runs)],
        "targets": [t.to_json() for t in evaluate(runs)],
    }


def rows_of(text: str, title: str) -> dict[str, list[str]]:
    """The rows of the table under ``### title``, by first cell."""
    block = text.split(f"### {title}", 1)[1].split("###", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    return {c[0]: c[1:] for c in cells}


def test_render_has_a_table_per_scenario_and_the_verdicts() -> None:
    text = render(report(full_set()))
    for title in (
        "Capacity sweep", "Bulk", "Mixed", "Overhead", "Chat", "Embed", "Single", "Burst",
        "Drop-in: 2,000 concurrent completions.create calls",
    ):  # fmt: skip
        assert f"### {title}" in text
    assert "| probe c=256 (best) |" in text
    assert "96.0 %" in text  # llmbatch's share of capacity
    assert "Transport" not in text  # not measured, not shown
    assert "Scale" not in text


def test_overhead_table_shows_medians_spread_and_ratios() -> None:
    rows = rows_of(render(report(full_set())), "Overhead")
    # ok over all rounds, median, range, of it GC, prompts/s, vs map, vs probe
    assert rows[hotplan.MAP][:2] == ["3,000/3,000", "12.0"]
    assert rows[hotplan.MAP][2:4] == ["11.0 to 30.0", "2.5"]
    assert rows[hotplan.MAP][5:] == ["1.00x", "1.20x"]
    assert rows[hotplan.OPENAI][3] == "-"  # the collector not timed
    assert rows[hotplan.OPENAI][5:] == ["166.67x", "200.00x"]
    assert "median of 3 interleaved rounds" in render(report(full_set()))


def test_dropin_table_shows_requests_cpu_and_both_ratios() -> None:
    rows = rows_of(render(report(full_set())), "Drop-in")
    # ok, HTTP requests, calls/request, CPU s, CPU µs/call, range, wall s, calls/s,
    # requests ratio, CPU ratio
    assert rows[hotplan.DROPIN_OPENAI] == [
        "6,000/6,000", "2,000", "1.0", "8.00", "4,000", "3,900 to 4,500", "1.00", "2,000",
        "1.0x", "1.00x",
    ]  # fmt: skip
    assert rows[hotplan.DROPIN][:5] == ["6,000/6,000", "32", "62.5", "1.40", "700"]
    assert rows[hotplan.DROPIN][-2:] == ["62.5x", "5.71x"]


def test_embed_table_shows_cost_per_item_and_requests() -> None:
    rows = rows_of(render(report(full_set())), "Embed")
    # ok, CPU µs/item, range, items/s, HTTP requests, items/request, vs completions
    assert rows[hotplan.COMPLETIONS][4:] == ["160", "62.5", "1.00x"]
    assert rows[hotplan.EMBED][1] == "205.0"
    assert rows[hotplan.EMBED][4:] == ["160", "62.3", "10.00x"]  # median 160.5 requests
    assert rows[hotplan.EMBED_BASE64][4:] == ["160", "62.5", "2.00x"]
    assert rows[hotplan.OPENAI_EMBED][4:] == ["1,000", "1.0", "100.00x"]


def test_single_table_shows_added_latency_over_raw() -> None:
    rows = rows_of(render(report(full_set())), "Single")
    # p50 µs, p99 µs, added p50, added p99
    assert rows[hotplan.RAW][1:5] == ["300", "300", "-", "-"]
    assert rows[hotplan.SINGLE_REALTIME][1:5] == ["400", "400", "100", "100"]


def test_burst_table_shows_memory_over_the_bare_baseline() -> None:
    rows = rows_of(render(report(full_set())), "Burst")
    # ..., CPU µs/prompt, vs map, peak RSS MB, over bare KB/call
    assert rows[hotplan.GATHER][4:8] == ["30.0", "2.50x", "250", "1.47"]
    assert rows[hotplan.BARE][5:8] == ["-", "106", "-"]


def test_targets_table_states_value_threshold_and_verdict() -> None:
    runs = full_set()
    replace(runs, "chat", hotplan.CHAT, us("chat", hotplan.CHAT, [40.0]))
    rows = rows_of(render(report(runs)), "Targets")
    assert rows["overhead_cpu"][:3] == ["12.0 µs", "≤ 20.0 µs", "met"]
    assert rows["chat_cpu_ratio"][:3] == ["3.33x", "≤ 1.50x", "MISSED"]
    assert rows["burst_rss"][:3] == ["250 MB", "< 300 MB", "met"]
    assert rows["burst_complete"][:3] == ["0 calls", "= 0 calls", "met"]
    assert rows["single_added_p99"][:3] == ["100.0 µs", "< 400.0 µs", "met"]


def test_render_without_summaries_computes_them() -> None:
    data = report(full_set())
    del data["summaries"]
    assert rows_of(render(data), "Overhead")[hotplan.MAP][1] == "12.0"


def test_json_is_standard_and_plots_are_written(tmp_path: Path) -> None:
    data = report(full_set())
    write_json(data, tmp_path / "out" / "bench.json")
    loaded = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert loaded["runs"][0]["latency"]["batch"]["p99"] == pytest.approx(0.1)
    assert loaded["summaries"][0]["label"] == "probe c=64"
    written = write_plots(data, tmp_path / "img")
    names = sorted(p.name for p in written)
    assert names == [
        "bench-burst.png",
        "bench-cpu.png",
        "bench-realtime.png",
        "bench-throughput.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_a_run_lists_only_the_targets_its_scenarios_measure() -> None:
    runs = full_set()
    every = {t.id for t in evaluate(runs)}
    single = {t.id for t in evaluate(runs, ["single"])}
    assert single == {t.id for t in evaluate(runs) if t.id.startswith("single_")}
    assert single < every
    assert evaluate(runs, ["embed"]) == []  # measures no target of its own
    # A target two scenarios measure is listed when either ran (unmeasured, it says
    # what it needs).
    bulk = {t.id: t for t in evaluate([], ["bulk"])}
    assert set(bulk) == {"bulk_throughput"}
    assert bulk["bulk_throughput"].met is None


def _ceiling_runs(shape: str) -> list[RunMetrics]:
    """llmbatch at 900 prompts/s, aiohttp at 400, beside an offline 1,000."""
    context = {"ceiling_prompts_per_s": 1000.0, "prompt_shape": shape}
    return [
        run("ceiling", "llmbatch", ok=900, extra={**context, "engine_cpu_s": 0.9}),
        run("ceiling", "aiohttp", ok=400, extra=context),
    ]


@pytest.mark.parametrize(
    ("shape", "share_met", "lead_met"), [("short", False, True), ("standard", True, True)]
)
def test_ceiling_targets_hold_llmbatch_to_the_offline_engine_and_the_best_baseline(
    shape: str, share_met: bool, lead_met: bool
) -> None:
    targets = {t.id: t for t in evaluate(_ceiling_runs(shape), ["ceiling"])}
    share, lead = targets["ceiling_share"], targets["ceiling_vs_baseline"]
    assert share.value == pytest.approx(0.9)
    assert share.threshold == (0.95 if shape == "short" else 0.9)
    assert share.met is share_met
    assert lead.value == pytest.approx(2.25)
    assert lead.threshold == (2.0 if shape == "short" else 1.0)
    assert lead.met is lead_met
    assert "LLM.generate 1000 prompts/s" in share.detail


def test_ceiling_targets_without_the_scenario_are_unmeasured() -> None:
    targets = {t.id: t for t in evaluate([], ["ceiling"])}
    assert targets["ceiling_share"].met is None
    assert "--vllm" in targets["ceiling_share"].detail


def test_ceiling_table_starts_with_the_offline_run_and_gives_each_share() -> None:
    data = report(_ceiling_runs("short"))
    data["ceiling"] = {
        "prompts": 2000, "prompts_per_s": 1000.0, "output_tokens_per_s": 4000.0,
        "front_cpu_s": 1.0, "engine_cpu_s": 2.0, "prompt_shape": "short",
    }  # fmt: skip
    rows = rows_of(render(data), "The engine's ceiling")
    # ok, prompts/s, tokens/s, share, client CPU, API server CPU, engine CPU
    assert rows["vLLM LLM.generate (offline)"] == [
        "2000/2000", "1,000", "4,000", "1.00x", "-", "500", "1,000",
    ]  # fmt: skip
    assert rows["llmbatch"][3] == "0.90x"
    assert rows["llmbatch"][6] == "1,000"  # 0.9 s over 900 prompts
    assert rows["aiohttp"][3] == "0.40x"
    assert "### The engine's ceiling" not in render(report(_ceiling_runs("short")))


def _ceiling_rounds() -> list[RunMetrics]:
    """Three interleaved rounds: llmbatch 900, 700, 950 prompts/s; aiohttp 800, 990,
    850 (each round's first-run leader differs; the medians decide)."""
    context = {"ceiling_prompts_per_s": 1000.0, "prompt_shape": "mixed"}
    runs = []
    for k, (ours, theirs) in enumerate([(900, 800), (700, 990), (950, 850)]):
        round_ = {**context, "round": k + 1}
        runs.append(run("ceiling", "llmbatch", ok=ours, repeat=k, extra=round_))
        runs.append(run("ceiling", "aiohttp", ok=theirs, repeat=k, extra=round_))
    return runs


def test_ceiling_targets_judge_the_medians_of_interleaved_rounds() -> None:
    targets = {t.id: t for t in evaluate(_ceiling_rounds(), ["ceiling"])}
    assert targets["ceiling_share"].value == pytest.approx(0.9)  # median 900 of 1,000
    assert targets["ceiling_vs_baseline"].value == pytest.approx(900 / 850)
    assert "aiohttp 850" in targets["ceiling_vs_baseline"].detail


def test_bulk_target_judges_the_median_of_its_rounds() -> None:
    runs = [run("sweep", "probe c=64", ok=1000)]
    runs += [run("bulk", "llmbatch", ok=ok, repeat=k) for k, ok in enumerate([500, 990, 960])]
    (bulk,) = [t for t in evaluate(runs, ["bulk"]) if t.id == "bulk_throughput"]
    assert bulk.value == pytest.approx(0.96)


def test_rounds_are_labelled_and_their_medians_tabled() -> None:
    data = report(_ceiling_rounds())
    data["ceiling"] = {"prompts": 2000, "prompts_per_s": 1000.0, "output_tokens_per_s": 4000.0}
    text = render(data)
    rows = rows_of(text, "The engine's ceiling")
    assert rows["llmbatch (round 2)"][1] == "700"
    medians = rows_of(text, "Medians over rounds")
    # rounds, median, range, vs best other, of the ceiling
    assert medians["llmbatch"] == ["3", "900", "700 to 950", "1.06x", "0.90x"]
    assert medians["aiohttp"][:2] == ["3", "850"]
    assert "Medians over rounds" not in render(report(_ceiling_runs("short")))
