"""The default transport on asyncio: aiohttp with one bounded connection pool.

Chosen for client CPU: per HTTP request aiohttp costs a fraction of httpx's pool
bookkeeping at high concurrency (docs/transport.md has the measurement).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager

import aiohttp

from llmbatch._config import Limits, Timeout
from llmbatch._exceptions import (
    ConnectTimeout,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
)
from llmbatch._transports.base import HTTPRequest, HTTPResponse
from llmbatch._transports.reasons import cannot_connect

__all__ = ["AiohttpTransport"]


@contextmanager
def _mapped_errors(pool_full: bool = False) -> Iterator[None]:
    """The one place aiohttp's exceptions become llmbatch's.

    aiohttp reports a wait for a pooled connection and a slow TCP connect alike
    (``ConnectionTimeoutError``); ``pool_full`` says whether the request had to wait
    for the pool, which tells them apart.
    """
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        if pool_full:
            raise PoolTimeout(
                "timed out waiting for a free connection in the client's pool "
                "(Timeout.pool; raise Limits.max_connections or lower the load)"
            ) from exc
        raise ConnectTimeout(f"timed out connecting: {exc}") from exc
    except aiohttp.ClientConnectorError as exc:
        raise cannot_connect(f"{exc.host}:{exc.port}", exc, str(exc)) from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise ReadTimeout("timed out waiting for the server (Timeout.read)") from exc
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        raise RemoteProtocolError(f"connection dropped mid-response: {exc}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise RemoteProtocolError(f"HTTP transport error: {exc!r}") from exc


class _Response:
    __slots__ = ("_done", "_response")

    def __init__(self, response: aiohttp.ClientResponse, done: Callable[[], None]) -> None:
        self._response = response
        self._done: Callable[[], None] | None = done

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return {k.lower(): v for k, v in self._response.headers.items()}

    async def read(self) -> bytes:
        with _mapped_errors():
            return await self._response.read()

    async def iter_lines(self) -> AsyncIterator[bytes]:
        with _mapped_errors():
            async for line in self._response.content:
                yield line.rstrip(b"\r\n")

    async def aclose(self) -> None:
        self._response.release()
        if self._done is not None:
            self._done()
            self._done = None


class AiohttpTransport:
    """aiohttp session with ``Limits.max_connections`` connections and keep-alive expiry."""

    def __init__(self, *, limits: Limits, timeout: Timeout, verify: bool = True) -> None:
        self._limits = limits
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            # aiohttp's "connect" covers waiting for a pooled connection as well.
            connect=timeout.pool,
            sock_connect=timeout.connect,
            sock_read=timeout.read,
        )
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None
        self._active = 0
        """Exchanges holding (or waiting for) a connection: is the pool full?"""

    def _open(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session must be made inside the running loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limits.max_connections,
                limit_per_host=self._limits.max_connections,
                keepalive_timeout=self._limits.keepalive_expiry,
                ssl=bool(self._verify),
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=True
            )
        return self._session

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        session = self._open()
        pool_full = self._active >= self._limits.max_connections
        self._active += 1
        try:
            with _mapped_errors(pool_full):
                response = await session.request(
                    request.method, request.url, data=request.body, headers=dict(request.headers)
                )
        except BaseException:
            self._active -= 1
            raise
        return _Response(response, self._release)

    def _release(self) -> None:
        self._active -= 1

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
