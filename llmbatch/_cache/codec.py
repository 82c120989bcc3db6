"""Answers as stored bytes and back: the server's choices as it sent them, the usage
and the response's identity, in compact JSON (readable with ``sqlite3`` and ``jq``).

A stored answer comes back as a new object each time (every caller owns its
result), marked ``from_cache``, with timings of its own: no queueing, no batch,
no attempt.
"""

from __future__ import annotations

import json
from typing import Any

from llmbatch._chunks import ChatCompletionChunk, CompletionChunk, make_chunk
from llmbatch._models import (
    ChatCompletion,
    Completion,
    Delivery,
    Embedding,
    make_answer,
)

__all__ = ["KINDS", "decode", "encode", "replay", "tokens_of"]

KINDS: dict[type[Any], str] = {
    Completion: "completion",
    ChatCompletion: "chat",
    Embedding: "embedding",
}
_CLASSES = {name: cls for cls, name in KINDS.items()}
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode(answer: Any) -> bytes | None:
    """``answer`` (a Completion, ChatCompletion or Embedding) as stored bytes; None
    for anything else, or an answer JSON cannot hold (not stored)."""
    kind = KINDS.get(type(answer))
    if kind is None:
        return None
    delivery: Delivery = answer._delivery
    record = {
        "kind": kind,
        "id": delivery.id,
        "model": delivery.model,
        "created": delivery.created,
        "fingerprint": delivery.system_fingerprint,
        "prompt_tokens": answer._prompt_tokens,
        "completion_tokens": answer._completion_tokens,
        "total_tokens": delivery.total_tokens,
        "estimated": delivery.estimated,
        "choices": answer._raw_choices(),
    }
    try:
        return _ENCODER.encode(record).encode()
    except (TypeError, ValueError):
        return None


def tokens_of(answer: Any) -> tuple[int, int]:
    """The prompt and completion tokens an answer was counted (what a hit saves)."""
    return answer._prompt_tokens, answer._completion_tokens


def decode(data: bytes, created_at: float, now: float) -> Any:
    """The answer ``data`` holds, asked for at ``created_at`` and read at ``now``;
    raises ``ValueError`` (or ``KeyError``, ``TypeError``) for bytes that are not a
    stored answer, which the caller treats as a miss."""
    record = json.loads(data)
    cls = _CLASSES[record["kind"]]
    choices = record["choices"]
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, dict) for c in choices)
    ):
        raise ValueError("a stored answer without choices")
    prompt, completion = int(record["prompt_tokens"]), int(record["completion_tokens"])
    total = record.get("total_tokens")
    delivery = Delivery(
        str(record["id"]),
        str(record["model"]),
        int(record["created"]),
        batch_size=0,
        dispatched_at=created_at,
        finished_at=now,
        estimated=bool(record["estimated"]),
        total_tokens=None if total is None else int(total),
        system_fingerprint=record.get("fingerprint"),
        from_cache=True,
    )
    return make_answer(cls, delivery, created_at, prompt, completion, 0, tuple(choices))


def replay(answer: Any, chunks: bool) -> list[Any]:
    """What a stream's caller reads of a stored ``answer``: its text as one delta, or
    (``chunks``) one chunk carrying every choice whole, then its usage."""
    if not chunks:
        text = answer.text
        return [text] if text else []
    chat = isinstance(answer, ChatCompletion)
    delivery: Delivery = answer._delivery
    head = {"id": delivery.id, "created": delivery.created, "model": delivery.model}
    choices = []
    for index, raw in enumerate(answer._raw_choices()):
        choice: dict[str, Any] = {"index": index, "finish_reason": raw.get("finish_reason")}
        if chat:
            delta = dict(raw.get("message") or {})
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                delta["tool_calls"] = [
                    {**call, "index": i} for i, call in enumerate(calls) if isinstance(call, dict)
                ]
            choice["delta"] = delta
        else:
            choice["text"] = raw.get("text", "")
        choices.append(choice)
    kind = ChatCompletionChunk if chat else CompletionChunk
    event = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    usage = answer.usage
    last = {
        **event,
        "choices": [],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
    }
    return [
        make_chunk(kind, {**event, "choices": choices}, answer.text),
        make_chunk(kind, last, ""),
    ]
