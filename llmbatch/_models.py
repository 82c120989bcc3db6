"""Results handed to callers: immutable, cheap to build, and built lazily where it pays.

A bulk map makes one result per prompt, tens of thousands a second. Building a
frozen dataclass is costly at that rate, and the garbage collector walks every
object a map keeps (docs/benchmarks.md, "Overhead"). So a
:class:`Completion` is one slotted object holding what the server sent (only the
text and finish reason, when its choice dict says nothing else: see
:class:`BareChoices`), and its ``choices``, ``usage`` and ``timings`` become
objects only when first read. The
small value types (:class:`Choice`, :class:`Usage`, ...) are plain frozen
dataclasses. Everything compares by value, pickles, and has ``to_dict()``.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from typing_extensions import TypeVar

from llmbatch._exceptions import LLMBatchError

__all__ = [
    "BareChoices",
    "ChatChoice",
    "ChatCompletion",
    "ChatMessage",
    "Choice",
    "Completion",
    "Delivery",
    "FunctionCall",
    "Result",
    "Timings",
    "ToolCall",
    "Usage",
    "make_answer",
    "make_result",
]

_set = object.__setattr__
_new = object.__new__


class _Immutable:
    """Refuses attribute assignment, as frozen dataclasses do."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts for one request.

    vLLM reports one ``usage`` for a whole list-prompt request; llmbatch apportions it
    over the prompts of a batch (by prompt and output length) and sets
    ``estimated=True`` when it had to. Sums over a batch are exact.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = False
    """True when these counts are this prompt's share of a batch's usage."""


@dataclass(frozen=True, slots=True)
class Timings:
    """Where the time went for one request, in seconds."""

    queued: float
    """From the call until its batch was sent."""
    latency: float
    """From the call until the answer was complete."""
    batch_size: int
    """How many prompts shared the HTTP request that answered it."""
    attempts: int
    """HTTP attempts made (1 = no retry)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """One generated alternative of a completion (there are ``n`` per prompt)."""

    text: str
    finish_reason: str | None = None
    """Why generation stopped: ``"stop"`` (end of text or a stop string), ``"length"``
    (``max_tokens`` reached), or None if the server did not say."""
    index: int = 0
    """Its place among the prompt's ``n`` choices."""
    logprobs: Any = None
    """The server's log-probabilities for it, as sent (with ``logprobs=``)."""


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """The function a tool call names, and its arguments as the model wrote them (JSON)."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call in an assistant message (chat with ``tools=``)."""

    id: str
    function: FunctionCall
    type: str = "function"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat conversation as returned by the server."""

    role: str
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    """The tools the model asked to call (with ``tools=``), or None."""
    reasoning_content: str | None = None
    """A reasoning model's thinking, when the server separates it (vLLM reasoning
    parsers), or None."""


@dataclass(frozen=True, slots=True)
class ChatChoice:
    """One generated alternative of a chat completion (there are ``n``)."""

    message: ChatMessage
    finish_reason: str | None = None
    """``"stop"``, ``"length"``, ``"tool_calls"``, ... or None if not said."""
    index: int = 0
    logprobs: Any = None
    """The server's log-probabilities for it, as sent (with ``logprobs=True``)."""


def _text(raw: Mapping[str, Any], key: str = "text") -> str:
    value = raw.get(key)
    return value if isinstance(value, str) else ""


def _finish(raw: Mapping[str, Any]) -> str | None:
    value = raw.get("finish_reason")
    return value if isinstance(value, str) else None


def _index(raw: Mapping[str, Any], default: int) -> int:
    value = raw.get("index")
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _choice(raw: Mapping[str, Any], index: int, *, server_index: bool = True) -> Choice:
    """A Choice from the server's dict, numbered as the server numbered it (a stream's
    chunk), or ``server_index=False``: at ``index`` among its answer's choices (the
    server numbers a batch's choices through the whole list of prompts)."""
    return Choice(
        text=_text(raw),
        finish_reason=_finish(raw),
        index=_index(raw, index) if server_index else index,
        logprobs=raw.get("logprobs"),
    )


def _tool_calls(raw: object) -> tuple[ToolCall, ...] | None:
    if not isinstance(raw, list) or not raw:
        return None
    calls = []
    for call in raw:
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        calls.append(
            ToolCall(
                id=_text(call, "id"),
                type=_text(call, "type") or "function",
                function=FunctionCall(
                    name=_text(function, "name"), arguments=_text(function, "arguments")
                ),
            )
        )
    return tuple(calls)


def _chat_choice(raw: Mapping[str, Any], index: int) -> ChatChoice:
    """A ChatChoice from the server's dict, at ``index`` among its answer's choices."""
    message = raw.get("message")
    message = message if isinstance(message, Mapping) else {}
    content = message.get("content")
    reasoning = message.get("reasoning_content")
    return ChatChoice(
        message=ChatMessage(
            role=_text(message, "role") or "assistant",
            content=content if isinstance(content, str) else None,
            tool_calls=_tool_calls(message.get("tool_calls")),
            reasoning_content=reasoning if isinstance(reasoning, str) else None,
        ),
        finish_reason=_finish(raw),
        index=index,
        logprobs=raw.get("logprobs"),
    )


# How the wire module hands over one request's usage: (prompt, completion, total,
# estimated).
RawUsage = tuple[int, int, int, bool]


class Delivery:
    """What one HTTP response tells every request it answered: kept once and shared
    by their results, not copied into each (fewer objects and fields per result)."""

    __slots__ = (
        "bare",
        "batch_size",
        "created",
        "dispatched_at",
        "estimated",
        "finished_at",
        "from_cache",
        "id",
        "model",
        "system_fingerprint",
        "total_tokens",
    )

    def __init__(
        self,
        id: str,
        model: str,
        created: int,
        *,
        batch_size: int,
        dispatched_at: float,
        finished_at: float,
        estimated: bool,
        total_tokens: int | None,
        system_fingerprint: str | None = None,
        bare: BareChoices | None = None,
        from_cache: bool = False,
    ) -> None:
        self.id = id
        self.system_fingerprint = system_fingerprint
        self.model = model
        self.created = created
        self.batch_size = batch_size
        self.dispatched_at = dispatched_at
        self.finished_at = finished_at
        self.estimated = estimated
        self.total_tokens = total_tokens
        """The server's total for a request answered alone (None: prompt + completion)."""
        self.bare = bare
        """How the response laid out its choices, when answers may keep only their
        text and finish reason (None: every answer keeps the server's dicts)."""
        self.from_cache = from_cache
        """Read from the client's response cache, or shared with an identical request
        in flight: no HTTP request of its own (docs/caching.md)."""

    @classmethod
    def of(
        cls,
        id: str,
        model: str,
        created: int,
        usage: Usage,
        timings: Timings,
        system_fingerprint: str | None,
    ) -> Delivery:
        """The delivery implied by explicitly given usage and timings (created at 0)."""
        return cls(
            id,
            model,
            created,
            batch_size=timings.batch_size,
            dispatched_at=timings.queued,
            finished_at=timings.latency,
            estimated=usage.estimated,
            total_tokens=usage.total_tokens,
            system_fingerprint=system_fingerprint,
        )


class _Record(_Immutable):
    """Value semantics from a class's ``_FIELDS``: equality, hash, repr, pickling and
    ``to_dict``, for results and stream chunks alike."""

    __slots__ = ()

    _FIELDS: tuple[str, ...] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _rebuild, (type(self), {name: getattr(self, name) for name in self._FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and scalars (JSON-ready)."""
        return {name: _plain(getattr(self, name)) for name in self._FIELDS}

    def model_dump(self) -> dict[str, Any]:
        """The same as :meth:`to_dict` (kept from 0.1, whose results were pydantic)."""
        return self.to_dict()


class _Answer(_Record):
    """What Completion, ChatCompletion and Embedding share: ids, usage and timings."""

    __slots__ = ("_attempts", "_completion_tokens", "_created_at", "_delivery", "_prompt_tokens")

    _delivery: Delivery
    _created_at: float
    _prompt_tokens: int
    _completion_tokens: int
    _attempts: int

    def _store(
        self,
        id: str,
        model: str,
        created: int,
        usage: Usage,
        timings: Timings,
        system_fingerprint: str | None,
    ) -> None:
        delivery = Delivery.of(id, model, created, usage, timings, system_fingerprint)
        _set(self, "_delivery", delivery)
        _set(self, "_created_at", 0.0)
        _set(self, "_prompt_tokens", usage.prompt_tokens)
        _set(self, "_completion_tokens", usage.completion_tokens)
        _set(self, "_attempts", timings.attempts)

    @property
    def id(self) -> str:
        """The server's response id (shared by the prompts of one batch)."""
        return self._delivery.id

    @property
    def model(self) -> str:
        """The model that answered."""
        return self._delivery.model

    @property
    def created(self) -> int:
        """The server's creation time of the response (Unix seconds; 0 if not sent)."""
        return self._delivery.created

    @property
    def system_fingerprint(self) -> str | None:
        """The server's configuration fingerprint, when it sends one."""
        return self._delivery.system_fingerprint

    @property
    def usage(self) -> Usage:
        """Token counts (this prompt's share when it was batched: ``usage.estimated``)."""
        delivery = self._delivery
        prompt, completion = self._prompt_tokens, self._completion_tokens
        total = delivery.total_tokens
        return make_usage(
            prompt, completion, prompt + completion if total is None else total, delivery.estimated
        )

    @property
    def from_cache(self) -> bool:
        """True when the answer came from the response cache (or from an identical
        request in flight at the same time): no HTTP request of its own was sent, and
        nothing was charged for it (docs/caching.md)."""
        return self._delivery.from_cache

    @property
    def timings(self) -> Timings:
        """Queueing time, latency, batch size and attempts for this request."""
        delivery, created_at = self._delivery, self._created_at
        return Timings(
            queued=delivery.dispatched_at - created_at,
            latency=delivery.finished_at - created_at,
            batch_size=delivery.batch_size,
            attempts=self._attempts,
        )

    def _raw_choices(self) -> list[dict[str, Any]]:
        """The choices as the server sent them (OpenAI's JSON), each indexed from 0
        within this answer, for the openai drop-in."""
        kept = getattr(self, "_choices", None)
        if kept is None:  # an Embedding
            return [dict(self._item)]  # type: ignore[attr-defined]
        if isinstance(kept, str):  # a bare choice: the server's dict, as it was
            shape = self._delivery.bare
            assert shape is not None
            return [shape.rebuild(kept, self._finish)]  # type: ignore[attr-defined]
        raw = (kept,) if isinstance(kept, Mapping) else kept
        out = []
        for j, choice in enumerate(raw):
            if isinstance(choice, Mapping):
                out.append({**choice, "index": j})
            else:  # built from objects (a constructed result): their fields, in JSON
                data = dataclasses.asdict(choice)
                data["index"] = j
                out.append(data)
        return out


def _rebuild(cls: type[_Record], fields: dict[str, Any]) -> _Record:
    return cls(**fields)


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


P = TypeVar("P", default=None)
"""What an answer's text was validated into (``response_model``); None without one."""


class Completion(_Answer, Generic[P]):
    """The answer to :meth:`Client.complete` (one prompt), in the OpenAI shape:
    ``id``, ``object``, ``created``, ``model``, ``choices``, ``usage``,
    ``system_fingerprint``; plus ``text`` (the first choice's), ``timings``, and
    ``parsed`` (the text validated into the call's ``response_model``)."""

    __slots__ = ("_choices", "_finish", "_parsed")
    _FIELDS = ("id", "model", "created", "choices", "usage", "timings", "system_fingerprint")
    object = "text_completion"
    # Built Choice objects, or what the server sent: its choice dicts, or the one
    # dict itself when n=1 (no tuple to keep alive), or, when that dict set nothing
    # but its text, finish reason and index, the text alone (its finish reason in
    # _finish): a map's results then keep no dict each (BareChoices).
    _choices: tuple[Choice, ...] | tuple[Mapping[str, Any], ...] | Mapping[str, Any] | str
    _finish: str

    def __init__(
        self,
        *,
        id: str,
        model: str,
        choices: Iterable[Choice],
        usage: Usage,
        timings: Timings,
        created: int = 0,
        system_fingerprint: str | None = None,
    ) -> None:
        _set(self, "_choices", tuple(choices))
        self._store(id, model, created, usage, timings, system_fingerprint)

    @property
    def choices(self) -> tuple[Choice, ...]:
        """``n`` choices (one unless the call passed ``n=``)."""
        choices = self._choices
        if isinstance(choices, str):
            alone: tuple[Choice, ...] = (Choice(text=choices, finish_reason=self._finish),)
            _set(self, "_choices", alone)
            return alone
        if isinstance(choices, Mapping):
            choices = (choices,)
        if choices and not isinstance(choices[0], Choice):
            built = tuple(
                _choice(raw, i, server_index=False)
                for i, raw in enumerate(choices)
                if isinstance(raw, Mapping)
            )
            _set(self, "_choices", built)
            return built
        return choices  # type: ignore[return-value]

    def _first(self) -> Choice | Mapping[str, Any]:
        choices = self._choices
        assert not isinstance(choices, str)  # (text and finish_reason read that form)
        return choices if isinstance(choices, Mapping) else choices[0]

    @property
    def text(self) -> str:
        """The first choice's text."""
        kept = self._choices
        if isinstance(kept, str):
            return kept
        first = self._first()
        return first.text if isinstance(first, Choice) else _text(first)

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason (``"stop"``, ``"length"``, ...)."""
        if isinstance(self._choices, str):
            return self._finish
        first = self._first()
        return first.finish_reason if isinstance(first, Choice) else _finish(first)

    @property
    def parsed(self) -> P:
        """The text validated into the call's ``response_model`` (None without one)."""
        return getattr(self, "_parsed", None)  # type: ignore[return-value]


class ChatCompletion(_Answer, Generic[P]):
    """The answer to :meth:`Client.chat`, in the OpenAI shape: ``id``, ``object``,
    ``created``, ``model``, ``choices`` (each with its ``message``), ``usage``,
    ``system_fingerprint``; plus ``message``, ``finish_reason`` and ``text`` (the
    first choice's), ``timings``, and ``parsed`` (the text validated into the
    call's ``response_model``)."""

    __slots__ = ("_choices", "_finish", "_parsed")
    _FIELDS = ("id", "model", "created", "choices", "usage", "timings", "system_fingerprint")
    object = "chat.completion"
    # As Completion's: built objects, the server's dicts (the one dict when n=1), or
    # a bare choice's message content alone (its finish reason in _finish).
    _choices: tuple[ChatChoice, ...] | tuple[Mapping[str, Any], ...] | Mapping[str, Any] | str
    _finish: str

    def __init__(
        self,
        *,
        id: str,
        model: str,
        usage: Usage,
        timings: Timings,
        choices: Iterable[ChatChoice] | None = None,
        message: ChatMessage | None = None,
        finish_reason: str | None = None,
        created: int = 0,
        system_fingerprint: str | None = None,
    ) -> None:
        if choices is None:  # 0.1's constructor: one message and its finish reason
            if message is None:
                raise TypeError("ChatCompletion needs choices= or message=")
            choices = (ChatChoice(message=message, finish_reason=finish_reason),)
        _set(self, "_choices", tuple(choices))
        self._store(id, model, created, usage, timings, system_fingerprint)

    @property
    def choices(self) -> tuple[ChatChoice, ...]:
        """``n`` choices (one unless the call passed ``n=``)."""
        choices = self._choices
        if isinstance(choices, str):
            message = ChatMessage(role="assistant", content=choices)
            alone: tuple[ChatChoice, ...] = (
                ChatChoice(message=message, finish_reason=self._finish),
            )
            _set(self, "_choices", alone)
            return alone
        if isinstance(choices, Mapping):
            choices = (choices,)
        if choices and not isinstance(choices[0], ChatChoice):
            built = tuple(
                _chat_choice(raw, i) for i, raw in enumerate(choices) if isinstance(raw, Mapping)
            )
            _set(self, "_choices", built)
            return built
        return choices  # type: ignore[return-value]

    @property
    def message(self) -> ChatMessage:
        """The first choice's message."""
        return self.choices[0].message

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason (``"stop"``, ``"length"``, ``"tool_calls"``)."""
        choices = self._choices
        if isinstance(choices, str):
            return self._finish
        if isinstance(choices, Mapping):
            return _finish(choices)
        return self.choices[0].finish_reason

    @property
    def text(self) -> str:
        """The first choice's message text (empty if the server sent none)."""
        choices = self._choices
        if isinstance(choices, str):
            return choices
        if isinstance(choices, Mapping):  # without building objects
            message = choices.get("message")
            if isinstance(message, Mapping):
                return _text(message, "content")
        return self.message.content or ""

    @property
    def parsed(self) -> P:
        """The text validated into the call's ``response_model`` (None without one)."""
        return getattr(self, "_parsed", None)  # type: ignore[return-value]


class Embedding(_Answer):
    """The answer to :meth:`Client.embed` for one input: its vector, in the OpenAI
    shape (``object``, ``index``, ``embedding``) plus ``model``, ``usage`` and
    ``timings``."""

    __slots__ = ("_item",)
    _FIELDS = ("id", "model", "created", "index", "embedding", "usage", "timings")
    object = "embedding"
    _item: Mapping[str, Any]

    def __init__(
        self,
        *,
        embedding: Iterable[float],
        usage: Usage,
        timings: Timings,
        index: int = 0,
        id: str = "",
        model: str = "",
        created: int = 0,
    ) -> None:
        _set(self, "_item", {"index": index, "embedding": list(embedding)})
        self._store(id, model, created, usage, timings, None)

    @property
    def index(self) -> int:
        """The input's position in the request that carried it."""
        return _index(self._item, 0)

    @property
    def embedding(self) -> list[float]:
        """The vector (decoded from base64 when ``encoding_format="base64"`` was asked)."""
        raw = self._item.get("embedding")
        if isinstance(raw, str):
            import array
            import base64

            values = array.array("f")
            values.frombytes(base64.b64decode(raw))
            decoded = values.tolist()
            _set(self, "_item", {**self._item, "embedding": decoded})
            return decoded
        return raw if isinstance(raw, list) else []

    @property
    def text(self) -> str:
        """Embeddings have no text: always empty (here so every answer has one)."""
        return ""


T = TypeVar("T")


class Result(_Immutable, Generic[T]):
    """The outcome of one item of :meth:`Client.map`: a value or that item's error.

    ``metadata`` is whatever rode along with the item's input. With a
    ``response_model``, ``value`` (and ``parsed``) is the validated object and
    ``response`` the server's answer it came from.
    """

    __slots__ = ("_response", "error", "index", "metadata", "value")

    index: int
    """The item's position in the inputs."""
    value: T | None
    """A :class:`Completion` or :class:`ChatCompletion` (with a ``response_model``,
    the validated object); None if the item failed."""
    error: LLMBatchError | None
    """The item's error (:class:`InvalidRequestError` for bad input); None on success."""
    metadata: object

    def __init__(
        self,
        *,
        index: int,
        value: T | None = None,
        error: LLMBatchError | None = None,
        metadata: object = None,
        response: object = None,
    ) -> None:
        _set(self, "index", index)
        _set(self, "value", value)
        _set(self, "error", error)
        _set(self, "metadata", metadata)
        if response is not None:
            _set(self, "_response", response)

    @property
    def response(self) -> Any:
        """The server's answer behind a ``response_model`` result (the last one, when
        it failed validation); None for plain results, whose ``value`` is the answer."""
        return getattr(self, "_response", None)

    @property
    def parsed(self) -> T | None:
        """The validated object of a ``response_model`` result (None otherwise)."""
        return self.value if self.response is not None else None

    @property
    def text(self) -> str | None:
        """The answer's raw text (None when there is no answer)."""
        answer = self.response if self.response is not None else self.value
        text: str | None = getattr(answer, "text", None) if isinstance(answer, _Answer) else None
        return text

    @property
    def from_cache(self) -> bool:
        """True when the item's answer came from the response cache (or was shared
        with an identical item in flight), as ``Completion.from_cache`` says."""
        answer = self.response if self.response is not None else self.value
        return isinstance(answer, _Answer) and answer.from_cache

    @property
    def ok(self) -> bool:
        """True if the item succeeded."""
        return self.error is None

    def unwrap(self) -> T:
        """The value, or raise the item's error."""
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        return (self.index, self.value, self.error, self.metadata) == (
            other.index,
            other.value,
            other.error,
            other.metadata,
        )

    def __hash__(self) -> int:
        return hash((self.index, self.value, self.error))

    def __repr__(self) -> str:
        return (
            f"Result(index={self.index!r}, value={self.value!r}, error={self.error!r}, "
            f"metadata={self.metadata!r})"
        )

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _rebuild_result, (self.index, self.value, self.error, self.metadata, self.response)

    def to_dict(self) -> dict[str, Any]:
        """The value as a dict (or None), the error's message (or None), index,
        metadata; with a ``response_model``, also the server's answer as ``response``
        (the value in JSON types)."""
        value = self.value
        plain: dict[str, Any] = {
            "index": self.index,
            "value": value.to_dict() if isinstance(value, _Answer) else _jsonable(value),
            "error": None if self.error is None else str(self.error),
            "metadata": self.metadata,
        }
        if self.response is not None:
            plain["response"] = self.response.to_dict()
        return plain


def _jsonable(value: object) -> object:
    """A validated object in JSON types (pydantic's, for models, enums, dates)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)


def _rebuild_result(
    index: int, value: object, error: LLMBatchError | None, meta: object, response: object = None
) -> Any:
    return Result(index=index, value=value, error=error, metadata=meta, response=response)


# -- the hot path: build without __init__'s checks (every value comes from llmbatch) --


def _setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[object, object], None], ...]:
    return tuple(getattr(cls, name).__set__ for name in names)


_ANSWER_SLOTS = ("_delivery", "_created_at", "_prompt_tokens", "_completion_tokens", "_attempts")
_completion_slots = _setters(Completion, (*_ANSWER_SLOTS, "_choices"))
(_set_finish,) = _setters(Completion, ("_finish",))
(_set_chat_finish,) = _setters(ChatCompletion, ("_finish",))
_chat_slots = _setters(ChatCompletion, (*_ANSWER_SLOTS, "_choices"))
_embedding_slots = _setters(Embedding, (*_ANSWER_SLOTS, "_item"))
_result_slots = _setters(Result, ("index", "value", "error", "metadata"))
_usage_slots = _setters(Usage, ("prompt_tokens", "completion_tokens", "total_tokens", "estimated"))


def make_usage(prompt: int, completion: int, total: int, estimated: bool) -> Usage:
    """A Usage without the frozen dataclass's ``__init__`` (a third of the cost): an
    answer builds one each time its ``usage`` is read, which a bulk caller does per
    item."""
    usage = _new(Usage)
    set_prompt, set_completion, set_total, set_estimated = _usage_slots
    set_prompt(usage, prompt)
    set_completion(usage, completion)
    set_total(usage, total)
    set_estimated(usage, estimated)
    return usage


class _Layout:
    """One level of a server's choice dict as a response laid it out: its keys in
    order, and for every key but the ``core`` ones an empty value (None, or an empty
    list: vLLM's ``tool_calls``). A dict fits when it has these keys with these empty
    values; it is rebuilt from the core values alone."""

    __slots__ = ("_empties", "_get", "_lists", "_size", "keys")

    def __init__(self, raw: Mapping[str, Any], core: tuple[str, ...]) -> None:
        self.keys = tuple(raw)
        others = [key for key in self.keys if key not in core]
        self._empties = tuple(raw[key] for key in others)
        self._lists = frozenset(key for key in others if raw[key] == [])
        self._size = len(self.keys)
        self._get: Callable[[Mapping[str, Any]], Any] | None = None
        if len(others) == 1:  # (itemgetter of one key returns the value, not a tuple)
            (key,) = others
            self._get = lambda raw: (raw[key],)
        elif others:
            self._get = operator.itemgetter(*others)

    @property
    def empty(self) -> bool:
        """Whether everything but the core was empty where it was read."""
        return all(value is None or value == [] for value in self._empties)

    def fits(self, raw: Mapping[str, Any]) -> bool:
        """``raw`` has these keys, and these empty values beside its core ones."""
        get = self._get
        if len(raw) != self._size:
            return False
        if get is None:
            return True
        try:
            return bool(get(raw) == self._empties)
        except KeyError:  # another key in the place of one of these
            return False

    def rebuild(self, core: Mapping[str, Any]) -> dict[str, Any]:
        """The dict, in the server's key order, with ``core`` and fresh empty values."""
        lists = self._lists
        raw: dict[str, Any] = {key: [] if key in lists else None for key in self.keys}
        raw.update(core)
        return raw


class BareChoices:
    """How a response laid out its choices, when its first sets nothing but its
    text (a chat message's content, the assistant's), finish reason and index: no
    log-probabilities, no stop reason, no tool calls, ... An answer whose choice is
    laid out the same keeps its text and finish reason and lets the dicts go (a
    map's result then holds two objects, not three or four: memory, and the garbage
    collector's work); the dicts are rebuilt from the layout when asked for."""

    __slots__ = ("_message", "_outer", "chat")

    def __init__(self, outer: _Layout, message: _Layout | None) -> None:
        self._outer = outer
        self._message = message
        self.chat = message is not None
        """A chat choice (its text in ``message.content``)."""

    @classmethod
    def of(
        cls,
        kind: type[Completion] | type[ChatCompletion] | type[Embedding],
        first: Mapping[str, Any],
    ) -> BareChoices | None:
        """The layout of a response of ``kind`` whose first choice is ``first``; None
        unless that is bare (a call with ``logprobs`` sets them in every choice: its
        answers are not checked one by one)."""
        if kind is Embedding:
            return None
        inner = first.get("message") if kind is ChatCompletion else None
        key = (kind, tuple(first), tuple(inner) if isinstance(inner, dict) else None)
        known = _LAYOUTS.get(key)
        if known is not None and known.fits(first):
            return known
        shape = cls._read(kind, first)
        if shape is not None:
            if len(_LAYOUTS) >= _LAYOUTS_KEPT:
                _LAYOUTS.clear()
            _LAYOUTS[key] = shape
        return shape

    @classmethod
    def _read(
        cls,
        kind: type[Completion] | type[ChatCompletion] | type[Embedding],
        first: Mapping[str, Any],
    ) -> BareChoices | None:
        message: _Layout | None = None
        if kind is Completion:
            outer = _Layout(first, ("text", "finish_reason", "index"))
        elif isinstance(first.get("message"), dict):
            outer = _Layout(first, ("message", "finish_reason", "index"))
            message = _Layout(first["message"], ("role", "content"))
        else:
            return None
        if not outer.empty or (message is not None and not message.empty):
            return None
        shape = cls(outer, message)
        return shape if shape.fits(first) else None

    def fits(self, raw: Mapping[str, Any]) -> bool:
        """``raw`` is laid out as the first was: string text (or message content, the
        assistant's) and finish reason, an int index, the rest empty alike."""
        if (
            type(raw.get("finish_reason")) is not str
            or type(raw.get("index")) is not int
            or not self._outer.fits(raw)
        ):
            return False
        message = self._message
        if message is None:
            return type(raw.get("text")) is str
        inner = raw.get("message")
        return (
            type(inner) is dict
            and inner.get("role") == "assistant"
            and type(inner.get("content")) is str
            and message.fits(inner)
        )

    def text(self, raw: Mapping[str, Any]) -> str:
        """The text of a choice that fits."""
        text: str = raw["message"]["content"] if self.chat else raw["text"]
        return text

    def rebuild(self, text: str, finish_reason: str) -> dict[str, Any]:
        """The server's choice dict of an answer that kept ``text`` and
        ``finish_reason`` (numbered 0 within its answer)."""
        core: dict[str, Any] = {"finish_reason": finish_reason, "index": 0}
        if self._message is None:
            core["text"] = text
        else:
            core["message"] = self._message.rebuild({"role": "assistant", "content": text})
        return self._outer.rebuild(core)


#: Layouts read so far, by the keys they have: a server lays out every response the
#: same way, and reading one took longer than checking that another fits it.
_LAYOUTS: dict[tuple[type, tuple[str, ...], tuple[str, ...] | None], BareChoices] = {}
#: Enough for a few servers and kinds of call; more (a server that varies its keys)
#: starts the cache again rather than growing it.
_LAYOUTS_KEPT = 64


def make_answer(
    kind: type[Completion] | type[ChatCompletion] | type[Embedding],
    delivery: Delivery,
    created_at: float,
    prompt_tokens: int,
    completion_tokens: int,
    attempts: int,
    choices: tuple[Mapping[str, Any], ...],
) -> Any:
    """A Completion (or ChatCompletion) over the server's choice dicts; fields are
    built when first read. ``created_at`` is when the caller asked (for timings)."""
    setters = (
        _completion_slots
        if kind is Completion
        else _chat_slots
        if kind is ChatCompletion
        else _embedding_slots
    )
    s_delivery, s_created_at, s_prompt, s_completion, s_attempts, s_choices = setters
    # n=1 (nearly always): keep the one dict, not a tuple around it.
    first = choices[0]
    kept: object = first if len(choices) == 1 else choices
    value = _new(kind)
    shape = delivery.bare
    if shape is not None and kept is first and shape.fits(first):
        # Only its text and finish reason to keep: the dicts go (a map's result then
        # holds two objects, not three or four, for the collector and for memory).
        (_set_chat_finish if shape.chat else _set_finish)(value, first["finish_reason"])
        kept = shape.text(first)
    s_delivery(value, delivery)
    s_created_at(value, created_at)
    s_prompt(value, prompt_tokens)
    s_completion(value, completion_tokens)
    s_attempts(value, attempts)
    s_choices(value, kept)
    return value


def make_result(index: int, value: object, error: LLMBatchError | None, metadata: object) -> Any:
    """A Result without __init__'s keyword handling (one per map item)."""
    result = _new(Result)
    set_index, set_value, set_error, set_metadata = _result_slots
    set_index(result, index)
    set_value(result, value)
    set_error(result, error)
    set_metadata(result, metadata)
    return result
