"""Call-site validation: bad input raises here, before anything is queued or sent, and
touches no other request.

A call's options (tier, sampling parameters, timeout) are checked once per distinct
set and cached as a :class:`CallSpec`, since a bulk map or a burst of ``complete()``
calls repeats the same options for every prompt; each prompt or conversation is
still checked on its own. Wrong types raise :class:`InvalidTypeError` (also a
``TypeError``), bad values :class:`InvalidRequestError` (also a ``ValueError``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from llmbatch._config import parse_priority
from llmbatch._exceptions import InvalidRequestError, InvalidTypeError
from llmbatch._params import check_extra, check_keywords, query_string
from llmbatch._request import CallSpec, Kind

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "TOKEN_OVERHEAD",
    "SpecCache",
    "check_messages",
    "check_prompt",
    "input_bytes",
    "validate_options",
]

#: ``max_tokens`` assumed for budgeting when the caller gives none (vLLM's default for
#: /v1/completions is 16; chat has none, so budget a typical answer).
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 512, "embedding": 0}
_CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
#: Tokens a tokenizer may add beyond one per byte (BOS, chat template markers).
TOKEN_OVERHEAD = 16


def _bad(message: str, name: str) -> InvalidRequestError:
    return InvalidRequestError(message, field=name)


def _wrong_type(name: str, expected: str, value: object) -> InvalidTypeError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return InvalidTypeError(
        f"{name} must be {expected}, got {type(value).__name__} {shown}", field=name
    )


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(name, "a positive int", value)
    if value < 1:
        raise _bad(f"{name} must be a positive int, got {value!r}", name)
    return value


def _number(params: Mapping[str, Any], name: str, lo: float, hi: float) -> None:
    value = params.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(name, "a number", value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise _bad(f"{name} must be a finite number between {lo} and {hi}, got {value!r}", name)


def check_timeout(value: object) -> float | None:
    """A call's deadline in seconds: a positive finite number, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type("timeout", "a number of seconds or None", value)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise _bad(f"timeout must be a positive number of seconds, got {value!r}", "timeout")
    return seconds


def check_max_retries(value: object) -> int | None:
    """Retries after the first attempt: an int >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type("max_retries", "an int >= 0", value)
    if value < 0:
        raise _bad(f"max_retries must be >= 0, got {value}", "max_retries")
    return value


def validate_options(
    *,
    kind: Kind,
    priority: object,
    model: object,
    params: Mapping[str, Any],
    timeout: object,
    stream: bool,
    max_model_len: int | None,
    method: str = "complete",
    extra_body: object = None,
    extra_headers: object = None,
    extra_query: object = None,
    max_retries: object = None,
    tenant: object = None,
    tenant_as_user: bool = True,
) -> CallSpec:
    """Check a call's options and build its :class:`CallSpec`, or raise."""
    tier = parse_priority(priority)
    who = check_tenant(tenant)
    if not isinstance(model, str) or not model:
        raise _wrong_type("model", "a non-empty str", model)
    checked = {k: v for k, v in params.items() if v is not None}
    check_keywords(kind, method, checked)
    # extra_body goes to the server as it is (like openai-python), after the checked
    # keywords, and what it sets counts (n, max_tokens) as if passed as keywords.
    checked.update(check_extra("extra_body", extra_body))
    headers = tuple(sorted(check_extra("extra_headers", extra_headers, strings=True).items()))
    query = query_string(check_extra("extra_query", extra_query, strings=True))
    if who is not None and tenant_as_user and "user" not in checked:
        # OpenAI's own field for who a request is for: servers can count by it.
        checked["user"] = who
    if kind == "chat" and "max_tokens" not in checked and "max_completion_tokens" in checked:
        checked["max_tokens"] = checked.pop("max_completion_tokens")
    max_tokens_given = checked.get("max_tokens")
    if max_tokens_given is not None:
        _positive_int(max_tokens_given, "max_tokens")
        if max_model_len is not None and max_tokens_given > max_model_len:
            raise _bad(
                f"max_tokens={max_tokens_given} exceeds the server's max_model_len of "
                f"{max_model_len}",
                "max_tokens",
            )
    n = _positive_int(checked.get("n", 1), "n")
    _number(checked, "temperature", 0.0, 100.0)
    _number(checked, "top_p", 0.0, 1.0)
    _number(checked, "presence_penalty", -2.0, 2.0)
    _number(checked, "frequency_penalty", -2.0, 2.0)
    stop = checked.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _wrong_type("stop", "a str or a list of str", stop)
    deadline = check_timeout(timeout)
    try:
        params_json = json.dumps(checked, sort_keys=True, allow_nan=False)
    except TypeError as exc:  # a value JSON has no type for (an object, a set)
        raise InvalidTypeError(f"parameters must be JSON-serialisable: {exc}") from None
    except ValueError as exc:  # the right type, a bad value (NaN, infinity)
        raise InvalidRequestError(f"parameters must be JSON-serialisable: {exc}") from None
    retries = check_max_retries(max_retries)
    attempts = None if retries is None else retries + 1
    assert isinstance(model, str)
    return CallSpec(
        kind=kind,
        priority=tier,
        model=model,
        params=checked,
        params_json=params_json,
        max_tokens=int(max_tokens_given or DEFAULT_MAX_TOKENS[kind]),
        n=n,
        timeout=deadline,
        stream=stream,
        headers=headers,
        query=query,
        attempts=attempts,
        tenant=who,
    )


#: Longer names are refused: a tenant labels stats and metrics.
MAX_TENANT_LENGTH = 256


def check_tenant(value: object) -> str | None:
    """A call's ``tenant``: None (the shared default tenant) or a printable str."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong_type("tenant", "a str or None", value)
    if not value or len(value) > MAX_TENANT_LENGTH or not value.isprintable():
        raise _bad(
            f"tenant must be 1 to {MAX_TENANT_LENGTH} printable characters, got {value!r:.80}",
            "tenant",
        )
    return value


class CallOptions(NamedTuple):
    """One call's own options, as given (None: left out). Sampling parameters travel
    beside it as a dict."""

    priority: object = None
    model: object = None
    timeout: object = None
    max_retries: object = None
    max_tokens: object = None
    extra_body: object = None
    extra_headers: object = None
    extra_query: object = None
    tenant: object = None

    @property
    def extras(self) -> tuple[object, object, object] | None:
        """``(extra_body, extra_headers, extra_query)``; None when none is given (the
        common case, which the spec cache keys cheaply)."""
        body, headers, query = self.extra_body, self.extra_headers, self.extra_query
        if body is None and headers is None and query is None:
            return None
        return (body, headers, query)


class SpecCache:
    """Validated :class:`CallSpec` objects by the options that made them.

    ``model`` is the client's default model and ``max_model_len`` its context length
    (None if the server did not say; another model's is not known here, so its
    prompts are not checked against one). Bounded: past ``size`` distinct option
    sets it starts afresh.
    """

    def __init__(
        self,
        model: str,
        max_model_len: int | None,
        *,
        size: int = 512,
        tenant_as_user: bool = True,
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.tenant_as_user = tenant_as_user
        """A call's tenant is sent as OpenAI's ``user`` (unless it has its own)."""
        self._size = size
        self._specs: dict[tuple[object, ...], CallSpec] = {}

    def context_of(self, model: str) -> int | None:
        """A model's context length, when the server told it."""
        return self.max_model_len if model == self.model else None

    def get(
        self,
        kind: Kind,
        method: str,
        tier: str,
        options: CallOptions,
        params: Mapping[str, Any],
        *,
        stream: bool = False,
    ) -> CallSpec:
        """The spec for one call's options (validated on first sight; raises if
        invalid). ``tier`` is the method's own default when the call names none."""
        priority = tier if options.priority is None else options.priority
        max_tokens, timeout, max_retries = options.max_tokens, options.timeout, options.max_retries
        extras = options.extras
        try:
            # The value's type is part of the key: True == 1 == 1.0, but not as JSON.
            key: tuple[object, ...] | None = (
                kind,
                priority,
                type(max_tokens),
                max_tokens,
                type(timeout),
                timeout,
                stream,
                options.model,
                method,
                type(max_retries),
                max_retries,
                tuple([(k, type(v), v) for k, v in params.items()]),
                None if extras is None else tuple(_freeze(e) for e in extras),
                options.tenant,
            )
            spec = self._specs.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable value (a list of stop strings): not cached
            key, spec = None, None
        if spec is not None:
            return spec
        if max_tokens is not None:
            params = {**params, "max_tokens": max_tokens}
        name = self.model if options.model is None else options.model
        spec = validate_options(
            kind=kind,
            priority=priority,
            model=name,
            params=params,
            timeout=timeout,
            stream=stream,
            max_model_len=self.context_of(name) if isinstance(name, str) else None,
            method=method,
            extra_body=options.extra_body,
            extra_headers=options.extra_headers,
            extra_query=options.extra_query,
            max_retries=max_retries,
            tenant=options.tenant,
            tenant_as_user=self.tenant_as_user,
        )
        if key is not None:
            if len(self._specs) >= self._size:
                self._specs.clear()
            self._specs[key] = spec
        return spec


def _freeze(value: object) -> object:
    """A hashable stand-in for an extra_* mapping (raises TypeError if it has none)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    hash(value)
    return (type(value), value)


def check_prompt(
    prompt: object, spec: CallSpec, max_model_len: int | None, name: str = "prompt"
) -> int:
    """Check one completion prompt (or embedding ``input``); returns its in-flight
    token estimate."""
    if not isinstance(prompt, str):
        raise _wrong_type(name, "a str", prompt)
    if not prompt:
        raise _bad(f"{name} must not be empty", name)
    size = len(prompt)
    if not prompt.isascii():
        try:
            size = len(prompt.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise _bad(f"{name} is not valid Unicode text ({exc.reason})", name) from None
    if max_model_len is not None:
        # A lower bound for any common tokenizer: no token spans more than 16 bytes of
        # ordinary text, so this never refuses a prompt the server would take.
        at_least = size // 16
        if at_least + spec.max_tokens > max_model_len:
            raise _bad(
                f"{name} (at least {at_least} tokens) + max_tokens ({spec.max_tokens}) exceeds "
                f"the server's max_model_len of {max_model_len}",
                name,
            )
    return spec.n * (len(prompt) // 4 + 1 + spec.max_tokens)


def input_bytes(prompt: str | None, messages: tuple[Mapping[str, Any], ...] | None) -> int:
    """A prompt's or conversation's size in UTF-8 bytes: no tokenizer makes more
    tokens than bytes (plus a few special tokens), so it bounds the token count."""
    if prompt is not None:
        return len(prompt) if prompt.isascii() else len(prompt.encode("utf-8"))
    total = 0
    for message in messages or ():
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.encode("utf-8")) + 8  # per-message template markers
    return total


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _wrong_type(name, "a str", value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _bad(f"{name} is not valid Unicode text ({exc.reason})", name) from None
    return value


def check_messages(messages: object, spec: CallSpec) -> tuple[tuple[Mapping[str, Any], ...], int]:
    """Check one conversation; returns it as a tuple, and its in-flight token estimate."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise _wrong_type("messages", "a list of {'role': ..., 'content': ...} dicts", messages)
    if not messages:
        raise _bad("messages must not be empty", "messages")
    chars = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _wrong_type(f"messages[{i}]", "a dict", message)
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise _bad(f"messages[{i}] has unknown role {role!r}", "messages")
        content = message.get("content")
        if isinstance(content, str):
            _check_text(content, f"messages[{i}].content")
            chars += len(content)
        elif content is None and role == "assistant":
            pass
        elif not isinstance(content, list):
            raise _wrong_type(f"messages[{i}].content", "a str or a list of parts", content)
    prompt_tokens = chars // 4 + 4 * len(messages)
    return tuple(messages), spec.n * (prompt_tokens + spec.max_tokens)
