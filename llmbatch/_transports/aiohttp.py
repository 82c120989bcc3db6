"""The default transport on asyncio: aiohttp with one bounded connection pool.

Chosen for client CPU: per HTTP request aiohttp costs a fraction of httpx's pool
bookkeeping at high concurrency (docs/transport.md has the measurement).

``Timeout.read`` is kept here rather than by aiohttp's ``sock_read``, which arms a
timer when a request is sent and again at every chunk of its answer: a lone call's
largest single cost after the request itself (docs/benchmarks.md, "Instructions").
A :class:`_ReadWatch` keeps one timer for every exchange of the transport; each wait
for the server (the answer's start, its body, a stream's next line) notes its
deadline, and when the timer finds one past it, it cancels that exchange's task and
the cancellation comes out as :class:`ReadTimeout`, as :func:`asyncio.timeout` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NoReturn

import aiohttp

from llmbatch._config import DEFAULT_LIMITS, DEFAULT_TIMEOUT, Limits, Timeout
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
        return _read_timeout()
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return RemoteProtocolError(f"connection dropped mid-response: {exc}")
    return RemoteProtocolError(f"HTTP transport error: {exc!r}")


def _read_timeout() -> ReadTimeout:
    return ReadTimeout("timed out waiting for the server (Timeout.read)")


def _raise_translated(exc: BaseException, wait: _Wait | None, pool_full: bool = False) -> NoReturn:
    """Raise an exchange's failure as llmbatch's: aiohttp's errors mapped, the read
    watch's cancellation as :class:`ReadTimeout`, anything else as it was."""
    if isinstance(exc, _FAILURES):
        raise _mapped(exc, pool_full) from exc
    if isinstance(exc, asyncio.CancelledError) and wait is not None and wait.timed_out():
        raise _read_timeout() from exc
    raise exc


class _Wait:
    """One exchange's wait for the server: the task waiting, and when it must have
    heard from the server."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    task: asyncio.Task[Any]
    cancelling: int
    """Cancellations the task had pending when the wait began: only one more than
    these can be the watch's own."""
    deadline: float

    def __init__(self) -> None:
        self.expired = False

    def timed_out(self) -> bool:
        """Whether the cancellation being raised is the watch's; if so it is taken
        back, as :func:`asyncio.timeout` takes back its own."""
        if not self.expired:
            return False
        self.expired = False
        return self.task.uncancel() <= self.cancelling


class _ReadWatch:
    """``Timeout.read`` for every exchange of one transport, with one timer.

    Deadlines are noted, not scheduled: the timer fires at the earliest deadline it
    knew of, cancels the waits that are past theirs, and sets itself for the next.
    The waits are all as long, so a new one ends after the timer fires (the timer
    is set only when it was not, or would fire too late), and a lone caller's calls,
    one after another, arm no timer of their own.
    """

    __slots__ = ("_armed_at", "_loop", "_read", "_timer", "_waiting")

    def __init__(self, read: float) -> None:
        self._read = read
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = 0.0
        self._waiting: dict[_Wait, None] = {}

    def begin(self, wait: _Wait | None = None) -> _Wait:
        """Start (or start again) the current task's wait for the server."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if wait is None:
            wait = _Wait()
        task = asyncio.current_task(loop)
        assert task is not None
        wait.task = task
        wait.cancelling = task.cancelling()
        wait.deadline = deadline = loop.time() + self._read
        self._waiting[wait] = None
        timer = self._timer
        if timer is None or deadline < self._armed_at:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)
            self._armed_at = deadline
        return wait

    def end(self, wait: _Wait | None) -> None:
        """The wait is over (the server answered, or the exchange ended)."""
        if wait is None:
            return
        self._waiting.pop(wait, None)
        if wait.expired:
            # Cancelled by the watch, but what came out was not that cancellation
            # (aiohttp turned it into an error of its own): take it back, or the task
            # would count a cancellation nobody is raising any more.
            wait.expired = False
            wait.task.uncancel()

    def _expire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        earliest: float | None = None
        for wait in list(self._waiting):
            if wait.deadline <= now:
                del self._waiting[wait]
                wait.expired = True
                wait.task.cancel("llmbatch: Timeout.read")
            elif earliest is None or wait.deadline < earliest:
                earliest = wait.deadline
        if earliest is not None:
            self._timer = loop.call_at(earliest, self._expire)
            self._armed_at = earliest

    def close(self) -> None:
        """Forget every wait and the loop (a transport opened again starts afresh)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()
        self._loop = None


class _Response:
    __slots__ = ("_done", "_response", "_wait", "_watch")

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        done: Callable[[], None],
        watch: _ReadWatch | None,
        wait: _Wait | None,
    ) -> None:
        self._response = response
        self._done: Callable[[], None] | None = done
        self._watch = watch
        self._wait = wait

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return {k.lower(): v for k, v in self._response.headers.items()}

    # read() and iter_lines() each keep their wait inline, not through a shared
    # coroutine: one more coroutine a read is a measurable part of what llmbatch
    # adds to a lone call (docs/benchmarks.md, "Instructions").

    async def read(self) -> bytes:
        watch, wait = self._watch, self._wait
        if watch is not None:
            wait = watch.begin(wait)
        try:
            return await self._response.read()
        except BaseException as exc:
            _raise_translated(exc, wait)
        finally:
            if watch is not None:
                watch.end(wait)

    async def iter_lines(self) -> AsyncIterator[bytes]:
        content = self._response.content
        watch, wait = self._watch, self._wait
        while True:
            if watch is not None:
                wait = watch.begin(wait)
            try:
                line = await content.readline()
            except BaseException as exc:
                _raise_translated(exc, wait)
            finally:
                if watch is not None:
                    watch.end(wait)
            if not line:
                return
            yield line.rstrip(b"\r\n")

    async def aclose(self) -> None:
        self._response.release()
        if self._done is not None:
            self._done()
            self._done = None


class AiohttpTransport:
    """The default transport on asyncio: an aiohttp session with
    ``Limits.max_connections`` connections, keep-alive expiry and ``Timeout``'s
    bounds (the defaults are a default client's). Public as
    ``llmbatch.transports.AiohttpTransport``, to be wrapped by a transport of your
    own (one that logs, or signs requests) and passed as ``Client(transport=...)``."""

    def __init__(
        self,
        *,
        limits: Limits = DEFAULT_LIMITS,
        timeout: Timeout = DEFAULT_TIMEOUT,
        verify: bool = True,
    ) -> None:
        self._limits = limits
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            # aiohttp's "connect" covers waiting for a pooled connection as well.
            connect=timeout.pool,
            sock_connect=timeout.connect,
            sock_read=None,  # kept by the watch (see the module's docstring)
        )
        self._watch = None if timeout.read is None else _ReadWatch(timeout.read)
        # A request that may wait for the pool (Timeout.pool's) keeps aiohttp's own
        # read timer, which starts once the request is sent.
        self._timeout_pool_full = aiohttp.ClientTimeout(
            total=None, connect=timeout.pool, sock_connect=timeout.connect, sock_read=timeout.read
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
        """Send ``request``; its answer (headers read, body still to read), or the
        failure as llmbatch's :class:`TransportError`."""
        session = self._open()
        pool_full = self._active >= self._limits.max_connections
        self._active += 1
        watch = None if pool_full else self._watch
        # The wait for the answer's start begins as the request goes: opening a new
        # connection, when one is opened, counts towards it (Timeout's docstring).
        wait = None if watch is None else watch.begin()
        try:
            response = await session.request(
                request.method,
                request.url,
                data=request.body,
                headers=dict(request.headers),
                timeout=self._timeout_pool_full if pool_full else self._timeout,
            )
        except BaseException as exc:
            self._active -= 1
            _raise_translated(exc, wait, pool_full)
        finally:
            if watch is not None:
                watch.end(wait)
        return _Response(response, self._release, watch, wait)

    def _release(self) -> None:
        self._active -= 1

    async def aclose(self) -> None:
        """Close every connection (a client does it when it closes)."""
        if self._watch is not None:
            self._watch.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
