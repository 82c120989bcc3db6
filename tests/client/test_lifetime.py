"""A client's lifetime: ``async with``, or (on asyncio) opened by its first call and
closed by ``await client.close()``, as AsyncOpenAI is; on trio ``async with`` only."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch import Client, ClientClosedError, RetryPolicy
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=1, outage_tolerance=0)


class Counting:
    """A FakeServer that counts model-list reads (one per opening) and can be held."""

    def __init__(self) -> None:
        self.fake = FakeServer()
        self.model_reads = 0
        self.down = False
        self.hold_models: anyio.Event | None = None

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            self.model_reads += 1
            if self.hold_models is not None:
                await self.hold_models.wait()
            if self.down:
                return MockResponse(status=503, json={"error": {"message": "loading"}})
        return self.fake(request)


def client(handler: Any, **kw: Any) -> Client:
    kw.setdefault("retry", FAST_RETRY)
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(handler), **kw)


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_the_first_call_opens_the_client_and_close_closes_it() -> None:
    server = Counting()
    c = client(server)
    assert "state=unopened" in repr(c)
    answer = await c.complete("hi", max_tokens=2)
    assert answer.text == "echo:hi:0"
    assert "state=open" in repr(c)
    assert (await c.chat([{"role": "user", "content": "yo"}])).text == "re:yo"
    assert [r.ok for r in await c.map(["a", "b"])] == [True, True]
    assert [r.ok async for r in c.imap(["c"])] == [True]
    assert c.stats().tiers[llmbatch.Priority.NORMAL].done == 2
    assert server.model_reads == 1
    await c.close()
    await c.close()  # twice is harmless
    assert "state=closed" in repr(c)
    with pytest.raises(ClientClosedError, match="the client is closed"):
        await c.complete("after")


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_map_unordered_and_stream_open_when_iteration_starts() -> None:
    for first in ("map_unordered", "stream"):
        c = client(Counting())
        if first == "map_unordered":
            got = [index async for index, result in c.map_unordered(["a", "b"]) if result.ok]
            assert sorted(got) == [0, 1]
        else:
            assert "".join([d async for d in c.stream("hi", max_tokens=2)])
        await c.aclose()


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_concurrent_first_calls_open_it_once() -> None:
    server = Counting()
    c = client(server)
    texts = await asyncio.gather(*(c.complete(f"p{i}", max_tokens=1) for i in range(20)))
    assert len(texts) == 20
    assert server.model_reads == 1
    await c.close()


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_a_failed_opening_fails_the_call_and_the_next_call_tries_again() -> None:
    server = Counting()
    server.down = True
    c = client(server)
    with pytest.raises(llmbatch.LLMBatchError):
        await c.complete("hi")
    assert "state=unopened" in repr(c)
    server.down = False
    assert (await c.complete("hi", max_tokens=1)).text
    await c.close()


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_a_cancelled_first_caller_leaves_the_opening_to_the_others() -> None:
    server = Counting()
    server.hold_models = anyio.Event()
    c = client(server)
    first = asyncio.create_task(c.complete("first", max_tokens=1))
    second = asyncio.create_task(c.complete("second", max_tokens=1))
    await asyncio.sleep(0.01)
    first.cancel()
    server.hold_models.set()
    assert (await second).text
    with pytest.raises(asyncio.CancelledError):
        await first
    assert server.model_reads == 1
    await c.close()


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_opened_in_one_task_and_closed_in_another() -> None:
    # A notebook runs each cell as a task of its own.
    c = client(Counting())
    assert (await asyncio.create_task(c.complete("cell 1", max_tokens=1))).text
    await asyncio.create_task(c.close())
    with pytest.raises(ClientClosedError):
        await c.complete("cell 3")


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_async_with_on_a_client_its_first_call_opened_says_how_to_close_it() -> None:
    c = client(Counting())
    await c.complete("hi", max_tokens=1)
    with pytest.raises(ClientClosedError, match=r"await client\.close\(\)"):
        async with c:
            pass
    await c.close()


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_a_client_collected_while_open_warns_and_is_closed() -> None:
    server = Counting()
    c = client(server)
    await c.complete("hi", max_tokens=1)
    runtime = c._runtime
    host = runtime._host
    assert host is not None
    with pytest.warns(ResourceWarning, match=r"garbage-collected while open"):
        del c, runtime  # the last references: collected at once
    # Its background work is released on the loop.
    await asyncio.wait({host}, timeout=5)
    assert host.done()


@pytest.mark.asyncio_only("opening on first use is asyncio's; trio requires async with")
async def test_a_view_opens_its_client_but_cannot_close_it() -> None:
    c = client(Counting())
    view = c.with_options(priority="realtime")
    assert (await view.complete("hi", max_tokens=1)).text
    with pytest.raises(ClientClosedError, match="close the client"):
        await view.close()
    await c.close()
    with pytest.raises(ClientClosedError):
        await view.complete("after")


async def test_closing_a_client_never_used_is_harmless_and_final() -> None:
    c = client(Counting())
    await c.close()
    with pytest.raises(ClientClosedError, match="the client is closed"):
        await c.complete("hi")


@pytest.mark.trio_only("trio has no task that could outlive the caller's nursery")
async def test_on_trio_a_call_without_async_with_says_what_to_do() -> None:
    c = client(Counting())
    message = r"on trio use it inside 'async with Client\(\.\.\.\)'"
    with pytest.raises(ClientClosedError, match=message):
        await c.complete("hi")
    with pytest.raises(ClientClosedError, match=message):
        c.map_unordered(["a"])
    with pytest.raises(ClientClosedError, match=message):
        async for _ in c.stream("hi"):
            pass
    async with c:  # the documented form works
        assert (await c.complete("hi", max_tokens=1)).text


async def test_async_with_stays_the_form_on_both_backends() -> None:
    async with client(Counting()) as c:
        assert (await c.complete("hi", max_tokens=1)).text
    with pytest.raises(ClientClosedError):
        await c.complete("after")
    with contextlib.suppress(ClientClosedError):
        await c.close()
