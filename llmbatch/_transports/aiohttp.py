"""The default transport on asyncio: aiohttp with one bounded connection pool.

Chosen for client CPU: per HTTP request aiohttp costs a fraction of httpx's pool
bookkeeping at high concurrency (docs/transport.md has the measurement).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

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


#: What aiohttp (and the socket under it) raises, for ``_mapped``.
_FAILURES = (aiohttp.ClientError, OSError, TimeoutError)


def _mapped(exc: BaseException, pool_full: bool = False) -> Exception:
    """The one place aiohttp's exceptions become llmbatch's (raised ``from exc``).

    aiohttp reports a wait for a pooled connection and a slow TCP connect alike
    (``ConnectionTimeoutError``); ``pool_full`` says whether the request had to wait
    for the pool, which tells them apart. (A function rather than a context manager:
    every request passes through it twice, and a generator's ``with`` cost more.)
    """
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        if pool_full:
            return PoolTimeout(
                "timed out waiting for a free connection in the client's pool "
                "(Timeout.pool; raise Limits.max_connections or lower the load)"
            )
        return ConnectTimeout(f"timed out connecting: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return cannot_connect(f"{exc.host}:{exc.port}", exc, str(exc))
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return ReadTimeout("timed out waiting for the server (Timeout.read)")
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return RemoteProtocolError(f"connection dropped mid-response: {exc}")
    return RemoteProtocolError(f"HTTP transport error: {exc!r}")


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
        try:
            return await self._response.read()
        except _FAILURES as exc:
            raise _mapped(exc) from exc

    async def iter_lines(self) -> AsyncIterator[bytes]:
        try:
            async for line in self._response.content:
                yield line.rstrip(b"\r\n")
        except _FAILURES as exc:
            raise _mapped(exc) from exc

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
            response = await session.request(
                request.method, request.url, data=request.body, headers=dict(request.headers)
            )
        except BaseException as exc:
            self._active -= 1
            if isinstance(exc, _FAILURES):
                raise _mapped(exc, pool_full) from exc
            raise
        return _Response(response, self._release)

    def _release(self) -> None:
        self._active -= 1

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
