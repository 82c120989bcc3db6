"""Automatic prefix caching: block hashes, hits, pinning, LRU eviction, the
prefill time it saves and what routing by prefix gains, on the engine's virtual
clock; its counters and ``usage`` details over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

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


def test_free_blocks_are_reused_least_recently_freed_tail_first() -> None:
    cache = KVCache(num_blocks=8, block_size=4)
    a, b, c = ([base + i for i in range(9)] for base in (0, 100, 200))
    for prompt in (a, b):  # 9 tokens: 2 cached blocks; 3 more output tokens: 3 blocks
        _run(cache, prompt, output=3)
    assert cache.cached_blocks == 4
    # Free, oldest first: 2 never used; a's output block, its 2nd and 1st prompt
    # blocks; b's likewise. c takes the 2 never used and a's output block.
    _run(cache, c, output=3)
    assert cache.evictions == 0
    _run(cache, [900], output=3)  # one block: a's second, its tail, goes first...
    assert cache.evictions == 1
    assert _run(cache, a, output=3).done == 1  # ...so a still finds its first
    # a took b's output block and b's second prompt block: b keeps its first.
    assert cache.evictions == 2
    assert _run(cache, b, output=3).done == 1


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


def test_sequences_without_hashes_are_not_looked_up() -> None:
    """Embeddings do not use the prefix cache, so they are no queries either."""
    cache = KVCache(num_blocks=100, block_size=16)
    table = cache.admit(None, 100, 100)
    assert table is not None
    assert table.cached == []
    cache.computed(table, 100)
    cache.release(table)
    assert (cache.queries, cache.hits, cache.cached_blocks) == (0, 0, 0)
    # A prompt shorter than a block has no hash but is still a query, as on vLLM.
    _run(cache, list(range(10)))
    assert (cache.queries, cache.hits) == (10, 0)


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def _engine(**limits: Any) -> Engine:
    vt = VirtualTime()
    return Engine(EngineLimits(**limits), StepModel(), clock=vt.clock, sleep=vt.sleep)


@contextlib.asynccontextmanager
async def _stepping(engine: Engine) -> AsyncIterator[None]:
    """Run the engine's loop for the block: one task, so no step is ever cut short."""
    task = asyncio.ensure_future(engine.run())
    try:
        yield
    finally:
        task.cancel()


def _submit(engine: Engine, tokens: list[int], target: int = 1) -> Sequence:
    """Queue one prompt of ``tokens`` that will generate ``target`` tokens."""
    group = Group()
    seq = Sequence(
        group=group,
        index=0,
        prompt_tokens=len(tokens),
        target=target,
        visible=target,
        finish_reason="length",
        stop_reason=None,
        seed=0,
        block_hashes=block_hashes(tokens, engine.limits.block_size),
    )
    engine.add(group, [seq])
    return seq


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(100_000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("the engine did not get there")


async def _serve(engine: Engine, tokens: list[int], target: int = 1) -> Sequence:
    """Send one prompt to a stepping engine and wait until it is answered."""
    seq = _submit(engine, tokens, target)
    await _until(lambda: seq.finished)
    return seq


def _ttft(seq: Sequence) -> float:
    assert seq.first_token_at is not None
    return seq.first_token_at - seq.arrival


@pytest.mark.parametrize("caching", [True, False])
def test_a_cached_prefix_shortens_prefill_in_engine_time(caching: bool) -> None:
    async def scenario() -> tuple[Sequence, Sequence, Engine]:
        engine = _engine(max_model_len=4096, enable_prefix_caching=caching)
        shared = list(range(3000))
        async with _stepping(engine):
            first = await _serve(engine, [*shared, 1, 2, 3])
            second = await _serve(engine, [*shared, 4, 5, 6])
        return first, second, engine

    first, second, engine = asyncio.run(scenario())
    step = StepModel()
    # One step with the whole prompt prefilled...
    assert first.cached_tokens == 0
    assert _ttft(first) == pytest.approx(step.step_seconds(1, 3003))
    if caching:
        # ...then one that prefills only what the cache lacks: 3003 - 187 * 16 = 11.
        assert second.cached_tokens == engine.kv.hits == 187 * 16
        assert _ttft(second) == pytest.approx(step.step_seconds(1, 3003 - 187 * 16))
        assert _ttft(second) < _ttft(first) / 2
    else:
        assert second.cached_tokens == 0
        assert _ttft(second) == _ttft(first)
        assert engine.kv.hits == 0


def test_a_cached_prefix_skips_chunked_prefill_steps() -> None:
    async def scenario() -> tuple[Engine, list[int]]:
        engine = _engine(max_model_len=4096, max_num_batched_tokens=512)
        shared = list(range(3000))
        steps = []
        async with _stepping(engine):
            for suffix in ([1, 2, 3], [4, 5, 6]):
                before = engine.steps
                await _serve(engine, [*shared, *suffix])
                steps.append(engine.steps - before)
        return engine, steps

    engine, steps = asyncio.run(scenario())
    # 3,003 tokens at 512 a step take 6 steps; the 11 the cache lacks, one.
    assert steps == [6, 1]
    assert engine.kv.hits == 187 * 16


def _prompt(base: int, blocks: int = 20, extra: int = 10) -> list[int]:
    """A prompt of ``blocks`` full 16-token blocks and ``extra`` more tokens, its
    ids starting at ``base`` (prompts with different bases share nothing)."""
    return list(range(base, base + blocks * 16 + extra))


@pytest.mark.parametrize(("kv_cache_tokens", "hit_after"), [(1024, 0), (8192, 320)])
def test_a_prefix_evicted_by_other_prompts_misses_again(
    kv_cache_tokens: int, hit_after: int
) -> None:
    async def scenario() -> tuple[Engine, list[Sequence], Sequence]:
        engine = _engine(max_model_len=512, kv_cache_tokens=kv_cache_tokens)
        shared = _prompt(0)
        async with _stepping(engine):
            warm = [await _serve(engine, shared), await _serve(engine, shared)]
            # Four other prompts of 21 blocks each: 64 blocks cannot keep them and
            # the first prompt's 20 too, so the least recently used (its) go.
            for base in (10_000, 20_000, 30_000, 40_000):
                await _serve(engine, _prompt(base))
            again = await _serve(engine, shared)
        return engine, warm, again

    engine, (first, second), again = asyncio.run(scenario())
    assert (first.cached_tokens, second.cached_tokens) == (0, 320)
    assert again.cached_tokens == hit_after
    if hit_after == 0:
        assert engine.kv.evictions > 0
        assert _ttft(again) == pytest.approx(_ttft(first))
    else:
        assert engine.kv.evictions == 0
        assert _ttft(again) == pytest.approx(_ttft(second))
    # Blocks held plus blocks kept for reuse never exceed the capacity.
    assert engine.kv.cached_blocks <= engine.kv.num_blocks == kv_cache_tokens // 16
    assert engine.kv_usage == 0.0  # nothing runs: every cached block is free to evict


def test_a_running_sequences_prefix_blocks_are_pinned() -> None:
    async def scenario() -> tuple[Engine, Sequence]:
        engine = _engine(max_model_len=512, kv_cache_tokens=1024)  # 64 blocks
        shared = _prompt(0)
        async with _stepping(engine):
            # 330 prompt + 300 output tokens: 40 blocks, held for 300 steps.
            holder = _submit(engine, shared, target=300)
            await _until(lambda: holder.generated > 0)
            # The other 24 blocks churn: each of these evicts the one before.
            for base in (10_000, 20_000, 30_000, 40_000):
                await _serve(engine, _prompt(base))
            sharer = await _serve(engine, [*shared[:320], 7, 7, 7])
            assert not holder.finished
        return engine, sharer

    engine, sharer = asyncio.run(scenario())
    # The first fits in never-used blocks; the others, and the sharer's one new
    # block, evict cached blocks freed before them (17, 20, 20 and 1)...
    assert engine.kv.evictions == 17 + 20 + 20 + 1
    # ...but never the holder's 20 prefix blocks, which the sharer finds.
    assert sharer.cached_tokens == 320


def _hit_rate(engines: list[Engine]) -> float:
    return sum(e.kv.hits for e in engines) / sum(e.kv.queries for e in engines)


def test_routing_by_prefix_beats_round_robin_when_prefixes_outgrow_a_replica() -> None:
    """32 system prompts of ~1,000 tokens (62 full blocks each: 1,984 blocks) against
    four replicas of 768 blocks (``kv_cache_tokens=12288``): all the prefixes need
    2.6x one replica's cache, a replica's quarter of them fits. Sent to the
    replica their prefix maps to, they hit after the first round; spread round
    robin, every replica churns through all 32. (Each replica serves its requests
    one at a time, in the order they were sent, so the outcome is exact.)"""
    prefixes = [_prompt(100_000 * p, blocks=62, extra=8) for p in range(32)]
    order = random.Random(0)
    requests = []
    for round_ in range(4):
        shuffled = list(range(32))
        order.shuffle(shuffled)
        requests += [(p, [*prefixes[p], round_, 1, 2]) for p in shuffled]

    async def route(pick: Callable[[int, int], int]) -> list[Engine]:
        replicas = [_engine(max_model_len=2048, kv_cache_tokens=12_288) for _ in range(4)]
        for r, replica in enumerate(replicas):
            async with _stepping(replica):
                for i, (p, prompt) in enumerate(requests):
                    if pick(i, p) == r:
                        await _serve(replica, prompt)
        return replicas

    by_prefix = asyncio.run(route(lambda i, p: p % 4))
    round_robin = asyncio.run(route(lambda i, p: i % 4))
    # 3 of 4 rounds find 992 of 1,003 tokens cached.
    assert _hit_rate(by_prefix) == pytest.approx(3 / 4 * 992 / 1003)
    assert _hit_rate(round_robin) < _hit_rate(by_prefix) / 2
    # The saved prefill is GPU time saved: the same work in less engine time.
    busy = sum(e.busy_seconds for e in by_prefix)
    assert busy < 0.8 * sum(e.busy_seconds for e in round_robin)


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


def test_usage_reports_cached_tokens_and_replicas_their_hit_rates() -> None:
    """``--enable-prompt-tokens-details`` puts each answer's cached prompt tokens in
    ``usage``; ``SimulatorProcess.prefix_cache`` reads each replica's counters."""
    system = "You are a careful assistant who answers briefly. " * 30
    with (
        run_simulator("--speed", "200", "--replicas", "2", "--enable-prompt-tokens-details") as sim,
        httpx.Client(base_url=sim.urls[0] + "/v1", timeout=30) as first,
        httpx.Client(base_url=sim.urls[1] + "/v1", timeout=30) as second,
    ):

        def usage(http: httpx.Client, route: str, body: dict[str, Any]) -> dict[str, Any]:
            r = http.post(route, json={**body, "max_tokens": 2})
            assert r.status_code == 200
            result: dict[str, Any] = r.json()["usage"]
            return result

        def chat(question: str) -> dict[str, Any]:
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ]
            return {"messages": messages}

        cold = usage(first, "/completions", {"prompt": system + "What is 2+2?"})
        warm = usage(first, "/completions", {"prompt": system + "Name a colour."})
        chat_cold = usage(first, "/chat/completions", chat("Hi?"))
        chat_warm = usage(first, "/chat/completions", chat("Bye?"))
        elsewhere = usage(second, "/completions", {"prompt": system + "Name a colour."})
        streamed = first.post(
            "/completions",
            json={
                "prompt": system + "Once more?",
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: {")]
        stream_usage = json.loads(events[-1])["usage"]
        stats = [sim.prefix_cache(0), sim.prefix_cache(1)]

    assert cold["prompt_tokens_details"] == {"cached_tokens": 0}
    assert chat_cold["prompt_tokens_details"] == {"cached_tokens": 0}
    shared = EstimateCounter().count(system)
    for answer in (warm, chat_warm, stream_usage):
        cached = answer["prompt_tokens_details"]["cached_tokens"]
        assert cached % 16 == 0
        assert shared - 16 <= cached < answer["prompt_tokens"]
    # The other replica has its own cache: the same prompt misses there.
    assert elsewhere["prompt_tokens_details"] == {"cached_tokens": 0}
    answers = (cold, warm, chat_cold, chat_warm, stream_usage)
    assert stats[0] == (
        sum(a["prompt_tokens"] for a in answers),
        sum(a["prompt_tokens_details"]["cached_tokens"] for a in answers),
    )
    assert stats[1] == (elsewhere["prompt_tokens"], 0)
    assert 0.4 < stats[0].hit_rate < 1.0
    assert stats[1].hit_rate == 0.0
