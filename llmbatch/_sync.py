"""``SyncClient``: the client's methods, blocking, for scripts, notebooks and threads.

A sync face over the async core, not a second implementation: the :class:`Client`
runs on an event loop of its own in a background thread (anyio's blocking portal),
and each method hands its call to that loop and waits. So calls from many threads
batch together, a notebook may open the client in one cell and close it in another,
and a thread that runs its own event loop can use it too (its loop waits while a
call blocks, but nothing deadlocks: the client's loop is another thread's).

Like the async client, its first call opens it. A SyncClient still open when the
interpreter exits is closed then (drained as ``close()`` would), while its loop's
thread still runs: otherwise the portal would be torn down after that thread
stopped, and the exit would wait forever.
"""

from __future__ import annotations

import atexit
import copy
import functools
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Literal, TypeVar, Unpack, overload

from anyio.from_thread import BlockingPortal, start_blocking_portal

from llmbatch._arguments import checked_arguments
from llmbatch._calls.defaults import ViewOptions
from llmbatch._calls.spec import (
    ChatParams,
    CompletionParams,
    EmbeddingParams,
    MapParams,
    TextParams,
)
from llmbatch._chunks import ChatCompletionChunk, CompletionChunk
from llmbatch._client import DEFAULT_DRAIN_TIMEOUT, Client
from llmbatch._config import (
    DEFAULT_LIMITS,
    DEFAULT_RETRY_POLICY,
    DEFAULT_TIMEOUT,
    BatchPolicy,
    Cache,
    Limits,
    Price,
    PriorityLike,
    RateLimit,
    RetryPolicy,
    SharedInFlight,
    SLOSetting,
    TenantLimits,
    Timeout,
)
from llmbatch._exceptions import ClientClosedError
from llmbatch._logs import logger
from llmbatch._models import ChatCompletion, Completion, Embedding, Result
from llmbatch._observers import Observer
from llmbatch._progress import ProgressLike
from llmbatch._replicas import Replica
from llmbatch._runtime.map import MapInput
from llmbatch._stats import Stats
from llmbatch._transports.base import Transport

__all__ = ["SyncClient"]

T = TypeVar("T")
M = TypeVar("M")


class SyncClient:
    """:class:`Client`'s methods, blocking, with the same arguments::

        with llmbatch.SyncClient(base_url="http://127.0.0.1:8000/v1") as client:
            print(client.complete("Hello", max_tokens=16).text)
            results = client.map(prompts, progress=True)

    As the async client, it may also be used without ``with``: its first call opens
    it (calls from several threads at once open it once), and ``client.close()``
    closes it; one still open when the interpreter exits is closed then. In a
    notebook, ``client = llmbatch.SyncClient(...)`` in one cell and
    ``client.close()`` in another work too (``.open()`` opens it ahead of a call).
    """

    @checked_arguments
    def __init__(
        self,
        base_url: str | Replica | Sequence[str | Replica] | None = None,
        *,
        api_key: str | None = None,
        model: str | None = None,
        batching: Mapping[PriorityLike, BatchPolicy] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        retry: RetryPolicy = DEFAULT_RETRY_POLICY,
        rate_limit: RateLimit | None = None,
        shared_in_flight: SharedInFlight | None = None,
        timeout: Timeout | float = DEFAULT_TIMEOUT,
        max_retries: int | None = None,
        default_headers: Mapping[str, str] | None = None,
        slo: SLOSetting = "auto",
        transport: Literal["aiohttp", "httpx"] | Transport | None = None,
        priority_scheduling: bool | None = None,
        verify: bool = True,
        on_close: Literal["drain", "cancel"] = "drain",
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        tenants: Mapping[str, TenantLimits] | None = None,
        send_tenant_as_user: bool = True,
        observers: Sequence[Observer] = (),
        prices: Mapping[str, Price] | None = None,
        max_cost: float | None = None,
        cache: str | os.PathLike[str] | Cache | None = None,
    ) -> None:
        self._client = Client(**_arguments(locals()))
        self._portal_context: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._root = self
        """The SyncClient that owns the loop: this one, or the one a view was made from."""
        self._closed = False
        self._opening = threading.Lock()
        """Held while it opens: concurrent first calls from several threads open it once."""

    def __repr__(self) -> str:
        return repr(self._client).replace("llmbatch.Client", "llmbatch.SyncClient", 1)

    @property
    def base_url(self) -> str:
        """The server's base URL."""
        return self._client.base_url

    @property
    def model(self) -> str | None:
        """The model every request names (read from the server when opened)."""
        return self._client.model

    @property
    def endpoints(self) -> SyncEndpoints:
        """The client's replicas: iterate them, ``add`` or ``remove`` one while the
        client is open (blocking; see :class:`llmbatch.Endpoints`)."""
        return SyncEndpoints(self)

    def with_options(self, **options: Unpack[ViewOptions]) -> SyncClient:
        """A view with other call defaults, sharing this client's loop and engine:
        see :meth:`Client.with_options`."""
        view = copy.copy(self)
        view._client = self._client.with_options(**options)
        return view

    # -- lifetime --------------------------------------------------------------------

    def open(self) -> SyncClient:
        """Start the background loop and open the client (what ``with`` does; the
        first call does it too)."""
        if self._root is not self:
            raise ClientClosedError(
                "a with_options() view shares its client's lifetime; open and close the client"
            )
        with self._opening:
            if self._portal is not None:
                raise ClientClosedError("this SyncClient is already open")
            self._start()
        return self

    def _start(self) -> None:
        if self._closed:
            raise ClientClosedError("the SyncClient is closed; make a new one")
        context = start_blocking_portal(backend="asyncio")
        portal = context.__enter__()
        try:
            portal.call(self._client.__aenter__)
        except BaseException:
            context.__exit__(None, None, None)
            raise
        self._portal_context, self._portal = context, portal
        _OPEN.add(self)

    def close(self) -> None:
        """Drain, close the client, and stop its loop (what leaving ``with`` does).
        Closing twice is harmless; a closed SyncClient cannot be used again."""
        self._shut(None, None, None)

    def __enter__(self) -> SyncClient:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._shut(exc_type, exc, tb)

    def _shut(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._root is not self:
            return
        self._closed = True
        portal, context = self._portal, self._portal_context
        if portal is None or context is None:
            return
        self._portal = self._portal_context = None
        _OPEN.discard(self)
        try:
            portal.call(self._client.__aexit__, exc_type, exc, tb)
        finally:
            context.__exit__(None, None, None)

    def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        portal = self._root._portal
        if portal is None:
            portal = self._root._open_on_first_use()
        return portal.call(functools.partial(function, *args, **kwargs))

    def _open_on_first_use(self) -> BlockingPortal:
        with self._opening:
            if self._portal is None:
                self._start()
            assert self._portal is not None
            return self._portal

    def _iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator of the client's loop, stepped from this thread."""
        try:
            while True:
                try:
                    yield self._call(agen.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(agen, "aclose", None)
            if close is not None and self._root._portal is not None:
                self._call(close)

    # -- calls -----------------------------------------------------------------------

    @overload
    def complete(
        self,
        prompt: str,
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[CompletionParams],
    ) -> Completion[M]: ...

    @overload
    def complete(
        self,
        prompt: str,
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[CompletionParams],
    ) -> Completion: ...

    @overload
    def complete(
        self,
        prompt: str,
        *,
        response_model: object,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[CompletionParams],
    ) -> Completion[Any]: ...

    def complete(
        self,
        prompt: str,
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        nowait: bool = False,
        **params: Unpack[CompletionParams],
    ) -> Completion[Any]:
        """:meth:`Client.complete`, blocking."""
        value: Completion[Any] = self._call(self._client.complete, **_arguments(locals()))
        return value

    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion[M]: ...

    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion: ...

    @overload
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion[Any]: ...

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        nowait: bool = False,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion[Any]:
        """:meth:`Client.chat`, blocking."""
        value: ChatCompletion[Any] = self._call(self._client.chat, **_arguments(locals()))
        return value

    @overload
    def embed(  # type: ignore[overload-overlap]  # a str is also a Sequence[str]
        self, input: str, *, nowait: bool = ..., **params: Unpack[EmbeddingParams]
    ) -> Embedding: ...

    @overload
    def embed(
        self, input: Sequence[str], *, nowait: bool = ..., **params: Unpack[EmbeddingParams]
    ) -> list[Embedding]: ...

    def embed(
        self,
        input: str | Sequence[str],
        *,
        nowait: bool = False,
        **params: Unpack[EmbeddingParams],
    ) -> Embedding | list[Embedding]:
        """:meth:`Client.embed`, blocking."""
        value: Embedding | list[Embedding] = self._call(self._client.embed, **_arguments(locals()))
        return value

    def stream(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        stream_options: Mapping[str, Any] | None = None,
        **params: Unpack[TextParams],
    ) -> Iterator[str]:
        """:meth:`Client.stream`: text deltas as they arrive."""
        return self._iterate(self._client.stream(**_arguments(locals())))

    @overload
    def stream_chunks(
        self,
        prompt: str,
        *,
        stream_options: Mapping[str, Any] | None = ...,
        **params: Unpack[TextParams],
    ) -> Iterator[CompletionChunk]: ...

    @overload
    def stream_chunks(
        self,
        prompt: Sequence[Mapping[str, Any]],
        *,
        stream_options: Mapping[str, Any] | None = ...,
        **params: Unpack[TextParams],
    ) -> Iterator[ChatCompletionChunk]: ...

    def stream_chunks(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        stream_options: Mapping[str, Any] | None = None,
        **params: Unpack[TextParams],
    ) -> Iterator[CompletionChunk] | Iterator[ChatCompletionChunk]:
        """:meth:`Client.stream_chunks`: every event's chunk as it arrives."""
        chunks: Iterator[Any] = self._iterate(self._client.stream_chunks(**_arguments(locals())))
        return chunks

    @overload
    def map(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> list[Result[M]]: ...

    @overload
    def map(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> list[Result[Any]]: ...

    @overload
    def map(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> list[Result[Any]]: ...

    def map(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Unpack[MapParams],
    ) -> list[Result[Any]]:
        """:meth:`Client.map`, blocking: one :class:`Result` per input, in order."""
        results: list[Result[Any]] = self._call(self._client.map, **_arguments(locals()))
        return results

    @overload
    def map_unordered(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> Iterator[tuple[int, Result[M]]]: ...

    @overload
    def map_unordered(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> Iterator[tuple[int, Result[Any]]]: ...

    @overload
    def map_unordered(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> Iterator[tuple[int, Result[Any]]]: ...

    def map_unordered(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Unpack[MapParams],
    ) -> Iterator[tuple[int, Result[Any]]]:
        """:meth:`Client.map_unordered`: ``(index, Result)`` as items finish."""
        return self._iterate(self._client.map_unordered(**_arguments(locals())))

    @overload
    def imap(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> Iterator[Result[M]]: ...

    @overload
    def imap(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> Iterator[Result[Any]]: ...

    @overload
    def imap(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> Iterator[Result[Any]]: ...

    def imap(
        self,
        inputs: Iterable[MapInput],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Unpack[MapParams],
    ) -> Iterator[Result[Any]]:
        """:meth:`Client.imap`: one :class:`Result` per input, in order, bounded memory."""
        return self._iterate(self._client.imap(**_arguments(locals())))

    @property
    def observers(self) -> tuple[Observer, ...]:
        """:attr:`Client.observers`."""
        return self._client.observers

    def add_observer(self, observer: Observer) -> None:
        """:meth:`Client.add_observer` (its methods run on the client's loop thread)."""
        self._client.add_observer(observer)

    def remove_observer(self, observer: Observer) -> bool:
        """:meth:`Client.remove_observer`."""
        return self._client.remove_observer(observer)

    def stats(self) -> Stats:
        """:meth:`Client.stats` (it does not open the client: before the first call it
        raises, after ``close()`` it is the last snapshot)."""
        if self._root._portal is None:
            return self._client.stats()
        stats: Stats = self._call(self._client.stats)
        return stats


def _arguments(values: dict[str, Any]) -> dict[str, Any]:
    """A method's arguments, from ``locals()`` taken first thing in its body, as
    keywords for the :class:`Client` method of the same signature (``**params``
    spread). The signatures are kept equal by tests/client/test_sync_client.py."""
    arguments = {name: value for name, value in values.items() if name != "self"}
    params = arguments.pop("params", {})
    return {**arguments, **params}


class SyncEndpoints:
    """A :class:`SyncClient`'s replicas: :class:`llmbatch.Endpoints`, blocking."""

    def __init__(self, client: SyncClient) -> None:
        self._sync = client

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._sync._client.endpoints))

    def __len__(self) -> int:
        return len(self._sync._client.endpoints)

    def __repr__(self) -> str:
        return f"<llmbatch.SyncEndpoints {list(self)!r}>"

    def add(self, replica: str | Replica, *, api_key: str | None = None) -> Replica:
        """Send to another replica; see :meth:`llmbatch.Endpoints.add`."""
        added: Replica = self._sync._call(
            self._sync._client.endpoints.add, replica, api_key=api_key
        )
        return added

    def remove(self, replica: str | Replica) -> None:
        """Send nothing more to ``replica``; see :meth:`llmbatch.Endpoints.remove`."""
        self._sync._call(self._sync._client.endpoints.remove, replica)


_OPEN: set[SyncClient] = set()
"""SyncClients open now (closed at exit if still open; held until closed)."""


@atexit.register
def _close_open_clients() -> None:
    for client in list(_OPEN):
        try:
            client.close()
        except Exception:  # the others are still closed; this one is reported
            logger.exception("closing %r at exit failed", client)
