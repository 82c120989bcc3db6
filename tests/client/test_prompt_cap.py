"""A server that takes fewer prompts a list than llmbatch sends (vLLM with
``VLLM_MAX_COMPLETION_PROMPTS`` set low): its 400 is read once, its cap kept, and
every prompt answered; nothing fails for it."""

from __future__ import annotations

import pytest

import llmbatch
from llmbatch_server.testing import run_simulator

pytestmark = pytest.mark.anyio


async def test_the_list_cap_is_learnt_from_the_refusal_and_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with run_simulator("--zero-latency", "--max-completion-prompts", "5") as sim:
        policy = llmbatch.BatchPolicy(max_batch_size=64, max_wait=0.05, send_when_idle=False)
        async with llmbatch.Client(sim.base_url, batching={"batch": policy}) as client:
            first = await client.map([f"p{i}" for i in range(40)], max_tokens=2)
            assert all(r.ok for r in first)
            bisections = client.stats().bisections
            again = await client.map([f"q{i}" for i in range(40)], max_tokens=2)
            assert all(r.ok for r in again)
            stats = client.stats()
        assert bisections == 0  # a cap, not a bad prompt: nothing was bisected
        assert stats.bisections == 0
        assert stats.max_batch_size <= 64
        assert stats.tiers[llmbatch.Priority.BATCH].failed == 0
    learnt = [r for r in caplog.records if "takes at most 5 prompts" in r.getMessage()]
    assert len(learnt) == 1  # refused once, kept after
