"""``map``/``map_unordered``: many inputs through the client with bounded memory.

Inputs are pulled lazily, at most ``window`` ahead of the results the caller has
taken, so a generator of millions of prompts runs in constant memory. Each item
ends in its own :class:`Result`; one item's failure never touches another.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from llmbatch._config import Priority
from llmbatch._exceptions import InvalidRequestError, LLMBatchError
from llmbatch._models import Result
from llmbatch._request import Kind, RequestSpec

__all__ = ["MapInput", "MapRunner"]

MapInput = str | list[Mapping[str, Any]] | Mapping[str, Any]
"""A prompt, a chat conversation, or a dict with ``prompt``/``messages``, per-item
options (``max_tokens``, sampling parameters, ``priority``, ``timeout``) and
``metadata``."""

_Item = tuple[int, Result[Any]]


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


class MapRunner:
    """Feeds inputs into the client from its task group; the caller only reads results."""

    def __init__(self, submit: Callable[[RequestSpec], Awaitable[Any]], build: _BuildSpec) -> None:
        self._submit = submit
        self._build = build

    async def run(
        self,
        tg: TaskGroup,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        window: int,
        params: Mapping[str, Any],
    ) -> AsyncIterator[_Item]:
        if isinstance(inputs, (str, bytes, Mapping)):
            raise InvalidRequestError(
                "map() takes an iterable of inputs, not a single str or dict", field="inputs"
            )
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise InvalidRequestError("window must be a positive int", field="window")
        send, receive = anyio.create_memory_object_stream[_Item](window)
        # The feeder lives in the client's task group, not in this generator, so no
        # task group ever spans a yield; leaving the loop early cancels the feeder.
        scope = anyio.CancelScope()
        failure: list[BaseException] = []
        tg.start_soon(self._feed, scope, inputs, priority, window, params, send, failure)
        try:
            with receive:
                async for item in receive:
                    yield item
        finally:
            scope.cancel()
        if failure:
            raise failure[0]

    async def _feed(
        self,
        scope: anyio.CancelScope,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        window: int,
        params: Mapping[str, Any],
        send: MemoryObjectSendStream[_Item],
        failure: list[BaseException],
    ) -> None:
        with scope, send:
            slots = anyio.Semaphore(window)
            async with anyio.create_task_group() as tg:
                iterator = _items(inputs).__aiter__()
                index = 0
                while True:
                    await slots.acquire()
                    try:
                        item = await iterator.__anext__()
                    except StopAsyncIteration:
                        break
                    except Exception as exc:  # the caller's iterable failed: report it
                        failure.append(exc)
                        break
                    tg.start_soon(self._one, index, item, priority, params, slots, send)
                    index += 1

    async def _one(
        self,
        index: int,
        item: object,
        priority: Priority,
        params: Mapping[str, Any],
        slots: anyio.Semaphore,
        send: MemoryObjectSendStream[_Item],
    ) -> None:
        metadata: object = None
        try:
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
                result: Result[Any] = Result(
                    index=index, value=await self._submit(spec), metadata=metadata
                )
            except LLMBatchError as exc:
                result = Result(index=index, error=exc, metadata=metadata)
            # The caller may have stopped reading; its result is then dropped.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await send.send((index, result))
        finally:
            slots.release()
