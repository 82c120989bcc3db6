"""Which keyword arguments a call may carry to the server: the OpenAI API's
parameters for the endpoint, and vLLM's documented extra sampling parameters.

A misspelt keyword (``maxtokens=5``) would otherwise reach the server and be
ignored, silently; openai-python raises ``TypeError`` for it, and so does llmbatch.
Anything else a server understands goes through ``extra_body={...}``, as in
openai-python.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from llmbatch._exceptions import InvalidRequestError, InvalidTypeError

__all__ = ["ALLOWED", "check_extra", "check_keywords", "nearest_parameter", "query_string"]

#: openai.completions.create's body parameters.
OPENAI_COMPLETIONS = frozenset(
    {
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)
#: openai.chat.completions.create's body parameters.
OPENAI_CHAT = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
#: vLLM's extra sampling parameters, on both endpoints.
VLLM_SAMPLING = frozenset(
    {
        "allowed_token_ids",
        "bad_words",
        "ignore_eos",
        "include_stop_str_in_output",
        "length_penalty",
        "min_p",
        "min_tokens",
        "prompt_logprobs",
        "repetition_penalty",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop_token_ids",
        "top_k",
        "truncate_prompt_tokens",
        "use_beam_search",
    }
)
#: vLLM's other extra parameters, on both endpoints.
VLLM_EXTRA = frozenset(
    {
        "add_special_tokens",
        "cache_salt",
        "guided_choice",
        "guided_decoding_backend",
        "guided_grammar",
        "guided_json",
        "guided_regex",
        "guided_whitespace_pattern",
        "kv_transfer_params",
        "logits_processors",
        "request_id",
        "response_format",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "structured_outputs",
        "vllm_xargs",
    }
)
#: vLLM's chat-only extra parameters.
VLLM_CHAT_EXTRA = frozenset(
    {
        "add_generation_prompt",
        "best_of",
        "chat_template",
        "chat_template_kwargs",
        "continue_final_message",
        "documents",
        "echo",
        "mm_processor_kwargs",
    }
)
ALLOWED = {
    "completion": OPENAI_COMPLETIONS | VLLM_SAMPLING | VLLM_EXTRA,
    "chat": OPENAI_CHAT | VLLM_SAMPLING | VLLM_EXTRA | VLLM_CHAT_EXTRA,
    "embedding": frozenset(
        {"dimensions", "encoding_format", "user", "truncate_prompt_tokens", "normalize"}
    )
    | {"add_special_tokens"},
}
#: Fields llmbatch sets itself; in ``extra_body`` they would break batching.
RESERVED = frozenset(
    {"prompt", "messages", "input", "model", "stream", "stream_options", "priority"}
)


def nearest_parameter(kind: str, name: str) -> str | None:
    """The endpoint's parameter closest to a misspelt ``name``, if one is close."""
    close = difflib.get_close_matches(name, ALLOWED[kind], n=1)
    return close[0] if close else None


def check_keywords(kind: str, method: str, params: Iterable[str]) -> None:
    """Raise a ``TypeError`` (:class:`InvalidTypeError`) for a keyword the endpoint
    does not take, suggesting the nearest one."""
    allowed = ALLOWED[kind]
    for name in params:
        if name in allowed:
            continue
        if name in RESERVED:
            raise InvalidRequestError(
                f"{name!r} is set by llmbatch and cannot be passed as a parameter", field=name
            )
        close = nearest_parameter(kind, name)
        hint = f"; did you mean {close!r}?" if close else ""
        raise InvalidTypeError(
            f"{method}() got an unexpected keyword argument {name!r}{hint} "
            "(a server-specific field goes in extra_body={...})",
            field=name,
        )


def check_extra(name: str, value: object, *, strings: bool = False) -> dict[str, Any]:
    """``extra_body`` / ``extra_headers`` / ``extra_query``: a mapping with str keys
    (and, for headers and queries, str values without line breaks)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"{name} must be a dict, got {type(value).__name__}", field=name)
    checked: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise InvalidTypeError(f"{name} keys must be non-empty str", field=name)
        if strings:
            if not isinstance(item, str):
                raise InvalidTypeError(f"{name}[{key!r}] must be a str", field=name)
            if any(c in item or c in key for c in "\r\n\0"):
                raise InvalidRequestError(f"{name}[{key!r}] contains a line break", field=name)
        elif key in RESERVED:
            raise InvalidRequestError(
                f"{name}[{key!r}] is set by llmbatch (pass it as an argument)", field=name
            )
        checked[key] = item
    return checked


def query_string(query: Mapping[str, str]) -> str:
    """``?a=1&b=2`` for ``extra_query`` (empty when there is none)."""
    if not query:
        return ""
    from urllib.parse import urlencode

    return "?" + urlencode(sorted(query.items()))
