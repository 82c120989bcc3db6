"""Turning a call into a request and waiting for its outcome: the one path that
``complete``, ``chat``, ``stream`` and ``map`` share.

The client keeps configuration, lifetime and the public methods; the map runner
keeps its window and results; both build requests and hand them to the engine here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from llmbatch._calls.prefix import HotPrefixes, prefix_keys
from llmbatch._calls.request import Request, State
from llmbatch._calls.spec import CallSpec, SpecCache
from llmbatch._calls.structured import Reask, Verdict, check_answer
from llmbatch._calls.validate import TOKEN_OVERHEAD, check_messages, check_prompt, input_bytes
from llmbatch._clock import Clock
from llmbatch._config import Price
from llmbatch._exceptions import InvalidRequestError, LLMBatchError
from llmbatch._observers import Observers
from llmbatch._runtime.caching import AnswerCache
from llmbatch._runtime.engine import Engine
from llmbatch._scheduler import Batch
from llmbatch._spending.ledger import SpendingLedger
from llmbatch._spending.prices import PriceBook, price_needed

__all__ = ["Submitter", "answered"]

#: A typical tokenizer's bytes per token on English text (a rough estimate, used only
#: to decide whether a long prompt goes alone).
BYTES_PER_TOKEN = 4


class Submitter:
    """Validates calls into requests and submits them to one client's engine."""

    def __init__(
        self,
        engine: Engine,
        specs: SpecCache,
        *,
        clock: Clock,
        loop: asyncio.AbstractEventLoop | None,
        observers: Observers,
        prices: PriceBook | None = None,
        spending: tuple[SpendingLedger, ...] = (),
        cache: AnswerCache | None = None,
    ) -> None:
        self.engine = engine
        self.specs = specs
        self.now = clock
        self._loop = loop
        self.observers = observers
        self.prices = prices
        """Each model's price (for what a spending limit reserves)."""
        self.spending = spending
        """The client's spending limit, which every request counts against (or none)."""
        self._hot = HotPrefixes()
        self.cache = cache
        """The client's response cache (None: none)."""
        if cache is not None:
            # A follower of a request that failed for a reason not its own goes on
            # as a map item does.
            cache.resubmit = self.enter

    def request(
        self,
        spec: CallSpec,
        payload: object,
        parent: object = None,
        spending: tuple[SpendingLedger, ...] = (),
        *,
        key: bytes | None = None,
        look_up: bool = True,
    ) -> Request:
        """One request for a prompt (``spec.kind == "completion"``) or a conversation;
        ``parent``: the trace context to record it under (default: the current one);
        ``spending``: a map's or job's spending limit, beside the client's.

        With a response cache, a stored answer comes back as a request settled
        already (nothing else done for it: not validated, counted or observed);
        ``look_up=False``: the caller looked ``key`` up already (a map's chunk)."""
        cache = self.cache
        if cache is not None and look_up and spec.cache != "off":
            key = cache.maker(spec).key(payload)
            if key is not None and spec.cache == "use":
                now = self.now()
                answer = cache.lookup(spec, key, now)
                if answer is not None:
                    return answered(spec, answer, now)
        max_model_len = self.specs.context_of(spec.model)
        if spec.kind != "chat":
            name = "prompt" if spec.kind == "completion" else "input"
            est_tokens = check_prompt(
                payload,
                n=spec.n,
                max_tokens=spec.max_tokens,
                max_model_len=max_model_len,
                name=name,
            )
            request = Request(spec, payload, None, est_tokens, self.now())  # type: ignore[arg-type]
        else:
            messages, est_tokens = check_messages(payload, n=spec.n, max_tokens=spec.max_tokens)
            request = Request(spec, None, messages, est_tokens, self.now())
        if spec.tenant is not None:
            self.engine.check_tenant_size(request)
        ledgers = self.spending + spending if spending else self.spending
        if ledgers:
            self._estimate_cost(request, ledgers)
        if self.engine.routing:
            self._key(request)
        if self.observers.on:
            self.observers.request_started(request, parent)
        if max_model_len is not None:
            size = input_bytes(request.prompt, request.messages)
            if size + TOKEN_OVERHEAD + spec.max_tokens > max_model_len:
                request.might_not_fit = True
                if size // BYTES_PER_TOKEN + spec.max_tokens > max_model_len:
                    # Likely too long by the usual ~4 bytes a token: alone from the
                    # start, so it cannot fail a batch. (Longer prompts that probably
                    # fit still batch, until the server refuses one as too long.)
                    request.travel_alone()
        if key is not None:
            assert cache is not None
            request.stored_as = key
            request.sharing = cache  # told when it settles: its answer is stored
            if not spec.stream:  # a stream's caller reads its own exchange
                request.cache_key = key
        return request

    def check_priced(self, model: str | None) -> Price:
        """``model``'s price, or :class:`InvalidRequestError` saying how to give one (a
        spending limit cannot be kept without it)."""
        price = None if self.prices is None else self.prices.price(model)
        if price is None:
            raise InvalidRequestError(price_needed(model), field="max_cost")
        return price

    def _estimate_cost(self, request: Request, ledgers: tuple[SpendingLedger, ...]) -> None:
        """What ``request`` may cost at most, which its spending limits reserve: a
        prompt token per byte (no tokenizer makes more) and ``max_tokens`` for every
        choice. An estimate of the usual four bytes a token would let the spend pass
        the limit by what it missed; this one settles for less, never for more."""
        spec = request.spec
        price = self.check_priced(spec.model)
        request.spending = ledgers
        prompt = input_bytes(request.prompt, request.messages) + TOKEN_OVERHEAD
        request.est_cost = price.cost(prompt, spec.max_tokens * spec.n)

    def _key(self, request: Request) -> None:
        """A prompt whose prefix recurs batches with its kind and carries its prefix
        keys, so its batch goes to the replica where that prefix is cached."""
        keys = prefix_keys(request.prompt, request.messages)
        group = self._hot.group_of(keys)
        if group is not None:
            request.prefix = keys
            request.join_prefix_group(group)

    async def wait(self, request: Request) -> None:
        """Return once ``request`` is settled."""
        waiting = request.waiter(self._loop)
        if waiting is not None:
            await waiting

    async def call(self, request: Request, *, nowait: bool = False) -> Any:
        """Submit ``request`` and return its value, or raise its error.

        The request's deadline (its ``timeout``) is kept by the scheduler, not by a
        timer here; a caller that is cancelled takes its request out of the queue,
        or out of its HTTP exchange if it was the last one waiting on it. With a
        ``response_model``, the answer comes back validated (``parsed``), after any
        re-asks, or the call raises :class:`StructuredOutputError`.
        """
        value = await self._call(request, nowait=nowait)
        if request.spec.response_model is None:
            return value
        while True:
            verdict = self.check(request, value)
            if verdict.ok:
                return value
            if verdict.error is not None:
                raise verdict.error
            assert verdict.reask is not None
            request = self.follow_up(request, verdict.reask)
            value = await self._call(request, nowait=False)

    def check(self, request: Request, answer: Any) -> Verdict:
        """Validate a ``response_model`` call's answer (setting its ``parsed``), and
        count what became of it."""
        verdict = check_answer(
            answer,
            request.spec,
            request.prompt if request.prompt is not None else request.messages or (),
            reasks=request.reasks,
            request_id=request.id,
            attempts=request.prior_attempts + answer.timings.attempts,
        )
        stats = self.engine.stats
        if verdict.ok:
            stats.validated += 1
            object.__setattr__(answer, "_parsed", verdict.parsed)
            cache = self.cache
            if cache is not None and request.stored_as is not None and not answer.from_cache:
                cache.keep(request.stored_as, request.spec, answer)
        elif verdict.error is not None:
            stats.structured_failed += 1
            cache = self.cache
            if cache is not None and request.stored_as is not None:
                cache.keep_failure(request.stored_as, verdict.error)
        return verdict

    def follow_up(self, request: Request, reask: Reask) -> Request:
        """The request that sends an answer back to be corrected: same options, the
        same deadline, the same place in a map. Raises if it is not valid (a
        conversation grown past the context)."""
        # Under the same spending limits: the client's come first, then its map's.
        follow = self.request(
            request.spec, reask.payload, spending=request.spending[len(self.spending) :]
        )
        follow.deadline = request.deadline
        follow.reasks = request.reasks + 1
        follow.prior_attempts = request.prior_attempts + request.attempts
        follow.index = request.index
        follow.metadata = request.metadata
        follow.stored_as = request.stored_as  # the answer is the first ask's
        self.engine.stats.reasked += 1
        return follow

    async def _call(self, request: Request, *, nowait: bool) -> Any:
        waiting = self.submit(request, nowait=nowait)
        try:
            if waiting is not None:
                await waiting
        finally:
            self.stop_waiting(request)
        return self.outcome(request)

    # The three steps of a call, for callers that wait in their own coroutine: a
    # gather of 100,000 calls holds a frame for each coroutine a call is suspended
    # in (about 230 bytes each), so ``complete`` and ``chat`` await ``submit``'s
    # future themselves rather than through ``call``:
    #
    #     waiting = submitter.submit(request)
    #     try:
    #         if waiting is not None:
    #             await waiting
    #     finally:
    #         submitter.stop_waiting(request)
    #     return submitter.outcome(request)

    def submit(self, request: Request, *, nowait: bool = False) -> Awaitable[None] | None:
        """Submit ``request``; what to await until it is settled (None: it is). A
        lone realtime call that may go at once is sent by what this returns, in the
        awaiting task (``Engine.send_inline``)."""
        if request.done:  # answered from the cache
            return None
        if self._follows(request):
            return request.waiter(self._loop)  # an identical request is in flight
        alone = self.engine.submit(request, nowait=nowait, inline=not request.spec.stream)
        if alone is not None:
            return self._send_inline(alone, request)
        return request.waiter(self._loop)

    async def _send_inline(self, batch: Batch, request: Request) -> None:
        await self.engine.send_inline(batch)
        # Settled, unless its server was down and it went back to the queue.
        waiting = request.waiter(self._loop)
        if waiting is not None:
            await waiting

    def enter(self, request: Request) -> None:
        """Queue a map's ``request`` (more follow it), or let it follow an identical
        one in flight."""
        if not self._follows(request):
            self.engine.submit(request, more=True)

    def _follows(self, request: Request) -> bool:
        """Whether ``request`` waits for an identical one in flight rather than goes
        (it becomes the one others follow otherwise)."""
        cache = self.cache
        return request.cache_key is not None and cache is not None and cache.follow(request)

    def stop_waiting(self, request: Request) -> None:
        """The caller is done waiting: if ``request`` is not settled (the caller was
        cancelled), it leaves its queue, or its HTTP exchange if it was the last one
        waiting on it."""
        if not request.done:
            self.abandon(request)

    def abandon(self, request: Request) -> None:
        """``request``'s caller went away: the engine drops it, unless identical
        requests still wait on its exchange."""
        cache = self.cache
        if cache is not None and request.cache_key is not None:
            dropped = cache.leave(request)
            if dropped is not None:
                self.engine.abandon(dropped)
            return
        self.engine.abandon(request)

    @staticmethod
    def outcome(request: Request) -> Any:
        """A settled request's value, or its error raised."""
        if request.error is not None:
            raise request.error
        return request.value


def answered(spec: CallSpec, answer: object, now: float) -> Request:
    """A request settled with a stored ``answer`` (or the failure kept for it): what a
    hit hands the caller."""
    request = Request(spec, None, None, 0, now)
    request.state = State.FINISHED
    if isinstance(answer, LLMBatchError):
        request.set_error(answer)
    else:
        request.set_value(answer)
    return request
