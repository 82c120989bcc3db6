"""``Timeout.read`` on the aiohttp transport, kept by one watch for every exchange:
against real sockets on 127.0.0.1, a server that stalls before its answer, inside
its body or between a stream's lines is a ReadTimeout; a stream slower in total
than the timeout but steady is read whole; and the caller's own cancellation stays
a cancellation, with nothing left pending on its task."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import SocketAttribute, SocketStream, TaskGroup

import llmbatch
from llmbatch import Limits, Timeout
from llmbatch._transports.aiohttp import AiohttpTransport
from llmbatch.transports import HTTPRequest

pytestmark = pytest.mark.anyio

#: What the server does once a request has come in: (seconds to wait, bytes to send).
Script = Sequence[tuple[float, bytes]]
Serve = Callable[[Script], Awaitable[str]]

STREAM = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def body(length: int) -> bytes:
    """A JSON answer's status line and headers, promising ``length`` bytes."""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiohttp runs on asyncio only


async def _listen(tg: TaskGroup, script: Script) -> str:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def answer(stream: SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive()
            for delay, data in script:
                await anyio.sleep(delay)
                await stream.send(data)
            await anyio.sleep(30)  # hold the connection: the client decides

    tg.start_soon(listener.serve, answer)
    return f"http://127.0.0.1:{listener.extra(SocketAttribute.local_port)}/v1/completions"


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start loopback servers that answer every request by a script (stopped after)."""
    async with anyio.create_task_group() as tg:
        yield lambda script: _listen(tg, script)
        tg.cancel_scope.cancel()


def transport(read: float | None) -> AiohttpTransport:
    return AiohttpTransport(limits=Limits(), timeout=Timeout(read=read))


def post(url: str) -> HTTPRequest:
    return HTTPRequest("POST", url, {"Content-Type": "application/json"}, b"{}")


def nothing_pending() -> None:
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # no cancellation of the watch's left on the task


async def test_a_server_silent_before_its_answer_is_a_read_timeout(serve: Serve) -> None:
    urls = [await serve([]) for _ in range(3)]
    http = transport(read=0.2)
    try:
        # Three exchanges waiting at once, on one watch: each times out.
        async def one(url: str) -> BaseException | None:
            try:
                await http.send(post(url))
            except llmbatch.ReadTimeout as exc:
                return exc
            return None

        with anyio.fail_after(5):
            errors = await asyncio.gather(*(one(url) for url in urls))
        assert all(isinstance(e, llmbatch.ReadTimeout) for e in errors)
        assert "Timeout.read" in str(errors[0])
        nothing_pending()
        await anyio.lowlevel.checkpoint()  # the task goes on, not cancelled
    finally:
        await http.aclose()


async def test_a_body_that_stalls_after_the_headers_is_a_read_timeout(serve: Serve) -> None:
    url = await serve([(0, body(20) + b'{"choices": ')])  # 12 of the 20 bytes promised
    http = transport(read=0.2)
    try:
        response = await http.send(post(url))
        assert response.status == 200
        with anyio.fail_after(5), pytest.raises(llmbatch.ReadTimeout):
            await response.read()
        await response.aclose()
        nothing_pending()
    finally:
        await http.aclose()


async def test_a_stream_is_timed_line_by_line(serve: Serve) -> None:
    # Six lines 0.1 s apart: 0.6 s in all, past a read timeout of 0.3 that each
    # line keeps; then the server stalls, and the next line's wait times out.
    lines = [(0.1, b"data: %d\n\n" % i) for i in range(6)]
    url = await serve([(0, STREAM), *lines])
    http = transport(read=0.3)
    try:
        response = await http.send(post(url))
        got = []
        with anyio.fail_after(5), pytest.raises(llmbatch.ReadTimeout):
            async for line in response.iter_lines():
                got.append(line)
        assert [line for line in got if line] == [b"data: %d" % i for i in range(6)]
        await response.aclose()
        nothing_pending()
    finally:
        await http.aclose()


async def test_the_callers_own_cancellation_stays_a_cancellation(serve: Serve) -> None:
    url = await serve([])
    http = transport(read=30)
    try:
        with anyio.move_on_after(0.1) as scope:
            await http.send(post(url))
        assert scope.cancelled_caught
        nothing_pending()
        assert not http._watch._waiting  # type: ignore[union-attr]  # the wait ended
    finally:
        await http.aclose()


async def test_without_a_read_timeout_nothing_is_watched(serve: Serve) -> None:
    answer = b'{"choices": []}'
    url = await serve([(0.3, body(len(answer)) + answer)])
    http = transport(read=None)
    try:
        assert http._watch is None
        response = await http.send(post(url))
        assert await response.read() == answer
        await response.aclose()
    finally:
        await http.aclose()


async def test_a_request_that_waited_for_the_pool_keeps_aiohttps_read_timer(
    serve: Serve,
) -> None:
    """With the pool full, the wait for a connection is Timeout.pool's: the read's
    timer (aiohttp's own, then) starts once the request is sent."""
    url = await serve([])
    http = AiohttpTransport(limits=Limits(max_connections=1), timeout=Timeout(read=0.4, pool=5))
    try:

        async def one() -> BaseException | None:
            try:
                await http.send(post(url))
            except llmbatch.TimeoutException as exc:
                return exc
            return None

        with anyio.fail_after(5):
            first, second = await asyncio.gather(one(), one())
        # The second waited for the first's connection (0.4 s), then read 0.4 s more.
        assert isinstance(first, llmbatch.ReadTimeout)
        assert isinstance(second, llmbatch.ReadTimeout)
        nothing_pending()
    finally:
        await http.aclose()


def test_a_transport_closed_and_opened_again_on_a_new_loop_keeps_its_read_timeout() -> None:
    """The watch forgets its loop when the transport closes: used again under another
    event loop, the read timeout still holds there."""
    with socket.socket() as listener:  # listens, never accepts: requests go unanswered
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions"
        http = transport(read=0.2)

        async def once() -> None:
            try:
                with pytest.raises(llmbatch.ReadTimeout):
                    await asyncio.wait_for(http.send(post(url)), timeout=5)
            finally:
                await http.aclose()

        asyncio.run(once())
        asyncio.run(once())
