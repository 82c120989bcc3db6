"""One client over two real vLLM processes: routing across both, the load report
read from each, and failover when one is stopped in the middle of a map.

The session's vLLM is one replica; each test here starts a second one (~45 s and
~3 GB on CPU). Latencies are printed, never asserted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
from vllm_recorder import Recorder

import llmbatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import RunningServer  # tests/real_vllm/conftest.py

    from llmbatch_server.launcher import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.anyio, pytest.mark.asyncio_only("aiohttp recorder")]


async def test_two_vllm_replicas_share_a_map_and_each_reports_its_load(
    vllm_server: RunningServer, make_server: Callable[..., VLLMServer]
) -> None:
    from conftest import ServerThread  # tests/real_vllm/conftest.py

    second = make_server()
    with ServerThread(second):
        wire = Recorder()
        urls = [vllm_server.base_url, second.base_url]
        async with llmbatch.Client(urls, transport=wire) as client:
            results = await client.map([f"Count to {i}:" for i in range(96)], max_tokens=16)
            stats = client.stats()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    origins = [url.split("/v1", 1)[0] for url in urls]
    print(f"\ntwo replicas: POSTs {dict(wire.posts())}")
    assert all(wire.posts()[origin] > 0 for origin in origins), wire.posts()
    assert [s.base_url for s in stats.servers] == urls
    for server in stats.servers:
        # The endpoint-load-metrics header (or /metrics) was read from each replica.
        assert server.kv_cache_usage is not None, server
        assert server.waiting is not None, server


async def test_a_vllm_replica_stopped_mid_map_hands_its_work_to_the_other(
    vllm_server: RunningServer, make_server: Callable[..., VLLMServer]
) -> None:
    from conftest import ServerThread  # tests/real_vllm/conftest.py

    second = make_server()
    thread = ServerThread(second)
    thread.__enter__()
    stopped = False
    n = 300
    seen: list[int] = []
    try:
        async with llmbatch.Client([vllm_server.base_url, second.base_url]) as client:
            async with anyio.create_task_group() as tg:

                async def run_map() -> None:
                    async for index, result in client.map_unordered(
                        [f"item {i}" for i in range(n)], max_tokens=8, ignore_eos=True
                    ):
                        assert result.ok, result.error
                        seen.append(index)

                tg.start_soon(run_map)
                with anyio.fail_after(120):
                    while len(seen) < 30:  # noqa: ASYNC110 (no event to wait on)
                        await anyio.sleep(0.1)
                await anyio.to_thread.run_sync(thread.__exit__, None, None, None)
                stopped = True
            stats = client.stats()
    finally:
        if not stopped:
            thread.__exit__(None, None, None)
    assert sorted(seen) == list(range(n)), "an item was lost or delivered twice"
    assert stats.tiers[llmbatch.Priority.BATCH].failed == 0
    first, gone = stats.servers
    print(
        f"\nfailover: {n} items answered once each; the stopped replica's breaker "
        f"{gone.breaker}, {stats.retries} HTTP retries"
    )
    assert first.breaker == "closed"
