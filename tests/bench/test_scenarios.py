"""Scenario runners, short: llmbatch through MockTransport, every contender and the
CLI against a real zero-latency simulator on 127.0.0.1."""

from __future__ import annotations

import json
import pstats
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_server import FakeServer

from llmbatch.transports import MockTransport
from llmbatch_bench import jobs, provenance
from llmbatch_bench.contenders import LlmbatchContender, available
from llmbatch_bench.hotpath.steady import PROFILE_ENV
from llmbatch_bench.jobs import Job, poisson_arrivals
from llmbatch_bench.scenarios import run_job
from llmbatch_bench.worker import run_in_worker

pytestmark = [
    pytest.mark.anyio,
    # What is measured is asyncio code: the baselines are asyncio.gather loops and the
    # scenario runner uses asyncio.TaskGroup and asyncio.wait.
    pytest.mark.asyncio_only("the benchmark harness and its baselines are asyncio code"),
]

MOCK_URL = "http://mock.invalid/v1"


def mock_contender(server: FakeServer, **kwargs: Any) -> LlmbatchContender:
    return LlmbatchContender(
        MOCK_URL,
        model=server.model,
        params={"ignore_eos": True},
        transport=MockTransport(server),
        **kwargs,
    )


def job(**fields: Any) -> Job:
    base: dict[str, Any] = {"scenario": "test", "contender": "llmbatch", "model": "fake-model"}
    return Job(**{"base_url": MOCK_URL, **base, **fields})


async def test_bulk_through_mock_counts_every_prompt_and_token() -> None:
    server = FakeServer()
    m = await run_job(job(kind="bulk", n=300, max_tokens=7), mock_contender(server))
    assert (m.ok, m.failed, m.unfinished) == (300, 0, 0)
    # usage is apportioned per prompt by llmbatch; the sum must be exact
    assert m.output_tokens == 300 * 7
    assert m.prompts_per_s == pytest.approx(300 / m.wall_s)
    assert m.cpu_us_per_prompt == pytest.approx(m.cpu_s / 300 * 1e6)
    assert m.latency["batch"].n == 300
    # batching really happened: fewer HTTP requests than prompts
    assert m.extra["http_requests"] < 300
    sent = sum(len(b["prompt"]) if isinstance(b["prompt"], list) else 1 for b in server.bodies)
    assert sent == 300
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 7 for b in server.bodies)


async def test_gather_mode_submits_complete_calls() -> None:
    server = FakeServer()
    m = await run_job(job(kind="bulk", n=50, mode="gather"), mock_contender(server, mode="gather"))
    assert m.ok == 50
    assert m.output_tokens == 50 * 64


async def test_failures_are_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    original = jobs.prompt
    monkeypatch.setattr(
        jobs, "prompt", lambda i, shape=None: original(i, shape) + (" POISON" * (i == 3))
    )
    # The poisoned prompt fails alone (llmbatch bisects the 400); the run goes on.
    m = await run_job(job(kind="bulk", n=20), mock_contender(FakeServer()))
    assert (m.ok, m.failed) == (19, 1)
    assert m.errors == {"BadRequestError": 1}


async def test_idle_and_mixed_record_realtime_streams() -> None:
    server = FakeServer()
    fields = {"realtime_rate": 40.0, "realtime_duration": 0.5, "realtime_warmup": 0.1}
    arrivals = len(poisson_arrivals(40.0, 0.5, seed=0))
    idle = await run_job(job(kind="idle", **fields), mock_contender(server))
    assert idle.ok == idle.requested == arrivals
    assert idle.ttft["realtime"].n == arrivals
    assert idle.ttft["realtime"].p50 <= idle.latency["realtime"].p50
    mixed = await run_job(job(kind="mixed", n=100_000, **fields), mock_contender(FakeServer()))
    assert mixed.extra["realtime_ok"] == arrivals
    assert mixed.extra["bulk_exhausted"] is False
    assert mixed.extra["window_s"] == pytest.approx(0.5, abs=0.1)
    assert mixed.latency["batch"].n > 0
    # bulk throughput counts the window only
    assert mixed.prompts_per_s * mixed.extra["window_s"] <= mixed.latency["batch"].n


# -- against the real simulator ---------------------------------------------------------

testing = pytest.importorskip("llmbatch_server.testing")


@pytest.fixture(scope="module")
def zero() -> Iterator[Any]:
    with testing.run_simulator("--zero-latency", "--max-model-len", "512") as sim:
        yield sim


def sim_job(sim: Any, **fields: Any) -> Job:
    return Job(base_url=sim.base_url, model="llmbatch-sim", scenario="test", **fields)


@pytest.mark.parametrize("name", ["llmbatch", "httpx", "aiohttp", "openai"])
async def test_each_contender_bulk_against_the_simulator(zero: Any, name: str) -> None:
    if not available(name):
        pytest.skip(f"{name} not installed")
    m = await run_job(sim_job(zero, kind="bulk", contender=name, n=60, max_tokens=5))
    assert (m.ok, m.failed) == (60, 0)
    assert m.output_tokens == 60 * 5  # ignore_eos: exactly max_tokens each
    assert m.cpu_s > 0


@pytest.mark.parametrize("name", ["llmbatch", "httpx", "aiohttp", "openai"])
async def test_each_contender_streams_against_the_simulator(zero: Any, name: str) -> None:
    if not available(name):
        pytest.skip(f"{name} not installed")
    fields = {"realtime_rate": 30.0, "realtime_duration": 0.3, "realtime_max_tokens": 6}
    m = await run_job(sim_job(zero, kind="idle", contender=name, **fields))
    assert m.ok == m.requested > 0
    assert m.failed == 0
    assert m.ttft["realtime"].n == m.ok
    assert m.output_tokens >= m.ok  # at least one chunk each


def test_probe_and_worker_process(zero: Any) -> None:
    m = run_in_worker(
        sim_job(zero, kind="probe", contender="probe", n=100, max_tokens=3, concurrency=32),
        timeout=60,
    )
    assert (m.ok, m.failed) == (100, 0)
    assert m.output_tokens == 300
    extra = dict(m.extra)
    gc_s, collections = extra.pop("gc_s"), extra.pop("gc_collections")
    assert extra == {"concurrency": 32, "batch": 16, "timed_out": False, "repeat": 0}
    assert 0 <= gc_s <= m.cpu_s  # the collector's part of the CPU
    assert collections >= 0
    assert m.latency["batch"].n == 7  # one sample per request of 16 prompts (100 / 16)
    assert (m.peak_rss_mb or 0) > 5


@pytest.mark.slow  # ~6 s; CI's slow stage runs it (and its bench smoke the command)
def test_cli_smoke_bulk(tmp_path: Path) -> None:
    """The CI smoke command: a small bulk run on a simulator the harness starts."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "llmbatch", "bench", "--scenario", "bulk", "--n", "200",
         "--max-tokens", "8", "--sim=--speed 1000", "--json", str(out),
         "--plots", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "### Bulk" in done.stdout
    report = json.loads(out.read_text())
    assert report["schema"] == "llmbatch-bench/1"
    assert report["server"]["simulator_args"] == ["--speed", "1000"]
    assert {"machine", "config", "runs", "targets", "notes"} <= set(report)
    assert report["llmbatch_code"]["source"] == provenance.code()["source"]
    runs = {r["label"]: r for r in report["runs"]}
    expected = {n for n in ("llmbatch", "httpx", "aiohttp", "openai") if available(n)}
    assert set(runs) == expected
    for r in runs.values():
        assert r["scenario"] == "bulk"
        assert (r["ok"], r["failed"], r["requested"]) == (200, 0, 200)
        assert r["output_tokens"] == 200 * 8
        assert r["cpu_us_per_prompt"] == pytest.approx(r["cpu_s"] / 200 * 1e6)
        assert r["peak_rss_mb"] > 0
        assert set(r["latency"]["batch"]) == {"n", "p50", "p95", "p99", "max"}
    assert report["hot_server"] is None  # no hot-path scenario asked for
    # Only the targets the bulk scenario measures (with the sweep): the rest need
    # scenarios this run did not have.
    assert [t["id"] for t in report["targets"]] == ["bulk_throughput"]
    assert (tmp_path / "bench-cpu.png").exists()


@pytest.mark.parametrize("sdk", ["openai", "llmbatch.openai"])
async def test_the_openai_program_counts_what_the_server_received(
    zero: Any, sdk: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not available("openai"):
        pytest.skip("openai not installed")
    profile = tmp_path / "measured.prof"
    monkeypatch.setenv(PROFILE_ENV, str(profile))
    fields = {"kind": "program", "contender": "openai", "n": 40, "max_tokens": 3}
    m = await run_job(
        sim_job(zero, sdk=sdk, concurrency=None, warmup=10, count_requests=True, **fields)
    )
    assert (m.ok, m.failed) == (40, 0)
    assert m.output_tokens <= 40 * 3  # the program sends no ignore_eos
    sent = m.extra["server_requests"]  # the warm-up's ten are not counted
    if sdk == "openai":
        assert sent == 40
    else:
        assert 0 < sent < 40
    # The measured calls ran under cProfile.
    stats = pstats.Stats(str(profile))
    calls = [n for (_, _, name), (_, n, *_) in stats.stats.items() if name == "create"]
    assert max(calls, default=0) >= 40
