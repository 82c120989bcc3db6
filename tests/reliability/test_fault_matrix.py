"""The fault matrix: 10,000 prompts through ``map`` against a simulator injecting
500s, 429s with Retry-After, 503s, dropped connections, latency spikes past the
read timeout and one poisoned prompt per 100. Every clean prompt succeeds, every
poisoned one fails alone with the server's message, nothing is lost or duplicated,
and retries stay within the configured bound."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import llmbatch
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio

N = 10_000
ATTEMPTS = 12


@pytest.fixture(scope="module")
def faulty_sim() -> Iterator[SimulatorProcess]:
    with run_simulator(
        "--zero-latency",
        "--poison",
        "POISON",
        "--error-rate-500",
        "0.10",
        "--error-rate-429",
        "0.05",
        "--retry-after",
        "0.01",
        "--error-rate-503",
        "0.05",
        "--drop-rate",
        "0.02",
        "--spike-rate",
        "0.01",
        "--spike-ms",
        "1500",
        "--enable-admin",
    ) as server:
        yield server


async def test_fault_matrix(
    faulty_sim: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = [f"POISON item {i}" if i % 100 == 37 else f"item {i}" for i in range(N)]
    retry = llmbatch.RetryPolicy(attempts=ATTEMPTS, initial_backoff=0.005, max_backoff=0.05)
    timeout = llmbatch.Timeout(connect=5, read=1.0, write=5, pool=30)
    async with llmbatch.Client(faulty_sim.base_url, retry=retry, timeout=timeout) as client:
        results = await client.map(prompts, max_tokens=2, ignore_eos=True)
        stats = client.stats()
    assert len(results) == N
    assert [r.index for r in results] == list(range(N))  # nothing lost, nothing duplicated
    poisoned = {i for i in range(N) if i % 100 == 37}
    failed = {r.index for r in results if not r.ok}
    assert failed == poisoned
    for i in poisoned:
        error = results[i].error
        assert isinstance(error, llmbatch.BadRequestError)
        assert "POISON" in str(error)  # the server's own message
        # attempts counts every HTTP exchange the item was in; each bisection step
        # (at most log2(64) = 6 below the first send) has its own retry budget.
        assert error.attempts <= ATTEMPTS * 7
    for r in results:
        if r.ok:
            assert r.unwrap().usage.completion_tokens == 2
    injected = faulty_sim.set_faults()["injected"]
    batch = stats.tiers[llmbatch.Priority.BATCH]
    assert batch.done == N - len(poisoned)
    assert batch.failed == len(poisoned)
    assert injected["500"] > 0
    assert injected["429"] > 0
    assert injected["503"] > 0
    assert injected["drop"] > 0
    assert injected["spike"] > 0
    assert re.search(r"vllm:num_requests_running\{[^}]*\} 0", faulty_sim.metrics())
    with capsys.disabled():
        print(
            f"\nfault matrix: {N} prompts, {N - len(poisoned)} ok, {len(poisoned)} poisoned "
            f"failed alone; HTTP batches {stats.batches_sent}, bisections {stats.bisections}, "
            f"retried items {batch.retried}; injected {injected}"
        )
