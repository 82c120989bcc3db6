"""Call-site validation of inputs: bad input raises here, before anything is queued
or sent, and touches no other request.

Each prompt or conversation is checked on its own (a call's options are checked
once per distinct set, in ``_callspec``), and so are the options' basic values.
Wrong types raise :class:`InvalidTypeError` (also a ``TypeError``), bad values
:class:`InvalidRequestError` (also a ``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch._exceptions import InvalidRequestError, InvalidTypeError

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "TOKEN_OVERHEAD",
    "bad_value",
    "check_max_retries",
    "check_messages",
    "check_prompt",
    "check_tenant",
    "check_timeout",
    "input_bytes",
    "positive_int",
    "wrong_type",
]

#: ``max_tokens`` assumed for budgeting when the caller gives none (vLLM's default for
#: /v1/completions is 16; chat has none, so budget a typical answer).
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 512, "embedding": 0}
_CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
#: Tokens a tokenizer may add beyond one per byte (BOS, chat template markers).
TOKEN_OVERHEAD = 16


def bad_value(message: str, name: str) -> InvalidRequestError:
    return InvalidRequestError(message, field=name)


def wrong_type(name: str, expected: str, value: object) -> InvalidTypeError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return InvalidTypeError(
        f"{name} must be {expected}, got {type(value).__name__} {shown}", field=name
    )


def positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(name, "a positive int", value)
    if value < 1:
        raise bad_value(f"{name} must be a positive int, got {value!r}", name)
    return value


def check_timeout(value: object) -> float | None:
    """A call's deadline in seconds: a positive finite number, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise wrong_type("timeout", "a number of seconds or None", value)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise bad_value(f"timeout must be a positive number of seconds, got {value!r}", "timeout")
    return seconds


def check_max_retries(value: object) -> int | None:
    """Retries after the first attempt: an int >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type("max_retries", "an int >= 0", value)
    if value < 0:
        raise bad_value(f"max_retries must be >= 0, got {value}", "max_retries")
    return value


#: Longer names are refused: a tenant labels stats and metrics.
MAX_TENANT_LENGTH = 256


def check_tenant(value: object) -> str | None:
    """A call's ``tenant``: None (the shared default tenant) or a printable str."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise wrong_type("tenant", "a str or None", value)
    if not value or len(value) > MAX_TENANT_LENGTH or not value.isprintable():
        raise bad_value(
            f"tenant must be 1 to {MAX_TENANT_LENGTH} printable characters, got {value!r:.80}",
            "tenant",
        )
    return value


def check_prompt(
    prompt: object,
    *,
    n: int,
    max_tokens: int,
    max_model_len: int | None = None,
    name: str = "prompt",
) -> int:
    """Check one completion prompt (or embedding ``input``) of a call that asks for
    ``n`` answers of up to ``max_tokens``; returns its in-flight token estimate."""
    if not isinstance(prompt, str):
        raise wrong_type(name, "a str", prompt)
    if not prompt:
        raise bad_value(f"{name} must not be empty", name)
    size = len(prompt)
    if not prompt.isascii():
        try:
            size = len(prompt.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise bad_value(f"{name} is not valid Unicode text ({exc.reason})", name) from None
    if max_model_len is not None:
        # A lower bound for any common tokenizer: no token spans more than 16 bytes of
        # ordinary text, so this never refuses a prompt the server would take.
        at_least = size // 16
        if at_least + max_tokens > max_model_len:
            raise bad_value(
                f"{name} (at least {at_least} tokens) + max_tokens ({max_tokens}) exceeds "
                f"the server's max_model_len of {max_model_len}",
                name,
            )
    return n * (len(prompt) // 4 + 1 + max_tokens)


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
        raise wrong_type(name, "a str", value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise bad_value(f"{name} is not valid Unicode text ({exc.reason})", name) from None
    return value


def check_messages(
    messages: object, *, n: int, max_tokens: int
) -> tuple[tuple[Mapping[str, Any], ...], int]:
    """Check one conversation of a call that asks for ``n`` answers of up to
    ``max_tokens``; returns it as a tuple, and its in-flight token estimate."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise wrong_type("messages", "a list of {'role': ..., 'content': ...} dicts", messages)
    if not messages:
        raise bad_value("messages must not be empty", "messages")
    chars = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise wrong_type(f"messages[{i}]", "a dict", message)
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise bad_value(f"messages[{i}] has unknown role {role!r}", "messages")
        content = message.get("content")
        if isinstance(content, str):
            _check_text(content, f"messages[{i}].content")
            chars += len(content)
        elif content is None and role == "assistant":
            pass
        elif not isinstance(content, list):
            raise wrong_type(f"messages[{i}].content", "a str or a list of parts", content)
    prompt_tokens = chars // 4 + 4 * len(messages)
    return tuple(messages), n * (prompt_tokens + max_tokens)
