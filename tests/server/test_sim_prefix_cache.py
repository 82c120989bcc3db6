"""Automatic prefix caching: block hashes, hits, pinning, LRU eviction, and the
prefill time it saves, on the engine's virtual clock and over HTTP."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from llmbatch_server.sim.config import EngineLimits, StepModel
from llmbatch_server.sim.counting import EstimateCounter
from llmbatch_server.sim.engine import Engine, Group, Sequence
from llmbatch_server.sim.prefix_cache import BlockTable, KVCache, block_hashes
from llmbatch_server.testing import run_simulator


def test_hashes_chain_over_full_blocks() -> None:
    a = block_hashes(list(range(40)), block_size=16)
    b = block_hashes([*range(32), 99, 99, 99], block_size=16)
    assert len(a) == 2  # the last 8 tokens are a partial block: no hash
    assert b == a  # same first two blocks; the partial third block is not hashed
    c = block_hashes([7, *range(1, 40)], block_size=16)
    # A change early on changes every later hash.
    assert c[0] != a[0]
    assert c[1] != a[1]
    assert block_hashes(list(range(40)), 16, salt="tenant-a") != a


def _run(cache: KVCache, tokens: list[int], output: int = 0) -> BlockTable:
    """Admit a sequence, compute its whole prompt, release it; return its table."""
    table = cache.admit(block_hashes(tokens, cache.block_size), len(tokens), len(tokens) + output)
    assert table is not None
    hit = len(table.cached)
    cache.computed(table, len(tokens))
    cache.release(table)
    table.done = hit  # what it found cached when admitted, for the caller
    return table


def test_a_repeated_prefix_hits_all_but_the_last_token() -> None:
    cache = KVCache(num_blocks=100, block_size=16)
    prompt = list(range(100))  # 6 full blocks and 4 tokens
    assert _run(cache, prompt).done == 0
    assert _run(cache, prompt).done == 6
    exact = list(range(1000, 1064))  # exactly 4 blocks
    _run(cache, exact)
    # The last prompt token is always recomputed, so its block cannot hit.
    assert _run(cache, exact).done == 3
    assert cache.queries == 2 * 100 + 2 * 64
    assert cache.hits == (6 + 3) * 16
    assert cache.used == 0


def test_blocks_of_running_sequences_are_pinned() -> None:
    cache = KVCache(num_blocks=4, block_size=4)
    holder = cache.admit(block_hashes(list(range(12)), 4), 12, 16)  # all 4 blocks
    assert holder is not None
    cache.computed(holder, 12)
    assert cache.usage == 1.0
    # Nothing is free, so nothing is evicted: the newcomer waits.
    assert cache.admit(block_hashes(list(range(50, 58)), 4), 8, 8) is None
    # The holder's cached prefix can be shared, though: only new blocks count.
    sharer = cache.admit(block_hashes([*range(8), 77, 78, 79], 4), 11, 11)
    assert sharer is None  # 2 shared + 1 new block > 0 free
    cache.release(holder)
    assert cache.usage == 0.0
    assert cache.cached_blocks == 3  # kept after release, until evicted


def test_free_blocks_are_evicted_least_recently_used_tail_first() -> None:
    cache = KVCache(num_blocks=8, block_size=4)
    a, b, c, d = ([base + i for i in range(9)] for base in (0, 100, 200, 300))
    for prompt in (a, b, c):  # 9 tokens: 2 cached blocks; 3 more output tokens: 3 blocks
        _run(cache, prompt, output=3)
    assert cache.cached_blocks == 6
    assert cache.evictions == 0
    _run(cache, d, output=3)  # needs 3 blocks, 2 never used: one cached block must go
    assert cache.evictions == 1
    # The oldest was a's; its tail block went first, so a keeps its first block.
    assert _run(cache, a, output=3).done == 1
    assert _run(cache, c, output=3).done == 2


def test_reset_forgets_free_cached_blocks() -> None:
    cache = KVCache(num_blocks=100, block_size=16)
    prompt = list(range(100))
    _run(cache, prompt)
    cache.reset()
    assert cache.cached_blocks == 0
    assert _run(cache, prompt).done == 0


def test_caching_off_never_hits() -> None:
    cache = KVCache(num_blocks=100, block_size=16, caching=False)
    prompt = list(range(100))
    _run(cache, prompt)
    assert _run(cache, prompt).done == 0
    assert (cache.queries, cache.hits) == (0, 0)  # vLLM records no stats then


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def _ttft(engine: Engine, tokens: list[int]) -> float:
    """Virtual seconds from arrival to the first token of a one-token answer."""
    group = Group()
    seq = Sequence(
        group=group,
        index=0,
        prompt_tokens=len(tokens),
        target=1,
        visible=1,
        finish_reason="length",
        stop_reason=None,
        seed=0,
        block_hashes=block_hashes(tokens, engine.limits.block_size),
    )
    engine.add(group, [seq])
    task = asyncio.ensure_future(engine.run())
    try:
        for _ in range(10_000):
            if group.pending == 0:
                break
            await asyncio.sleep(0)
    finally:
        task.cancel()
    assert seq.first_token_at is not None
    return seq.first_token_at - seq.arrival


@pytest.mark.parametrize("caching", [True, False])
def test_a_cached_prefix_shortens_prefill_in_engine_time(caching: bool) -> None:
    async def scenario() -> tuple[float, float, Engine]:
        vt = VirtualTime()
        limits = EngineLimits(max_model_len=4096, enable_prefix_caching=caching)
        engine = Engine(limits, StepModel(), clock=vt.clock, sleep=vt.sleep)
        shared = list(range(3000))
        first = await _ttft(engine, [*shared, 1, 2, 3])
        second = await _ttft(engine, [*shared, 4, 5, 6])
        return first, second, engine

    first, second, engine = asyncio.run(scenario())
    step = StepModel()
    # One step with the whole prompt prefilled...
    assert first == pytest.approx(step.step_seconds(1, 3003))
    if caching:
        # ...then one that prefills only what the cache lacks: 3003 - 187 * 16 = 11.
        assert engine.kv.hits == 187 * 16
        assert second == pytest.approx(step.step_seconds(1, 3003 - 187 * 16))
        assert second < first / 2
    else:
        assert second == first
        assert engine.kv.hits == 0


def _counter(metrics: str, name: str) -> float:
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)
    assert match, name
    return float(match.group(1))


@pytest.mark.parametrize("flag", ["--enable-prefix-caching", "--no-enable-prefix-caching"])
def test_metrics_count_queries_and_hits(flag: str) -> None:
    prefix = "You are a careful assistant. " * 40  # a shared system prompt
    with (
        run_simulator("--speed", "200", flag) as sim,
        httpx.Client(base_url=sim.base_url, timeout=30) as http,
    ):
        for question in ("What is 2+2?", "Name a colour."):
            r = http.post("/completions", json={"prompt": prefix + question, "max_tokens": 2})
            assert r.status_code == 200
        salted = {"prompt": prefix + "Again?", "max_tokens": 2, "cache_salt": "other-tenant"}
        assert http.post("/completions", json=salted).status_code == 200
        assert http.post("/completions", json={**salted, "cache_salt": ""}).status_code == 400
        metrics = sim.metrics()
    queries = _counter(metrics, "vllm:prefix_cache_queries_total")
    hits = _counter(metrics, "vllm:prefix_cache_hits_total")
    if flag == "--enable-prefix-caching":
        prompt_tokens = _counter(metrics, "vllm:prompt_tokens_total")
        assert queries == prompt_tokens
        # The second prompt found the shared prefix's full blocks; the salted
        # one found nothing, as if it came from another tenant.
        assert hits >= 0.75 * EstimateCounter().count(prefix)
        assert hits < queries / 2
    else:
        assert (queries, hits) == (0, 0)
