"""One queued request: its validated input, its budget estimate and its outcome slot.

Validation happens here, at the call site, so bad input raises
:class:`InvalidRequestError` before anything is queued and touches no other request.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from llmbatch._config import Priority
from llmbatch._exceptions import InvalidRequestError, LLMBatchError

__all__ = ["Flight", "Outcome", "Request", "RequestSpec", "estimate_tokens", "validate"]

Kind = Literal["completion", "chat"]

#: ``max_tokens`` assumed for budgeting when the caller gives none (vLLM's default for
#: /v1/completions is 16; chat has none, so budget a typical answer).
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 512}
_CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
_ids = itertools.count(1)


def estimate_tokens(text: str) -> int:
    """A cheap upper-ish estimate of a text's token count (≈4 characters a token)."""
    return len(text) // 4 + 1


def _min_tokens(text: str) -> int:
    """A lower bound for any common tokenizer: no token spans more than 16 bytes of
    ordinary text, so rejecting on this bound never refuses a prompt the server would
    take."""
    return len(text.encode("utf-8", "surrogatepass")) // 16


class Outcome:
    """Where a request's single result lands; the first ``set_*`` wins.

    A waiter gets an event (made only when someone waits); ``map`` registers a
    callback instead, which spares it a task and an event per item.
    """

    __slots__ = ("_callback", "_event", "done", "error", "value")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self._callback: Callable[[Outcome], None] | None = None
        self.done = False
        self.value: Any = None
        self.error: LLMBatchError | None = None

    def set_value(self, value: object) -> bool:
        if self.done:
            return False
        self.value = value
        self._finish()
        return True

    def set_error(self, error: LLMBatchError) -> bool:
        if self.done:
            return False
        self.error = error
        self._finish()
        return True

    def on_done(self, callback: Callable[[Outcome], None]) -> None:
        """Call ``callback(self)`` once the outcome is set (at once if it is)."""
        if self.done:
            callback(self)
        else:
            self._callback = callback

    def _finish(self) -> None:
        self.done = True
        if self._event is not None:
            self._event.set()
        if self._callback is not None:
            self._callback(self)

    async def wait(self) -> None:
        if not self.done:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A validated call, before it gets an id and a place in a queue."""

    kind: Kind
    priority: Priority
    model: str
    prompt: str | None
    messages: tuple[Mapping[str, Any], ...] | None
    params: Mapping[str, Any]
    max_tokens: int
    est_tokens: int
    n: int
    timeout: float | None
    stream: bool
    compat_key: tuple[object, ...]


class Flight:
    """The requests sharing one HTTP exchange, and the scope that can cancel it."""

    __slots__ = ("requests", "scope")

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = requests
        self.scope = anyio.CancelScope()

    def cancel_if_abandoned(self) -> None:
        """Stop the HTTP exchange once every caller it serves has gone away."""
        if all(r.abandoned for r in self.requests):
            self.scope.cancel()


@dataclass(eq=False, slots=True)
class Request:
    """A request in the client: spec + id + timing + outcome (compared by identity)."""

    spec: RequestSpec
    created_at: float
    deadline: float | None
    enqueued_at: float = 0.0
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    outcome: Outcome = field(default_factory=Outcome)
    deltas: MemoryObjectSendStream[str] | None = None
    attempts: int = 0
    retried: bool = False
    """Needed a second HTTP attempt (bisection halves do not count)."""
    dispatched_at: float | None = None
    abandoned: bool = False
    """The caller stopped waiting (cancelled or deadline); drop its result."""
    flight: Flight | None = None
    queued: bool = False
    """Waiting in a scheduler queue (maintained by the scheduler)."""

    @property
    def priority(self) -> Priority:
        return self.spec.priority

    @property
    def est_tokens(self) -> int:
        return self.spec.est_tokens


def _bad(message: str, name: str) -> InvalidRequestError:
    return InvalidRequestError(message, field=name)


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{name} must be a str, got {type(value).__name__}", name)
    if not value:
        raise _bad(f"{name} must not be empty", name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(f"{name} is not valid Unicode text ({exc.reason})", name) from None
    return value


def _check_messages(messages: object) -> tuple[Mapping[str, Any], ...]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise _bad("messages must be a list of {'role': ..., 'content': ...} dicts", "messages")
    if not messages:
        raise _bad("messages must not be empty", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _bad(f"messages[{i}] must be a dict, got {type(message).__name__}", "messages")
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise _bad(f"messages[{i}] has unknown role {role!r}", "messages")
        content = message.get("content")
        if isinstance(content, str):
            if content:
                _check_text(content, f"messages[{i}].content")
        elif content is None and role == "assistant":
            pass
        elif not isinstance(content, list):
            raise _bad(f"messages[{i}].content must be a str or a list of parts", "messages")
    return tuple(messages)


def _number(params: dict[str, Any], name: str, lo: float, hi: float) -> None:
    if name not in params or params[name] is None:
        return
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{name} must be a finite number, got {value!r}", name)
    if not lo <= value <= hi:
        raise _bad(f"{name} must be between {lo} and {hi}, got {value!r}", name)


def _positive_int(value: object, name: str, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{name} must be a positive int, got {value!r}", name)
    if upper is not None and value > upper:
        raise _bad(f"{name}={value} exceeds the server's max_model_len of {upper}", name)
    return value


def validate(
    *,
    kind: Kind,
    priority: Priority,
    model: str,
    prompt: object = None,
    messages: object = None,
    params: Mapping[str, Any],
    timeout: object,
    stream: bool,
    max_model_len: int | None,
) -> RequestSpec:
    """Check one call's input and build its :class:`RequestSpec`, or raise
    :class:`InvalidRequestError`."""
    text: str | None = None
    convo: tuple[Mapping[str, Any], ...] | None = None
    if kind == "completion":
        text = _check_text(prompt, "prompt")
        prompt_tokens = estimate_tokens(text)
        min_prompt_tokens = _min_tokens(text)
    else:
        convo = _check_messages(messages)
        chars = sum(len(m["content"]) for m in convo if isinstance(m.get("content"), str))
        prompt_tokens = chars // 4 + 4 * len(convo)
        min_prompt_tokens = 0
    checked = {k: v for k, v in params.items() if v is not None}
    max_tokens_given = checked.get("max_tokens")
    if max_tokens_given is not None:
        _positive_int(max_tokens_given, "max_tokens", max_model_len)
    n = _positive_int(checked.get("n", 1), "n")
    _number(checked, "temperature", 0.0, 100.0)
    _number(checked, "top_p", 0.0, 1.0)
    _number(checked, "presence_penalty", -2.0, 2.0)
    _number(checked, "frequency_penalty", -2.0, 2.0)
    stop = checked.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _bad("stop must be a str or a list of str", "stop")
    for reserved in ("prompt", "messages", "model", "stream", "stream_options", "priority"):
        if reserved in checked:
            raise _bad(
                f"{reserved!r} is set by llmbatch and cannot be passed as a parameter", reserved
            )
    params_key = _params_key(checked)
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise _bad(f"timeout must be a positive number of seconds, got {timeout!r}", "timeout")
    max_tokens = int(max_tokens_given or DEFAULT_MAX_TOKENS[kind])
    if max_model_len is not None and min_prompt_tokens + max_tokens > max_model_len:
        raise _bad(
            f"prompt (at least {min_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
            f"the server's max_model_len of {max_model_len}",
            "prompt",
        )
    return RequestSpec(
        kind=kind,
        priority=priority,
        model=model,
        prompt=text,
        messages=convo,
        params=checked,
        max_tokens=max_tokens,
        est_tokens=n * (prompt_tokens + max_tokens),
        n=n,
        timeout=float(timeout) if timeout is not None else None,
        stream=stream,
        # Streams never share a request: each caller reads its own SSE response.
        compat_key=(kind, model, params_key, stream and object()),
    )


#: Canonical JSON of recently seen parameter sets. A bulk map sends the same
#: parameters with every prompt, and encoding them each time was ~10% of client CPU.
_PARAMS_KEYS: dict[tuple[object, ...], str] = {}
_PARAMS_KEYS_MAX = 1024


def _params_key(params: Mapping[str, Any]) -> str:
    """The canonical JSON of ``params`` (what decides batch compatibility)."""
    try:
        # The value's type is part of the key: True == 1 == 1.0 but their JSON differs.
        cache_key: tuple[object, ...] | None = tuple(
            (k, type(v), v) for k, v in sorted(params.items())
        )
        cached = _PARAMS_KEYS.get(cache_key)  # type: ignore[arg-type]
    except TypeError:  # an unhashable value (a list of stop strings): no caching
        cache_key, cached = None, None
    if cached is not None:
        return cached
    try:
        encoded = json.dumps(params, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"parameters must be JSON-serialisable: {exc}") from None
    if cache_key is not None:
        if len(_PARAMS_KEYS) >= _PARAMS_KEYS_MAX:
            _PARAMS_KEYS.clear()
        _PARAMS_KEYS[cache_key] = encoded
    return encoded
