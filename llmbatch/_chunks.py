"""Streamed answers, one chunk per server-sent event: what :meth:`Client.stream_chunks`
yields, in openai-python's shape (``ChatCompletionChunk``, ``choices[0].delta``).

A chunk is made for every event of every stream (``stream()`` reads their text), so
like the results it keeps the event dict the server sent and builds its choices
and usage only when first read; only ``text`` is set when it is made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch._models import Choice, Usage, _choice, _finish, _index, _new, _Record, _set, _setters

__all__ = [
    "ChatChunkChoice",
    "ChatCompletionChunk",
    "ChatDelta",
    "Chunk",
    "CompletionChunk",
    "FunctionCallDelta",
    "ToolCallDelta",
    "make_chunk",
]


@dataclass(frozen=True, slots=True)
class FunctionCallDelta:
    """A piece of a streamed tool call's function: its ``name`` (in the first piece)
    and a piece of its ``arguments`` (JSON text, to be joined); None where absent."""

    name: str | None = None
    arguments: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call in a streamed chat answer (chat with ``tools=``).

    The pieces with the same ``index`` make one call: the first brings its ``id``,
    ``type`` and function name, the rest pieces of the arguments.
    """

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


@dataclass(frozen=True, slots=True)
class ChatDelta:
    """What one chunk of a streamed chat answer adds to its message.

    ``role`` comes with the first chunk; ``content`` is a piece of the text (None in
    a chunk that carries none).
    """

    role: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] | None = None
    """Pieces of the tools the model asks to call (with ``tools=``), or None."""
    reasoning_content: str | None = None
    """A piece of a reasoning model's thinking, when the server separates it, or None."""


@dataclass(frozen=True, slots=True)
class ChatChunkChoice:
    """One choice of a :class:`ChatCompletionChunk`: the ``delta`` it adds."""

    delta: ChatDelta
    finish_reason: str | None = None
    """Set in the choice's last chunk: ``"stop"``, ``"length"``, ``"tool_calls"``, ..."""
    index: int = 0
    logprobs: Any = None
    """The server's log-probabilities for this piece, as sent (with ``logprobs=True``)."""


_UNREAD: Any = object()
"""A chunk's usage not yet built from its event."""


class _Chunk(_Record):
    """What both chunk kinds share: the event they were made from, read lazily."""

    __slots__ = ("_choices", "_event", "_usage", "text")
    _FIELDS = ("id", "model", "created", "choices", "usage", "system_fingerprint")

    _event: Mapping[str, Any]
    _choices: tuple[Any, ...] | None
    _usage: Usage | None
    text: str
    """The text this chunk adds (its choice's; empty in a chunk without any, such
    as the last one, which carries only ``usage``)."""

    def _store(
        self,
        id: str,
        model: str,
        created: int,
        choices: tuple[Any, ...],
        usage: Usage | None,
        system_fingerprint: str | None,
        text: str,
    ) -> None:
        head: dict[str, Any] = {"id": id, "model": model, "created": created}
        if system_fingerprint is not None:
            head["system_fingerprint"] = system_fingerprint
        _set(self, "_event", head)
        _set(self, "_choices", choices)
        _set(self, "_usage", usage)
        _set(self, "text", text)

    def _build(self, raw: Mapping[str, Any], index: int) -> Any:
        raise NotImplementedError

    @property
    def id(self) -> str:
        """The server's id of the streamed response (the same in every chunk)."""
        value = self._event.get("id")
        return value if isinstance(value, str) else ""

    @property
    def model(self) -> str:
        """The model that answers."""
        value = self._event.get("model")
        return value if isinstance(value, str) else ""

    @property
    def created(self) -> int:
        """The server's creation time of the response (Unix seconds; 0 if not sent)."""
        value = self._event.get("created")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def system_fingerprint(self) -> str | None:
        """The server's configuration fingerprint, when it sends one."""
        value = self._event.get("system_fingerprint")
        return value if isinstance(value, str) else None

    @property
    def usage(self) -> Usage | None:
        """The stream's token counts: set in the last chunk (llmbatch always asks for
        them), None in the others."""
        usage = self._usage
        if usage is _UNREAD:
            usage = _usage_of(self._event.get("usage"))
            _set(self, "_usage", usage)
        return usage

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason, in the chunk that ends it (else None)."""
        choices = self._built_choices()
        return choices[0].finish_reason if choices else None

    def _built_choices(self) -> tuple[Any, ...]:
        choices = self._choices
        if choices is None:
            raw = self._event.get("choices")
            listed = raw if isinstance(raw, list) else []
            choices = tuple(
                self._build(c, i) for i, c in enumerate(listed) if isinstance(c, Mapping)
            )
            _set(self, "_choices", choices)
        return choices


class CompletionChunk(_Chunk):
    """One event of :meth:`Client.stream_chunks` for a prompt, in the OpenAI shape of a
    streamed completion: ``id``, ``object``, ``created``, ``model``, ``choices`` (each
    a :class:`Choice` holding a piece of text), ``usage`` (in the last chunk only),
    ``system_fingerprint``; plus ``text`` and ``finish_reason`` (the first choice's)."""

    __slots__ = ()
    object = "text_completion"

    def __init__(
        self,
        *,
        id: str,
        model: str,
        choices: Iterable[Choice],
        created: int = 0,
        usage: Usage | None = None,
        system_fingerprint: str | None = None,
    ) -> None:
        built = tuple(choices)
        text = "".join(choice.text for choice in built)
        self._store(id, model, created, built, usage, system_fingerprint, text)

    def _build(self, raw: Mapping[str, Any], index: int) -> Choice:
        return _choice(raw, index)

    @property
    def choices(self) -> tuple[Choice, ...]:
        """The choices this chunk adds to (one, or none in the usage chunk)."""
        choices: tuple[Choice, ...] = self._built_choices()
        return choices


class ChatCompletionChunk(_Chunk):
    """One event of :meth:`Client.stream_chunks` for chat messages, in the OpenAI
    shape: ``id``, ``object``, ``created``, ``model``, ``choices`` (each with its
    ``delta``: ``role`` first, then pieces of ``content`` and ``tool_calls``),
    ``usage`` (in the last chunk only), ``system_fingerprint``; plus ``text`` and
    ``finish_reason`` (the first choice's)."""

    __slots__ = ()
    object = "chat.completion.chunk"

    def __init__(
        self,
        *,
        id: str,
        model: str,
        choices: Iterable[ChatChunkChoice],
        created: int = 0,
        usage: Usage | None = None,
        system_fingerprint: str | None = None,
    ) -> None:
        built = tuple(choices)
        text = "".join(choice.delta.content or "" for choice in built)
        self._store(id, model, created, built, usage, system_fingerprint, text)

    def _build(self, raw: Mapping[str, Any], index: int) -> ChatChunkChoice:
        delta = raw.get("delta")
        delta = delta if isinstance(delta, Mapping) else {}
        return ChatChunkChoice(
            delta=ChatDelta(
                role=_str_or_none(delta, "role"),
                content=_str_or_none(delta, "content"),
                tool_calls=_tool_call_deltas(delta.get("tool_calls")),
                reasoning_content=_str_or_none(delta, "reasoning_content"),
            ),
            finish_reason=_finish(raw),
            index=_index(raw, index),
            logprobs=raw.get("logprobs"),
        )

    @property
    def choices(self) -> tuple[ChatChunkChoice, ...]:
        """The choices this chunk adds to (one, or none in the usage chunk)."""
        choices: tuple[ChatChunkChoice, ...] = self._built_choices()
        return choices


Chunk = CompletionChunk | ChatCompletionChunk
"""Either kind of chunk (what the dispatcher hands a ``stream_chunks`` caller)."""


def _str_or_none(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def _tool_call_deltas(raw: object) -> tuple[ToolCallDelta, ...] | None:
    if not isinstance(raw, list) or not raw:
        return None
    calls = []
    for i, call in enumerate(raw):
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        calls.append(
            ToolCallDelta(
                index=_index(call, i),
                id=_str_or_none(call, "id"),
                type=_str_or_none(call, "type"),
                function=FunctionCallDelta(
                    name=_str_or_none(function, "name"),
                    arguments=_str_or_none(function, "arguments"),
                )
                if isinstance(function, Mapping)
                else None,
            )
        )
    return tuple(calls)


def _usage_of(raw: object) -> Usage | None:
    if not isinstance(raw, Mapping):
        return None
    counts = []
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = raw.get(key)
        counts.append(value if isinstance(value, int) and not isinstance(value, bool) else 0)
    prompt, completion, total = counts
    return Usage(prompt, completion, total or prompt + completion)


# -- the hot path: one chunk per server-sent event -------------------------------------

_chunk_slots = _setters(_Chunk, ("_event", "_choices", "_usage", "text"))


def make_chunk(
    kind: type[CompletionChunk] | type[ChatCompletionChunk], event: Mapping[str, Any], text: str
) -> Any:
    """A chunk over the server's event dict (``text``: the text its choices carry)."""
    set_event, set_choices, set_usage, set_text = _chunk_slots
    chunk = _new(kind)
    set_event(chunk, event)
    set_choices(chunk, None)
    set_usage(chunk, _UNREAD)
    set_text(chunk, text)
    return chunk
