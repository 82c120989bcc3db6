"""Sends batches, retries what is worth retrying, bisects 400s, and hands each caller
its own answer or its own error.

Fault isolation lives here: a batch's failure is resolved per request. A 400 on a
list of prompts or conversations (vLLM fails the whole list for one bad item and
does not say which) is split in halves until the offending items fail alone and
every other one is answered.

Retries are a plain loop rather than a retry library: the first attempt must cost
nothing extra (setting up tenacity took ~33 µs per call, a fifth of the
single-request latency budget), and each resend is charged to the rate limits.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from llmbatch._clock import Clock
from llmbatch._config import RetryPolicy
from llmbatch._exceptions import (
    APIStatusError,
    BadRequestError,
    ConnectError,
    NotFoundError,
    RateLimitError,
    RequestError,
    ServerError,
    TimeoutException,
    TransportError,
)
from llmbatch._models import ChatCompletion, Completion, Delivery, make_answer
from llmbatch._request import Flight, Request
from llmbatch._scheduler import Batch
from llmbatch._stats import StatsRecorder
from llmbatch._transports.base import HTTPRequest, HTTPResponse, Transport
from llmbatch._wire import (
    Answers,
    StreamDecoder,
    chat_batch_body,
    chat_body,
    completion_body,
    error_from_response,
    parse_chat,
    parse_chat_batch,
    parse_completions,
    split_usage,
)

__all__ = ["Dispatcher"]

logger = logging.getLogger("llmbatch")

T = TypeVar("T")

#: Parameters the chat batch route does not take (vLLM: no tools, no streaming, n=1).
_CHAT_BATCH_UNSUPPORTED = frozenset({"tools", "tool_choice", "functions", "function_call"})


class Dispatcher:
    """Turns batches into HTTP exchanges and resolves every request's outcome."""

    def __init__(
        self,
        *,
        transport: Transport,
        base_url: str,
        headers: Mapping[str, str],
        retry: RetryPolicy,
        stats: StatsRecorder,
        reserve_resend: Callable[[float, int], float] | None = None,
        priority_scheduling: bool = False,
        clock: Clock = time.monotonic,
    ) -> None:
        self._now = clock
        self._transport = transport
        self._base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self._retry = retry
        self._stats = stats
        self._reserve_resend = reserve_resend
        self._priority_scheduling = priority_scheduling
        self.chat_batch: bool | None = None
        """Whether the server has /chat/completions/batch: None until the first try."""

    async def send(self, batch: Batch) -> None:
        """Answer every request of ``batch``; never raises for a request's failure."""
        requests = batch.requests
        flight = Flight(requests)
        for request in requests:
            request.flight = flight
        try:
            with flight.scope:
                spec = requests[0].spec
                if spec.stream:
                    await self._stream(requests[0])
                elif spec.kind == "completion":
                    await self._complete(list(requests))
                else:
                    await self._chat(list(requests))
        finally:
            # Request -> flight -> requests is a cycle: break it so that answered
            # requests are freed at once, not by the garbage collector.
            for request in requests:
                request.flight = None

    # -- completions -------------------------------------------------------------------

    async def _complete(self, requests: list[Request]) -> None:
        live = [r for r in requests if not r.abandoned]
        if not live:
            return
        body = completion_body(live, self._rank(live))
        try:
            content = await self._with_retries(live, lambda: self._post("/completions", live, body))
            answers = parse_completions(content, live)
        except BadRequestError as exc:
            await self._bisect(live, exc, self._complete)
            return
        except RequestError as exc:
            self._fail_all(live, exc)
            return
        self._deliver(live, answers)

    async def _bisect(
        self,
        requests: list[Request],
        error: BadRequestError,
        again: Callable[[list[Request]], Coroutine[Any, Any, None]],
    ) -> None:
        """Split a batch the server refused whole until the bad items fail alone."""
        if len(requests) == 1:
            self._fail_all(requests, error)
            return
        # vLLM fails the whole list for one bad item without naming it.
        logger.info("400 on a batch of %d, bisecting: %s", len(requests), error.message)
        self._stats.bisections += 1
        middle = len(requests) // 2
        if self._reserve_resend is not None:
            # Two new HTTP requests: they count against the rate limits.
            now = self._now()
            delay = max(
                self._reserve_resend(now, sum(r.est_tokens for r in half))
                for half in (requests[:middle], requests[middle:])
            )
            await anyio.sleep(delay)
        async with anyio.create_task_group() as tg:
            tg.start_soon(again, requests[:middle])
            tg.start_soon(again, requests[middle:])

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
            await self._chat_batch(live)
            return
        async with anyio.create_task_group() as tg:
            for request in live:
                tg.start_soon(self._chat_one, request)

    async def _chat_batch(self, requests: list[Request]) -> None:
        """Several conversations in one /chat/completions/batch request (vLLM 0.32+)."""
        body = chat_batch_body(requests, self._rank(requests))
        try:
            content = await self._with_retries(
                requests, lambda: self._post("/chat/completions/batch", requests, body)
            )
            answers = parse_chat_batch(content, requests)
        except NotFoundError as exc:
            # A server without the route answers 404 without an OpenAI error object;
            # either way the single-conversation route gives each request its answer.
            if not (isinstance(exc.body, Mapping) and isinstance(exc.body.get("error"), Mapping)):
                if self.chat_batch is None:
                    logger.info("the server has no /chat/completions/batch; sending one by one")
                self.chat_batch = False
            async with anyio.create_task_group() as tg:
                for request in requests:
                    tg.start_soon(self._chat_one, request)
            return
        except BadRequestError as exc:
            await self._bisect(requests, exc, self._chat)
            return
        except RequestError as exc:
            self._fail_all(requests, exc)
            return
        self.chat_batch = True
        self._deliver(requests, answers)

    async def _chat_one(self, request: Request) -> None:
        if request.abandoned:
            return
        body = chat_body(request, self._rank([request]))
        try:
            content = await self._with_retries(
                [request], lambda: self._post("/chat/completions", [request], body)
            )
            answers = parse_chat(content)
        except RequestError as exc:
            self._fail_all([request], exc)
            return
        self._deliver([request], answers)

    # -- streaming -------------------------------------------------------------------

    async def _stream(self, request: Request) -> None:
        """Stream one request's text deltas; retried only before the first delta."""
        chat = request.spec.kind == "chat"
        path = "/chat/completions" if chat else "/completions"
        rank = self._rank([request])
        body = chat_body(request, rank) if chat else completion_body([request], rank)
        decoder = StreamDecoder()
        deltas = request.deltas

        async def exchange() -> None:
            response = await self._open(path, [request], body)
            try:
                if response.status >= 400:
                    raise error_from_response(
                        response.status, response.headers, await response.read()
                    )
                async for line in response.iter_lines():
                    for text in decoder.feed_line(line):
                        if deltas is not None:
                            await deltas.send(text)
            finally:
                await response.aclose()

        try:
            await self._with_retries([request], exchange, retry_if=lambda: not decoder.parts)
        except RequestError as exc:
            self._fail_all([request], exc)
            return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the caller stopped reading; it has already been told
        finally:
            if deltas is not None:
                deltas.close()
        answers = Answers(
            decoder.id,
            decoder.model,
            decoder.created,
            [(decoder.choice(chat=chat),)],
            decoder.usage,
        )
        self._deliver([request], answers)

    # -- HTTP and retries ------------------------------------------------------------

    def _rank(self, requests: Sequence[Request]) -> int | None:
        return requests[0].priority.rank if self._priority_scheduling else None

    async def _open(self, path: str, requests: Sequence[Request], body: bytes) -> HTTPResponse:
        self._stats.batch_sent(len(requests))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "POST %s: %d prompt(s), tier %s, attempt %d",
                path,
                len(requests),
                requests[0].priority.value,
                requests[0].attempts,
            )
        return await self._transport.send(
            HTTPRequest("POST", self._base_url + path, self._headers, body)
        )

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
        requests: Sequence[Request],
        call: Callable[[], Awaitable[T]],
        retry_if: Callable[[], bool] | None = None,
    ) -> T:
        """``call()``, retried with backoff on 429, 5xx and network errors."""
        attempts = self._retry.attempts
        attempt = 1
        while True:
            retried = attempt > 1
            for request in requests:
                request.attempts += 1
                if retried:
                    request.retried = True
            try:
                return await call()
            except RequestError as error:
                if attempt >= attempts or not self._retryable(error, requests, retry_if):
                    raise
                delay = self._backoff(attempt, error)
                exc = error
            if self._reserve_resend is not None:
                tokens = sum(r.est_tokens for r in requests)
                delay = max(delay, self._reserve_resend(self._now(), tokens))
            logger.debug(
                "retrying in %.3fs (%d request(s), attempt %d of %d failed: %s)",
                delay,
                len(requests),
                attempt,
                attempts,
                exc,
            )
            await anyio.sleep(delay)
            attempt += 1

    def _retryable(
        self, exc: RequestError, requests: Sequence[Request], retry_if: Callable[[], bool] | None
    ) -> bool:
        if all(r.abandoned for r in requests) or (retry_if is not None and not retry_if()):
            return False
        if isinstance(exc, TimeoutException) and not isinstance(exc, ConnectError):
            # The server may be working on it: RetryPolicy.retry_on_timeout decides.
            # (A connect timeout reached no server, like any connection failure.)
            return self._retry.retry_on_timeout
        return isinstance(exc, RateLimitError | ServerError | TransportError)

    def _backoff(self, attempt: int, error: RequestError) -> float:
        """Full jitter, or the server's Retry-After if that asks for longer."""
        policy = self._retry
        ceiling = min(policy.max_backoff, policy.initial_backoff * 2 ** (attempt - 1))
        delay = random.uniform(0, ceiling)
        if isinstance(error, APIStatusError) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, policy.max_backoff))
        return delay

    # -- outcomes --------------------------------------------------------------------

    def _deliver(self, requests: Sequence[Request], answers: Answers) -> None:
        now = self._now()
        size = len(requests)
        first = requests[0]
        usage = answers.usage
        delivery = Delivery(
            answers.id,
            answers.model,
            answers.created,
            batch_size=size,
            attempts=first.attempts,  # the requests of one exchange share their attempts
            dispatched_at=first.dispatched_at if first.dispatched_at is not None else now,
            finished_at=now,
            estimated=size > 1,
            total_tokens=usage[2] if size == 1 else None,
        )
        kind = Completion if first.spec.kind == "completion" else ChatCompletion
        prompt_parts, completion_parts = split_usage(usage, requests, answers.choices)
        settle = self._stats.settle_value
        for request, choices, prompt, completion in zip(
            requests, answers.choices, prompt_parts, completion_parts, strict=True
        ):
            created = request.created_at
            value = make_answer(kind, delivery, created, prompt, completion, choices)
            settle(request, value, now - created, prompt, completion)

    def _fail_all(self, requests: Sequence[Request], error: RequestError) -> None:
        settle = self._stats.settle_error
        for request in requests:
            settle(request, error.for_request(request.id, request.attempts))
