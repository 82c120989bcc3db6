"""``llmbatch.Client``: the public entry point, wiring scheduler, engine and transport."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import enum
import math
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import anyio
import sniffio
from anyio.abc import TaskGroup

from llmbatch._arguments import checked_arguments
from llmbatch._chunks import ChatCompletionChunk, CompletionChunk
from llmbatch._clock import loop_clock
from llmbatch._config import (
    DEFAULT_BATCH_POLICIES,
    DEFAULT_LIMITS,
    DEFAULT_RETRY_POLICY,
    DEFAULT_TIMEOUT,
    SLO,
    BatchPolicy,
    Limits,
    PriorityLike,
    RateLimit,
    RetryPolicy,
    SharedInFlight,
    Timeout,
    parse_priority,
)
from llmbatch._engine import Engine
from llmbatch._exceptions import (
    ClientClosedError,
    ConfigError,
    ConfigTypeError,
    InvalidRequestError,
    InvalidTypeError,
    LLMBatchError,
)
from llmbatch._fleet import Endpoints, Fleet, ServerConfig
from llmbatch._map import MapInput, MapRunner, check_inputs, check_map_options, kinds_of
from llmbatch._models import ChatCompletion, Completion, Embedding, Result
from llmbatch._options import NOT_GIVEN, CallDefaults, NotGiven
from llmbatch._progress import ProgressLike, make_tracker
from llmbatch._replicas import Replica, check_api_key, env, resolve
from llmbatch._request import Kind
from llmbatch._scheduler import Scheduler
from llmbatch._shared.budgets import SharedBudgets
from llmbatch._stats import Stats, StatsRecorder
from llmbatch._submit import Submitter
from llmbatch._tracing import Tracer
from llmbatch._transports.base import Transport
from llmbatch._validate import SpecCache
from llmbatch._version import __version__

__all__ = ["Client"]

#: How long ``async with`` waits on exit for queued and in-flight work by default.
DEFAULT_DRAIN_TIMEOUT = 60.0
#: How long ``stats()`` called from another thread waits for the client's loop.
STATS_TIMEOUT = 5.0

T = TypeVar("T")


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


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
    Opening fails, saying what to do, when that list shows no request could succeed:
    a base URL without its ``/v1`` (:class:`ServerInfoError`), a missing or refused
    key (:class:`AuthenticationError`, :class:`PermissionDeniedError`), a ``model`` the
    server does not serve (:class:`UnknownModelError`). A server that cannot be
    reached fails it only when ``model`` is None (with one, it may come up later).

    ``base_url`` may list several servers of the same models (URLs or
    :class:`Replica` objects; the environment variables comma-separated): batches
    are routed among them by load and prompt prefix, around any that are down, and
    opening needs one to answer (docs/scale-out.md). ``endpoints`` lists them, and
    adds or removes them while the client is open.

    ``transport`` is ``"aiohttp"`` (default on asyncio: lowest client CPU),
    ``"httpx"`` (default on trio), or any :class:`llmbatch.transports.Transport`.
    ``slo=SLO(ttft=..., tpot=...)`` is the latency realtime must keep: the client
    limits lower-tier work in flight to hold it (docs/concepts.md). Each tier is sent
    as the ``priority`` field in the server's own convention where it is known
    (``priority_scheduling=None``, the default): vLLM's (0, 1, 2, lower first;
    honoured under ``--scheduling-policy priority``), SGLang's when its priority
    scheduling is on (higher first); other servers get none. ``False`` never sends
    it, ``True`` always (in vLLM's convention where the server's is not known).
    On exit, ``on_close="drain"`` (default) finishes queued and in-flight work for up
    to ``drain_timeout`` seconds, then cancels the rest; ``"cancel"`` cancels at once.
    Cancelled requests fail with :class:`RequestCancelled`; no caller waits forever.
    Bad configuration raises :class:`ConfigError` (a :class:`ConfigTypeError`, also a
    ``TypeError``, for a value of the wrong type).
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
        slo: SLO | None = None,
        transport: Literal["aiohttp", "httpx"] | Transport | None = None,
        priority_scheduling: bool | None = None,
        verify: bool = True,
        on_close: Literal["drain", "cancel"] = "drain",
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    ) -> None:
        self._api_key = check_api_key(api_key or env("LLMBATCH_API_KEY", "OPENAI_API_KEY"))
        self._replicas = resolve(None if base_url == "" else base_url, self._api_key)
        self.base_url = self._replicas[0].base_url
        """The (first) server's OpenAI-style base URL (``http://host:port/v1``), no
        trailing slash; ``endpoints`` lists every replica."""
        if model is not None and not isinstance(model, str):
            raise ConfigTypeError("model must be a str or None", field="model")
        if model == "":
            raise ConfigError("model must be a non-empty str or None", field="model")
        self._model = model
        self._max_model_len: int | None = None
        self._policies = _policies(batching)
        for name, value, kind in (
            ("limits", limits, Limits),
            ("retry", retry, RetryPolicy),
        ):
            if not isinstance(value, kind):
                raise ConfigTypeError(f"{name} must be a {kind.__name__}", field=name)
        # openai-python's options: a number is each call's timeout (queueing and
        # retries included); max_retries and default_headers apply to every request.
        call_timeout: object = None
        if not isinstance(timeout, Timeout):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise ConfigTypeError(
                    "timeout must be a Timeout or a number of seconds", field="timeout"
                )
            call_timeout, timeout = timeout, DEFAULT_TIMEOUT
        given = CallDefaults.checked(
            None,
            {
                "timeout": call_timeout,
                "max_retries": max_retries,
                "default_headers": default_headers,
            },
            config=True,
        )
        self._default_headers = (given.headers if given else None) or {}
        if given is not None and given.max_retries is not None:
            retry = dataclasses.replace(retry, attempts=given.max_retries + 1)
        self._defaults: CallDefaults | None = (
            CallDefaults(timeout=given.timeout) if given and given.timeout else None
        )
        """What a call gets for the options it leaves out (set by ``with_options``)."""
        self._root = self
        """The client that owns the engine: this one, or the one a view was made from."""
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise ConfigTypeError("rate_limit must be a RateLimit or None", field="rate_limit")
        if shared_in_flight is not None and not isinstance(shared_in_flight, SharedInFlight):
            raise ConfigTypeError(
                "shared_in_flight must be a SharedInFlight or None", field="shared_in_flight"
            )
        if slo is not None and not isinstance(slo, SLO):
            raise ConfigTypeError("slo must be an SLO or None", field="slo")
        if priority_scheduling is not None and not isinstance(priority_scheduling, bool):
            raise ConfigTypeError(
                "priority_scheduling must be True, False or None", field="priority_scheduling"
            )
        if on_close not in ("drain", "cancel"):
            raise ConfigError("on_close must be 'drain' or 'cancel'", field="on_close")
        if isinstance(transport, str) and transport not in ("aiohttp", "httpx"):
            raise ConfigError(
                f"transport must be 'aiohttp', 'httpx' or a Transport, got {transport!r}",
                field="transport",
            )
        if transport is not None and not isinstance(transport, str | Transport):
            raise ConfigTypeError(
                "transport must be 'aiohttp', 'httpx' or a Transport", field="transport"
            )
        if (
            isinstance(drain_timeout, bool)
            or not isinstance(drain_timeout, (int, float))
            or math.isnan(drain_timeout)
            or drain_timeout < 0
        ):
            raise ConfigError(
                "drain_timeout must be a number of seconds >= 0", field="drain_timeout"
            )
        self.limits = limits
        """The :class:`Limits` this client runs with."""
        self._retry = retry
        self._rate_limit = rate_limit
        self._shared = SharedBudgets(rate_limit, shared_in_flight)
        self._timeout = timeout
        self._slo = slo
        self._transport_choice = transport
        self._priority_scheduling = priority_scheduling
        self._verify = bool(verify)
        self._on_close = on_close
        self._drain_timeout = float(drain_timeout)
        self._state = _State.UNOPENED
        self._exit_stack: AsyncExitStack | None = None
        self._engine: Engine | None = None
        self._host: asyncio.Task[None] | None = None
        self._fleet: Fleet | None = None
        self._recorder: StatsRecorder | None = None
        self._submitter: Submitter | None = None
        self._map: MapRunner | None = None
        self.endpoints = Endpoints(lambda: self._root._fleet, self._api_key)
        """The client's replicas: iterate them, ``await endpoints.add(url)`` or
        ``await endpoints.remove(url)`` while it is open."""
        self._in_loop: _LoopCaller | None = None
        self._tracer: Tracer | None = None

    def __repr__(self) -> str:
        # Never the API key: only whether one is set.
        key = "set" if self._api_key else "none"
        root = self._root
        view = "" if root is self else f" view={self._defaults!r}"
        return (
            f"<llmbatch.Client base_url={self.base_url!r} model={self.model!r} "
            f"api_key={key} state={root._state.value}{view}>"
        )

    @property
    def model(self) -> str | None:
        """The model every request names; read from ``/v1/models`` on entry if None."""
        defaults = self._defaults
        if defaults is not None and defaults.model is not None:
            return defaults.model
        return self._root._model

    @property
    def max_model_len(self) -> int | None:
        """The server's context length from ``/v1/models`` (None if it does not say).

        When known, a prompt plus ``max_tokens`` that cannot fit fails at the call."""
        return self._root._max_model_len

    def with_options(
        self,
        *,
        priority: PriorityLike | NotGiven | None = NOT_GIVEN,
        model: str | NotGiven | None = NOT_GIVEN,
        timeout: float | NotGiven | None = NOT_GIVEN,
        max_retries: int | NotGiven | None = NOT_GIVEN,
        default_headers: Mapping[str, str] | NotGiven = NOT_GIVEN,
    ) -> Client:
        """A view of this client whose calls default to other options.

        The view shares this client's engine, queues, limits and lifetime (use it
        while the client is open; it has no ``async with`` of its own). What a call
        passes still wins over the view's defaults::

            urgent = client.with_options(priority="realtime", timeout=5, max_retries=1)
            answer = await urgent.complete("Hi")

        ``priority`` is the tier of every method (where each otherwise has its own
        default); ``model`` the model; ``timeout`` each call's deadline in seconds
        (None: none); ``max_retries`` retries after the first attempt;
        ``default_headers`` HTTP headers added to every request (a call's
        ``extra_headers`` override them). A view of a view keeps the first's options
        that the second does not set. Bad values raise here.
        """
        options = {
            name: value
            for name, value in (
                ("priority", priority),
                ("model", model),
                ("timeout", timeout),
                ("max_retries", max_retries),
                ("default_headers", default_headers),
            )
            if value is not NOT_GIVEN
        }
        view = copy.copy(self)
        view._defaults = CallDefaults.checked(self._defaults, options, config=False)
        return view

    # -- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        if self._root is not self:
            raise ClientClosedError(
                "a with_options() view shares its client's lifetime: use it inside the "
                "client's 'async with', without one of its own"
            )
        if self._state is not _State.UNOPENED:
            raise ClientClosedError("a Client can be opened only once; make a new one")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            fleet = Fleet(
                ServerConfig(
                    limits=self.limits,
                    retry=self._retry,
                    slo=self._slo,
                    priority_scheduling=self._priority_scheduling,
                    headers=self._headers,
                    make_transport=self._make_transport,
                )
            )
            stack.push_async_callback(fleet.aclose)
            self._model, self._max_model_len = await fleet.open(self._replicas, self._model)
            now = loop_clock()
            stats = StatsRecorder(now())
            scheduler = Scheduler(
                policies=self._policies, limits=self.limits, rate_limit=self._rate_limit
            )
            engine = fleet.start(scheduler, stats, now)
            self._fleet = fleet
            loop = (
                asyncio.get_running_loop() if sniffio.current_async_library() == "asyncio" else None
            )
            self._submitter = Submitter(
                engine, SpecCache(self._model, self._max_model_len), clock=now, loop=loop
            )
            if loop is not None:
                tg = await self._start_host(loop, engine)
            else:
                tg = await stack.enter_async_context(anyio.create_task_group())
                tg.start_soon(engine.run, tg)
            self._task_group = tg
            if self._shared:
                self._shared.start(tg, scheduler, engine.wake, now)
                engine.shared_stats = self._shared.stats
                stack.push_async_callback(self._shared.aclose)
            self._recorder = stats
            self._install_tracer(self._tracer)
            self._map = MapRunner(self._submitter, tg)
            self._engine = engine
        except BaseException:
            await stack.aclose()
            raise
        self._exit_stack = stack
        self._in_loop = _loop_caller(loop)
        self._state = _State.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is not _State.OPEN or self._root is not self:
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
            if self._host is not None:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait({self._host})
                self._host.result()  # a bug in the background work surfaces here
        finally:
            self._state = _State.CLOSED
            await stack.aclose()

    async def _start_host(self, loop: asyncio.AbstractEventLoop, engine: Engine) -> TaskGroup:
        """On asyncio, the client's background work runs in a task group hosted by a
        task of its own, so the client may be closed from another task than the one
        that opened it (a notebook runs each cell as a task; a drop-in transport opens
        its client inside a request). trio has no task without a nursery: there the
        task group lives in the task that opens the client."""
        started: asyncio.Future[TaskGroup] = loop.create_future()

        async def host() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.run, tg)
                started.set_result(tg)
                await anyio.sleep_forever()  # until __aexit__ cancels the task group

        self._host = loop.create_task(host(), name="llmbatch client")
        waiting: set[asyncio.Future[Any]] = {self._host, started}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            self._host.result()  # it failed before starting: raise why
        return started.result()

    def _set_tracer(self, tracer: Tracer | None) -> None:
        """Record this client's requests and HTTP requests with ``tracer`` (None: stop);
        ``llmbatch.otel.instrument`` calls it, before or after the client opens."""
        root = self._root
        root._tracer = tracer
        if root._engine is not None:
            root._install_tracer(tracer)

    def _install_tracer(self, tracer: Tracer | None) -> None:
        assert self._submitter is not None
        assert self._recorder is not None
        assert self._fleet is not None
        self._submitter.tracer = self._recorder.tracer = tracer
        self._fleet.set_tracer(tracer)

    def _make_transport(self) -> Transport:
        choice = self._transport_choice
        if choice is not None and not isinstance(choice, str):
            return choice
        if choice is None:
            choice = "aiohttp" if sniffio.current_async_library() == "asyncio" else "httpx"
        if choice == "aiohttp":
            if sniffio.current_async_library() != "asyncio":
                raise ConfigError(
                    "the aiohttp transport needs asyncio; use 'httpx'", field="transport"
                )
            from llmbatch._transports.aiohttp import AiohttpTransport

            return AiohttpTransport(limits=self.limits, timeout=self._timeout, verify=self._verify)
        from llmbatch._transports.httpx import HttpxTransport

        return HttpxTransport(limits=self.limits, timeout=self._timeout, verify=self._verify)

    def _headers(self, api_key: str | None) -> dict[str, str]:
        """Every request's headers for a server with this API key."""
        headers = {"Content-Type": "application/json", "User-Agent": f"llmbatch/{__version__}"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        headers.update(self._default_headers)
        return headers

    def _open(self) -> Submitter:
        root = self._root
        if root._state is not _State.OPEN or root._submitter is None:
            raise ClientClosedError(
                f"the client is {root._state.value}; use it inside 'async with Client(...)'"
            )
        return root._submitter

    # -- calls -----------------------------------------------------------------------

    async def complete(
        self,
        prompt: str,
        *,
        priority: PriorityLike | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        nowait: bool = False,
        model: str | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Completion:
        """Complete one prompt; batched with compatible prompts of the same tier.

        Sampling parameters are keyword arguments: the OpenAI completions API's
        (``temperature``, ``top_p``, ``stop``, ``n``, ``seed``, ``logprobs``, ...) and
        vLLM's extra ones (``top_k``, ``min_p``, ``ignore_eos``, ...); any other
        keyword is a ``TypeError``, as in openai-python. ``extra_body``,
        ``extra_headers`` and ``extra_query`` go to the server as they are.
        ``model`` overrides the client's model for this call. ``timeout`` bounds the
        whole request, queueing included (:class:`DeadlineExceeded`). ``nowait=True``
        raises :class:`QueueFull` instead of waiting when the tier's queue is full.
        """
        submitter = self._open()
        defaults = self._defaults
        if defaults is not None:
            priority, model, timeout, max_retries, extra_headers = defaults.fill(
                priority, model, timeout, max_retries, extra_headers
            )
        spec = submitter.specs.get(
            "completion",
            "normal" if priority is None else priority,
            max_tokens,
            timeout,
            params,
            model=model,
            method="complete",
            extras=_extras(extra_body, extra_headers, extra_query),
            max_retries=max_retries,
        )
        value: Completion = await submitter.call(submitter.request(spec, prompt), nowait=nowait)
        return value

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        priority: PriorityLike | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        nowait: bool = False,
        model: str | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatCompletion:
        """Answer one conversation (``[{"role": "user", "content": "hi"}]``).

        Parameters as for :meth:`complete`, from the OpenAI chat API (``tools``,
        ``tool_choice``, ``response_format``, ``n``, ``logprobs``, ``top_logprobs``,
        ``max_completion_tokens``, ...) and vLLM's extras. Conversations that arrive
        together go to the server as one ``/v1/chat/completions/batch`` request
        where it has that route (vLLM 0.19+) and the call allows it, else one
        request each.
        """
        submitter = self._open()
        defaults = self._defaults
        if defaults is not None:
            priority, model, timeout, max_retries, extra_headers = defaults.fill(
                priority, model, timeout, max_retries, extra_headers
            )
        spec = submitter.specs.get(
            "chat",
            "normal" if priority is None else priority,
            max_tokens,
            timeout,
            params,
            model=model,
            method="chat",
            extras=_extras(extra_body, extra_headers, extra_query),
            max_retries=max_retries,
        )
        value: ChatCompletion = await submitter.call(
            submitter.request(spec, messages), nowait=nowait
        )
        return value

    @overload
    async def embed(
        self,
        input: str,
        *,
        priority: PriorityLike | None = ...,
        timeout: float | None = ...,
        nowait: bool = ...,
        model: str | None = ...,
        max_retries: int | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, str] | None = ...,
        **params: Any,
    ) -> Embedding: ...

    @overload
    async def embed(
        self,
        input: Sequence[str],
        *,
        priority: PriorityLike | None = ...,
        timeout: float | None = ...,
        nowait: bool = ...,
        model: str | None = ...,
        max_retries: int | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, str] | None = ...,
        **params: Any,
    ) -> list[Embedding]: ...

    async def embed(
        self,
        input: str | Sequence[str],
        *,
        priority: PriorityLike | None = None,
        timeout: float | None = None,
        nowait: bool = False,
        model: str | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Embedding | list[Embedding]:
        """Embed a text (an :class:`Embedding`) or a list of texts (a list, in order).

        Texts from any number of calls are batched into ``/v1/embeddings`` requests
        like prompts are, with the same tiers, isolation and retries. A list fails as
        a whole with its first item's error (as openai's ``embeddings.create`` does);
        for per-item results over a large corpus, use :meth:`map` with
        ``{"input": text}`` items. Parameters: ``dimensions``, ``encoding_format``,
        ``user`` and vLLM's ``truncate_prompt_tokens``, ``normalize``.
        """
        submitter = self._open()
        defaults = self._defaults
        if defaults is not None:
            priority, model, timeout, max_retries, extra_headers = defaults.fill(
                priority, model, timeout, max_retries, extra_headers
            )
        spec = submitter.specs.get(
            "embedding",
            "normal" if priority is None else priority,
            None,
            timeout,
            params,
            model=model,
            method="embed",
            extras=_extras(extra_body, extra_headers, extra_query),
            max_retries=max_retries,
        )
        if isinstance(input, str):
            value: Embedding = await submitter.call(submitter.request(spec, input), nowait=nowait)
            return value
        if isinstance(input, bytes) or not isinstance(input, Sequence):
            raise InvalidTypeError(
                f"input must be a str or a list of str, got {type(input).__name__}", field="input"
            )
        requests = [submitter.request(spec, text) for text in input]
        values: list[Embedding] = []
        async with anyio.create_task_group() as tg:
            results: list[Any] = [None] * len(requests)

            async def one(i: int) -> None:
                try:
                    results[i] = await submitter.call(requests[i], nowait=nowait)
                except LLMBatchError as exc:
                    results[i] = exc

            for i in range(len(requests)):
                tg.start_soon(one, i)
        for result in results:
            if isinstance(result, LLMBatchError):
                raise result
            values.append(result)
        return values

    def stream(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        priority: PriorityLike | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        model: str | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str] | None = None,
        stream_options: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> AsyncGenerator[str, None]:
        """Yield text deltas as the server produces them (a prompt, or chat messages).

        Parameters as for :meth:`complete` or :meth:`chat`. ``stream_options`` is
        accepted for openai-python compatibility; usage is always requested.
        Errors before the first delta are retried; after it, they are raised here.
        Leaving the loop early cancels the request on the server side. For the ids,
        finish reason and usage too, use :meth:`stream_chunks`.
        """
        return self._stream(
            prompt,
            priority,
            max_tokens,
            timeout,
            model,
            max_retries,
            (extra_body, extra_headers, extra_query),
            stream_options,
            params,
            chunks=False,
        )

    @overload
    def stream_chunks(
        self,
        prompt: str,
        *,
        priority: PriorityLike | None = ...,
        max_tokens: int | None = ...,
        timeout: float | None = ...,
        model: str | None = ...,
        max_retries: int | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, str] | None = ...,
        stream_options: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> AsyncGenerator[CompletionChunk, None]: ...

    @overload
    def stream_chunks(
        self,
        prompt: Sequence[Mapping[str, Any]],
        *,
        priority: PriorityLike | None = ...,
        max_tokens: int | None = ...,
        timeout: float | None = ...,
        model: str | None = ...,
        max_retries: int | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, str] | None = ...,
        stream_options: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> AsyncGenerator[ChatCompletionChunk, None]: ...

    def stream_chunks(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        priority: PriorityLike | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        model: str | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str] | None = None,
        stream_options: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> AsyncGenerator[CompletionChunk, None] | AsyncGenerator[ChatCompletionChunk, None]:
        """Yield every event of the stream as a chunk, as openai-python's
        ``stream=True`` does: a :class:`CompletionChunk` for a prompt, a
        :class:`ChatCompletionChunk` for chat messages::

            async for chunk in client.stream_chunks(messages, max_tokens=64):
                print(chunk.text, end="")          # choices[0].delta.content, or ""
                if chunk.usage is not None:        # the last chunk
                    print(chunk.usage.completion_tokens)

        Each chunk has ``id``, ``model``, ``created`` and ``choices``: a chat choice's
        ``delta`` holds the ``role`` (first chunk), a piece of ``content``, and the
        pieces of ``tool_calls`` as the server sends them; a completion choice holds
        a piece of ``text``. ``finish_reason`` is set in the chunk that ends a
        choice. Usage is always requested: the last chunk has no choices and
        ``usage`` set (``stream_options`` is accepted and ignored). Everything
        else is as in :meth:`stream`: parameters, the ``realtime`` tier by default,
        retries only before the first chunk, errors raised from the loop, and
        leaving it early cancels the request on the server side.
        """
        chunks: AsyncGenerator[Any, None] = self._stream(
            prompt,
            priority,
            max_tokens,
            timeout,
            model,
            max_retries,
            (extra_body, extra_headers, extra_query),
            stream_options,
            params,
            chunks=True,
        )
        return chunks

    async def _stream(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        priority: PriorityLike | None,
        max_tokens: int | None,
        timeout: float | None,
        model: str | None,
        max_retries: int | None,
        extras: tuple[object, object, object],
        stream_options: object,
        params: dict[str, Any],
        *,
        chunks: bool,
    ) -> AsyncGenerator[Any, None]:
        """What :meth:`stream` and :meth:`stream_chunks` yield: text deltas, or chunks.

        An async generator, so a call is checked (and runs, on the client's loop)
        when iteration starts, as a ``SyncClient``'s must."""
        submitter = self._open()
        kind: Kind = "completion" if isinstance(prompt, str) else "chat"
        _check_stream_options(stream_options)
        extra_body, extra_headers, extra_query = extras
        defaults = self._defaults
        if defaults is not None:
            priority, model, timeout, max_retries, extra_headers = defaults.fill(
                priority, model, timeout, max_retries, extra_headers
            )
        spec = submitter.specs.get(
            kind,
            "realtime" if priority is None else priority,
            max_tokens,
            timeout,
            params,
            stream=True,
            model=model,
            method="stream_chunks" if chunks else "stream",
            extras=_extras(extra_body, extra_headers, extra_query),
            max_retries=max_retries,
        )
        request = submitter.request(spec, prompt)
        send, receive = anyio.create_memory_object_stream[Any](64)
        request.deltas = send
        request.chunks = chunks
        engine = submitter.engine
        try:
            with receive:
                engine.submit(request)
                async for item in receive:
                    yield item
            await submitter.wait(request)
        finally:
            if not request.done:
                engine.abandon(request)
        if request.error is not None:
            raise request.error

    async def map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        priority: PriorityLike | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Any,
    ) -> list[Result[Any]]:
        """Run every input; one :class:`Result` per input, in input order.

        Never raises because an item failed and never cancels siblings. An input is a
        prompt ``str``, a chat ``list`` of messages, or a ``dict`` with ``prompt`` or
        ``messages`` plus per-item options and ``metadata``. At most ``window`` inputs
        (default ``2 * Limits.max_in_flight`` per replica) are pulled from ``inputs``
        ahead of their results, but the returned list holds every result: for inputs
        too large to keep in memory use :meth:`map_unordered` or :meth:`imap`.

        ``progress=True`` draws a :class:`ProgressBar` on stderr (when it is a
        terminal); a callable receives a :class:`MapProgress` snapshot at most every
        0.2 s and once at the end.
        """
        runner, tier, size, tracker, params = self._map_call(
            inputs, priority, window, progress, params
        )
        return await runner.collect(inputs, tier, size, params, tracker)

    def map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        priority: PriorityLike | None = None,
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
        runner, tier, size, tracker, params = self._map_call(
            inputs, priority, window, progress, params
        )
        return runner.iterate(inputs, tier, size, params, ordered=False, tracker=tracker)

    async def imap(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        priority: PriorityLike | None = None,
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
        runner, tier, size, tracker, params = self._map_call(
            inputs, priority, window, progress, params
        )
        results = runner.iterate(inputs, tier, size, params, ordered=True, tracker=tracker)
        async with contextlib.aclosing(results):
            async for _index, result in results:
                yield result

    def _map_call(
        self,
        inputs: object,
        priority: PriorityLike | None,
        window: int | None,
        progress: ProgressLike,
        params: dict[str, Any],
    ) -> tuple[MapRunner, Any, int, Any, dict[str, Any]]:
        """Check a map call's arguments at the call site."""
        submitter = self._open()
        runner = self._root._map
        assert runner is not None
        if window is None:
            # The limits hold per replica: room for twice what all of them may run.
            window = 2 * self.limits.max_in_flight * max(1, len(self.endpoints))
        size = window
        check_inputs(inputs, size)
        defaults = self._defaults
        if defaults is not None:
            priority = defaults.priority if priority is None else priority
            params = defaults.fill_map(params)
        tier = parse_priority("batch" if priority is None else priority)
        check_map_options(submitter.specs, tier, params, kinds_of(inputs))
        return runner, tier, size, make_tracker(progress, inputs, submitter.now), params

    def stats(self) -> Stats:
        """An immutable snapshot of queues, outcomes, batches, latencies and tokens.

        Safe from any thread (a metrics exporter's, a web framework's): from outside
        the client's event loop it is taken on the loop, waiting for it up to 5 s
        (then ``TimeoutError``)."""
        root = self._root
        engine = root._engine
        if engine is None:
            raise ClientClosedError("stats() is available once the client has been opened")
        if root._state is _State.OPEN and root._in_loop is not None:
            return root._in_loop(engine.snapshot)
        return engine.snapshot()


class _LoopCaller:
    """Runs a function on the client's event loop from another thread and waits for
    its result; on the loop's own thread, just runs it."""

    __slots__ = ("_loop", "_thread", "_token")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, token: object) -> None:
        self._thread = threading.get_ident()
        self._loop = loop
        self._token = token

    def __call__(self, function: Callable[[], T]) -> T:
        if threading.get_ident() == self._thread:
            return function()
        if self._loop is None:
            import trio

            return trio.from_thread.run_sync(function, trio_token=self._token)  # type: ignore[arg-type]
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to the waiting thread
                    future.set_exception(exc)

        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop has closed: nothing mutates any more
            return function()
        return future.result(timeout=STATS_TIMEOUT)


def _loop_caller(loop: asyncio.AbstractEventLoop | None) -> _LoopCaller:
    if loop is not None:
        return _LoopCaller(loop, None)
    import trio

    return _LoopCaller(None, trio.lowlevel.current_trio_token())


def _extras(body: object, headers: object, query: object) -> tuple[object, object, object] | None:
    """A call's ``extra_*`` arguments, or None when it has none (the common case)."""
    if body is None and headers is None and query is None:
        return None
    return (body, headers, query)


def _check_stream_options(options: object) -> None:
    if options is not None and not isinstance(options, Mapping):
        raise InvalidTypeError("stream_options must be a dict", field="stream_options")


def _policies(batching: object) -> dict[Any, BatchPolicy]:
    policies = dict(DEFAULT_BATCH_POLICIES)
    if batching is None:
        return policies
    if not isinstance(batching, Mapping):
        raise ConfigTypeError("batching must be a mapping of tier to BatchPolicy", field="batching")
    for tier, policy in batching.items():
        if not isinstance(policy, BatchPolicy):
            raise ConfigTypeError("batching values must be BatchPolicy", field="batching")
        try:
            policies[parse_priority(tier)] = policy
        except InvalidRequestError as exc:
            raise ConfigError(f"batching: {exc}", field="batching") from None
    return policies
