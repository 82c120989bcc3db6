"""Which keyword arguments a call may carry to the server: the OpenAI API's
parameters for the endpoint, and vLLM's documented extra sampling parameters.

A misspelt keyword (``maxtokens=5``) would otherwise reach the server and be
ignored, silently; openai-python raises ``TypeError`` for it, and so does llmbatch.
Anything else a server understands goes through ``extra_body={...}``, as in
openai-python.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmbatch._exceptions import InvalidRequestError, InvalidTypeError

__all__ = [
    "ALLOWED",
    "ChatFields",
    "CompletionFields",
    "EmbeddingFields",
    "Fields",
    "check_extra",
    "check_keywords",
    "keys_of",
    "nearest_parameter",
    "query_string",
]


if TYPE_CHECKING:
    from typing import TypedDict as Fields
else:

    class Fields:
        """What the declarations below are at run time: plain classes, whose
        annotations (strings) name the keys. To a type checker they are TypedDicts;
        as TypedDicts at run time each key would become a compiled ForwardRef, some
        milliseconds of ``import llmbatch`` for about ninety keys."""

        def __init_subclass__(cls, **options: object) -> None:
            super().__init_subclass__()


def keys_of(fields: type) -> frozenset[str]:
    """The keys a declaration names, its bases' included."""
    return frozenset(
        key for klass in fields.__mro__ for key in vars(klass).get("__annotations__", {})
    )


class SharedFields(Fields, total=False):
    """Body fields both text endpoints take: the OpenAI API's shared sampling
    parameters, and vLLM's extra sampling and request parameters."""

    # OpenAI, both endpoints.
    frequency_penalty: float | None
    logit_bias: Mapping[str, int] | None
    logprobs: int | bool | None
    max_tokens: int | None
    n: int | None
    presence_penalty: float | None
    seed: int | None
    stop: str | Sequence[str] | None
    temperature: float | None
    top_p: float | None
    user: str | None
    best_of: int | None
    echo: bool | None
    # vLLM's extra sampling parameters.
    allowed_token_ids: Sequence[int] | None
    bad_words: Sequence[str] | None
    ignore_eos: bool | None
    include_stop_str_in_output: bool | None
    length_penalty: float | None
    min_p: float | None
    min_tokens: int | None
    prompt_logprobs: int | None
    repetition_penalty: float | None
    skip_special_tokens: bool | None
    spaces_between_special_tokens: bool | None
    stop_token_ids: Sequence[int] | None
    top_k: int | None
    truncate_prompt_tokens: int | None
    use_beam_search: bool | None
    # vLLM's other extra parameters (``guided_*``: vLLM before 0.12).
    add_special_tokens: bool | None
    cache_salt: str | None
    guided_choice: Sequence[str] | None
    guided_decoding_backend: str | None
    guided_grammar: str | None
    guided_json: str | Mapping[str, Any] | None
    guided_regex: str | None
    guided_whitespace_pattern: str | None
    kv_transfer_params: Mapping[str, Any] | None
    logits_processors: Sequence[Any] | None
    request_id: str | None
    response_format: Mapping[str, Any] | type | None
    return_token_ids: bool | None
    return_tokens_as_token_ids: bool | None
    session_id: str | None
    structured_outputs: Mapping[str, Any] | None
    vllm_xargs: Mapping[str, Any] | None


class CompletionFields(SharedFields, total=False):
    """``/v1/completions`` body fields (``openai.completions.create``'s and vLLM's)."""

    suffix: str | None


class ChatFields(SharedFields, total=False):
    """``/v1/chat/completions`` body fields (``openai.chat.completions.create``'s
    and vLLM's chat extras)."""

    audio: Mapping[str, Any] | None
    function_call: str | Mapping[str, Any] | None
    functions: Sequence[Mapping[str, Any]] | None
    max_completion_tokens: int | None
    metadata: Mapping[str, str] | None
    modalities: Sequence[str] | None
    parallel_tool_calls: bool | None
    prediction: Mapping[str, Any] | None
    prompt_cache_key: str | None
    reasoning_effort: str | None
    safety_identifier: str | None
    service_tier: str | None
    store: bool | None
    tool_choice: str | Mapping[str, Any] | None
    tools: Sequence[Mapping[str, Any]] | None
    top_logprobs: int | None
    verbosity: str | None
    web_search_options: Mapping[str, Any] | None
    # vLLM's chat-only extras.
    add_generation_prompt: bool | None
    chat_template: str | None
    chat_template_kwargs: Mapping[str, Any] | None
    continue_final_message: bool | None
    documents: Sequence[Mapping[str, str]] | None
    mm_processor_kwargs: Mapping[str, Any] | None


class EmbeddingFields(Fields, total=False):
    """``/v1/embeddings`` body fields (OpenAI's and vLLM's)."""

    dimensions: int | None
    encoding_format: str | None
    user: str | None
    truncate_prompt_tokens: int | None
    normalize: bool | None
    add_special_tokens: bool | None


ALLOWED = {
    "completion": keys_of(CompletionFields),
    "chat": keys_of(ChatFields),
    "embedding": keys_of(EmbeddingFields),
}
"""The body fields each endpoint takes, by kind: what a call may pass as keywords."""
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
