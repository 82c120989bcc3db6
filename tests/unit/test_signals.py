"""Signals: which sources reported on a server lately, and the best live one for the
step time. Pure, on made-up times; then against real simulators that report all of
vLLM's signals, its gauges alone, or nothing."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

import llmbatch
from llmbatch._control.signals import LIVE_FOR, STEP_TIME_SOURCES, Signals
from llmbatch._stats import SignalSource
from llmbatch_server.testing import run_simulator


def test_a_source_is_live_for_a_while_after_its_last_sample() -> None:
    signals = Signals()
    assert signals.live(0.0) == ()
    signals.saw(SignalSource.ANSWER_LATENCY, 10.0)
    signals.saw(SignalSource.LOAD_HEADER, 12.0)
    assert signals.live(12.0) == ("load_header", "answer_latency")
    assert signals.live(10.0 + LIVE_FOR + 0.1) == ("load_header",)
    assert signals.live(12.0 + LIVE_FOR + 0.1) == ()


def test_the_best_live_source_feeds_the_step_time_and_a_quiet_one_gives_way() -> None:
    signals = Signals()
    signals.saw(SignalSource.ANSWER_LATENCY, 0.0)
    assert signals.best(0.0, STEP_TIME_SOURCES) is SignalSource.ANSWER_LATENCY
    signals.saw(SignalSource.STREAM_TIMING, 1.0)
    assert signals.best(1.0, STEP_TIME_SOURCES) is SignalSource.STREAM_TIMING
    signals.saw(SignalSource.METRICS_STEP_TIME, 2.0)
    assert signals.best(2.0, STEP_TIME_SOURCES) is SignalSource.METRICS_STEP_TIME
    # The histogram stops being reported (a proxy now filters it): answers take over.
    signals.saw(SignalSource.ANSWER_LATENCY, 2.0 + LIVE_FOR + 1)
    assert signals.best(2.0 + LIVE_FOR + 1, STEP_TIME_SOURCES) is SignalSource.ANSWER_LATENCY
    signals.forget()
    assert signals.best(2.0 + LIVE_FOR + 1, STEP_TIME_SOURCES) is None


SERVERS = [
    pytest.param(
        (),
        {"load_header", "metrics_gauges", "metrics_step_time", "answer_latency"},
        "metrics_step_time",
        id="vllm-full",
    ),
    pytest.param(
        ("--metrics", "gauges"),
        {"load_header", "metrics_gauges", "answer_latency"},
        "answer_latency",
        id="gauges-only",
        # A real simulator each, ~4 s: the other kinds run in CI's slow stage.
        marks=pytest.mark.slow,
    ),
    pytest.param(
        ("--metrics", "none", "--no-load-header"),
        {"answer_latency"},
        "answer_latency",
        id="reports-nothing",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("args", "live", "step_source"), SERVERS)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_each_kind_of_server_is_seen_through_what_it_reports(
    args: tuple[str, ...], live: set[str], step_source: str, anyio_backend: Any
) -> None:
    # The step time keeps being measured whatever the server reports: on a server
    # with vLLM's gauges but no histogram it stopped after one sample in 0.2.
    # Each map keeps the server busy for about a second, so /metrics (read every
    # 0.5 s while work runs there) is read during it.
    with run_simulator("--speed", "5", *args) as sim:
        async with llmbatch.Client(sim.base_url) as client:
            prompts = [f"p{i}" for i in range(256)]
            results = await client.map(prompts, max_tokens=16, ignore_eos=True)
            assert all(r.ok for r in results)
            busy = client.stats().servers[0]
            # Then one sequence at a time: each step is several times shorter, and the
            # estimate must follow (in 0.2 it froze at its first sample on a server
            # with vLLM's gauges but no histogram). Two dozen calls give the estimate
            # four reads of /metrics to follow; a dozen left it at the margin.
            for i in range(24):
                await client.complete(f"alone {i}", max_tokens=16, ignore_eos=True)
            quiet = client.stats().servers[0]
    assert set(quiet.signals) == live
    assert quiet.step_time_source == step_source
    assert busy.step_time is not None
    assert quiet.step_time is not None
    assert quiet.step_time < 0.6 * busy.step_time, (busy.step_time, quiet.step_time)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_streams_report_their_own_timing(anyio_backend: Any) -> None:
    with run_simulator("--speed", "50", "--metrics", "none") as sim:
        async with llmbatch.Client(sim.base_url) as client:
            async for _ in client.stream("Hello", max_tokens=8, ignore_eos=True):
                pass
            server = client.stats().servers[0]
    assert "stream_timing" in server.signals
    assert server.step_time_source == "stream_timing"
    assert server.ttft is not None  # the first token's own time, from the stream


@pytest.mark.slow  # ~6 s of a server too slow for its SLO; CI's slow stage
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_slo_the_server_cannot_meet_is_said(
    anyio_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Steps of several ms against 0.5 ms per token: bulk falls to one sequence and
    # stats() (and one warning) say the SLO is out of reach, not just "limit 1".
    with run_simulator("--speed", "5", "--metrics", "gauges") as sim:
        async with llmbatch.Client(sim.base_url, slo=llmbatch.SLO(tpot=0.0005)) as client:
            with anyio.move_on_after(5):
                await client.map([f"p{i}" for i in range(400)], max_tokens=32, ignore_eos=True)
            server = client.stats().servers[0]
    assert server.bulk_limit == 1
    assert server.slo_unreachable
    warnings = [r for r in caplog.records if "too slow for it" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_bulk_is_paced_when_the_slo_asks_and_stats_say_how_fast(anyio_backend: Any) -> None:
    with run_simulator("--speed", "20") as sim:
        slo = llmbatch.SLO(tpot=0.01, pace=True)
        async with llmbatch.Client(sim.base_url, slo=slo) as client:
            results = await client.map([f"p{i}" for i in range(300)], max_tokens=16)
            paced = client.stats().servers[0]
            requests = _completion_requests(sim.base_url)
        async with llmbatch.Client(sim.base_url, slo=llmbatch.SLO(tpot=0.01)) as client:
            await client.map([f"q{i}" for i in range(50)], max_tokens=16)
            free = client.stats().servers[0]
    assert len(results) == 300
    assert all(r.ok for r in results)
    assert paced.bulk_pace is not None
    assert paced.bulk_slice is not None
    assert paced.bulk_slice >= 1
    assert free.bulk_pace is None  # an SLO without pace=True: unpaced
    # Slices, not a request a prompt: a request costs the API server a fixed amount.
    assert requests <= 300 / 4, requests


def _completion_requests(base_url: str) -> int:
    """The simulator's count of /v1/completions requests answered."""
    origin = base_url.removesuffix("/v1")
    text = httpx.get(origin + "/metrics", timeout=5).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("http_requests_total") and 'handler="/v1/completions"' in line
    )
