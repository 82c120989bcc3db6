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


@pytest.mark.parametrize(("stated", "most"), [(None, 40), (1200, 4)])
async def test_a_stated_step_budget_keeps_each_batch_to_one_steps_prompts(
    stated: int | None, most: int
) -> None:
    """Prompts of ~300 tokens: the kind's default step (vLLM: 8,192) takes a whole
    map of 40 in one request; a stated 1,200 takes at most four."""
    prompts = [f"{i} " + "word " * 300 for i in range(40)]
    policy = llmbatch.BatchPolicy(max_batch_size=64, max_wait=0.05, send_when_idle=False)
    with run_simulator("--zero-latency") as sim:
        replica = llmbatch.Replica(sim.base_url, max_num_batched_tokens=stated)
        async with llmbatch.Client(replica, batching={"batch": policy}) as client:
            results = await client.map(prompts, max_tokens=2)
            stats = client.stats()
    assert all(r.ok for r in results)
    assert 1 < stats.max_batch_size <= most
    if stated is None:
        assert stats.max_batch_size > 4


def test_a_bad_step_budget_is_refused_naming_the_field() -> None:
    with pytest.raises(llmbatch.ConfigError, match="max_num_batched_tokens"):
        llmbatch.Replica("http://127.0.0.1:1/v1", max_num_batched_tokens=0)
    with pytest.raises(TypeError, match="max_num_batched_tokens"):
        llmbatch.Replica("http://127.0.0.1:1/v1", max_num_batched_tokens=1.5)  # type: ignore[arg-type]
    replica = llmbatch.Replica("http://127.0.0.1:1/v1", max_num_batched_tokens=4096)
    assert repr(replica) == "Replica('http://127.0.0.1:1/v1', max_num_batched_tokens=4096)"


@pytest.mark.parametrize(
    ("value", "error"),
    [(0, llmbatch.ConfigError), (float("nan"), llmbatch.ConfigError), ("1e-5", TypeError)],
)
def test_a_bad_prefill_cost_is_refused_naming_the_field(value: object, error: type) -> None:
    with pytest.raises(error, match="prefill_seconds_per_token"):
        llmbatch.Replica("http://127.0.0.1:1/v1", prefill_seconds_per_token=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the pace is backend-free: ~4 s
async def test_a_stated_prefill_cost_paces_bulk_in_smaller_slices(anyio_backend: str) -> None:
    """Paced under an SLO, a prefill cost stated too high for the SLO's room leaves
    one prompt a slice, where the unpriced pace sends eight."""
    slo = llmbatch.SLO(tpot=0.01, pace=True)
    prompts = [f"p{i} " + "word " * 20 for i in range(150)]
    slices = []
    with run_simulator("--speed", "20") as sim:
        for cost in (None, 0.01):
            replica = llmbatch.Replica(sim.base_url, prefill_seconds_per_token=cost)
            async with llmbatch.Client(replica, slo=slo) as client:
                results = await client.map(prompts, max_tokens=16)
                server = client.stats().servers[0]
            assert all(r.ok for r in results)
            assert server.bulk_pace is not None
            slices.append(server.bulk_slice)
    unpriced, priced = slices
    assert priced is not None
    assert unpriced is not None
    assert priced < unpriced
    assert priced <= 40  # one prompt's estimated tokens
