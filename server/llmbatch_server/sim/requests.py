"""Parse and validate request bodies the way vLLM's OpenAI server does.

Every problem becomes an :class:`ApiError` carrying vLLM's status and message,
so a client sees the same error JSON it would get from a real server.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from llmbatch_server.sim.counting import TokenCounter
from llmbatch_server.sim.errors import ApiError
from llmbatch_server.sim.schema import Constraint, constraint_of


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
    #: vLLM's ``cache_salt``: only requests with the same salt share cached blocks.
    cache_salt: str | None = None
    #: Each prompt's token ids, when the caller asked for them (the prefix cache).
    prompt_ids: list[list[int]] | None = None
    #: OpenAI's ``user``: who the request is for (counted per user at ``/metrics``).
    user: str | None = None
    #: What the answer is constrained to (a JSON schema, a choice); None: free text.
    constraint: Constraint | None = None


_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def parse(
    body: object,
    *,
    chat: bool,
    model: str,
    max_model_len: int,
    poison: tuple[str, ...],
    counter: TokenCounter,
    keep_ids: bool = False,
) -> Generation:
    """Validate ``body`` for ``/v1/completions`` (``chat=False``) or chat completions.

    ``keep_ids``: tokenize the prompts fully (``Generation.prompt_ids``), not just count.
    """
    body = _object(body)
    check_model(body, model)
    prompts = _messages(body.get("messages")) if chat else _prompts(body.get("prompt"))
    return _generation(
        body,
        prompts,
        chat=chat,
        max_model_len=max_model_len,
        poison=poison,
        counter=counter,
        keep_ids=keep_ids,
    )


def parse_batch_chat(
    body: object,
    *,
    model: str,
    max_model_len: int,
    poison: tuple[str, ...],
    counter: TokenCounter,
    keep_ids: bool = False,
) -> Generation:
    """Validate ``body`` for ``/v1/chat/completions/batch`` (vLLM 0.19+).

    ``messages`` is a list of conversations sharing one set of sampling
    parameters; each becomes one prompt, so choice ``i`` answers conversation
    ``i``. As in vLLM, the request-model checks (conversation shape, ``n``, no
    streaming, no tools, no beam search) come before the model check, and one
    conversation too long for the context fails the whole request.
    """
    body = _object(body)
    conversations = body.get("messages")
    if not isinstance(conversations, list) or not conversations:
        raise ApiError(
            400,
            "1 validation error:\n  messages: must be a non-empty list of conversations",
            param="messages",
            error_type="Bad Request",
        )
    for i, conversation in enumerate(conversations):
        if not isinstance(conversation, list) or not conversation:
            raise ApiError(
                400,
                f"1 validation error:\n  messages.{i}: a conversation must be a non-empty list",
                param="messages",
                error_type="Bad Request",
            )
    _check_batch_mode(body)
    check_model(body, model)
    prompts = [_messages(c, where=f"messages[{i}]")[0] for i, c in enumerate(conversations)]
    return _generation(
        body,
        prompts,
        chat=True,
        max_model_len=max_model_len,
        poison=poison,
        counter=counter,
        keep_ids=keep_ids,
    )


def _check_batch_mode(body: dict[str, Any]) -> None:
    """What vLLM's ``BatchChatCompletionRequest`` refuses."""
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError.validation(
            "Batch chat completions do not support `n > 1`. Please set `n` to 1.",
            param="n",
            value=n,
        )
    if body.get("use_beam_search"):
        raise ApiError.validation(
            "Batch chat completions do not support beam search. "
            "Please set `use_beam_search` to False.",
            param="use_beam_search",
        )
    # vLLM documents these two as unsupported, but releases up to at least 0.26
    # accepted them (stream=true gave empty choices, tools were dropped:
    # vllm#50026; the proposed fixes reject them). The simulator follows the contract.
    if body.get("stream") or body.get("stream_options") is not None:
        raise ApiError.validation(
            "Batch chat completions do not support streaming. Please set `stream` to False.",
            param="stream",
        )
    if body.get("tools") is not None:
        raise ApiError.validation(
            "Batch chat completions do not support tool use. Please omit `tools`.",
            param="tools",
        )
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "none"):
        # vLLM types the field Literal["none"], so pydantic rejects anything else.
        raise ApiError(
            400,
            "1 validation error:\n  tool_choice: Input should be 'none'",
            param="tool_choice",
            error_type="Bad Request",
        )


def _object(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], model: str) -> None:
    """404 for a ``model`` other than the served one, as vLLM answers."""
    requested = body.get("model")
    if requested is not None and requested != model:
        raise ApiError(404, f"The model `{requested}` does not exist.", param="model")


def _generation(
    body: dict[str, Any],
    prompts: list[str],
    *,
    chat: bool,
    max_model_len: int,
    poison: tuple[str, ...],
    counter: TokenCounter,
    keep_ids: bool,
) -> Generation:
    """The checks and fields every generation route shares."""
    check_poison(prompts, poison)
    key = "max_completion_tokens" if chat and body.get("max_tokens") is None else "max_tokens"
    default = None if chat else 16
    max_tokens = _int(body, key, default, minimum=1)
    prompt_ids = [counter.encode(p) for p in prompts] if keep_ids else None
    counts = [len(ids) for ids in prompt_ids] if prompt_ids else [counter.count(p) for p in prompts]
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
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ApiError.validation(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
            param="cache_salt",
        )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError.validation("Parameter 'user' must be a string if provided.", param="user")
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
        cache_salt=cache_salt,
        prompt_ids=prompt_ids,
        user=user,
        constraint=constraint_of(body),
    )


def check_poison(prompts: list[str], poison: tuple[str, ...]) -> None:
    """400 for a prompt containing a ``--poison`` marker (fails the whole request)."""
    for text in prompts:
        for marker in poison:
            if marker in text:
                raise ApiError(
                    400,
                    f"prompt rejected: contains {marker!r} (simulated bad input)",
                    param="prompt",
                )


def render_chat(messages: object) -> str:
    """A conversation as the simulator's chat template renders it."""
    return _messages(messages)[0]


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def check_prompt_count(prompt: object, limit: int) -> None:
    """400 for a list of more prompts than ``limit``, in vLLM's words (its
    ``VLLM_MAX_COMPLETION_PROMPTS`` check, before anything else is read)."""
    if (
        isinstance(prompt, list)
        and len(prompt) > limit
        and not all(isinstance(t, int) for t in prompt)
    ):
        raise ApiError.validation(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of {limit}. "
            "To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            param="prompt",
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


def _messages(messages: object, where: str = "messages") -> list[str]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, f"{where} must be a non-empty list", param="messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ApiError(400, f"{where}[{i}] needs a valid role", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise ApiError(400, f"{where}[{i}].content must be a string", param="messages")
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
