"""Network failures become the right llmbatch errors, over real sockets on 127.0.0.1:
a server that never answers is a ReadTimeout, an exhausted pool a PoolTimeout, a
closed port a ConnectError, on both transports."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import httpx
import pytest
from anyio.abc import SocketStream

import llmbatch
from llmbatch import Limits, RetryPolicy, Timeout
from llmbatch._transports.aiohttp import _mapped as aiohttp_error
from llmbatch._transports.httpx import _mapped_errors as httpx_errors

pytestmark = pytest.mark.anyio

ONCE = RetryPolicy(attempts=1)


MODELS = b'{"data": [{"id": "m", "max_model_len": 4096}]}'
MODELS_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(MODELS), MODELS)
)


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A loopback port that answers ``GET /v1/models`` and never answers anything else
    (it reads and holds the connection)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def hold(stream: SocketStream) -> None:
        async with stream:
            try:
                while True:
                    data = await stream.receive()
                    if data.startswith(b"GET /v1/models"):
                        await stream.send(MODELS_RESPONSE)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def transports() -> list[Any]:
    return [
        pytest.param(("aiohttp", "asyncio"), id="aiohttp"),
        pytest.param(("httpx", "asyncio"), id="httpx-asyncio"),
        pytest.param(("httpx", "trio"), id="httpx-trio"),
    ]


@pytest.fixture(params=transports())
def setup(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def anyio_backend(setup: tuple[str, str]) -> str:
    return setup[1]


async def test_a_server_that_never_answers_is_a_read_timeout(
    setup: tuple[str, str], silent_port: int
) -> None:
    async with llmbatch.Client(
        f"http://127.0.0.1:{silent_port}/v1",
        model="m",
        transport=setup[0],  # type: ignore[arg-type]
        timeout=Timeout(read=0.2),
        retry=ONCE,
    ) as client:
        with pytest.raises(llmbatch.ReadTimeout) as info:
            await client.complete("hi")
    assert isinstance(info.value, llmbatch.TimeoutException)
    assert not isinstance(info.value, llmbatch.PoolTimeout)


async def test_an_exhausted_pool_is_a_pool_timeout(
    setup: tuple[str, str], silent_port: int
) -> None:
    async with llmbatch.Client(
        f"http://127.0.0.1:{silent_port}/v1",
        model="m",
        transport=setup[0],  # type: ignore[arg-type]
        limits=Limits(max_connections=1),
        timeout=Timeout(read=30, pool=0.2),
        retry=ONCE,
        batching={"normal": llmbatch.BatchPolicy(max_batch_size=1, max_wait=0)},
        on_close="cancel",
    ) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.complete, "holds the only connection")
            await anyio.sleep(0.05)
            with pytest.raises(llmbatch.PoolTimeout):
                await client.complete("finds none free")
            tg.cancel_scope.cancel()


async def test_a_closed_port_is_a_connect_error(setup: tuple[str, str]) -> None:
    port = closed_port()
    async with llmbatch.Client(
        f"http://127.0.0.1:{port}/v1",
        model="m",
        transport=setup[0],  # type: ignore[arg-type]
        retry=ONCE,
    ) as client:
        with pytest.raises(llmbatch.ConnectError) as info:
            await client.complete("hi")
    # In llmbatch's words, the same on every transport (not aiohttp's "ssl:default").
    assert str(info.value).startswith(f"cannot connect to 127.0.0.1:{port}: connection refused")


async def test_a_name_that_does_not_resolve_is_said_so(setup: tuple[str, str]) -> None:
    async with llmbatch.Client(
        "http://no-such-host.invalid:8000/v1",  # .invalid never resolves (RFC 2606)
        model="m",
        transport=setup[0],  # type: ignore[arg-type]
        retry=ONCE,
    ) as client:
        with pytest.raises(llmbatch.ConnectError) as info:
            await client.complete("hi")
    assert "cannot connect to no-such-host.invalid:8000: the host name did not resolve" in str(
        info.value
    )


def test_aiohttp_connect_timeouts_are_told_from_pool_waits() -> None:
    timeout = aiohttp.ConnectionTimeoutError("Connection timeout to host")
    for pool_full, expected in ((False, llmbatch.ConnectTimeout), (True, llmbatch.PoolTimeout)):
        assert type(aiohttp_error(timeout, pool_full)) is expected
    assert issubclass(llmbatch.ConnectTimeout, llmbatch.ConnectError)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (httpx.ConnectTimeout("slow"), llmbatch.ConnectTimeout),
        (httpx.ReadTimeout("slow"), llmbatch.ReadTimeout),
        (httpx.WriteTimeout("slow"), llmbatch.WriteTimeout),
        (httpx.PoolTimeout("slow"), llmbatch.PoolTimeout),
        (httpx.ConnectError("refused"), llmbatch.ConnectError),
        (httpx.RemoteProtocolError("dropped"), llmbatch.RemoteProtocolError),
    ],
)
def test_httpx_errors_map_one_to_one(raised: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected), httpx_errors():
        raise raised


async def test_a_transport_failing_in_background_reads_does_not_take_the_client_down() -> None:
    """A custom transport must raise only llmbatch's errors; one that raises anything
    else on /metrics or /health costs those reads, not the client."""
    from fake_server import FakeServer

    import llmbatch
    from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

    fake = FakeServer()

    async def handler(request: HTTPRequest) -> MockResponse:
        if request.method == "GET" and not request.url.endswith("/models"):
            raise KeyError("a bug in the application's transport")
        if request.method == "POST":
            await anyio.sleep(0.7)  # in flight across one /metrics read (every 0.5 s)
        return fake(request)

    async with llmbatch.Client("http://127.0.0.1:1/v1", transport=MockTransport(handler)) as c:
        results = await c.map([f"p{i}" for i in range(300)], max_tokens=2)
        assert all(r.ok for r in results)
        assert c._runtime.fleet is not None
        assert c._runtime.fleet.health.server(0).has_metrics is False
