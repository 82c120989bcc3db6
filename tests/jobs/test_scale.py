"""Bulk maps at scale against the simulator: memory stays bounded by the window.

The 100k run is part of the default suite (about 10 s); the 1M run is marked slow
(about 2 minutes on two cores). Both print prompts/s and RSS; speed is reported
(docs/benchmarks.md), never asserted: memory is what these tests hold the map to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from llmbatch import Client
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.anyio,
    # Memory bounded by the window does not depend on the event loop; on trio (httpx)
    # the 100k run alone takes twice as long.
    pytest.mark.asyncio_only("heavy scale test: the window bounds memory on any backend"),
]

MODEL = "sim-model"
#: The map's own memory: RSS growth from just before it starts to its peak. (Not the
#: process's whole RSS: that depends on what the rest of the session imported, e.g.
#: pandas and pyarrow when the ray extra is installed.)
MAP_GROWTH_LIMIT_MB = 50
#: RSS may grow this much after the first tenth of the run (allocator noise, not
#: per-item state: a leak of even 100 bytes per prompt would show as ~90 MB at 1M).
GROWTH_LIMIT_MB = 25


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL) as server:
        yield server


class PeakRSS:
    """Samples this process's resident set size in a background thread."""

    def __init__(self, every: float = 0.02) -> None:
        self._process = psutil.Process()
        self._every = every
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._every)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def mb(value: float) -> float:
    return value / 2**20


async def pump(sim: SimulatorProcess, n: int, capsys: pytest.CaptureFixture[str]) -> None:
    ok = failed = 0
    rss_at_tenth = 0
    async with Client(sim.base_url, model=MODEL) as client:
        before = psutil.Process().memory_info().rss
        with PeakRSS() as rss:
            started = time.perf_counter()
            prompts = (f"prompt number {i}" for i in range(n))
            async for _index, result in client.map_unordered(prompts, max_tokens=1):
                if result.error is None:
                    ok += 1
                else:
                    failed += 1
                if ok + failed == n // 10:
                    rss_at_tenth = rss.peak
            elapsed = time.perf_counter() - started
    rate = n / elapsed
    with capsys.disabled():
        print(
            f"\nmap_unordered {n:,} prompts: {rate:,.0f} prompts/s, {elapsed:.1f} s, "
            f"RSS before {mb(before):.1f} MB, peak {mb(rss.peak):.1f} MB "
            f"(the map's own: {mb(rss.peak - before):.1f} MB; at 10%: {mb(rss_at_tenth):.1f} MB)"
        )
    assert (ok, failed) == (n, 0)
    assert mb(rss.peak - before) < MAP_GROWTH_LIMIT_MB
    assert mb(rss.peak - rss_at_tenth) < GROWTH_LIMIT_MB


@pytest.mark.slow  # ~5 s; CI's slow stage runs it (and the 1M-prompt run beside it)
async def test_100k_prompts_in_bounded_memory(
    sim: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    await pump(sim, 100_000, capsys)


@pytest.mark.slow
async def test_1m_prompts_in_bounded_memory(
    sim: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    await pump(sim, 1_000_000, capsys)
