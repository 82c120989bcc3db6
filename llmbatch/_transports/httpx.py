"""The portable transport: httpx, which runs on asyncio and trio alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager

import httpx

from llmbatch._config import DEFAULT_LIMITS, DEFAULT_TIMEOUT, Limits, Timeout
from llmbatch._exceptions import (
    ConnectTimeout,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
    WriteTimeout,
)
from llmbatch._transports.base import HTTPRequest, HTTPResponse
from llmbatch._transports.reasons import cannot_connect

__all__ = ["HttpxTransport"]


def _reason(exc: BaseException) -> str:
    """What went wrong, in words: httpx's own message, or, when it has none (on trio
    a refused TLS certificate hides behind an empty BrokenResourceError), the first
    cause that has one."""
    seen: BaseException | None = exc
    while seen is not None:
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return repr(exc)


def _address(exc: httpx.RequestError) -> str:
    """``host:port`` of the request's URL (the scheme's default port if it has none)."""
    try:
        url = exc.request.url
    except RuntimeError:  # raised without its request: nothing to name
        return "the server"
    return f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """The one place httpx's exceptions become llmbatch's."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise cannot_connect(_address(exc), exc, _reason(exc)) from exc
    except httpx.ConnectTimeout as exc:
        raise ConnectTimeout(f"timed out connecting (Timeout.connect): {_reason(exc)}") from exc
    except httpx.PoolTimeout as exc:
        raise PoolTimeout(
            "timed out waiting for a free connection in the client's pool "
            "(Timeout.pool; raise Limits.max_connections or lower the load)"
        ) from exc
    except httpx.WriteTimeout as exc:
        raise WriteTimeout("timed out sending the request (Timeout.write)") from exc
    except httpx.TimeoutException as exc:
        raise ReadTimeout("timed out waiting for the server (Timeout.read)") from exc
    except httpx.HTTPError as exc:
        raise RemoteProtocolError(f"connection dropped mid-response: {_reason(exc)}") from exc


class _Response:
    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return {k.lower(): v for k, v in self._response.headers.items()}

    async def read(self) -> bytes:
        with _mapped_errors():
            return await self._response.aread()

    async def iter_lines(self) -> AsyncIterator[bytes]:
        with _mapped_errors():
            async for line in self._response.aiter_lines():
                yield line.encode()

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxTransport:
    """The portable transport (asyncio and trio): an ``httpx.AsyncClient`` with
    bounded connections and explicit timeouts (the defaults are a default client's).
    Public as ``llmbatch.transports.HttpxTransport``, to be wrapped like
    :class:`AiohttpTransport`."""

    def __init__(
        self,
        *,
        limits: Limits = DEFAULT_LIMITS,
        timeout: Timeout = DEFAULT_TIMEOUT,
        verify: bool = True,
    ) -> None:
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_connections,
                keepalive_expiry=limits.keepalive_expiry,
            ),
            timeout=httpx.Timeout(
                connect=timeout.connect, read=timeout.read, write=timeout.write, pool=timeout.pool
            ),
            verify=verify,
            trust_env=False,
        )

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        """Send ``request``; its answer (headers read, body still to read), or the
        failure as llmbatch's :class:`TransportError`."""
        built = self._client.build_request(
            request.method, request.url, content=request.body, headers=dict(request.headers)
        )
        with _mapped_errors():
            response = await self._client.send(built, stream=True)
        return _Response(response)

    async def aclose(self) -> None:
        """Close every connection (a client does it when it closes)."""
        await self._client.aclose()
