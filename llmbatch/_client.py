"""``llmbatch.Client``: the public entry point, wiring scheduler, engine and transport."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import sniffio

from llmbatch._clock import loop_clock
from llmbatch._config import (
    DEFAULT_BATCH_POLICIES,
    DEFAULT_LIMITS,
    DEFAULT_RETRY_POLICY,
    DEFAULT_TIMEOUT,
    BatchPolicy,
    Limits,
    PriorityLike,
    RateLimit,
    RetryPolicy,
    Timeout,
    parse_priority,
)
from llmbatch._dispatcher import Dispatcher
from llmbatch._engine import Engine
from llmbatch._exceptions import (
    ClientClosedError,
    InvalidRequestError,
    RequestError,
    ServerInfoError,
)
from llmbatch._map import MapInput, MapRunner
from llmbatch._models import ChatCompletion, Completion, Result
from llmbatch._progress import ProgressLike, make_tracker
from llmbatch._ratelimit import RateLimiter
from llmbatch._request import Kind, Request, RequestSpec, validate
from llmbatch._scheduler import Scheduler
from llmbatch._stats import Stats, StatsRecorder
from llmbatch._transports.base import HTTPRequest, Transport
from llmbatch._version import __version__
from llmbatch._wire import error_from_response

__all__ = ["Client"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
#: How long ``async with`` waits on exit for queued and in-flight work by default.
DEFAULT_DRAIN_TIMEOUT = 60.0


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _check_base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(
            f"base_url must be an http(s) URL like {DEFAULT_BASE_URL!r}, got {url!r}",
            field="base_url",
        )
    return url.rstrip("/")


def _check_api_key(key: object) -> str | None:
    # A key read from a file often keeps its newline. Sent as a header it would fail
    # in the HTTP library, whose error message (and our retry log) quotes the header,
    # key included; refuse it here, without echoing it.
    if key is None:
        return None
    if not (isinstance(key, str) and key.isascii() and key.isprintable()) or any(
        c.isspace() for c in key
    ):
        raise InvalidRequestError(
            "api_key must be a str of printable ASCII without spaces or newlines "
            "(read from a file? strip it); the key itself is not shown",
            field="api_key",
        )
    return key


class Client:
    """An async client that queues, batches, prioritises and retries LLM requests.

    Use it as an async context manager; it owns one task group for its background
    work and refuses use outside ``async with``::

        async with llmbatch.Client(base_url="http://127.0.0.1:8000/v1") as client:
            answer = await client.complete("Hello", priority="realtime", max_tokens=64)
            print(answer.text)

    ``base_url`` and ``api_key`` default to ``LLMBATCH_BASE_URL``/``LLMBATCH_API_KEY``,
    then ``OPENAI_BASE_URL``/``OPENAI_API_KEY``. ``model=None`` uses the server's
    (first) model from ``/v1/models``, which also tells llmbatch ``max_model_len``.

    ``transport`` is ``"aiohttp"`` (default on asyncio: lowest client CPU),
    ``"httpx"`` (default on trio), or any :class:`llmbatch.transports.Transport`.
    ``priority_scheduling=True`` sends each tier as vLLM's ``priority`` field
    (0, 1, 2), which vLLM honours only under ``--scheduling-policy priority``.
    On exit, ``on_close="drain"`` (default) finishes queued and in-flight work for up
    to ``drain_timeout`` seconds, then cancels the rest; ``"cancel"`` cancels at once.
    Cancelled requests fail with :class:`RequestCancelled`; no caller waits forever.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        model: str | None = None,
        batching: Mapping[PriorityLike, BatchPolicy] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        retry: RetryPolicy = DEFAULT_RETRY_POLICY,
        rate_limit: RateLimit | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        transport: Literal["aiohttp", "httpx"] | Transport | None = None,
        priority_scheduling: bool = False,
        verify: bool = True,
        on_close: Literal["drain", "cancel"] = "drain",
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    ) -> None:
        self.base_url = _check_base_url(
            base_url or _env("LLMBATCH_BASE_URL", "OPENAI_BASE_URL") or DEFAULT_BASE_URL
        )
        """The server's OpenAI-style base URL (``http://host:port/v1``), no trailing slash."""
        self._api_key = _check_api_key(api_key or _env("LLMBATCH_API_KEY", "OPENAI_API_KEY"))
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidRequestError("model must be a non-empty str or None", field="model")
        self.model = model
        """The model every request names; read from ``/v1/models`` on entry if None."""
        self.max_model_len: int | None = None
        """The server's context length from ``/v1/models`` (None if it does not say).

        When known, a prompt plus ``max_tokens`` that cannot fit fails at the call."""
        policies = dict(DEFAULT_BATCH_POLICIES)
        for tier, policy in (batching or {}).items():
            if not isinstance(policy, BatchPolicy):
                raise InvalidRequestError("batching values must be BatchPolicy", field="batching")
            policies[parse_priority(tier)] = policy
        self._policies = policies
        for name, value, kind in (
            ("limits", limits, Limits),
            ("retry", retry, RetryPolicy),
            ("timeout", timeout, Timeout),
        ):
            if not isinstance(value, kind):
                raise InvalidRequestError(f"{name} must be a {kind.__name__}", field=name)
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise InvalidRequestError("rate_limit must be a RateLimit", field="rate_limit")
        if on_close not in ("drain", "cancel"):
            raise InvalidRequestError("on_close must be 'drain' or 'cancel'", field="on_close")
        if transport not in (None, "aiohttp", "httpx") and not isinstance(transport, Transport):
            raise InvalidRequestError(
                "transport must be 'aiohttp', 'httpx' or a Transport", field="transport"
            )
        self.limits = limits
        """The :class:`Limits` this client runs with."""
        self._retry = retry
        self._rate_limit = rate_limit
        self._timeout = timeout
        self._transport_choice = transport
        self._priority_scheduling = bool(priority_scheduling)
        self._verify = bool(verify)
        self._on_close = on_close
        self._drain_timeout = float(drain_timeout)
        self._state = _State.UNOPENED
        self._exit_stack: AsyncExitStack | None = None
        self._now = time.monotonic
        self._engine: Engine | None = None
        self._transport: Transport | None = None
        self._map = MapRunner(
            engine=self._require_open,
            build=self._build_spec,
            new_request=self._new_request,
            submit=self._submit_spec,
        )

    def __repr__(self) -> str:
        # Never the API key: only whether one is set.
        key = "set" if self._api_key else "none"
        return (
            f"<llmbatch.Client base_url={self.base_url!r} model={self.model!r} "
            f"api_key={key} state={self._state.value}>"
        )

    # -- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        if self._state is not _State.UNOPENED:
            raise ClientClosedError("a Client can be opened only once; make a new one")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            transport = self._make_transport()
            stack.push_async_callback(transport.aclose)
            self._transport = transport
            await self._learn_server()
            self._now = now = loop_clock()
            stats = StatsRecorder(now())
            rate_limiter = RateLimiter(self._rate_limit) if self._rate_limit else None
            dispatcher = Dispatcher(
                transport=transport,
                base_url=self.base_url,
                headers=self._headers(),
                retry=self._retry,
                stats=stats,
                rate_limiter=rate_limiter,
                priority_scheduling=self._priority_scheduling,
                clock=now,
            )
            scheduler = Scheduler(policies=self._policies, limits=self.limits)
            self._engine = Engine(scheduler, dispatcher, stats, clock=now)
            tg = await stack.enter_async_context(anyio.create_task_group())
            self._task_group = tg
            tg.start_soon(self._engine.run, tg)
        except BaseException:
            await stack.aclose()
            raise
        self._exit_stack = stack
        self._state = _State.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is not _State.OPEN:
            return
        self._state = _State.CLOSING
        engine, stack = self._engine, self._exit_stack
        assert engine is not None
        assert stack is not None
        try:
            if self._on_close == "drain" and exc_type is None:
                engine.start_flush()
                with anyio.move_on_after(self._drain_timeout, shield=True):
                    await engine.wait_idle()
            engine.cancel_queued()
            self._task_group.cancel_scope.cancel()
        finally:
            self._state = _State.CLOSED
            await stack.aclose()

    def _make_transport(self) -> Transport:
        choice = self._transport_choice
        if choice is not None and not isinstance(choice, str):
            return choice
        if choice is None:
            choice = "aiohttp" if sniffio.current_async_library() == "asyncio" else "httpx"
        if choice == "aiohttp":
            if sniffio.current_async_library() != "asyncio":
                raise InvalidRequestError(
                    "the aiohttp transport needs asyncio; use 'httpx'", field="transport"
                )
            from llmbatch._transports.aiohttp import AiohttpTransport

            return AiohttpTransport(limits=self.limits, timeout=self._timeout, verify=self._verify)
        from llmbatch._transports.httpx import HttpxTransport

        return HttpxTransport(limits=self.limits, timeout=self._timeout, verify=self._verify)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": f"llmbatch/{__version__}"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def _learn_server(self) -> None:
        """Read /v1/models: the model to use (if none given) and its max_model_len."""
        assert self._transport is not None
        try:
            response = await self._transport.send(
                HTTPRequest("GET", self.base_url + "/models", self._headers())
            )
            try:
                content = await response.read()
            finally:
                await response.aclose()
            if response.status >= 400:
                raise error_from_response(response.status, response.headers, content)
            models = json.loads(content)["data"]
            entry = next((m for m in models if m.get("id") == self.model), None)
            if self.model is None:
                entry = models[0]
                self.model = str(entry["id"])
            if entry is not None and isinstance(entry.get("max_model_len"), int):
                self.max_model_len = entry["max_model_len"]
        except (RequestError, ValueError, KeyError, IndexError, TypeError) as exc:
            if self.model is None:
                raise ServerInfoError(
                    f"could not read the model list at {self.base_url}/models ({exc}); "
                    "is the server up? Pass model=... to skip this check"
                ) from exc

    def _require_open(self) -> Engine:
        if self._state is not _State.OPEN or self._engine is None:
            raise ClientClosedError(
                f"the client is {self._state.value}; use it inside 'async with Client(...)'"
            )
        return self._engine

    # -- calls -----------------------------------------------------------------------

    async def complete(
        self,
        prompt: str,
        *,
        priority: PriorityLike = "normal",
        max_tokens: int | None = None,
        timeout: float | None = None,
        nowait: bool = False,
        **params: Any,
    ) -> Completion:
        """Complete one prompt; batched with compatible prompts of the same tier.

        Sampling parameters (``temperature``, ``top_p``, ``stop``, ``n``, ``seed``, ...)
        are keyword arguments; unknown ones go to the server as they are.
        ``timeout`` bounds the whole request, queueing included
        (:class:`DeadlineExceeded`). ``nowait=True`` raises :class:`QueueFull` instead
        of waiting when the tier's queue is full.
        """
        spec = self._build_spec("completion", prompt, priority, max_tokens, timeout, params)
        value = await self._submit_spec(spec, nowait=nowait)
        assert isinstance(value, Completion)
        return value

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        priority: PriorityLike = "normal",
        max_tokens: int | None = None,
        timeout: float | None = None,
        nowait: bool = False,
        **params: Any,
    ) -> ChatCompletion:
        """Answer one conversation (``[{"role": "user", "content": "hi"}]``)."""
        spec = self._build_spec("chat", messages, priority, max_tokens, timeout, params)
        value = await self._submit_spec(spec, nowait=nowait)
        assert isinstance(value, ChatCompletion)
        return value

    async def stream(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        priority: PriorityLike = "realtime",
        max_tokens: int | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> AsyncIterator[str]:
        """Yield text deltas as the server produces them (a prompt, or chat messages).

        Errors before the first delta are retried; after it, they are raised here.
        Leaving the loop early cancels the request on the server side.
        """
        kind: Kind = "completion" if isinstance(prompt, str) else "chat"
        spec = self._build_spec(kind, prompt, priority, max_tokens, timeout, params, stream=True)
        engine = self._require_open()
        send, receive = anyio.create_memory_object_stream[str](64)
        request = self._new_request(spec)
        request.deltas = send
        try:
            with receive:
                await engine.submit(request, nowait=False)
                while True:
                    received = False
                    # A deadline scope must not span the yield, so it wraps each receive.
                    with anyio.move_on_after(self._remaining(request)):
                        try:
                            delta = await receive.receive()
                        except anyio.EndOfStream:
                            break
                        received = True
                    if not received:
                        engine.expire(request)
                        break
                    yield delta
                await request.outcome.wait()
        finally:
            if not request.outcome.done:
                engine.abandon(request)
        if request.outcome.error is not None:
            raise request.outcome.error

    async def map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        priority: PriorityLike = "batch",
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Any,
    ) -> list[Result[Any]]:
        """Run every input; one :class:`Result` per input, in input order.

        Never raises because an item failed and never cancels siblings. An input is a
        prompt ``str``, a chat ``list`` of messages, or a ``dict`` with ``prompt`` or
        ``messages`` plus per-item options and ``metadata``. At most ``window`` inputs
        (default ``2 * Limits.max_in_flight``) are pulled from ``inputs`` ahead of
        their results, but the returned list holds every result: for inputs too large
        to keep in memory use :meth:`map_unordered` or :meth:`imap`.

        ``progress=True`` draws a :class:`ProgressBar` on stderr (when it is a
        terminal); a callable receives a :class:`MapProgress` snapshot at most every
        0.2 s and once at the end.
        """
        results: dict[int, Result[Any]] = {}
        async for index, result in self.map_unordered(
            inputs, priority=priority, window=window, progress=progress, **params
        ):
            results[index] = result
        return [results[i] for i in range(len(results))]

    def map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        priority: PriorityLike = "batch",
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Any,
    ) -> AsyncGenerator[tuple[int, Result[Any]], None]:
        """Yield ``(index, Result)`` as items finish, pulling inputs lazily.

        Memory stays bounded by ``window`` however long ``inputs`` is (a generator of
        millions of prompts is fine). Leaving the loop early cancels what is left once
        the generator is closed; ``async with contextlib.aclosing(...)`` closes it at
        once. ``progress`` works as in :meth:`map`.
        """
        return self._run_map(inputs, priority, window, progress, params, ordered=False)

    async def imap(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        priority: PriorityLike = "batch",
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Any,
    ) -> AsyncGenerator[Result[Any], None]:
        """Yield one :class:`Result` per input, in input order, with bounded memory.

        Results that finish before an earlier one wait in a reorder buffer; inputs
        submitted plus results buffered never exceed ``window``, so one slow item
        stalls the feeder once ``window`` items are ahead of it. Prefer
        :meth:`map_unordered` for throughput, ``imap`` when order matters and the
        input is too large for :meth:`map`'s list.
        """
        results = self._run_map(inputs, priority, window, progress, params, ordered=True)
        async with contextlib.aclosing(results):
            async for _index, result in results:
                yield result

    def _run_map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        priority: PriorityLike,
        window: int | None,
        progress: ProgressLike,
        params: dict[str, Any],
        *,
        ordered: bool,
    ) -> AsyncGenerator[tuple[int, Result[Any]], None]:
        self._require_open()
        size = window if window is not None else 2 * self.limits.max_in_flight
        tracker = make_tracker(progress, inputs, self._now)
        return self._map.run(
            self._task_group,
            inputs,
            parse_priority(priority),
            size,
            params,
            ordered=ordered,
            tracker=tracker,
        )

    def stats(self) -> Stats:
        """An immutable snapshot of queues, outcomes, batches, latencies and tokens."""
        if self._engine is None:
            raise ClientClosedError("stats() is available once the client has been opened")
        return self._engine.snapshot()

    # -- plumbing --------------------------------------------------------------------

    def _build_spec(
        self,
        kind: Kind,
        payload: object,
        priority: object,
        max_tokens: object,
        timeout: object,
        params: Mapping[str, Any],
        *,
        stream: bool = False,
    ) -> RequestSpec:
        self._require_open()
        assert self.model is not None
        return validate(
            kind=kind,
            priority=parse_priority(priority),
            model=self.model,
            prompt=payload if kind == "completion" else None,
            messages=payload if kind == "chat" else None,
            params={**params, "max_tokens": max_tokens},
            timeout=timeout,
            stream=stream,
            max_model_len=self.max_model_len,
        )

    def _new_request(self, spec: RequestSpec) -> Request:
        now = self._now()
        deadline = now + spec.timeout if spec.timeout is not None else None
        return Request(spec, created_at=now, deadline=deadline)

    def _remaining(self, request: Request) -> float:
        if request.deadline is None:
            return float("inf")
        return max(0.0, request.deadline - self._now())

    async def _submit_spec(self, spec: RequestSpec, *, nowait: bool = False) -> Any:
        """Queue one validated request and wait for its value or error."""
        engine = self._require_open()
        request = self._new_request(spec)
        try:
            if request.deadline is None:
                await engine.submit(request, nowait=nowait)
                await request.outcome.wait()
            else:
                with anyio.move_on_after(self._remaining(request)):
                    await engine.submit(request, nowait=nowait)
                    await request.outcome.wait()
                if not request.outcome.done:
                    engine.expire(request)
        finally:
            if not request.outcome.done:
                engine.abandon(request)
        if request.outcome.error is not None:
            raise request.outcome.error
        return request.outcome.value
