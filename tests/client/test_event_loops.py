"""A client and the event loops that use it (issue #44, item 1).

A client belongs to the loop that opened it. One its first call opened (no
``async with``) opens again on the next loop once its own has ended: a module-level
client across ``asyncio.run()`` calls, a test framework's loop per test. Any other
use from a second loop is refused with a ``ClientClosedError`` that says what
happened and what to do, never asyncio's "attached to a different loop".

Sync tests: each makes and ends its own loops. A real simulator process and the
default aiohttp transport, whose connections belong to a loop as well.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from collections.abc import Iterator

import pytest

import llmbatch
from llmbatch import ClientClosedError
from llmbatch_server.testing import SimulatorProcess, run_simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator() as server:
        yield server


async def one_call(client: llmbatch.Client) -> str:
    return (await client.complete("hi", max_tokens=2)).text


def test_a_first_use_client_opens_again_on_the_next_loop(sim: SimulatorProcess) -> None:
    client = llmbatch.Client(sim.base_url)  # as a module-level client is
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(one_call(client))
        assert "state=closed" in repr(client)  # released as its loop ended

        async def second(client: llmbatch.Client) -> int:
            results = await client.map(["a", "b", "c"], max_tokens=2)
            got = [i async for i, r in client.map_unordered(["d", "e"], max_tokens=2) if r.ok]
            assert sorted(got) == [0, 1]
            assert await one_call(client)
            return sum(r.ok for r in results)

        assert asyncio.run(second(client)) == 3
        # Its counts start again with the new opening.
        assert client.stats().tiers[llmbatch.Priority.NORMAL].done == 1
        assert asyncio.run(one_call(client))
        asyncio.run(client.close())
        del client
        gc.collect()
    # Each loop's connections were closed on that loop: nothing left unclosed.
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_an_async_with_client_on_a_second_loop_says_what_to_do(sim: SimulatorProcess) -> None:
    client = llmbatch.Client(sim.base_url)

    async def enter_and_call() -> str:
        await client.__aenter__()  # left open: its loop ends under it
        return await one_call(client)

    assert asyncio.run(enter_and_call())
    with pytest.raises(ClientClosedError) as raised:
        asyncio.run(one_call(client))
    message = str(raised.value)
    assert "event loop ended while it was open" in message
    assert "make a new one on this loop" in message
    assert "attached to a different loop" not in message
    asyncio.run(client.close())  # harmless: it was released with its loop


def test_a_client_whose_loop_runs_in_another_thread_is_refused(sim: SimulatorProcess) -> None:
    client = llmbatch.Client(sim.base_url)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert asyncio.run_coroutine_threadsafe(one_call(client), loop).result(30)
        for call in (one_call(client), client.close()):
            with pytest.raises(ClientClosedError, match="another event loop, which is still"):
                asyncio.run(call)
        # Still usable on its own loop, and closed there.
        assert asyncio.run_coroutine_threadsafe(one_call(client), loop).result(30)
        asyncio.run_coroutine_threadsafe(client.close(), loop).result(30)
        assert "state=closed" in repr(client)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_loop_closed_without_ending_its_tasks_is_left_behind(sim: SimulatorProcess) -> None:
    client = llmbatch.Client(sim.base_url)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(one_call(client))
    # Stopped and closed with the client's task still pending (not asyncio.run's way
    # out): nothing of the client can run there again.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Task was destroyed but it is pending"
        loop.close()
    assert "state=open" in repr(client)
    assert asyncio.run(one_call(client))  # opened again on this loop
    asyncio.run(client.close())
    assert "state=closed" in repr(client)
