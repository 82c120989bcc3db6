"""Sends batches, retries what is worth retrying, bisects 400s, and hands each caller
its own answer or its own error.

Fault isolation lives here: a batch's failure is resolved per request. A 400 on a
list of prompts or conversations (vLLM fails the whole list for one bad item and
does not say which) is split until the offending items fail alone and every other
one is answered; a too-long prompt is found from the token count in vLLM's message
rather than by blind halving.

Everything the server shows about itself goes to its :class:`Server`: load
headers, latencies (for the admission controller), and failures (for the circuit
breaker). When the server is down and worth waiting for, the batch is handed back
for the queue instead of spending its retries on the outage.

The first attempt is a plain call: it must cost nothing extra (setting up tenacity
is a measurable part of a lone call's work: docs/benchmarks.md, "Single"). Only
after it fails do the retry rules (``_control.retry``) run, on tenacity, with each
resend charged to the rate limits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from llmbatch._calls.outcome import Outcomes
from llmbatch._calls.request import Flight, Request
from llmbatch._calls.validate import TOKEN_OVERHEAD, input_bytes
from llmbatch._clock import Clock
from llmbatch._config import Priority
from llmbatch._control.retry import Retries, is_backpressure, is_unavailable
from llmbatch._exceptions import (
    BadRequestError,
    NotFoundError,
    RequestError,
    ServiceUnavailableError,
)
from llmbatch._logs import BISECTION, Bisection, Throttle, logger
from llmbatch._models import (
    BareChoices,
    ChatCompletion,
    Completion,
    Delivery,
    Embedding,
    make_answer,
)
from llmbatch._observers import ObservedBatch, Observers
from llmbatch._recorder import StatsRecorder
from llmbatch._scheduler.budgets import RateBudget
from llmbatch._servers.model_list import read_models
from llmbatch._servers.server import Server
from llmbatch._servers.wire import (
    Answers,
    StreamDecoder,
    chat_batch_body,
    chat_body,
    completion_body,
    embedding_body,
    error_from_response,
    parse_chat,
    parse_chat_batch,
    parse_completions,
    parse_embeddings,
    priority_refused,
    prompt_cap,
    split_cached,
    split_usage,
    too_long,
)
from llmbatch._transports.base import HTTPRequest, HTTPResponse

__all__ = ["Dispatcher"]


T = TypeVar("T")

#: Parameters the chat batch route does not take (vLLM: no tools, no streaming, n=1).
_CHAT_BATCH_UNSUPPORTED = frozenset({"tools", "tool_choice", "functions", "function_call"})
#: How long a 404's answer may wait for the model list that explains it.
MODELS_REREAD_TIMEOUT = 5.0
#: A list read this recently explains later 404s too (a map naming a wrong model
#: fails every batch: one read a second, not one a batch).
MODELS_REREAD_INTERVAL = 1.0


_ANSWER_TYPES: dict[str, type[Completion] | type[ChatCompletion] | type[Embedding]] = {
    "completion": Completion,
    "chat": ChatCompletion,
    "embedding": Embedding,
}


@dataclass(frozen=True, slots=True)
class Route:
    """One way of asking the server: its path, how a batch becomes a body, and how
    the answer becomes each request's."""

    path: str
    body: Callable[[Sequence[Request], int | None], bytes]
    parse: Callable[[bytes, Sequence[Request]], Answers]


COMPLETIONS = Route("/completions", completion_body, parse_completions)
EMBEDDINGS = Route("/embeddings", embedding_body, parse_embeddings)
#: Several conversations in one request (vLLM 0.19+; others answer 404).
CHAT_BATCH = Route("/chat/completions/batch", chat_batch_body, parse_chat_batch)
#: One conversation.
CHAT = Route(
    "/chat/completions",
    lambda requests, rank: chat_body(requests[0], rank),
    lambda content, requests: parse_chat(content, requests[0].spec.n),
)


class _Unavailable(Exception):
    """The server is down and worth waiting for: the requests go back to the queue."""


class Dispatcher:
    """Turns batches into HTTP exchanges and resolves every request's outcome."""

    def __init__(
        self,
        *,
        server: Server,
        retries: Retries,
        stats: StatsRecorder,
        outcomes: Outcomes,
        observers: Observers,
        rate: Callable[[], RateBudget | None] = lambda: None,
        fail_over: Callable[[], bool] | None = None,
        patient: Callable[[], bool] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._now = clock
        self._retry_log = Throttle(clock)
        self.server = server
        self._retries = retries
        self._stats = stats
        self._outcomes = outcomes
        self._rate = rate
        """The rate limits now (stated, or learnt from the answers): resends are
        charged to them, and answers tell the token budget what they really used."""
        self.chat_batch: bool | None = None
        """Whether the server has /chat/completions/batch: None until the first try."""
        self._observers = observers
        self._fail_over = fail_over
        """Whether another replica takes batches now (several servers only)."""
        self._patient = patient
        """Whether the server is worth waiting for before it first answers (one of
        several replicas whose peers answered)."""
        self._models_read: tuple[float, list[str]] | None = None
        """When ``/v1/models`` was last read to explain a 404, and what it listed."""

    async def send(self, requests: Sequence[Request], flight: Flight) -> list[Request]:
        """Answer every request of a batch; returns those that must go back to the
        queue because the server went down (the engine requeues them). Never raises
        for a request's failure."""
        with flight.scope:
            spec = requests[0].spec
            if spec.stream:
                await self._stream(requests[0])
            elif spec.kind == "completion":
                await self._complete(list(requests))
            elif spec.kind == "chat":
                await self._chat(list(requests))
            else:
                await self._embed(list(requests))
        return flight.handed_back

    # -- completions -------------------------------------------------------------------

    async def _complete(self, requests: list[Request]) -> None:
        await self._exchange(COMPLETIONS, requests, self._complete)

    async def _embed(self, requests: list[Request]) -> None:
        """Texts in one /v1/embeddings request (``input`` is a list)."""
        await self._exchange(EMBEDDINGS, requests, self._embed)

    async def _exchange(
        self,
        route: Route,
        requests: list[Request],
        again: Callable[[list[Request]], Coroutine[Any, Any, None]],
    ) -> None:
        """One batch over one route, with retries, and every outcome settled: answered;
        back in the queue (the server is down); resent without the priority field or
        in parts (a 400 for the batch: the bad items fail alone, through ``again``);
        failed. The chat batch route falls back to one request per conversation on a
        server without it."""
        live = [r for r in requests if not r.abandoned]
        if not live:
            return
        cap = self.server.prompt_cap
        if cap is not None and route is COMPLETIONS and len(live) > cap:
            # The server refused a list this long once: send it in lists it takes.
            async with anyio.create_task_group() as tg:
                for start in range(0, len(live), cap):
                    tg.start_soon(again, live[start : start + cap])
            return
        body = route.body(live, self.server.rank(live[0].priority))
        try:
            content = await self._with_retries(
                route.path, live, lambda: self._post(route.path, live, body)
            )
            answers = route.parse(content, live)
        except _Unavailable:
            self._requeue(live)
            return
        except NotFoundError as exc:
            if route is not CHAT_BATCH:
                self._fail_all(live, exc)
                return
            # A server without the route answers 404 without an OpenAI error object;
            # either way the single-conversation route gives each request its answer.
            if not (isinstance(exc.body, Mapping) and isinstance(exc.body.get("error"), Mapping)):
                if self.chat_batch is None:
                    logger.info("the server has no /chat/completions/batch; sending one by one")
                self.chat_batch = False
            await self._chat_each(live)
            return
        except BadRequestError as exc:
            if self._priority_refused(exc, live) or self._list_refused(exc, route, live):
                await again(live)
                return
            await self._split(live, exc, again)
            return
        except RequestError as exc:
            self._fail_all(live, exc)
            return
        if route is CHAT_BATCH:
            self.chat_batch = True
        self._deliver(live, answers)

    def _priority_refused(self, error: BadRequestError, requests: Sequence[Request]) -> bool:
        """The server refused the ``priority`` field (vLLM on ``fcfs``): it is told, so
        that none is sent from now on, and the batch is resent."""
        server = self.server
        if server.rank(requests[0].priority) is None or not priority_refused(error.message):
            return False
        server.on_priority_refused(error.message)
        return True

    def _list_refused(
        self, error: BadRequestError, route: Route, requests: Sequence[Request]
    ) -> bool:
        """The server refused the list of prompts as too long (vLLM's
        ``VLLM_MAX_COMPLETION_PROMPTS`` set lower than 1024): keep its cap for good
        and resend in lists it takes."""
        cap = prompt_cap(error.message)
        if route is not COMPLETIONS or cap is None or len(requests) <= cap:
            return False
        self.server.on_list_refused(cap)
        return True

    async def _split(
        self,
        requests: list[Request],
        error: BadRequestError,
        again: Callable[[list[Request]], Coroutine[Any, Any, None]],
    ) -> None:
        """Resend a batch the server refused whole, in parts, until the bad items fail
        alone. A too-long prompt is found from vLLM's message: only prompts with at
        least that many bytes can have that many tokens, so they are sent one by one
        and the rest together; otherwise the batch is halved, longest prompts first."""
        refused = too_long(error.message)
        if refused is not None:
            self.server.on_too_long()
        if len(requests) == 1:
            self._fail_all(requests, error)
            return
        self._stats.bisections += 1
        parts = None
        if refused is not None and refused.input_tokens is not None:
            parts = _suspect_parts(requests, refused.input_tokens)
        if parts is None:
            ordered = sorted(requests, key=_size, reverse=True)
            middle = len(ordered) // 2
            parts = [ordered[:middle], ordered[middle:]]
        logger.debug(
            "400 on a batch of %d, resending in %d parts: %s",
            len(requests),
            len(parts),
            error.message,
        )
        outer = BISECTION.get()
        split = outer or Bisection(len(requests), error.message)
        split.requests += len(parts)
        token = BISECTION.set(split) if outer is None else None
        try:
            rate = self._rate()
            if rate is not None:
                # New HTTP requests: they count against the rate limits.
                now = self._now()
                delay = max(rate.reserve(now, sum(r.est_tokens for r in part)) for part in parts)
                await anyio.sleep(delay)
            async with anyio.create_task_group() as tg:
                for part in parts:
                    tg.start_soon(again, part)
        finally:
            if token is not None:
                BISECTION.reset(token)
                failed = sum(r.error is not None for r in requests)
                logger.info(
                    "400 on a batch of %d (%s): split into %d more requests; "
                    "%d failed alone, %d answered",
                    split.size,
                    split.error,
                    split.requests,
                    failed,
                    len(requests) - failed,
                )

    # -- chat ------------------------------------------------------------------------

    async def _chat(self, requests: list[Request]) -> None:
        live = [r for r in requests if not r.abandoned]
        if not live:
            return
        spec = live[0].spec
        if (
            len(live) > 1
            and self.chat_batch is not False
            and spec.n == 1
            and _CHAT_BATCH_UNSUPPORTED.isdisjoint(spec.params)
        ):
            await self._exchange(CHAT_BATCH, live, self._chat)
        else:
            await self._chat_each(live)

    async def _chat_each(self, requests: list[Request]) -> None:
        """One /chat/completions request per conversation, at once."""
        if len(requests) == 1:
            await self._exchange(CHAT, requests, self._chat)
            return
        rate = self._rate()
        now = self._now()
        async with anyio.create_task_group() as tg:
            for i, request in enumerate(requests):
                # The batch was charged as one request: each further one is a request
                # of its own to the rate limits (its tokens were charged with it).
                delay = 0.0 if rate is None or i == 0 else rate.reserve(now, 0)
                tg.start_soon(self._chat_one, request, delay)

    async def _chat_one(self, request: Request, delay: float) -> None:
        if delay > 0:
            await anyio.sleep(delay)
        await self._exchange(CHAT, [request], self._chat)

    # -- streaming -------------------------------------------------------------------

    async def _stream(self, request: Request) -> None:
        """Stream one request to its caller, as text deltas or as every event's chunk;
        retried only until the caller has been sent something."""
        chat = request.spec.kind == "chat"
        path = "/chat/completions" if chat else "/completions"
        rank = self.server.rank(request.priority)
        body = chat_body(request, rank) if chat else completion_body([request], rank)
        # A caller of stream() is sent the text of each event that has some; one of
        # stream_chunks() every event's chunk (a chunk is never falsy).
        decoder = StreamDecoder(chat=chat, chunks=request.chunks)
        deltas = request.deltas
        sent = False
        # When the first generated text arrived: the stream's TTFT and per-token time
        # are the server's own, not an answer's latency spread over its tokens.
        first_token_at: float | None = None

        async def exchange() -> None:
            nonlocal sent, first_token_at
            response = await self._open(path, [request], body)
            try:
                if response.status >= 400:
                    raise error_from_response(
                        response.status, response.headers, await response.read()
                    )
                async for line in response.iter_lines():
                    item = decoder.feed_line(line)
                    if first_token_at is None and decoder.parts:
                        first_token_at = self._now()
                    if item and deltas is not None:
                        await deltas.send(item)
                        sent = True
            finally:
                await response.aclose()

        requeued = False
        try:
            await self._with_retries(path, [request], exchange, retry_if=lambda: not sent)
        except _Unavailable:
            # Nothing was sent to the caller yet: the stream waits out the outage in
            # the queue like any request, its caller still reading.
            requeued = True
            self._requeue([request])
            return
        except RequestError as exc:
            self._fail_all([request], exc)
            return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the caller stopped reading; it has already been told
        finally:
            if deltas is not None and not requeued:
                deltas.close()
        answers = Answers(
            decoder.id,
            decoder.model,
            decoder.created,
            [(decoder.choice(chat=chat),)],
            decoder.usage,
            cached=decoder.cached,
        )
        self._deliver([request], answers, first_token_at=first_token_at)

    # -- HTTP and retries ------------------------------------------------------------

    async def _open(self, path: str, requests: Sequence[Request], body: bytes) -> HTTPResponse:
        self._stats.batch_sent(len(requests))
        server = self.server
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "POST %s: %d prompt(s), tier %s, attempt %d",
                path,
                len(requests),
                requests[0].priority.value,
                requests[0].attempts,
            )
        spec = requests[0].spec
        headers = server.headers
        if spec.headers:  # extra_headers
            headers = {**headers, **dict(spec.headers)}
        url = server.base_url + path + spec.query
        sent_at = self._now()
        if spec.priority is not Priority.REALTIME and server.paces:
            # (Only pacing reads the bulk prompts' size: no sum per batch otherwise.)
            tokens = sum(r.prefill_tokens for r in requests)
            server.on_sent(sent_at, len(requests) * spec.n, tokens, bulk=True)
        else:
            server.on_sent(sent_at, len(requests) * spec.n)
        observers = self._observers
        if not observers.on:
            response = await server.transport.send(HTTPRequest("POST", url, headers, body))
        else:
            batch = _observed(path, url, requests)
            sent = observers.batch_sent(batch)
            try:
                response = await server.transport.send(HTTPRequest("POST", url, headers, body))
            except BaseException as exc:
                observers.batch_answered(batch, sent, None, exc)
                raise
            observers.batch_answered(batch, sent, response.status, None)
        server.on_response(response.status, response.headers, self._now(), sent_at)
        return response

    async def _post(self, path: str, requests: Sequence[Request], body: bytes) -> bytes:
        response = await self._open(path, requests, body)
        try:
            content: bytes = await response.read()
        finally:
            await response.aclose()
        if response.status >= 400:
            raise error_from_response(response.status, response.headers, content)
        return content

    async def _with_retries(
        self,
        path: str,
        requests: Sequence[Request],
        call: Callable[[], Awaitable[T]],
        retry_if: Callable[[], bool] | None = None,
    ) -> T:
        """``call()``, retried with backoff on 429, 5xx and network errors; raises
        :class:`_Unavailable` when the server is down and worth waiting for, or when
        another replica can take the batch at once (failover).

        The first attempt goes out plain, so it costs nothing when nothing fails; the
        retry policy after a first failure runs on tenacity (waits with full jitter
        or the server's Retry-After, each resend charged to the rate limits; stops
        after ``RetryPolicy.attempts``; a log line before each sleep). tenacity stays
        private: what a caller sees is the last attempt's own error."""
        attempts = self._retries.attempts(requests[0].spec.attempts)
        try:
            return await self._attempt(requests, call, retry_if, attempts)
        except _Unavailable:
            raise
        except RequestError as error:
            if attempts <= 1 or not self._retryable(error, requests, _can(retry_if)):
                raise
            first = error
        # Only a failed first attempt gets here, and pays for the retry machinery.
        import tenacity

        replay: list[RequestError] = [first]

        async def attempt() -> T:
            if replay:  # tenacity's attempt 1 is the plain one that already failed
                raise replay.pop()
            for request in requests:
                request.retried = True
            return await self._attempt(requests, call, retry_if, attempts)

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=lambda state: self._wait(requests, state.attempt_number, _failure(state)),
            retry=tenacity.retry_if_exception(
                lambda exc: (
                    isinstance(exc, RequestError) and self._retryable(exc, requests, _can(retry_if))
                )
            ),
            before_sleep=lambda state: self._before_sleep(path, requests, state, attempts),
            sleep=anyio.sleep,
            reraise=True,
        )
        result: T = await retrying(attempt)
        return result

    async def _attempt(
        self,
        requests: Sequence[Request],
        call: Callable[[], Awaitable[T]],
        retry_if: Callable[[], bool] | None,
        attempts: int,
    ) -> T:
        """One attempt: a failure that says the server is down (and worth waiting for,
        or another replica is up) becomes :class:`_Unavailable`, a 404 naming a model
        says which the server has; other failures are raised as they are."""
        for request in requests:
            request.attempts += 1
        try:
            return await call()
        except NotFoundError as error:
            told = await self._unknown_model(error, requests[0].spec.model)
            if told is error:
                raise
            raise told from error
        except RequestError as error:
            if (
                isinstance(error, ServiceUnavailableError)
                and is_backpressure(error)
                and _can(retry_if)
            ):
                # The server's queue is full. Hold this batch's seats for a backoff (so
                # less is sent meanwhile; the controller halves the limit while such
                # answers are many), then back to the client's queue, where priorities
                # still apply and its retries start afresh: not a failure, not an outage.
                for request in requests:
                    request.retried = True  # it will be sent again
                await anyio.sleep(self._retries.backoff(1, error))
                raise _Unavailable from error
            if (
                is_unavailable(error)
                and _can(retry_if)
                and (
                    self.server.on_unavailable(
                        self._now(), error, patient=self._patient is not None and self._patient()
                    )
                    or self._may_fail_over(requests, attempts)
                )
            ):
                raise _Unavailable from error
            raise

    def _wait(self, requests: Sequence[Request], attempt: int, error: RequestError) -> float:
        """Before retry ``attempt + 1``: the backoff, or longer if the server cools
        down after a 429 (until it ends, spread a little past it) or the rate limits
        ask (the resend is charged to them now)."""
        delay = self._retries.backoff(attempt, error)
        left = self.server.cooldown_until - self._now()
        if left > 0:
            delay = max(delay, self._retries.after_cooldown(left))
        rate = self._rate()
        if rate is not None:
            tokens = sum(r.est_tokens for r in requests)
            delay = max(delay, rate.reserve(self._now(), tokens))
        return delay

    def _before_sleep(
        self, path: str, requests: Sequence[Request], state: Any, attempts: int
    ) -> None:
        self._stats.retries += 1
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        error = _failure(state)
        self._log_retry(requests, state.attempt_number, attempts, sleep, error)
        if self._observers.on:
            url = self.server.base_url + path + requests[0].spec.query
            batch = _observed(path, url, requests, attempt=state.attempt_number)
            self._observers.batch_retrying(batch, error, sleep)

    async def _unknown_model(self, error: NotFoundError, model: str) -> NotFoundError:
        """A 404 that names no route (an OpenAI error object: vLLM's "The model `x`
        does not exist") says which models the server has, read again from
        ``/v1/models`` since adapters may have been loaded or unloaded since opening."""
        if not (isinstance(error.body, Mapping) and isinstance(error.body.get("error"), Mapping)):
            return error  # a route the server lacks
        server = self.server
        now = self._now()
        if self._models_read is None or now - self._models_read[0] > MODELS_REREAD_INTERVAL:
            try:
                with anyio.fail_after(MODELS_REREAD_TIMEOUT):
                    models, _, _ = await read_models(
                        server.transport, server.base_url, server.headers, None
                    )
            except Exception:  # the 404 is the answer; the list would only have helped
                return error
            self._models_read = (now, [str(m["id"]) for m in models])
        names = self._models_read[1]
        if model in names:
            said = f"its /v1/models lists {model!r} now (loaded since the request was sent?)"
        else:
            listed = ", ".join(repr(name) for name in names) or "no models"
            said = f"{server.base_url} serves {listed}"
        return NotFoundError(
            f"{error.message} ({said})",
            status_code=error.status_code,
            body=error.body,
            retry_after=error.retry_after,
        )

    def _may_fail_over(self, requests: Sequence[Request], attempts: int) -> bool:
        """Send the batch to another replica rather than retry this one: one is up,
        and the requests have not yet used their attempts (so a batch cannot bounce
        between failing replicas forever)."""
        fail_over = self._fail_over
        return (
            fail_over is not None and all(r.attempts < attempts for r in requests) and fail_over()
        )

    def _log_retry(
        self,
        requests: Sequence[Request],
        attempt: int,
        attempts: int,
        delay: float,
        error: RequestError,
    ) -> None:
        """One WARNING per retried batch (its first retry), at most one per interval
        with a count of those held back; every retry at DEBUG."""
        held = self._retry_log.allow() if attempt == 1 else None
        if held is None:
            logger.debug(
                "retrying %d request(s) in %.3fs (attempt %d of %d failed: %s)",
                len(requests),
                delay,
                attempt,
                attempts,
                error,
            )
            return
        logger.warning(
            "%s: a batch of %d failed (%s); retrying, %d attempt(s) left%s",
            self.server.base_url,
            len(requests),
            error,
            attempts - attempt,
            f" ({held} more retried batch(es) since the last warning)" if held else "",
        )

    def _retryable(self, exc: RequestError, requests: Sequence[Request], can_retry: bool) -> bool:
        """Worth another attempt: the rules say so, the exchange may still be retried
        (a stream: not once it sent text), and someone still waits for an answer."""
        if not can_retry or all(r.abandoned for r in requests):
            return False
        return self._retries.retryable(exc)

    # -- outcomes --------------------------------------------------------------------

    def _deliver(
        self,
        requests: Sequence[Request],
        answers: Answers,
        *,
        first_token_at: float | None = None,
    ) -> None:
        now = self._now()
        size = len(requests)
        first = requests[0]
        usage = answers.usage
        sent_at = first.dispatched_at if first.dispatched_at is not None else now
        kind = _ANSWER_TYPES[first.spec.kind]
        delivery = Delivery(
            answers.id,
            answers.model,
            answers.created,
            batch_size=size,
            dispatched_at=sent_at,
            finished_at=now,
            estimated=size > 1,
            total_tokens=usage[2] if size == 1 else None,
            system_fingerprint=answers.system_fingerprint,
            bare=BareChoices.of(kind, answers.choices[0][0]),
        )
        of_first = size > 1 and self.server.dialect.usage_of_first
        prompt_parts, completion_parts = split_usage(
            usage, requests, answers.choices, of_first=of_first
        )
        prompt_total, total = usage[0], usage[2]
        if of_first:  # the server counted the first request alone: the estimates' sums
            prompt_total = sum(prompt_parts)
            total = prompt_total + sum(completion_parts) if total else 0
        rate = self._rate()
        if rate is not None and total:
            budgeted = sum(r.spec.n * r.spec.max_tokens for r in requests)
            rate.correct(sum(r.est_tokens for r in requests), total, prompt_total + budgeted)
        if prompt_total and first.spec.n == 1:
            # The server's count against the estimate: batches are sized by it.
            self.server.on_prompt_usage(sum(r.prefill_tokens for r in requests), prompt_total)
        if total:
            for request, prompt, completion in zip(
                requests, prompt_parts, completion_parts, strict=True
            ):
                tenant = request.quota
                if tenant is not None and tenant.rate is not None:
                    # Its tenant's token rate was charged the estimate: it gets the
                    # difference back, as the client's own rate limit does.
                    tenant.rate.correct(request.est_tokens, prompt + completion)
        values = [
            make_answer(
                kind, delivery, request.created_at, prompt, completion, request.attempts, choices
            )
            for request, choices, prompt, completion in zip(
                requests, answers.choices, prompt_parts, completion_parts, strict=True
            )
        ]
        cached = None
        if answers.cached:
            if size == 1:
                cached = [answers.cached]
            elif of_first:  # the first request's, and nothing said of the others'
                cached = [min(answers.cached, prompt_parts[0])] + [0] * (size - 1)
            else:
                cached = split_cached(answers.cached, prompt_parts, usage[0])
        self._outcomes.answered(requests, values, now, prompt_parts, completion_parts, cached)
        self.server.answered_sequences += size * first.spec.n
        self.server.on_timing(
            first.priority, now - sent_at, max(completion_parts), now, first_token_at
        )

    @staticmethod
    def _requeue(requests: Sequence[Request]) -> None:
        """Hand requests back for the queue: their server is down and worth waiting
        for. (They share their batch's flight, which ``send`` returns them in.)"""
        flight = requests[0].flight
        assert flight is not None
        flight.handed_back.extend(requests)

    def _fail_all(self, requests: Sequence[Request], error: RequestError) -> None:
        settle = self._outcomes.failed
        for request in requests:
            settle(request, error.for_request(request.id, request.attempts))


def _can(retry_if: Callable[[], bool] | None) -> bool:
    """Whether the exchange may still be retried (a stream: not once it sent text)."""
    return retry_if is None or retry_if()


def _failure(state: Any) -> RequestError:
    """The error a tenacity attempt ended with."""
    error = state.outcome.exception()
    assert isinstance(error, RequestError)
    return error


def _suspect_parts(requests: list[Request], tokens: int) -> list[list[Request]] | None:
    """Split a batch refused for a too-long prompt: prompts that could have the token
    count the server names go alone, the rest together. None if nothing can be ruled
    out."""
    suspects = [r for r in requests if _size(r) + TOKEN_OVERHEAD >= tokens]
    if not suspects or len(suspects) == len(requests):
        return None
    rest = [r for r in requests if _size(r) + TOKEN_OVERHEAD < tokens]
    return [rest, *([s] for s in suspects)]


def _size(request: Request) -> int:
    return input_bytes(request.prompt, request.messages)


def _observed(
    path: str, url: str, requests: Sequence[Request], *, attempt: int | None = None
) -> ObservedBatch:
    """An HTTP request as observers see it (made only when some are added)."""
    return ObservedBatch(
        path=path,
        url=url,
        requests=tuple(requests),
        priority=requests[0].priority,
        attempt=requests[0].attempts if attempt is None else attempt,
    )
