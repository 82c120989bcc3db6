"""``map``/``map_unordered``/``imap``: many inputs through the client with bounded memory.

Inputs are pulled lazily, at most ``window`` ahead of the results the caller has
taken, so a generator of millions of prompts runs in constant memory. Each item
ends in its own :class:`Result`; one item's failure never touches another. In
ordered mode (``imap``) a result counts as taken only once it has been yielded in
input order, so finished results waiting behind a slow one hold window slots and
the feeder stalls when ``window`` items are ahead.

Items are submitted straight to the engine with a completion callback rather than
a task each: per-item client CPU is what bounds bulk throughput on a small machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from llmbatch._config import Priority
from llmbatch._engine import Engine
from llmbatch._exceptions import InvalidRequestError, LLMBatchError
from llmbatch._models import Result, trusted
from llmbatch._progress import ProgressTracker
from llmbatch._request import Kind, Outcome, Request, RequestSpec

__all__ = ["MapInput", "MapRunner"]

MapInput = str | list[Mapping[str, Any]] | Mapping[str, Any]
"""A prompt, a chat conversation, or a dict with ``prompt``/``messages``, per-item
options (``max_tokens``, sampling parameters, ``priority``, ``timeout``) and
``metadata``."""

_Item = tuple[int, Result[Any]]
_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class _BuildSpec(Protocol):
    def __call__(
        self,
        kind: Kind,
        payload: object,
        priority: object,
        max_tokens: object,
        timeout: object,
        params: Mapping[str, Any],
    ) -> RequestSpec: ...


def _parse_input(
    item: object, params: Mapping[str, Any]
) -> tuple[Kind, object, dict[str, Any], object]:
    """(kind, prompt or messages, merged options, metadata) for one map input."""
    if isinstance(item, str):
        return "completion", item, dict(params), None
    if isinstance(item, list):
        return "chat", item, dict(params), None
    if isinstance(item, Mapping):
        options = {**params, **item}
        metadata = options.pop("metadata", None)
        if "prompt" in options and "messages" not in options:
            return "completion", options.pop("prompt"), options, metadata
        if "messages" in options and "prompt" not in options:
            return "chat", options.pop("messages"), options, metadata
        raise InvalidRequestError(
            "a map item dict needs exactly one of 'prompt' or 'messages'", field="inputs"
        )
    raise InvalidRequestError(
        f"a map item must be a str, a list of messages or a dict, got {type(item).__name__}",
        field="inputs",
    )


async def _items(inputs: Iterable[object] | AsyncIterable[object]) -> AsyncIterator[object]:
    if isinstance(inputs, AsyncIterable):
        async for item in inputs:
            yield item
    else:
        for item in inputs:
            yield item


class _Run:
    """One map call's shared state: the result stream and the requests not yet done."""

    def __init__(
        self, send: MemoryObjectSendStream[_Item], tracker: ProgressTracker | None
    ) -> None:
        self.send = send
        self.tracker = tracker
        self.outstanding: set[Request] = set()
        self.feeding = True
        self.drained = anyio.Event()

    def emit(self, index: int, result: Result[Any]) -> None:
        # Never blocks: a window slot is held for every result not yet taken, and the
        # stream buffer is the window's size.
        if self.tracker is not None:
            self.tracker.finished(result)
        with contextlib.suppress(*_CLOSED, anyio.WouldBlock):
            self.send.send_nowait((index, result))

    def finished(self, request: Request, index: int, metadata: object, outcome: Outcome) -> None:
        self.outstanding.discard(request)
        self.emit(
            index,
            trusted(
                Result, index=index, value=outcome.value, error=outcome.error, metadata=metadata
            ),
        )
        if not self.feeding and not self.outstanding:
            self.drained.set()


class MapRunner:
    """Feeds inputs into the engine from the client's task group; the caller only
    reads results."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        build: _BuildSpec,
        new_request: Callable[[RequestSpec], Request],
        submit: Callable[[RequestSpec], Awaitable[Any]],
    ) -> None:
        self._engine = engine
        self._build = build
        self._new_request = new_request
        self._submit = submit

    async def run(
        self,
        tg: TaskGroup,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        window: int,
        params: Mapping[str, Any],
        *,
        ordered: bool = False,
        tracker: ProgressTracker | None = None,
    ) -> AsyncGenerator[_Item, None]:
        """Yield ``(index, result)`` as items finish, or in input order if ``ordered``."""
        if isinstance(inputs, (str, bytes, Mapping)):
            raise InvalidRequestError(
                "map() takes an iterable of inputs, not a single str or dict", field="inputs"
            )
        if not isinstance(inputs, (Iterable, AsyncIterable)):
            raise InvalidRequestError(
                f"map() takes an iterable of inputs, got {type(inputs).__name__}",
                field="inputs",
            )
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise InvalidRequestError("window must be a positive int", field="window")
        send, receive = anyio.create_memory_object_stream[_Item](window)
        slots = anyio.Semaphore(window)
        # The feeder lives in the client's task group, not in this generator, so no
        # task group ever spans a yield; leaving the loop early cancels the feeder.
        scope = anyio.CancelScope()
        failure: list[BaseException] = []
        run = _Run(send, tracker)
        tg.start_soon(self._feed, scope, inputs, priority, slots, params, run, failure)
        # Ordered mode: finished items waiting for an earlier one, by index.
        pending: dict[int, Result[Any]] = {}
        expected = 0
        try:
            if tracker is not None:
                tracker.start()
            with receive:
                async for index, result in receive:
                    if tracker is not None:
                        tracker.maybe_emit()
                    if not ordered:
                        slots.release()
                        yield index, result
                        continue
                    # A slot frees only when its item is yielded, so items submitted
                    # plus items buffered here never exceed the window.
                    pending[index] = result
                    while expected in pending:
                        slots.release()
                        yield expected, pending.pop(expected)
                        expected += 1
        finally:
            scope.cancel()
            if tracker is not None:
                tracker.close()
        if failure:
            raise failure[0]

    async def _feed(
        self,
        scope: anyio.CancelScope,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        slots: anyio.Semaphore,
        params: Mapping[str, Any],
        run: _Run,
        failure: list[BaseException],
    ) -> None:
        engine = self._engine()
        with scope, run.send:
            try:
                async with anyio.create_task_group() as timed:
                    iterator = _items(inputs).__aiter__()
                    index = 0
                    while True:
                        try:
                            # No checkpoint per item: a window of items is queued in
                            # one tick and the scheduler sees them together.
                            slots.acquire_nowait()
                        except anyio.WouldBlock:
                            await slots.acquire()
                        try:
                            item = await iterator.__anext__()
                        except StopAsyncIteration:
                            break
                        except Exception as exc:  # the caller's iterable failed: report it
                            failure.append(exc)
                            break
                        if run.tracker is not None:
                            run.tracker.submitted()
                        await self._start(engine, timed, run, index, item, priority, params)
                        index += 1
                run.feeding = False
                if run.outstanding:
                    await run.drained.wait()
            finally:
                for request in list(run.outstanding):
                    engine.abandon(request)

    async def _start(
        self,
        engine: Engine,
        timed: TaskGroup,
        run: _Run,
        index: int,
        item: object,
        priority: Priority,
        params: Mapping[str, Any],
    ) -> None:
        metadata: object = None
        try:
            kind, payload, options, metadata = _parse_input(item, params)
            spec = self._build(
                kind,
                payload,
                options.pop("priority", priority),
                options.pop("max_tokens", None),
                options.pop("timeout", None),
                options,
            )
        except LLMBatchError as exc:
            run.emit(index, trusted(Result, index=index, value=None, error=exc, metadata=metadata))
            return
        if spec.timeout is not None:
            # A per-item deadline needs a timer: the full per-call path provides it.
            timed.start_soon(self._timed, run, index, spec, metadata)
            return
        request = self._new_request(spec)
        run.outstanding.add(request)
        request.outcome.on_done(lambda outcome: run.finished(request, index, metadata, outcome))
        await engine.submit(request, nowait=False)

    async def _timed(self, run: _Run, index: int, spec: RequestSpec, metadata: object) -> None:
        try:
            value = await self._submit(spec)
            result = trusted(Result, index=index, value=value, error=None, metadata=metadata)
        except LLMBatchError as exc:
            result = trusted(Result, index=index, value=None, error=exc, metadata=metadata)
        run.emit(index, result)
