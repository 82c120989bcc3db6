"""Answers as stored text and back: the server's choices as it sent them, the usage
and the response's identity, in compact JSON (readable with ``sqlite3`` and ``jq``).

A stored answer comes back as a new object each time (every caller owns its
result), marked ``from_cache``, with timings of its own: no queueing, no batch,
no attempt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from llmbatch._chunks import ChatCompletionChunk, CompletionChunk, make_chunk
from llmbatch._exceptions import (
    APIStatusError,
    BadRequestError,
    LLMBatchError,
    OutputTruncatedError,
    StructuredOutputError,
)
from llmbatch._models import (
    BareChoices,
    ChatCompletion,
    Completion,
    Delivery,
    Embedding,
    make_answer,
)

__all__ = [
    "FAILURE",
    "KINDS",
    "Expired",
    "decode",
    "encode",
    "encode_failure",
    "keeps",
    "replay",
    "tokens_of",
]

KINDS: dict[type[Any], str] = {
    Completion: "completion",
    ChatCompletion: "chat",
    Embedding: "embedding",
}
_CLASSES = {name: cls for cls, name in KINDS.items()}
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


#: The first field of a stored answer: its layout (a change here makes a new one, and
#: raises ``KEY_VERSION`` so that no older entry is read as this one).
_FORMAT = 1
#: The C scanner behind ``json.loads``, called directly: a hit decodes one small
#: document, where ``json.loads``'s own checks cost as much as the scan.
#: A str as a JSON string (the C function ``json.dumps`` uses; non-ASCII kept).
_STRING: Callable[[str], str] = json.encoder.encode_basestring
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def encode(answer: Any) -> str | None:
    """``answer`` (a Completion, ChatCompletion or Embedding) as stored text: a JSON
    array of the format, kind, id, model, created, fingerprint, prompt, completion
    and total tokens, whether they were estimated, and the choices: the server's
    dicts, or ``[text, finish_reason]`` for an answer that kept nothing else (a bulk
    map's, nearly always); None for anything else, or an answer JSON cannot hold
    (not stored)."""
    kind = KINDS.get(type(answer))
    if kind is None:
        return None
    kept = getattr(answer, "_choices", None)
    try:
        if type(kept) is str:  # bare: written by hand, a fifth of the encoder's cost
            choices = f"[[{_STRING(kept)},{_STRING(answer._finish)}]]"
        else:
            raw = answer._raw_choices()
            if kind == "embedding":  # its place in the HTTP request that carried it
                raw = [{**raw[0], "index": 0}]
            choices = _ENCODER.encode(raw)
        delivery: Delivery = answer._delivery
        fingerprint = delivery.system_fingerprint
        total = delivery.total_tokens
        return (
            f'[{_FORMAT},"{kind}",{_STRING(delivery.id)},{_STRING(delivery.model)},'
            f"{int(delivery.created)},{'null' if fingerprint is None else _STRING(fingerprint)},"
            f"{int(answer._prompt_tokens)},{int(answer._completion_tokens)},"
            f"{'null' if total is None else int(total)},"
            f"{'true' if delivery.estimated else 'false'},{choices}]"
        )
    except (TypeError, ValueError):
        return None


FAILURE = "failure"
"""The kind of a stored failure: ``[format, "failure", expires at, error]``."""
#: The failures that are the request's own, which may be kept, by name.
_FAILURES: dict[str, type[LLMBatchError]] = {
    cls.__name__: cls for cls in (BadRequestError, StructuredOutputError, OutputTruncatedError)
}


class Expired(ValueError):
    """A stored failure past its time to live (dropped, and the request sent again)."""


def keeps(error: LLMBatchError) -> bool:
    """Whether ``error`` is the request's own, kept when asked (``keep_failures``): a
    400 for this prompt, or an answer that failed validation after its re-asks."""
    return _FAILURES.get(type(error).__name__) is type(error)


def encode_failure(error: LLMBatchError, expires_at: float) -> str | None:
    """A failure the request itself caused, kept until ``expires_at`` (epoch seconds)."""
    fields: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, APIStatusError):
        fields["status_code"] = error.status_code
    if isinstance(error, StructuredOutputError):
        fields["text"] = error.text
        fields["reasks"] = error.reasks
        fields["errors"] = [
            {"loc": _plain_list(e.get("loc")), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in error.errors
            if isinstance(e, dict)
        ]
    try:
        return _ENCODER.encode([_FORMAT, FAILURE, expires_at, fields])
    except (TypeError, ValueError):
        return None


def _plain_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _failure(record: list[Any], now: float) -> LLMBatchError:
    form, _, expires_at, fields = record
    if form != _FORMAT or type(fields) is not dict:
        raise ValueError("not a stored failure")
    if not isinstance(expires_at, int | float) or expires_at <= now:
        raise Expired("a stored failure past its time to live")
    cls = _FAILURES[fields["type"]]
    message = f"{fields['message']} (kept in the response cache)"
    if issubclass(cls, StructuredOutputError):
        return cls(
            message,
            text=str(fields["text"]),
            errors=[dict(e) for e in fields.get("errors") or () if isinstance(e, dict)],
            reasks=int(fields.get("reasks", 0)),
        )
    return cls(message, status_code=int(fields.get("status_code", 400)))  # type: ignore[call-arg]


def tokens_of(answer: Any) -> tuple[int, int]:
    """The prompt and completion tokens an answer was counted (what a hit saves)."""
    return answer._prompt_tokens, answer._completion_tokens


def decode(
    data: str, created_at: float, now: float, wall_clock: Callable[[], float] = time.time
) -> Any:
    """The answer ``data`` holds, asked for at ``created_at`` and read at ``now``, or
    the kept failure (an :class:`LLMBatchError` to raise; :class:`Expired` once past
    its time by ``wall_clock``, epoch seconds as its expiry was written). Raises
    ``ValueError`` (or ``KeyError``, ``TypeError``) for text that is not a stored
    answer, which the caller treats as a miss."""
    try:
        record, end = _SCAN(data, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(data) or type(record) is not list:
        raise ValueError("not a stored answer")
    if len(record) == 4 and record[1] == FAILURE:
        return _failure(record, wall_clock())
    if len(record) != 11:
        raise ValueError("not a stored answer")
    (form, kind, id, model, created, fingerprint, prompt, completion, total, estimated, choices) = (
        record
    )
    if form != _FORMAT:
        raise ValueError(f"a stored answer of format {form!r}")
    cls = _CLASSES[kind]
    if type(choices) is not list or not choices:
        raise ValueError("a stored answer without choices")
    bare = None
    first = choices[0]
    if type(first) is list:  # [text, finish_reason]: rebuilt as the server's dict
        text, finish = first
        if len(choices) != 1 or type(text) is not str or type(finish) is not str:
            raise ValueError("a stored answer with a malformed choice")
        if cls is ChatCompletion:
            message = {"role": "assistant", "content": text}
            choices = [{"index": 0, "message": message, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text, "finish_reason": finish}]
        bare = BareChoices.of(cls, choices[0])
    elif not all(type(c) is dict for c in choices):
        raise ValueError("a stored answer with a malformed choice")
    if type(prompt) is not int or type(completion) is not int:
        raise TypeError("token counts must be ints")
    delivery = Delivery(
        str(id),
        str(model),
        int(created),
        batch_size=0,
        dispatched_at=created_at,
        finished_at=now,
        estimated=bool(estimated),
        total_tokens=None if total is None else int(total),
        system_fingerprint=fingerprint,
        bare=bare,
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
