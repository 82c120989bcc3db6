"""The bench's arithmetic: percentiles, rates, CPU per prompt, JSON round trips."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from collections.abc import AsyncIterator

import pytest

from llmbatch_bench.jobs import (
    chat_inputs,
    embedding_inputs,
    poisson_arrivals,
    prompts,
    within_limit,
)
from llmbatch_bench.metrics import (
    Meter,
    Recorder,
    RunMetrics,
    measure,
    peak_rss_mb,
    percentile,
    percentiles,
)
from llmbatch_bench.server import api_posts


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 99) == pytest.approx(99.01)
    # Order of the input does not matter.
    assert percentile(list(reversed(values)), 99) == pytest.approx(99.01)


def test_percentile_edge_cases() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 3.0], 50) == 2.0
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)


def test_percentiles_summary() -> None:
    p = percentiles([0.5, 0.1, 0.3, 0.2, 0.4])
    assert (p.n, p.p50, p.max) == (5, 0.3, 0.5)
    assert p.p99 == pytest.approx(0.496)
    empty = percentiles([])
    assert empty.n == 0
    assert math.isnan(empty.p99)


def _meter(wall: float, cpu: float) -> Meter:
    return Meter(wall=wall, cpu=cpu, rss_before_mb=40.0, peak_rss_mb=50.0)


def test_recorder_rates_and_cpu_per_prompt() -> None:
    rec = Recorder()
    for i in range(8):
        rec.success("batch", 0.1 * (i + 1), output_tokens=16)
    rec.failure(TimeoutError())
    rec.failure("HTTP 503")
    rec.failure("HTTP 503")
    m = rec.finish(
        scenario="bulk", contender="x", label="x", requested=12, meter=_meter(wall=2.0, cpu=0.004)
    )
    assert (m.ok, m.failed, m.unfinished) == (8, 3, 1)
    assert m.errors == {"HTTP 503": 2, "TimeoutError": 1}
    assert m.prompts_per_s == pytest.approx(4.0)
    assert m.output_tokens == 128
    assert m.output_tokens_per_s == pytest.approx(64.0)
    # CPU per prompt divides the whole run's CPU by the prompts answered.
    assert m.cpu_us_per_prompt == pytest.approx(500.0)
    assert m.latency["batch"].p50 == pytest.approx(0.45)


def test_recorder_window_overrides_and_tiers() -> None:
    rec = Recorder()
    rec.success("batch", 1.0, 10)
    rec.success("batch", 1.0, 10)
    rec.success("realtime", 0.05, 4, ttft=0.01)
    assert rec.count("batch") == 2
    assert rec.tokens["batch"] == 20
    m = rec.finish(
        scenario="mixed",
        contender="x",
        label="x",
        requested=1,
        meter=_meter(wall=10.0, cpu=1.0),
        prompts=2,
        tokens=20,
        window=4.0,
    )
    assert m.prompts_per_s == pytest.approx(0.5)
    assert m.output_tokens_per_s == pytest.approx(5.0)
    assert set(m.latency) == {"batch", "realtime"}
    assert m.ttft["realtime"].p50 == pytest.approx(0.01)


def test_unfinished_requests_stay_in_the_latency_percentiles() -> None:
    rec = Recorder()
    for _ in range(99):
        rec.success("realtime", 0.01, 1)
    rec.unfinished("realtime", 12.0)
    m = rec.finish(
        scenario="mixed", contender="x", label="x", requested=100, meter=_meter(1.0, 0.1)
    )
    assert m.failed == 1
    assert m.errors == {"Unfinished": 1}
    assert m.latency["realtime"].max == 12.0
    assert m.extra["censored"] == {"realtime": 1}
    assert rec.count("realtime") == 99


def test_run_metrics_json_round_trip_maps_nan_to_null() -> None:
    rec = Recorder()
    rec.failure("boom")
    m = rec.finish(scenario="s", contender="c", label="c", requested=1, meter=_meter(1.0, 0.5))
    assert math.isnan(m.cpu_us_per_prompt)
    data = m.to_json()
    text = json.dumps(data, allow_nan=False)  # standard JSON: no NaN literals
    back = RunMetrics.from_json(json.loads(text))
    assert math.isnan(back.cpu_us_per_prompt)
    assert back.failed == 1
    assert back.to_json() == data


def test_measure_counts_this_process_cpu_not_sleep() -> None:
    with measure() as meter:
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:
            pass
        time.sleep(0.05)
    assert meter.cpu >= 0.05
    assert meter.wall >= 0.1
    assert meter.cpu < meter.wall
    assert meter.peak_rss_mb is not None
    assert meter.peak_rss_mb >= (peak_rss_mb() or 0) - 1e-9
    assert meter.peak_rss_mb > 5


def test_measure_times_the_garbage_collector_and_then_stops_listening() -> None:
    callbacks = list(gc.callbacks)
    with measure() as meter:
        for _ in range(3):
            cycles = []
            for _ in range(20_000):  # garbage only the collector can free
                node: list[object] = []
                node.append(node)
                cycles.append(node)
            del cycles, node
            gc.collect()
    assert meter.gc_collections >= 3
    assert 0 < meter.gc_s <= meter.wall
    assert gc.callbacks == callbacks
    before = meter.gc_collections
    gc.collect()  # after the block: not counted
    assert meter.gc_collections == before


def test_poisson_arrivals_are_seeded_bounded_and_at_rate() -> None:
    a = poisson_arrivals(50.0, 100.0, seed=1)
    assert a == poisson_arrivals(50.0, 100.0, seed=1)
    assert a != poisson_arrivals(50.0, 100.0, seed=2)
    assert all(0 < t < 100 for t in a)
    assert a == sorted(a)
    assert 4700 < len(a) < 5300
    assert poisson_arrivals(0.0, 10.0, seed=1) == []


def test_prompts_are_distinct_and_lazy() -> None:
    first = list(prompts(3))
    assert len(set(first)) == 3
    endless = prompts(None)
    assert [next(endless) for _ in range(3)] == first


def test_chat_inputs_are_the_same_prompts_as_conversations() -> None:
    assert list(chat_inputs(2, start=5)) == [
        [{"role": "user", "content": text}] for text in prompts(2, start=5)
    ]


def test_embedding_inputs_are_the_same_prompts_as_map_items() -> None:
    assert list(embedding_inputs(2, start=5)) == [{"input": text} for text in prompts(2, start=5)]


def test_api_posts_counts_post_requests_to_the_api_routes() -> None:
    text = "\n".join(
        [
            "# TYPE http_requests_total counter",
            'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 12.0',
            'http_requests_total{handler="/v1/completions",method="POST",status="4xx"} 1.0',
            'http_requests_total{handler="/v1/embeddings",method="POST",status="2xx"} 3.0',
            'http_requests_total{handler="/v1/models",method="GET",status="2xx"} 7.0',
            'http_requests_total{handler="/tokenize",method="POST",status="2xx"} 5.0',
            'vllm:request_success_total{model_name="m",finished_reason="length"} 900.0',
        ]
    )
    assert api_posts(text) == 16
    assert api_posts('http_requests_total{handler="/v1/models",method="GET"} 2\n') == 0
    # A server without the counter: nothing to compare, not zero requests.
    assert api_posts('vllm:request_success_total{model_name="m"} 900.0\n') is None


def test_tallies_fold_into_the_recorder_once() -> None:
    rec = Recorder()
    counts = rec.tally("batch")
    counts.ok += 3
    counts.tokens += 48
    rec.success_many("batch", 64, 1024, latency=0.2)  # one sample for 64 prompts
    rec.failure("HTTP 500")
    meter = _meter(wall=1.0, cpu=0.0067)
    m = rec.finish(scenario="s", contender="c", label="c", requested=68, meter=meter)
    assert (m.ok, m.failed, m.output_tokens) == (67, 1, 1072)
    assert m.cpu_us_per_prompt == pytest.approx(100.0)
    assert m.latency["batch"].n == 1
    again = rec.finish(scenario="s", contender="c", label="c", requested=68, meter=meter)
    assert again.ok == 67  # finishing twice (a hard stop, then the end) counts once


def test_within_limit_reports_whether_work_was_cut_short() -> None:
    async def work(seconds: float, done: list[bool]) -> None:
        await asyncio.sleep(seconds)
        done.append(True)

    finished: list[bool] = []
    assert asyncio.run(within_limit(work(0.0, finished), None)) is False
    assert asyncio.run(within_limit(work(0.0, finished), 5.0)) is False
    assert finished == [True, True]
    cut: list[bool] = []
    assert asyncio.run(within_limit(work(5.0, cut), 0.01)) is True
    assert cut == []


def test_the_server_cpu_per_prompt_comes_from_the_process_or_the_api_servers_metrics() -> None:
    from llmbatch_bench.tables import server_cpu_per_prompt

    own = {"ok": 1000, "extra": {"server_cpu_s": 0.5}}
    remote = {"ok": 1000, "extra": {"api_server_cpu_s": 0.9}}
    unknown = {"ok": 1000, "extra": {}}
    assert server_cpu_per_prompt(own) == "500"
    assert server_cpu_per_prompt(remote) == "900"
    assert server_cpu_per_prompt(unknown) == "-"
    engine = {"ok": 1000, "extra": {"api_server_cpu_s": 0.9, "engine_cpu_s": 2.0}}
    assert server_cpu_per_prompt(engine, "engine_cpu_s") == "2,000"
    assert server_cpu_per_prompt(remote, "engine_cpu_s") == "-"


def test_the_sampler_reads_a_remote_api_servers_cpu_from_its_metrics() -> None:
    from llmbatch_bench.server import MetricsSampler, ServerInfo
    from llmbatch_server.testing import run_simulator

    with run_simulator("--zero-latency") as sim:
        info = ServerInfo(sim.base_url, "m")  # as with --url: no pid known
        with MetricsSampler(info) as sampler:
            deadline = time.process_time() + 0.05
            while time.process_time() < deadline:
                pass
        summary = sampler.summary()
    assert summary["api_server_cpu_s"] >= 0.0  # the simulator exports it as vLLM does
    assert "server_cpu_s" not in summary


def test_a_streams_record_names_its_longest_wait_and_when_it_ended() -> None:
    from llmbatch_bench.metrics import STREAM_FIELDS, record_stream

    async def deltas() -> AsyncIterator[str]:
        for text, wait in (("a", 0.0), ("b", 0.01), ("", 0.0), ("c", 0.08), ("d", 0.01)):
            await asyncio.sleep(wait)
            yield text

    rec = Recorder()
    begun = time.monotonic()
    answered = asyncio.run(record_stream(rec, deltas(), time.perf_counter()))
    assert answered is not None
    (stream,) = rec.streams
    assert stream.tokens == 4  # the empty delta is no token
    assert stream.tpot == answered[1]
    assert stream.tpot is not None
    assert stream.max_gap is not None
    assert 0.07 < stream.max_gap < 0.2
    assert stream.max_gap > stream.tpot
    assert stream.max_gap_at is not None
    assert begun <= stream.started < stream.max_gap_at < time.monotonic()
    row = stream.row(origin=begun)
    assert len(row) == len(STREAM_FIELDS)
    assert row[-1] == 4
