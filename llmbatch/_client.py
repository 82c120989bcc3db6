"""``llmbatch.Client``: the public methods.

A client is three parts: its configuration, checked once into one value
(``_clientconfig``); the runtime its ``async with`` builds (``_runtime``: servers,
scheduler, engine, background tasks), shared with its ``with_options`` views; and
the call defaults a view fills in. Each method's keywords (declared once, in
``_callspec``) are checked through one spec cache, and the request handed in.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Iterable,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Literal, TypeVar, Unpack, overload

import anyio
from sniffio import current_async_library

from llmbatch._arguments import checked_arguments
from llmbatch._cache.codec import replay
from llmbatch._calls.defaults import CallDefaults, ViewOptions
from llmbatch._calls.spec import (
    CallSpec,
    ChatParams,
    CompletionParams,
    EmbeddingParams,
    Kind,
    MapParams,
    TextParams,
)
from llmbatch._chunks import ChatCompletionChunk, CompletionChunk
from llmbatch._config import (
    DEFAULT_LIMITS,
    DEFAULT_RETRY_POLICY,
    DEFAULT_TIMEOUT,
    BatchPolicy,
    Cache,
    Limits,
    Price,
    Priority,
    PriorityLike,
    RateLimit,
    RetryPolicy,
    SharedInFlight,
    SLOSetting,
    TenantLimits,
    Timeout,
    parse_priority,
)
from llmbatch._exceptions import (
    ClientClosedError,
    InvalidTypeError,
    LLMBatchError,
)
from llmbatch._models import ChatCompletion, Completion, Embedding, Result
from llmbatch._observers import Observer
from llmbatch._progress import ProgressLike, make_tracker
from llmbatch._replicas import Replica
from llmbatch._runtime.config import ClientConfig, check_max_cost, check_observer
from llmbatch._runtime.endpoints import Endpoints
from llmbatch._runtime.map import MapInput, MapRunner, check_inputs, check_map_options, kinds_of
from llmbatch._runtime.runtime import Runtime, State
from llmbatch._runtime.submitter import Submitter
from llmbatch._spending.ledger import SpendingLedger
from llmbatch._stats import Stats
from llmbatch._transports.base import Transport

__all__ = ["Client"]

M = TypeVar("M")
"""A ``response_model``: what the answers are validated into."""

#: How long ``async with`` waits on exit for queued and in-flight work by default.
DEFAULT_DRAIN_TIMEOUT = 60.0


class Client:
    """An async client that queues, batches, prioritises and retries LLM requests.

    Use it as an async context manager; it owns one task group for its background
    work, which ends with the ``async with``::

        async with llmbatch.Client(base_url="http://127.0.0.1:8000/v1") as client:
            answer = await client.complete("Hello", priority="realtime", max_tokens=64)
            print(answer.text)

    On asyncio it may also be used as ``AsyncOpenAI`` is, without ``async with``: its
    first call opens it, and ``await client.close()`` closes it (a client collected
    while open warns with a ``ResourceWarning``); once the event loop it opened on
    has ended, its next call opens it again on the loop that makes it. On trio,
    where nothing may outlive the nursery that runs it, ``async with`` is required.

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
    ``tenants={"agent-7": TenantLimits(max_in_flight=2), "*": TenantLimits(...)}``
    limits what the calls of one ``tenant=`` may hold and spend (``"*"``: every named
    tenant not listed; calls without a tenant are never limited), and weighs tenants
    against each other within a tier (docs/tenants.md). A call's tenant is sent as
    OpenAI's ``user`` unless the call has one, or ``send_tenant_as_user=False``
    (then tenants whose calls are otherwise alike share HTTP batches).
    ``observers=[...]`` lists :class:`Observer` objects that see every request and
    HTTP request as it happens (an exporter's hook; :meth:`add_observer` adds one
    later).
    ``prices={"model": Price(input=..., output=...)}`` states what tokens cost
    (dollars per million; otherwise the ``genai-prices`` catalogue's for a hosted
    provider, with ``llmbatch[prices]`` installed): ``stats()`` then counts dollars
    by tier, tenant and model. ``max_cost=`` dollars is a spending limit: once it
    is spent no new request goes, and the rest fail with
    :class:`SpendingLimitReached` (docs/hosted.md).
    ``cache="answers.db"`` (a Redis URL, or a :class:`Cache`) keeps every answer
    under a key of what was asked: a request asked again is answered from the file, without the
    server, and identical requests in flight at once share one exchange; a call's
    ``cache=False`` skips it, ``cache="refresh"`` asks again (docs/caching.md).
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
        config = ClientConfig.build(
            base_url=base_url,
            api_key=api_key,
            model=model,
            batching=batching,
            limits=limits,
            retry=retry,
            rate_limit=rate_limit,
            shared_in_flight=shared_in_flight,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            slo=slo,
            transport=transport,
            priority_scheduling=priority_scheduling,
            verify=verify,
            on_close=on_close,
            drain_timeout=drain_timeout,
            tenants=tenants,
            send_tenant_as_user=send_tenant_as_user,
            observers=observers,
            prices=prices,
            max_cost=max_cost,
            cache=cache,
        )
        self._setup(config, Runtime(config), config.call_defaults, view=False)

    def _setup(
        self,
        config: ClientConfig,
        runtime: Runtime,
        defaults: CallDefaults | None,
        *,
        view: bool,
    ) -> None:
        """A client is three parts: its configuration (one checked value), the runtime
        opening builds (shared with its views), and the call defaults its methods
        fill in (a view's own)."""
        self._config = config
        self._runtime = runtime
        self._defaults = defaults
        """What a call gets for the options it leaves out (set by ``with_options``)."""
        self._view = view
        self.base_url = config.replicas[0].base_url
        """The (first) server's OpenAI-style base URL (``http://host:port/v1``), no
        trailing slash; ``endpoints`` lists every replica."""
        self.limits = config.limits
        """The :class:`Limits` this client runs with."""
        self.endpoints = Endpoints(
            current=runtime.replicas,
            add=runtime.add_replica,
            remove=runtime.remove_replica,
            api_key=config.api_key,
        )
        """The client's replicas: iterate them, ``await endpoints.add(url)`` or
        ``await endpoints.remove(url)`` while it is open."""

    def __repr__(self) -> str:
        # Never the API key: only whether one is set.
        key = "set" if self._config.api_key else "none"
        view = f" view={self._defaults!r}" if self._view else ""
        return (
            f"<llmbatch.Client base_url={self.base_url!r} model={self.model!r} "
            f"api_key={key} state={self._runtime.state.value}{view}>"
        )

    @property
    def model(self) -> str | None:
        """The model every request names; read from ``/v1/models`` on entry if None."""
        defaults = self._defaults
        if defaults is not None and defaults.get("model") is not None:
            return str(defaults.get("model"))
        return self._runtime.model

    @property
    def max_model_len(self) -> int | None:
        """The server's context length from ``/v1/models`` (None if it does not say).

        When known, a prompt plus ``max_tokens`` that cannot fit fails at the call."""
        return self._runtime.max_model_len

    def with_options(self, **options: Unpack[ViewOptions]) -> Client:
        """A view of this client whose calls default to other options.

        The view shares this client's engine, queues, limits and lifetime (use it
        while the client is open; it has no ``async with`` of its own). What a call
        passes still wins over the view's defaults::

            urgent = client.with_options(priority="realtime", timeout=5, max_retries=1)
            answer = await urgent.complete("Hi")

        The options (:class:`~llmbatch._calls.defaults.ViewOptions`): ``priority``, the
        tier of every method (where each otherwise has its own default); ``model``
        the model; ``timeout`` each call's deadline in seconds (None: none);
        ``max_retries`` retries after the first attempt; ``default_headers`` HTTP
        headers added to every request (a call's ``extra_headers`` override them);
        ``tenant`` who its calls are for (see :meth:`complete`). A view of a view
        keeps the first's options that the second does not set. Bad values raise
        here; an unknown keyword is a ``TypeError``.
        """
        view = Client.__new__(Client)
        defaults = CallDefaults.checked(self._defaults, options, config=False)
        view._setup(self._config, self._runtime, defaults, view=True)
        return view

    # -- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        if self._view:
            raise ClientClosedError(
                "a with_options() view shares its client's lifetime: use it inside the "
                "client's 'async with', without one of its own"
            )
        await self._runtime.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._view:
            await self._runtime.close(failed=exc_type is not None)

    async def close(self) -> None:
        """Close a client used without ``async with`` (its first call opened it):
        finish or cancel its work as ``on_close`` says and release its connections.
        Closing twice, or closing a client never used, is harmless; a closed client
        cannot be used again."""
        if self._view:
            raise ClientClosedError(
                "a with_options() view shares its client's lifetime: close the client"
            )
        await self._runtime.close(failed=False)

    async def aclose(self) -> None:
        """The same as :meth:`close` (for ``contextlib.aclosing``)."""
        await self.close()

    # -- observers -------------------------------------------------------------------

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The :class:`Observer` objects that see this client's requests (a view's are
        its client's)."""
        return self._runtime.observers.tuple

    def add_observer(self, observer: Observer) -> None:
        """Let ``observer`` see this client's requests and HTTP requests from now on
        (before or after it opens; adding one twice adds it once)."""
        self._runtime.observers.add(check_observer(observer))

    def remove_observer(self, observer: Observer) -> bool:
        """Stop telling ``observer`` (requests it saw start still end with it); False
        if it was not added."""
        return self._runtime.observers.remove(observer)

    async def _spec(
        self,
        kind: Kind,
        method: str,
        tier: PriorityLike,
        params: Mapping[str, Any],
        *,
        stream: bool = False,
    ) -> tuple[Submitter, CallSpec]:
        """Where a call goes in, and its checked options (the view's defaults filled
        in where the call left them out). The first call opens an unopened client."""
        runtime = self._runtime
        if runtime.state is not State.OPEN or runtime.on_another_loop():
            await runtime.open_on_first_use()
        submitter = runtime.submitter()
        defaults = self._defaults
        if defaults is not None:
            params = defaults.fill(params)
        return submitter, submitter.specs.get(kind, method, tier, params, stream=stream)

    # -- calls -----------------------------------------------------------------------

    @overload
    async def complete(
        self,
        prompt: str,
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[CompletionParams],
    ) -> Completion[M]: ...

    @overload
    async def complete(
        self,
        prompt: str,
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[CompletionParams],
    ) -> Completion: ...

    @overload
    async def complete(
        self,
        prompt: str,
        *,
        response_model: object,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[CompletionParams],
    ) -> Completion[Any]: ...

    async def complete(
        self,
        prompt: str,
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        nowait: bool = False,
        **params: Unpack[CompletionParams],
    ) -> Completion[Any]:
        """Complete one prompt; batched with compatible prompts of the same tier.

        Sampling parameters are keyword arguments: the OpenAI completions API's
        (``temperature``, ``top_p``, ``stop``, ``n``, ``seed``, ``logprobs``, ...) and
        vLLM's extra ones (``top_k``, ``min_p``, ``ignore_eos``, ...); any other
        keyword is a ``TypeError``, as in openai-python. ``extra_body``,
        ``extra_headers`` and ``extra_query`` go to the server as they are.
        ``model`` overrides the client's model for this call. ``timeout`` bounds the
        whole request, queueing included (:class:`DeadlineExceeded`). ``nowait=True``
        raises :class:`QueueFull` instead of waiting when the tier's queue is full.
        ``tenant`` names who the call is for (an agent, a team, a user): within a tier,
        each tenant's work forms its own groups, and groups take turns, so one
        tenant's backlog never holds another's; it is sent as OpenAI's ``user`` when
        the call has no ``user`` of its own. None (the default) is one shared tenant.
        """
        submitter, spec = await self._spec(
            "completion", "complete", "normal", _with_model(params, response_model, max_reasks)
        )
        request = submitter.request(spec, prompt)
        if spec.response_model is not None:
            structured: Completion[Any] = await submitter.call(request, nowait=nowait)
            return structured
        # Submitter.call's steps, awaited here: one coroutine frame per waiting call.
        waiting = submitter.submit(request, nowait=nowait)
        try:
            if waiting is not None:
                await waiting
        finally:
            submitter.stop_waiting(request)
        value: Completion[Any] = submitter.outcome(request)
        return value

    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion[M]: ...

    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion: ...

    @overload
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        nowait: bool = ...,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion[Any]: ...

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        nowait: bool = False,
        **params: Unpack[ChatParams],
    ) -> ChatCompletion[Any]:
        """Answer one conversation (``[{"role": "user", "content": "hi"}]``).

        Parameters as for :meth:`complete`, from the OpenAI chat API (``tools``,
        ``tool_choice``, ``response_format``, ``n``, ``logprobs``, ``top_logprobs``,
        ``max_completion_tokens``, ...) and vLLM's extras. Conversations that arrive
        together go to the server as one ``/v1/chat/completions/batch`` request
        where it has that route (vLLM 0.19+) and the call allows it, else one
        request each.
        """
        submitter, spec = await self._spec(
            "chat", "chat", "normal", _with_model(params, response_model, max_reasks)
        )
        request = submitter.request(spec, messages)
        if spec.response_model is not None:
            structured: ChatCompletion[Any] = await submitter.call(request, nowait=nowait)
            return structured
        # As complete's: Submitter.call's steps awaited here.
        waiting = submitter.submit(request, nowait=nowait)
        try:
            if waiting is not None:
                await waiting
        finally:
            submitter.stop_waiting(request)
        value: ChatCompletion[Any] = submitter.outcome(request)
        return value

    @overload
    async def embed(  # type: ignore[overload-overlap]  # a str is also a Sequence[str]
        self, input: str, *, nowait: bool = ..., **params: Unpack[EmbeddingParams]
    ) -> Embedding: ...

    @overload
    async def embed(
        self, input: Sequence[str], *, nowait: bool = ..., **params: Unpack[EmbeddingParams]
    ) -> list[Embedding]: ...

    async def embed(
        self,
        input: str | Sequence[str],
        *,
        nowait: bool = False,
        **params: Unpack[EmbeddingParams],
    ) -> Embedding | list[Embedding]:
        """Embed a text (an :class:`Embedding`) or a list of texts (a list, in order).

        Texts from any number of calls are batched into ``/v1/embeddings`` requests
        like prompts are, with the same tiers, isolation and retries. A list fails as
        a whole with its first item's error (as openai's ``embeddings.create`` does);
        for per-item results over a large corpus, use :meth:`map` with
        ``{"input": text}`` items. Parameters: ``dimensions``, ``encoding_format``,
        ``user`` and vLLM's ``truncate_prompt_tokens``, ``normalize``.
        """
        submitter, spec = await self._spec("embedding", "embed", "normal", params)
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
        stream_options: Mapping[str, Any] | None = None,
        **params: Unpack[TextParams],
    ) -> AsyncGenerator[str, None]:
        """Yield text deltas as the server produces them (a prompt, or chat messages).

        Parameters as for :meth:`complete` or :meth:`chat`. ``stream_options`` is
        accepted for openai-python compatibility; usage is always requested.
        Errors before the first delta are retried; after it, they are raised here.
        Leaving the loop early cancels the request on the server side. For the ids,
        finish reason and usage too, use :meth:`stream_chunks`.
        """
        return self._stream(prompt, stream_options, params, chunks=False)

    @overload
    def stream_chunks(
        self,
        prompt: str,
        *,
        stream_options: Mapping[str, Any] | None = ...,
        **params: Unpack[TextParams],
    ) -> AsyncGenerator[CompletionChunk, None]: ...

    @overload
    def stream_chunks(
        self,
        prompt: Sequence[Mapping[str, Any]],
        *,
        stream_options: Mapping[str, Any] | None = ...,
        **params: Unpack[TextParams],
    ) -> AsyncGenerator[ChatCompletionChunk, None]: ...

    def stream_chunks(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        *,
        stream_options: Mapping[str, Any] | None = None,
        **params: Unpack[TextParams],
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
            prompt, stream_options, params, chunks=True
        )
        return chunks

    async def _stream(
        self,
        prompt: str | Sequence[Mapping[str, Any]],
        stream_options: object,
        params: Mapping[str, Any],
        *,
        chunks: bool,
    ) -> AsyncGenerator[Any, None]:
        """What :meth:`stream` and :meth:`stream_chunks` yield: text deltas, or chunks.

        An async generator, so a call is checked (and runs, on the client's loop)
        when iteration starts, as a ``SyncClient``'s must."""
        kind: Kind = "completion" if isinstance(prompt, str) else "chat"
        _check_stream_options(stream_options)
        method = "stream_chunks" if chunks else "stream"
        submitter, spec = await self._spec(kind, method, "realtime", params, stream=True)
        request = submitter.request(spec, prompt)
        if request.done:  # answered from the response cache
            for item in replay(request.value, chunks):
                yield item
            return
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

    @overload
    async def map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> list[Result[M]]: ...

    @overload
    async def map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> list[Result[Any]]: ...

    @overload
    async def map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> list[Result[Any]]: ...

    async def map(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Unpack[MapParams],
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
        await self._open_on_first_use()
        runner, tier, size, tracker, options, spending = self._map_call(
            inputs, window, progress, _with_model(params, response_model, max_reasks)
        )
        return await runner.collect(inputs, tier, size, options, tracker, spending)

    @overload
    def map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[tuple[int, Result[M]], None]: ...

    @overload
    def map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[tuple[int, Result[Any]], None]: ...

    @overload
    def map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[tuple[int, Result[Any]], None]: ...

    def map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[tuple[int, Result[Any]], None]:
        """Yield ``(index, Result)`` as items finish, pulling inputs lazily.

        Memory stays bounded by ``window`` however long ``inputs`` is (a generator of
        millions of prompts is fine). Leaving the loop early cancels what is left once
        the generator is closed; ``async with contextlib.aclosing(...)`` closes it at
        once. ``progress`` works as in :meth:`map`. Its options are checked at the
        call, or, on a client that its first call will open, when iteration starts.
        """
        runtime = self._runtime
        if (
            runtime.state is State.UNOPENED or runtime.on_another_loop()
        ) and current_async_library() == "asyncio":
            return self._open_then_map_unordered(
                inputs, window, progress, _with_model(params, response_model, max_reasks)
            )
        runner, tier, size, tracker, options, spending = self._map_call(
            inputs, window, progress, _with_model(params, response_model, max_reasks)
        )
        return runner.iterate(
            inputs, tier, size, options, ordered=False, tracker=tracker, spending=spending
        )

    async def _open_then_map_unordered(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        window: int | None,
        progress: ProgressLike,
        params: Mapping[str, Any],
    ) -> AsyncGenerator[tuple[int, Result[Any]], None]:
        await self._open_on_first_use()
        results = self.map_unordered(inputs, window=window, progress=progress, **params)
        async with contextlib.aclosing(results):
            async for item in results:
                yield item

    @overload
    def imap(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: type[M],
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[Result[M], None]: ...

    @overload
    def imap(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: None = ...,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[Result[Any], None]: ...

    @overload
    def imap(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: object,
        max_reasks: int | None = ...,
        window: int | None = ...,
        progress: ProgressLike = ...,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[Result[Any], None]: ...

    async def imap(
        self,
        inputs: Iterable[MapInput] | AsyncIterable[MapInput],
        *,
        response_model: object = None,
        max_reasks: int | None = None,
        window: int | None = None,
        progress: ProgressLike = None,
        **params: Unpack[MapParams],
    ) -> AsyncGenerator[Result[Any], None]:
        """Yield one :class:`Result` per input, in input order, with bounded memory.

        Results that finish before an earlier one wait in a reorder buffer; inputs
        submitted plus results buffered never exceed ``window``, so one slow item
        stalls the feeder once ``window`` items are ahead of it. Prefer
        :meth:`map_unordered` for throughput, ``imap`` when order matters and the
        input is too large for :meth:`map`'s list.
        """
        await self._open_on_first_use()
        runner, tier, size, tracker, options, spending = self._map_call(
            inputs, window, progress, _with_model(params, response_model, max_reasks)
        )
        results = runner.iterate(
            inputs, tier, size, options, ordered=True, tracker=tracker, spending=spending
        )
        async with contextlib.aclosing(results):
            async for _index, result in results:
                yield result

    async def _open_on_first_use(self) -> None:
        runtime = self._runtime
        if runtime.state is not State.OPEN or runtime.on_another_loop():
            await runtime.open_on_first_use()

    def _map_call(
        self,
        inputs: object,
        window: int | None,
        progress: ProgressLike,
        params: Mapping[str, Any],
    ) -> tuple[MapRunner, Priority, int, Any, dict[str, Any], tuple[SpendingLedger, ...]]:
        """Check a map call's arguments at the call site; its tier, its options (the
        view's defaults filled in) without the tier, and its own spending limit."""
        submitter = self._runtime.submitter()
        runner = self._runtime.map
        assert runner is not None
        if window is None:
            # The limits hold per replica: room for twice what all of them may run.
            window = 2 * self.limits.max_in_flight * max(1, len(self.endpoints))
        size = window
        check_inputs(inputs, size)
        defaults = self._defaults
        options = dict(params) if defaults is None else defaults.fill(params)
        priority = options.pop("priority", None)
        tier = parse_priority("batch" if priority is None else priority)
        max_cost = check_max_cost(options.pop("max_cost", None))
        check_map_options(submitter.specs, tier, options, kinds_of(inputs))
        spending: tuple[SpendingLedger, ...] = ()
        if max_cost is not None:
            submitter.check_priced(options.get("model") or self.model)
            spending = (SpendingLedger(max_cost, "map"),)
        tracker = make_tracker(progress, inputs, submitter.now)
        return runner, tier, size, tracker, options, spending

    def stats(self) -> Stats:
        """An immutable snapshot of queues, outcomes, batches, latencies and tokens.

        Safe from any thread (a metrics exporter's, a web framework's): from outside
        the client's event loop it is taken on the loop, waiting for it up to 5 s
        (then ``TimeoutError``)."""
        return self._runtime.stats()


def _with_model(
    params: Mapping[str, Any], response_model: object, max_reasks: int | None
) -> Mapping[str, Any]:
    """A call's keywords with its ``response_model`` and ``max_reasks``, where given."""
    if response_model is None and max_reasks is None:
        return params
    return {**params, "response_model": response_model, "max_reasks": max_reasks}


def _check_stream_options(options: object) -> None:
    if options is not None and not isinstance(options, Mapping):
        raise InvalidTypeError("stream_options must be a dict", field="stream_options")
