"""Parse and validate request bodies the way vLLM's OpenAI server does.

Every problem becomes an :class:`ApiError` carrying vLLM's status and message,
so a client sees the same error JSON it would get from a real server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmbatch_server.sim import tokenizer


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def type(self) -> str:
        return {
            400: "BadRequestError",
            401: "AuthenticationError",
            404: "NotFoundError",
            429: "RateLimitError",
            503: "ServiceUnavailableError",
        }.get(self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True, kw_only=True)
class Generation:
    """A validated completion or chat request."""

    chat: bool
    prompts: list[str]  # for chat: the conversation rendered by the chat template
    prompt_tokens: list[int]
    n: int
    max_tokens: int | None  # None: whatever the context leaves
    ignore_eos: bool
    min_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    priority: int
    stream: bool
    include_usage: bool


_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def parse(
    body: object, *, chat: bool, model: str, max_model_len: int, poison: tuple[str, ...]
) -> Generation:
    """Validate ``body`` for ``/v1/completions`` (``chat=False``) or chat completions."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    requested = body.get("model")
    if requested is not None and requested != model:
        raise ApiError(404, f"The model `{requested}` does not exist.", param="model")
    prompts = _messages(body.get("messages")) if chat else _prompts(body.get("prompt"))
    for text in prompts:
        for marker in poison:
            if marker in text:
                raise ApiError(
                    400,
                    f"prompt rejected: contains {marker!r} (simulated bad input)",
                    param="prompt",
                )
    key = "max_completion_tokens" if chat and body.get("max_tokens") is None else "max_tokens"
    default = None if chat else 16
    max_tokens = _int(body, key, default, minimum=1)
    counts = [tokenizer.count_tokens(p) for p in prompts]
    for count in counts:
        wanted = count + (max_tokens or 0)
        if count >= max_model_len or wanted > max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {wanted} tokens ({count} in the messages, {max_tokens or 0} in the "
                "completion). Please reduce the length of the messages or completion.",
                param="prompt" if not chat else "messages",
            )
    temperature = body.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or math.isnan(temperature) or temperature < 0
    ):
        raise ApiError(400, "temperature must be a non-negative number", param="temperature")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return Generation(
        chat=chat,
        prompts=prompts,
        prompt_tokens=counts,
        n=_int(body, "n", 1, minimum=1) or 1,
        max_tokens=max_tokens,
        ignore_eos=_bool(body, "ignore_eos"),
        min_tokens=_int(body, "min_tokens", 0, minimum=0) or 0,
        stop=_stop(body.get("stop")),
        seed=_int(body, "seed", None, minimum=None),
        priority=_int(body, "priority", 0, minimum=None) or 0,
        stream=_bool(body, "stream"),
        include_usage=bool(stream_options.get("include_usage")),
    )


def _prompts(prompt: object) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(t, int) for t in prompt):
            return [" ".join(map(str, prompt))]  # one prompt of token ids
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return [" ".join(map(str, p)) for p in prompt]
    raise ApiError(
        400, "prompt must be a string, a non-empty list of strings or token ids", param="prompt"
    )


def _messages(messages: object) -> list[str]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ApiError(400, f"messages[{i}] needs a valid role", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", param="messages")
        rendered.append(f"<|{message['role']}|>{content}")
    rendered.append("<|assistant|>")
    return ["\n".join(rendered)]


def _int(
    body: dict[str, Any], name: str, default: int | None, *, minimum: int | None
) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer", param=name)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}", param=name)
    return value


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean", param=name)
    return value


def _stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise ApiError(400, "stop must be a string or a list of strings", param="stop")
