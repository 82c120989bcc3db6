"""``Stats``: histograms, windowed rates, outcome counting and the printed table.

The recorder is driven with explicit times (the client passes its loop clock), so
the sliding window is tested without waiting; the end-to-end part runs a client
through MockTransport."""

from __future__ import annotations

import json

import pytest
from factories import make_request
from fake_server import FailsFirstPost, FakeServer

import llmbatch
from llmbatch import (
    Client,
    DeadlineExceeded,
    Histogram,
    Priority,
    RequestCancelled,
    RetryPolicy,
    ServerError,
)
from llmbatch._calls.outcome import Outcomes
from llmbatch._observers import Observers
from llmbatch._recorder import LATENCY_BOUNDS, RATE_WINDOW, StatsRecorder
from llmbatch.transports import MockTransport

QUIET = {p: 0 for p in Priority}


def settle(recorder: StatsRecorder, at: float, latency: float, tokens: int = 10) -> None:
    request = make_request(Priority.BATCH, at=at - latency)
    Outcomes(recorder, Observers()).answered([request], [object()], at, [3], [tokens])
    assert request.done


def test_rates_cover_only_the_last_window() -> None:
    recorder = StatsRecorder(started_at=0.0)
    for second in range(30):  # one answer of 10 tokens a second for 30 s
        settle(recorder, at=second + 0.5, latency=0.1)
    stats = recorder.snapshot(30.0, QUIET, QUIET)
    assert RATE_WINDOW - 1 <= stats.rate_window <= RATE_WINDOW
    assert stats.requests_per_second == pytest.approx(1.0)
    assert stats.tokens_per_second == pytest.approx(10.0)
    # Quiet for a whole window: the rates fall to zero; the totals stay.
    later = recorder.snapshot(30.0 + RATE_WINDOW + 1, QUIET, QUIET)
    assert later.tokens_per_second == 0.0
    assert later.completion_tokens == 300


def test_rates_just_after_open_use_the_time_since_open() -> None:
    recorder = StatsRecorder(started_at=100.0)
    for i in range(20):
        settle(recorder, at=100.0 + i * 0.1, latency=0.05)
    stats = recorder.snapshot(102.0, QUIET, QUIET)
    assert stats.rate_window == pytest.approx(2.0)
    assert stats.requests_per_second == pytest.approx(10.0)


def test_histograms_count_every_observation_in_its_bucket() -> None:
    recorder = StatsRecorder(started_at=0.0)
    latencies = [0.001, 0.005, 0.02, 0.3, 7.0, 1000.0]
    for latency in latencies:  # asked at 0, answered at the latency: exact, on the bounds
        request = make_request(Priority.BATCH, at=0.0)
        Outcomes(recorder, Observers()).answered([request], [object()], latency, [3], [10])
    for size in (1, 3, 64, 2000):
        recorder.batch_sent(size)
    stats = recorder.snapshot(2000.0, QUIET, QUIET)
    histogram = stats.tiers[Priority.BATCH].latency_histogram
    assert histogram.bounds == LATENCY_BOUNDS
    assert histogram.count == len(latencies)
    assert histogram.sum == pytest.approx(sum(latencies))
    cumulative = dict(histogram.cumulative())
    assert cumulative[0.005] == 2  # "less than or equal", as Prometheus counts
    assert cumulative[0.025] == 3
    assert cumulative[0.5] == 4
    assert cumulative[10.0] == 5
    assert cumulative[float("inf")] == 6
    sizes = stats.batch_size_histogram
    assert dict(sizes.cumulative())[1.0] == 1
    assert dict(sizes.cumulative())[4.0] == 2
    assert dict(sizes.cumulative())[64.0] == 3
    assert sizes.counts[-1] == 1  # 2000: above every bound
    assert stats.max_batch_size == 2000


def test_cancellations_and_deadlines_count_as_cancelled_not_failed() -> None:
    recorder = StatsRecorder(started_at=0.0)
    for error in (
        DeadlineExceeded("late"),
        RequestCancelled("gone"),
        ServerError("boom", status_code=500),
    ):
        assert Outcomes(recorder, Observers()).failed(make_request(Priority.NORMAL), error)
    tier = recorder.snapshot(1.0, QUIET, QUIET).tiers[Priority.NORMAL]
    assert (tier.cancelled, tier.failed, tier.done) == (2, 1, 0)
    assert tier.latency_histogram.count == 0  # failures are not latency samples


def test_a_snapshot_dumps_to_plain_data_and_json() -> None:
    # model_dump() and model_dump_json() are kept from 0.1's pydantic snapshots.
    recorder = StatsRecorder(started_at=0.0)
    settle(recorder, at=1.0, latency=0.25)
    stats = recorder.snapshot(2.0, QUIET, QUIET)
    plain = stats.model_dump()
    assert plain == stats.to_dict()
    batch = plain["tiers"][Priority.BATCH]
    assert batch["done"] == 1
    assert batch["latency"]["p50"] == 0.25
    assert isinstance(batch["latency_histogram"]["counts"], tuple)
    loaded = json.loads(stats.model_dump_json())
    assert loaded == stats.model_dump(mode="json")
    assert loaded["tiers"]["batch"]["done"] == 1  # tiers by name in JSON
    assert isinstance(loaded["tiers"]["batch"]["latency_histogram"]["counts"], list)
    assert stats == recorder.snapshot(2.0, QUIET, QUIET)  # compared by value


def test_histogram_is_public_and_immutable() -> None:
    h = Histogram(bounds=(1.0,), counts=(1, 2), sum=5.0, count=3)
    assert h.cumulative() == [(1.0, 1), (float("inf"), 3)]
    with pytest.raises(AttributeError, match="cannot assign"):
        h.count = 4  # type: ignore[misc]


@pytest.mark.anyio
async def test_client_stats_print_as_a_table_and_count_retries() -> None:
    retry = RetryPolicy(initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)
    client = Client("http://127.0.0.1:1/v1", transport=MockTransport(FailsFirstPost()), retry=retry)
    async with client:
        await client.map([f"p{i}" for i in range(10)], max_tokens=2)
        await client.complete("hi", priority="realtime")
        stats = client.stats()
    assert stats.retries == 1
    assert stats.tiers[Priority.BATCH].retried == 10
    assert stats.tiers[Priority.BATCH].queue_wait_histogram.count == 10
    assert stats.tiers[Priority.BATCH].latency_histogram.count == 10
    assert stats.requests_per_second > 0
    text = str(stats)
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["tier", "queued", "in"]
    assert [line.split()[0] for line in lines[2:5]] == ["realtime", "normal", "batch"]
    assert lines[4].split()[1:7] == ["0", "0", "10", "0", "0", "10"]
    assert "retries 1" in text
    assert "Priority." not in text  # no reprs
    assert "server http://127.0.0.1:1/v1" in text


@pytest.mark.anyio
async def test_a_stated_max_num_seqs_is_believed_and_caps_bulk_below_it() -> None:
    replica = llmbatch.Replica("http://127.0.0.1:1/v1", max_num_seqs=12)
    assert repr(replica) == "Replica('http://127.0.0.1:1/v1', max_num_seqs=12)"
    async with Client(replica, transport=MockTransport(FakeServer())) as client:
        await client.complete("hi", max_tokens=1)
        server = client.stats().servers[0]
    seats = server.inference("seats")
    assert seats is not None
    assert (seats.value, seats.source, seats.evidence) == (
        12.0,
        "stated",
        "Replica(max_num_seqs=12)",
    )
    assert server.bulk_limit <= 12 - server.realtime_reserve
    assert {i.name for i in server.inferences} == {
        "queue",
        "seats",
        "step_time",
        "slo_unreachable",
        "api_queue",
        "slo_floor",
        "slo_auto",  # the default SLO says what it aims at
    }
    assert server.slo_auto is not None
    assert server.model_dump(mode="json")["inferences"][1]["source"] == "stated"


@pytest.mark.parametrize(("value", "error"), [(0, llmbatch.ConfigError), ("8", TypeError)])
def test_a_bad_max_num_seqs_is_refused_naming_the_field(value: object, error: type) -> None:
    with pytest.raises(error, match="max_num_seqs"):
        llmbatch.Replica("http://127.0.0.1:1/v1", max_num_seqs=value)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_providers_rate_limit_headers_show_in_its_server_stats() -> None:
    fake = FakeServer()
    remaining = iter(range(99, 0, -1))

    def answer(request: llmbatch.transports.HTTPRequest) -> llmbatch.transports.MockResponse:
        response = fake(request)
        if request.method == "POST":
            response.headers = {
                **response.headers,
                "x-ratelimit-limit-requests": "100",
                "x-ratelimit-remaining-requests": str(next(remaining)),
                "x-ratelimit-reset-requests": "600ms",
                "x-ratelimit-limit-tokens": "90000",
                "x-ratelimit-remaining-tokens": "89950",
                "x-ratelimit-reset-tokens": "1m0s",
            }
        return response

    async with Client("http://127.0.0.1:1/v1", transport=MockTransport(answer)) as client:
        assert client.stats().servers[0].provider_limits is None  # nothing answered yet
        await client.complete("hi", max_tokens=1)
        await client.complete("hi again", max_tokens=1)
        limits = client.stats().servers[0].provider_limits
    assert limits is not None
    assert (limits.requests_limit, limits.requests_remaining) == (100, 98)  # the last answer's
    assert (limits.tokens_limit, limits.tokens_remaining) == (90000, 89950)
    assert limits.requests_reset is not None
    assert 0.0 <= limits.requests_reset <= 0.6
    assert limits.tokens_reset is not None
    assert 59.0 < limits.tokens_reset <= 60.0
    assert limits.model_dump()["tokens_limit"] == 90000


def test_the_table_says_what_the_provider_said() -> None:
    server = llmbatch.ServerStats(
        base_url="http://h/v1",
        bulk_limit=4,
        ceiling=8,
        realtime_reserve=1,
        step_time=None,
        ttft=None,
        waiting=None,
        kv_cache_usage=None,
        slo_met=0,
        slo_missed=0,
        breaker="closed",
        outages=0,
        provider_limits=llmbatch.ProviderLimits(
            requests_limit=100, requests_remaining=98, tokens_remaining=5000, tokens_reset=2.0
        ),
    )
    line = llmbatch._stats._server(server)
    assert "provider limits: requests 98 of 100 left, tokens 5,000 left (whole in 2.00 s)" in line
