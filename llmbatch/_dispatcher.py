"""Sends batches, retries what is worth retrying, bisects 400s, and hands each caller
its own answer or its own error.

Fault isolation lives here: a batch's failure is resolved per request. A 400 on a
list prompt (vLLM fails the whole list for one bad prompt and does not say which) is
split in halves until the offending prompts fail alone and every other prompt is
answered.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from llmbatch._clock import Clock
from llmbatch._config import RetryPolicy
from llmbatch._exceptions import (
    APIStatusError,
    BadRequestError,
    RateLimitError,
    ReadTimeout,
    RequestError,
    ServerError,
    TransportError,
    status_error_type,
)
from llmbatch._models import (
    ChatCompletion,
    ChatMessage,
    Choice,
    Completion,
    Timings,
    Usage,
    trusted,
)
from llmbatch._ratelimit import RateLimiter
from llmbatch._request import Flight, Request
from llmbatch._scheduler import Batch
from llmbatch._stats import StatsRecorder
from llmbatch._transports.base import HTTPRequest, Transport
from llmbatch._wire import (
    Answer,
    chat_body,
    completion_body,
    error_from_response,
    error_message,
    parse_chat,
    parse_completions,
    parse_sse_line,
    split_usage,
)

__all__ = ["Dispatcher"]

logger = logging.getLogger("llmbatch")

T = TypeVar("T")


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
        rate_limiter: RateLimiter | None = None,
        priority_scheduling: bool = False,
        clock: Clock = time.monotonic,
    ) -> None:
        self._now = clock
        self._transport = transport
        self._base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self._retry = retry
        self._stats = stats
        self._rate_limiter = rate_limiter
        self._priority_scheduling = priority_scheduling

    async def send(self, batch: Batch) -> None:
        """Answer every request of ``batch``; never raises for a request's failure."""
        flight = Flight(batch.requests)
        for request in batch.requests:
            request.flight = flight
        with flight.scope:
            first = batch.requests[0].spec
            if first.stream:
                await self._stream(batch.requests[0])
            elif first.kind == "completion":
                await self._complete(list(batch.requests))
            else:
                async with anyio.create_task_group() as tg:
                    for request in batch.requests:
                        tg.start_soon(self._chat, request)

    # -- completions -------------------------------------------------------------------

    async def _complete(self, requests: list[Request]) -> None:
        live = [r for r in requests if not r.abandoned]
        if not live:
            return
        try:
            content = await self._with_retries(
                live,
                lambda: self._post("/completions", live, completion_body(live, self._rank(live))),
            )
            answers, usage = parse_completions(content, live)
        except BadRequestError as exc:
            if len(live) == 1:
                self._fail(live[0], exc)
                return
            # vLLM fails the whole list for one bad prompt without naming it.
            logger.info("400 on a batch of %d, bisecting: %s", len(live), exc.message)
            self._stats.bisections += 1
            middle = len(live) // 2
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._complete, live[:middle])
                tg.start_soon(self._complete, live[middle:])
            return
        except RequestError as exc:
            for request in live:
                self._fail(request, exc)
            return
        for request, answer, share in zip(
            live, answers, split_usage(usage, live, answers), strict=True
        ):
            self._deliver(request, answer, share, len(live))

    # -- chat ------------------------------------------------------------------------

    async def _chat(self, request: Request) -> None:
        if request.abandoned:
            return
        try:
            content = await self._with_retries(
                [request],
                lambda: self._post(
                    "/chat/completions", [request], chat_body(request, self._rank([request]))
                ),
            )
            answer, usage = parse_chat(content)
        except RequestError as exc:
            self._fail(request, exc)
            return
        self._deliver(request, answer, usage, 1)

    # -- streaming -------------------------------------------------------------------

    async def _stream(self, request: Request) -> None:
        """Stream one request's text deltas; retried only before the first delta."""
        parts: list[str] = []
        state: dict[str, Any] = {"finish": None, "usage": Usage(), "id": "", "model": ""}
        is_chat = request.spec.kind == "chat"
        path = "/chat/completions" if is_chat else "/completions"
        rank = self._rank([request])
        body = chat_body(request, rank) if is_chat else completion_body([request], rank)

        async def exchange() -> None:
            response = await self._open(path, [request], body)
            try:
                if response.status >= 400:
                    raise error_from_response(
                        response.status, response.headers, await response.read()
                    )
                async for line in response.iter_lines():
                    data = parse_sse_line(line)
                    if data is None:
                        continue
                    await self._stream_event(request, data, parts, state)
            finally:
                await response.aclose()

        try:
            await self._with_retries([request], exchange, retry_if=lambda: not parts)
        except RequestError as exc:
            self._fail(request, exc)
            return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the caller stopped reading; it has already been told
        finally:
            if request.deltas is not None:
                request.deltas.close()
        answer = Answer(
            state["id"],
            state["model"],
            (Choice(text="".join(parts), finish_reason=state["finish"]),),
        )
        self._deliver(request, answer, state["usage"], 1)

    async def _stream_event(
        self, request: Request, data: Any, parts: list[str], state: dict[str, Any]
    ) -> None:
        if not isinstance(data, Mapping):
            return
        if "error" in data:
            # vLLM reports failures after the 200 in the stream itself.
            error = data["error"]
            code = error.get("code") if isinstance(error, Mapping) else None
            status = code if isinstance(code, int) and code >= 400 else 500
            raise status_error_type(status)(
                error_message(data, "error in stream"), status_code=status, body=data
            )
        state["id"] = data.get("id", state["id"])
        state["model"] = data.get("model", state["model"])
        for choice in data.get("choices") or ():
            delta = choice.get("delta")
            text = (delta or {}).get("content") if delta is not None else choice.get("text")
            if text:
                parts.append(text)
                if request.deltas is not None:
                    await request.deltas.send(text)
            if choice.get("finish_reason"):
                state["finish"] = choice["finish_reason"]
        if data.get("usage"):
            raw = data["usage"]
            state["usage"] = Usage(
                prompt_tokens=int(raw.get("prompt_tokens") or 0),
                completion_tokens=int(raw.get("completion_tokens") or 0),
                total_tokens=int(raw.get("total_tokens") or 0),
            )

    # -- HTTP and retries ------------------------------------------------------------

    def _rank(self, requests: Sequence[Request]) -> int | None:
        return requests[0].priority.rank if self._priority_scheduling else None

    async def _open(self, path: str, requests: Sequence[Request], body: bytes) -> Any:
        if self._rate_limiter is not None:
            await self._rate_limiter.acquire(sum(r.est_tokens for r in requests))
        self._stats.batch_sent(len(requests))
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
        retry_if: Callable[[], bool] = lambda: True,
    ) -> T:
        def retryable(exc: BaseException) -> bool:
            if all(r.abandoned for r in requests) or not retry_if():
                return False
            if isinstance(exc, ReadTimeout):
                return self._retry.retry_on_timeout
            return isinstance(exc, RateLimitError | ServerError | TransportError)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._retry.attempts),
            wait=self._backoff,
            retry=retry_if_exception(retryable),
            sleep=anyio.sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                retry = attempt.retry_state.attempt_number > 1
                for request in requests:
                    request.attempts += 1
                    request.retried = request.retried or retry
                return await call()
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _backoff(self, state: RetryCallState) -> float:
        """Full jitter, or the server's Retry-After if that asks for longer."""
        policy = self._retry
        ceiling = min(policy.max_backoff, policy.initial_backoff * 2 ** (state.attempt_number - 1))
        delay = random.uniform(0, ceiling)
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, APIStatusError) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, policy.max_backoff))
        logger.debug("retrying in %.3fs after %r", delay, error)
        return delay

    # -- outcomes --------------------------------------------------------------------

    def _deliver(self, request: Request, answer: Answer, usage: Usage, batch_size: int) -> None:
        now = self._now()
        timings = trusted(
            Timings,
            queued=(request.dispatched_at or now) - request.created_at,
            latency=now - request.created_at,
            batch_size=batch_size,
            attempts=request.attempts,
        )
        value: Completion | ChatCompletion
        if request.spec.kind == "completion":
            value = trusted(
                Completion,
                id=answer.id,
                model=answer.model,
                choices=answer.choices,
                usage=usage,
                timings=timings,
            )
        else:
            value = trusted(
                ChatCompletion,
                id=answer.id,
                model=answer.model,
                message=trusted(ChatMessage, role=answer.role, content=answer.choices[0].text),
                finish_reason=answer.choices[0].finish_reason,
                usage=usage,
                timings=timings,
            )
        if request.outcome.set_value(value):
            self._stats.succeeded(
                request.priority,
                timings.latency,
                request.retried,
                usage.prompt_tokens,
                usage.completion_tokens,
            )

    def _fail(self, request: Request, error: RequestError) -> None:
        if request.outcome.set_error(error.for_request(request.id, request.attempts)):
            self._stats.failed(request.priority, request.retried)
