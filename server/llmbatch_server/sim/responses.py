"""Response bodies in vLLM's OpenAI format, and the raw ASGI responses the
simulator needs: server-sent events that stop the engine when the client leaves,
and bodies cut off mid-way (fault injection)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from llmbatch_server.sim.engine import Sequence


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """vLLM's ``usage`` object; ``cached_tokens`` is None unless the server was
    asked for prompt token details (``--enable-prompt-tokens-details``)."""
    details = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
    }


def completion_body(
    request_id: str,
    model: str,
    sequences: Iterable[Sequence],
    prompt_tokens: int,
    *,
    chat: bool,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """The non-streaming answer, choices ordered by index."""
    choices = []
    completion_tokens = 0
    for seq in sorted(sequences, key=lambda s: s.index):
        completion_tokens += seq.generated
        choice: dict[str, Any] = {"index": seq.index}
        if chat:
            choice["message"] = {"role": "assistant", "content": seq.text(), "tool_calls": []}
        else:
            choice["text"] = seq.text()
        choice.update(logprobs=None, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason)
        choices.append(choice)
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }


def chunk(
    request_id: str, model: str, seq: Sequence, piece: str, *, chat: bool, first: bool
) -> dict[str, Any]:
    """One streamed choice update (vLLM sends one choice per chunk)."""
    finish = seq.finish_reason if seq.finished else None
    choice: dict[str, Any] = {"index": seq.index}
    if chat:
        delta: dict[str, Any] = {"content": piece}
        if first:
            delta["role"] = "assistant"
        choice["delta"] = delta
    else:
        choice["text"] = piece
    choice.update(
        logprobs=None, finish_reason=finish, stop_reason=seq.stop_reason if finish else None
    )
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def sse(obj: object) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class CutResponse(Response):
    """Sends headers and part of ``body``, then closes the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send(
            {
                "type": "http.response.body",
                "body": self.body[: len(self.body) // 2],
                "more_body": True,
            }
        )
        # Returning with the body incomplete makes the server drop the connection.


class EventStream(Response):
    """A ``text/event-stream`` fed by a queue of byte chunks (``None`` ends it).

    When the client disconnects, ``on_disconnect`` runs so the engine stops
    generating for it, as vLLM aborts a request whose client went away.
    ``cut`` ends the response abruptly instead (fault injection).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        queue: asyncio.Queue[bytes | None],
        on_disconnect: Callable[[], None],
        *,
        cut: bool = False,
    ) -> None:
        super().__init__(media_type=self.media_type)
        # No content-length: the body is streamed (chunked transfer encoding).
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        self._queue = queue
        self._on_disconnect = on_disconnect
        self._cut = cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        finished = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            sent = 0
            while True:
                getter = asyncio.ensure_future(self._queue.get())
                await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    return  # client gone
                data = getter.result()
                if data is None:
                    break
                await send({"type": "http.response.body", "body": data, "more_body": True})
                sent += 1
                if self._cut and sent >= 2:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            finished = True
        finally:
            watcher.cancel()
            if not finished:
                self._on_disconnect()


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def wait_or_disconnect(done: asyncio.Future[None], receive: Receive) -> bool:
    """Wait for ``done``; False if the client disconnected first."""
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({done, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    return done.done()
