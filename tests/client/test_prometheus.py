"""llmbatch.prometheus against the real prometheus-client: a registry served over
HTTP on 127.0.0.1 and scraped from another thread, as Prometheus would, while the
client works against a real simulator process."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

import llmbatch
import llmbatch.prometheus
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--poison", "POISON") as server:
        yield server


@pytest.fixture
def exporter() -> Iterator[tuple[CollectorRegistry, str]]:
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield registry, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def scrape(url: str) -> dict[str, Any]:
    """``{metric name: [(labels, value), ...]}`` from one scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    matches = [v for got, v in samples[name] if all(got.get(k) == w for k, w in labels.items())]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return float(matches[0])


async def test_scraped_metrics_match_the_clients_stats(
    sim: SimulatorProcess, exporter: tuple[CollectorRegistry, str]
) -> None:
    registry, url = exporter
    # slo=None: the default SLO would hold the last map to one sequence while it
    # measures the idle latency (its realtime answer is too short to), and the poison
    # must share a batch with "fine" to be bisected out.
    async with llmbatch.Client(sim.base_url, slo=None) as client:
        llmbatch.prometheus.register(client, registry)
        results = await client.map([f"prompt {i}" for i in range(100)], max_tokens=3)
        await client.complete("hello", priority="realtime", max_tokens=2)
        bad = await client.map(["fine", "POISON this one"], max_tokens=2)
        # Scraped from another thread: stats() hops onto the client's loop.
        samples = await anyio.to_thread.run_sync(scrape, url)
        stats = client.stats()
    assert all(r.ok for r in results)
    assert not bad[1].ok
    assert value(samples, "llmbatch_requests_total", tier="batch", outcome="done") == 101
    assert value(samples, "llmbatch_requests_total", tier="batch", outcome="failed") == 1
    assert value(samples, "llmbatch_requests_total", tier="realtime", outcome="done") == 1
    assert value(samples, "llmbatch_http_requests_total") == stats.batches_sent
    assert value(samples, "llmbatch_bisections_total") == stats.bisections >= 1
    assert value(samples, "llmbatch_completion_tokens_total") == stats.completion_tokens
    assert value(samples, "llmbatch_queued_requests", tier="batch") == 0
    # Histograms: cumulative buckets, a count equal to the answers.
    assert value(samples, "llmbatch_request_duration_seconds_count", tier="batch") == 101
    assert (
        value(samples, "llmbatch_request_duration_seconds_bucket", tier="batch", le="+Inf") == 101
    )
    assert value(samples, "llmbatch_batch_size_count") == stats.batches_sent
    assert value(samples, "llmbatch_queue_wait_seconds_count", tier="realtime") == 1
    # The server's admission state, per server.
    assert value(samples, "llmbatch_admission_ceiling", server=sim.base_url) == 256
    assert value(samples, "llmbatch_breaker_state", server=sim.base_url, state="closed") == 1
    assert value(samples, "llmbatch_breaker_state", server=sim.base_url, state="open") == 0
    assert value(samples, "llmbatch_slo_unreachable", server=sim.base_url) == 0
    # Where /metrics was read while work ran, the API process's queue as stats() has it.
    api_queue = stats.servers[0].api_queue
    scraped = samples.get("llmbatch_server_api_queue_requests", [])
    assert [v for _, v in scraped] == ([] if api_queue is None else [api_queue])
    # Which sources the client hears from, each source always present (0 or 1).
    for source in ("load_header", "metrics_gauges", "metrics_step_time", "stream_timing"):
        expected = 1.0 if source in stats.servers[0].signals else 0.0
        assert value(
            samples, "llmbatch_server_signal_live", server=sim.base_url, source=source
        ) == (expected)
    assert value(samples, "llmbatch_server_signal_live", server=sim.base_url, source="load_header")
    # Names follow Prometheus conventions: counters end in _total, units are named.
    assert all(name.startswith("llmbatch_") for name in samples)


async def test_two_clients_share_a_registry_told_apart_by_labels(
    sim: SimulatorProcess, exporter: tuple[CollectorRegistry, str]
) -> None:
    registry, url = exporter
    async with (
        llmbatch.Client(sim.base_url) as search,
        llmbatch.Client(sim.base_url) as ads,
    ):
        llmbatch.prometheus.register(search, registry, labels={"app": "search"})
        llmbatch.prometheus.register(ads, registry, labels={"app": "ads"})
        with pytest.raises(llmbatch.ConfigError, match="already registered"):
            llmbatch.prometheus.register(ads, registry, labels={"app": "other"})
        with pytest.raises(llmbatch.ConfigError, match="same label names"):
            llmbatch.prometheus.register(llmbatch.Client(sim.base_url), registry)
        await search.map(["a", "b", "c"], max_tokens=2)
        await ads.complete("x", max_tokens=2)
        samples = await anyio.to_thread.run_sync(scrape, url)
        assert llmbatch.prometheus.unregister(ads, registry)
        after = await anyio.to_thread.run_sync(scrape, url)
    done = "llmbatch_requests_total"
    assert value(samples, done, app="search", tier="batch", outcome="done") == 3
    assert value(samples, done, app="ads", tier="normal", outcome="done") == 1
    assert {labels["app"] for labels, _ in after[done]} == {"search"}


def test_bad_registrations_raise_typed_errors() -> None:
    registry = CollectorRegistry()
    client = llmbatch.Client("http://127.0.0.1:1/v1", model="m")
    with pytest.raises(llmbatch.ConfigTypeError):
        llmbatch.prometheus.register("not a client", registry)  # type: ignore[arg-type]
    with pytest.raises(llmbatch.ConfigError, match="used by llmbatch"):
        llmbatch.prometheus.register(client, registry, labels={"tier": "x"})
    with pytest.raises(llmbatch.ConfigError, match="not a valid"):
        llmbatch.prometheus.register(client, registry, labels={"bad-name": "x"})
    # Registered before it opens: nothing reported yet, and no error at scrape.
    llmbatch.prometheus.register(client, registry)
    assert registry.get_sample_value("llmbatch_http_requests_total") is None


def test_import_llmbatch_does_not_import_prometheus_client() -> None:
    import subprocess
    import sys

    code = "import sys, llmbatch; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_tenants_named_in_tenants_have_series_the_rest_are_other(
    sim: SimulatorProcess, exporter: tuple[CollectorRegistry, str]
) -> None:
    registry, url = exporter
    tenants = {"team-a": llmbatch.TenantLimits(max_in_flight=8)}
    async with llmbatch.Client(sim.base_url, tenants=tenants) as client:
        llmbatch.prometheus.register(client, registry)
        await client.map([f"a {i}" for i in range(20)], tenant="team-a", max_tokens=3)
        await client.map(["POISON", "fine"], tenant="team-a", max_tokens=3)
        for i in range(5):
            await client.complete(f"conversation {i}", tenant=f"chat-{i}", max_tokens=3)
        await client.complete("nobody's", max_tokens=3)
        samples = await anyio.to_thread.run_sync(scrape, url)
        stats = client.stats()
    assert value(samples, "llmbatch_tenant_requests_total", tenant="team-a", outcome="done") == 21
    assert value(samples, "llmbatch_tenant_requests_total", tenant="team-a", outcome="failed") == 1
    assert value(samples, "llmbatch_tenant_requests_total", tenant="other", outcome="done") == 5
    assert value(samples, "llmbatch_tenant_tokens_total", tenant="team-a", kind="completion") == (
        stats.tenants["team-a"].completion_tokens
    )
    assert value(samples, "llmbatch_tenant_queued_requests", tenant="team-a") == 0
    labels = {got["tenant"] for got, _ in samples["llmbatch_tenant_requests_total"]}
    assert labels == {"team-a", "other"}
    # stats() names every active tenant; the tiers count everything.
    assert sorted(stats.tenants) == ["chat-0", "chat-1", "chat-2", "chat-3", "chat-4", "team-a"]
    assert stats.tenants["chat-3"].done == 1
    assert stats.tenants["team-a"].latency.p50 > 0
    assert stats.other_tenants is not None
    assert stats.other_tenants.done == 5
    assert sum(t.done for t in stats.tiers.values()) == 27
    assert "tenant team-a" in str(stats)


async def test_what_the_answers_cost_is_exported_by_tier_model_and_tenant(
    sim: SimulatorProcess, exporter: tuple[CollectorRegistry, str]
) -> None:
    registry, url = exporter
    price = llmbatch.Price(input=1.0, output=2.0)
    tenants = {"team-a": llmbatch.TenantLimits()}
    async with llmbatch.Client(
        sim.base_url, slo=None, prices={"*": price}, max_cost=1.0, tenants=tenants
    ) as client:
        llmbatch.prometheus.register(client, registry)
        await client.map([f"prompt {i}" for i in range(20)], max_tokens=3, tenant="team-a")
        samples = await anyio.to_thread.run_sync(scrape, url)
        stats = client.stats()
    model = next(iter(stats.models))
    dollars = stats.cost.dollars
    assert dollars > 0
    assert value(samples, "llmbatch_cost_dollars_total", tier="batch") == dollars
    assert value(samples, "llmbatch_model_cost_dollars_total", model=model) == dollars
    assert value(samples, "llmbatch_model_tokens_total", model=model, kind="completion") == (
        stats.models[model].completion_tokens
    )
    assert value(samples, "llmbatch_tenant_cost_dollars_total", tenant="team-a") == dollars
    assert value(samples, "llmbatch_max_cost_dollars", state="limit") == 1.0
    assert value(samples, "llmbatch_max_cost_dollars", state="spent") == dollars


async def test_the_response_caches_hits_and_savings_are_exported(
    sim: SimulatorProcess, exporter: tuple[CollectorRegistry, str], tmp_path: Path
) -> None:
    registry, url = exporter
    price = llmbatch.Price(input=1.0, output=2.0)
    async with llmbatch.Client(
        sim.base_url, slo=None, prices={"*": price}, cache=tmp_path / "c.db"
    ) as client:
        llmbatch.prometheus.register(client, registry)
        prompts = [f"prompt {i}" for i in range(10)]
        await client.map(prompts, max_tokens=3, temperature=0)
        await client.map([*prompts, "new"], max_tokens=3, temperature=0)
        samples = await anyio.to_thread.run_sync(scrape, url)
        stats = client.stats()
    cache = stats.cache
    assert cache is not None
    assert cache.hits == 10
    assert value(samples, "llmbatch_cache_answers_total", outcome="hit") == 10
    assert value(samples, "llmbatch_cache_answers_total", outcome="miss") == 11
    assert value(samples, "llmbatch_cache_answers_total", outcome="stored") == 11
    assert value(samples, "llmbatch_cache_saved_tokens_total", kind="completion") == 30
    assert value(samples, "llmbatch_cache_saved_dollars_total") == cache.saved.dollars > 0
