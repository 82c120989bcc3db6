"""The response cache kept in a real redis-server: clients (and processes) sharing
it, entries that expire, what a Redis that cannot be reached does at opening and
later (lookups are misses, writes lost and counted, requests answered)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from cache_worker_paths import WORKER

import llmbatch
from llmbatch import Cache, ConfigError
from llmbatch_server.redis_process import RedisProcess
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency") as server:
        yield server


async def test_clients_share_answers_through_redis(
    sim: SimulatorProcess, redis_server: RedisProcess, tmp_path: Path
) -> None:
    namespace = uuid.uuid4().hex  # the module's server is shared by its tests
    redis = pytest.importorskip("redis").Redis.from_url(redis_server.url)
    redis.flushdb()
    cache = Cache(redis_server.url, namespace=namespace, max_age=60)
    prompts = [f"redis prompt {i}" for i in range(300)]
    before = sim.finished()
    async with llmbatch.Client(sim.base_url, cache=cache) as client:
        # (max_tokens as the worker asks it: the same requests.)
        first = await client.map(prompts, temperature=0, max_tokens=8)
        stats = client.stats()
    assert sim.finished() - before == 300
    assert stats.cache is not None
    assert stats.cache.location == redis_server.url
    assert stats.cache.stored == 300
    # Another process finds every answer there.
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    before = sim.finished()
    argv = [sys.executable, str(WORKER), sim.base_url, redis_server.url, str(prompts_file)]
    out = await anyio.run_process([*argv, "--namespace", namespace], check=True)
    result = json.loads(out.stdout)
    assert sim.finished() == before
    assert result["hits"] == 300
    assert result["texts"] == {p: r.text for p, r in zip(prompts, first, strict=True)}
    # Each entry expires max_age after it was written.
    try:
        keys = redis.keys("llmbatch:cache:*")
        ttls = [redis.ttl(key) for key in keys if b":hits:" not in key]
        assert len(ttls) == 300
        assert all(0 < ttl <= 60 for ttl in ttls)
        assert int(redis.get(f"llmbatch:cache:hits:{namespace}")) == 300
    finally:
        redis.close()


async def test_a_redis_that_cannot_be_reached_fails_the_opening(sim: SimulatorProcess) -> None:
    with pytest.raises(ConfigError, match=r"cannot be reached") as caught:
        async with llmbatch.Client(sim.base_url, cache="redis://:hunter2@127.0.0.1:1/0"):
            pass
    assert "hunter2" not in str(caught.value)


async def test_a_redis_gone_later_makes_misses_not_failures(
    sim: SimulatorProcess, redis_server: RedisProcess
) -> None:
    namespace = uuid.uuid4().hex
    async with llmbatch.Client(
        sim.base_url, cache=Cache(redis_server.url, namespace=namespace)
    ) as client:
        await client.map(["a", "b"], temperature=0, max_tokens=2)
        store = client._runtime.cache.store  # type: ignore[union-attr]
        redis_server.stop()
        try:
            with pytest.warns(RuntimeWarning, match="could not be read"):
                again = await client.map(["a", "b", "c"], temperature=0, max_tokens=2)
            with pytest.warns(RuntimeWarning, match="could not be written"):
                store.flush()
        finally:
            redis_server.restart()
        stats = client.stats()
    assert all(r.ok for r in again)
    assert stats.cache is not None
    assert stats.cache.write_errors >= 1
