"""The OpenAI-compatible wire format, sans I/O: request bodies in, per-request answers,
errors and stream chunks out.

Knows nothing of tiers, queues or sockets, so every parser is tested on bytes alone.
vLLM specifics it honours (see the design notes): a list prompt yields choices
indexed ``prompt_idx * n + j`` and one ``usage`` for the whole request; the chat
batch route answers ``choices[i]`` for conversation ``i``; errors after a 200
arrive in the stream as ``data: {"error": ...}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmbatch._calls.request import Request
from llmbatch._calls.spec import CallSpec
from llmbatch._chunks import ChatCompletionChunk, Chunk, CompletionChunk, make_chunk
from llmbatch._exceptions import APIStatusError, RemoteProtocolError, status_error_type
from llmbatch._models import RawUsage
from llmbatch._servers.kinds import PRIORITY_REFUSED, TOO_LONG
from llmbatch._servers.limits.wait import retry_after

__all__ = [
    "Answers",
    "StreamDecoder",
    "TooLong",
    "chat_batch_body",
    "chat_body",
    "completion_body",
    "embedding_body",
    "error_from_response",
    "error_message",
    "parse_chat",
    "parse_chat_batch",
    "parse_completions",
    "parse_embeddings",
    "priority_refused",
    "split_cached",
    "split_usage",
    "too_long",
]


# -- request bodies ------------------------------------------------------------------


def _prefix(spec: CallSpec) -> bytes:
    """The JSON body without its closing brace: parameters and model, made once per spec
    (a bulk map sends the same parameters with every batch)."""
    prefix = spec.body_prefix
    if prefix is None:
        body = dict(spec.params)
        body["model"] = spec.model
        if spec.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        prefix = spec.body_prefix = json.dumps(body).encode()[:-1]
    return prefix


def _body(spec: CallSpec, key: bytes, value: object, priority: int | None) -> bytes:
    tail = b"}" if priority is None else b', "priority": %d}' % priority
    return b"".join((_prefix(spec), b', "', key, b'": ', json.dumps(value).encode(), tail))


def completion_body(requests: Sequence[Request], priority: int | None) -> bytes:
    """One /v1/completions body for compatible requests (a list prompt if several)."""
    if len(requests) == 1:
        return _body(requests[0].spec, b"prompt", requests[0].prompt, priority)
    return _body(requests[0].spec, b"prompt", [r.prompt for r in requests], priority)


def chat_body(request: Request, priority: int | None) -> bytes:
    """One /v1/chat/completions body (one conversation)."""
    return _body(request.spec, b"messages", request.messages, priority)


def embedding_body(requests: Sequence[Request], priority: int | None) -> bytes:
    """One /v1/embeddings body: ``input`` is the list of texts (or the one text)."""
    if len(requests) == 1:
        return _body(requests[0].spec, b"input", requests[0].prompt, priority)
    return _body(requests[0].spec, b"input", [r.prompt for r in requests], priority)


def chat_batch_body(requests: Sequence[Request], priority: int | None) -> bytes:
    """One /v1/chat/completions/batch body: ``messages`` is a list of conversations."""
    return _body(requests[0].spec, b"messages", [r.messages for r in requests], priority)


# -- responses -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answers:
    """One response demultiplexed: each request's choice dicts, and the whole usage."""

    id: str
    model: str
    created: int
    choices: list[tuple[Mapping[str, Any], ...]]
    """Per request (in the order sent), its ``n`` choice dicts in index order."""
    usage: RawUsage
    """The response's usage (prompt, completion, total, estimated=False)."""
    system_fingerprint: str | None = None
    cached: int = 0
    """Of its prompt tokens, those the server read from its prompt cache, where its
    usage says (``prompt_tokens_details.cached_tokens``): they may cost less."""


def _load(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise RemoteProtocolError(f"the server sent invalid JSON: {content[:200]!r}") from exc


def _usage(data: Mapping[str, Any]) -> RawUsage:
    raw = data.get("usage") or {}
    try:
        prompt = int(raw.get("prompt_tokens") or 0)
        completion = int(raw.get("completion_tokens") or 0)
        total = int(raw.get("total_tokens") or prompt + completion)
    except (TypeError, ValueError, AttributeError) as exc:
        raise RemoteProtocolError(f"the server sent a malformed usage: {raw!r}") from exc
    return (prompt, completion, total, False)


def cached_tokens(data: Mapping[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (0: not said, or not a count)."""
    usage = data.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0 else 0


def _header(data: Any) -> tuple[str, str, int]:
    if not isinstance(data, Mapping):
        raise RemoteProtocolError(f"the server sent a {type(data).__name__}, not an object")
    created = data.get("created")
    return (
        str(data.get("id", "")),
        str(data.get("model", "")),
        created if isinstance(created, int) else 0,
    )


def _fingerprint(data: Mapping[str, Any]) -> str | None:
    value = data.get("system_fingerprint")
    return value if isinstance(value, str) else None


def _demultiplex(choices: object, count: int, n: int) -> list[tuple[Mapping[str, Any], ...]]:
    """Group choice dicts by request: choice ``index`` = request slot * n + j."""
    if not isinstance(choices, list):
        raise RemoteProtocolError("the server's response has no choices list")
    try:
        if n == 1 and len(choices) == count:
            slots: list[Any] = [None] * count
            for choice in choices:
                slots[choice["index"]] = (choice,)
            if None not in slots:
                return slots
        grouped: list[list[Any]] = [[None] * n for _ in range(count)]
        for choice in choices:
            slot, j = divmod(int(choice["index"]), n)
            grouped[slot][j] = choice
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RemoteProtocolError(f"the server sent malformed choices: {exc!r}") from exc
    if any(c is None for per in grouped for c in per):
        raise RemoteProtocolError("the server's response is missing choices for a prompt")
    return [tuple(per) for per in grouped]


def parse_completions(content: bytes, requests: Sequence[Request]) -> Answers:
    """Demultiplex a (list-prompt) completions response into each request's choices."""
    data = _load(content)
    id_, model, created = _header(data)
    choices = _demultiplex(data.get("choices"), len(requests), requests[0].spec.n)
    return Answers(
        id_, model, created, choices, _usage(data), _fingerprint(data), cached_tokens(data)
    )


def parse_chat(content: bytes, n: int = 1) -> Answers:
    """A chat completion's ``n`` choices and usage (one conversation)."""
    data = _load(content)
    id_, model, created = _header(data)
    choices = _demultiplex(data.get("choices"), 1, n)
    if not all(isinstance(c.get("message"), Mapping) for c in choices[0]):
        raise RemoteProtocolError("the server sent a chat choice without a message")
    return Answers(
        id_, model, created, choices, _usage(data), _fingerprint(data), cached_tokens(data)
    )


def parse_embeddings(content: bytes, requests: Sequence[Request]) -> Answers:
    """An embeddings response: ``data[i]`` (by its ``index``) is input ``i``'s vector."""
    data = _load(content)
    id_, model, created = _header(data)
    items = _demultiplex(data.get("data"), len(requests), 1)
    if not all("embedding" in item[0] for item in items):
        raise RemoteProtocolError("the server sent an embedding without its vector")
    return Answers(id_, model, created, items, _usage(data), None, cached_tokens(data))


def parse_chat_batch(content: bytes, requests: Sequence[Request]) -> Answers:
    """A chat batch response: ``choices[i]`` answers conversation ``i``."""
    data = _load(content)
    id_, model, created = _header(data)
    choices = _demultiplex(data.get("choices"), len(requests), 1)
    if not all(isinstance(c[0].get("message"), Mapping) for c in choices):
        raise RemoteProtocolError("the server sent a chat choice without a message")
    return Answers(
        id_, model, created, choices, _usage(data), _fingerprint(data), cached_tokens(data)
    )


# -- usage apportioning --------------------------------------------------------------


def _largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` in proportion to ``weights``; the parts sum to ``total`` exactly."""
    weight_sum = sum(weights)
    if weight_sum <= 0:
        weights = [1] * len(weights)
        weight_sum = len(weights)
    raw = [total * w / weight_sum for w in weights]
    parts = [int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - parts[i], reverse=True)
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _output_chars(choices: tuple[Mapping[str, Any], ...], *, skip_length: bool) -> int:
    total = 0
    for choice in choices:
        if skip_length and choice.get("finish_reason") == "length":
            continue
        text = choice.get("text")
        if not isinstance(text, str):
            message = choice.get("message")
            text = message.get("content") if isinstance(message, Mapping) else None
        total += len(text) if isinstance(text, str) else 0
    return total


def _input_chars(request: Request) -> int:
    if request.prompt is not None:
        return len(request.prompt)
    messages = request.messages or ()
    return sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))


def split_cached(cached: int, prompts: Sequence[int], prompt_total: int) -> list[int]:
    """Apportion a batch's cached prompt tokens by each request's prompt tokens,
    summing exactly to ``cached`` (never more than a request's prompt)."""
    if prompt_total <= 0:
        return [0] * len(prompts)
    cached = min(cached, prompt_total)
    parts = [cached * p // prompt_total for p in prompts]
    short = cached - sum(parts)
    for i in sorted(range(len(prompts)), key=lambda i: prompts[i] - parts[i], reverse=True):
        if short <= 0:
            break
        if parts[i] < prompts[i]:
            parts[i] += 1
            short -= 1
    return parts


def split_usage(
    usage: RawUsage,
    requests: Sequence[Request],
    choices: Sequence[tuple[Mapping[str, Any], ...]],
    *,
    of_first: bool = False,
) -> tuple[list[int], list[int]]:
    """Apportion one response's usage over the requests it answered: (prompt tokens,
    completion tokens) per request, summing exactly to the response's counts.

    Prompt tokens go by input length. A choice that stopped for ``length`` used
    exactly the ``max_tokens`` it was sent with, so it gets that count; the rest
    of the completion tokens go by output length.

    ``of_first``: the server's usage counts the first request alone (llama.cpp's
    server for a list of prompts), which then gets it exactly; the others are
    estimated from it (:func:`_from_first`), and the parts sum to more than the
    response's counts.
    """
    if len(requests) == 1:
        return [usage[0]], [usage[1]]
    if of_first:
        return _from_first(usage, requests, choices)
    prompt_total, completion_total = usage[0], usage[1]
    inputs: list[int] = []
    known: list[int] = []
    weights: list[int] = []
    for request, answered in zip(requests, choices, strict=True):
        inputs.append(_input_chars(request))
        spec = request.spec
        if len(answered) == 1:  # the common case, without the generic loops
            choice = answered[0]
            stopped_for_length = choice.get("finish_reason") == "length"
            if spec.max_tokens_given and stopped_for_length:
                known.append(spec.max_tokens)
                weights.append(0)
                continue
            known.append(0)
            weights.append(_output_chars(answered, skip_length=False))
            continue
        lengths = sum(1 for c in answered if c.get("finish_reason") == "length")
        known.append(spec.max_tokens * lengths if spec.max_tokens_given else 0)
        weights.append(_output_chars(answered, skip_length=spec.max_tokens_given))
    rest = completion_total - sum(known)
    if rest < 0:  # the server counted differently; fall back to output length alone
        known = [0] * len(requests)
        weights = [_output_chars(cs, skip_length=False) for cs in choices]
        rest = completion_total
    prompt_parts = _largest_remainder(prompt_total, inputs)
    if rest == 0:
        return prompt_parts, known
    output_parts = _largest_remainder(rest, weights)
    return prompt_parts, [k + part for k, part in zip(known, output_parts, strict=True)]


def _from_first(
    usage: RawUsage,
    requests: Sequence[Request],
    choices: Sequence[tuple[Mapping[str, Any], ...]],
) -> tuple[list[int], list[int]]:
    """Counts for a batch whose usage is its first request's: the first gets them;
    each other request's prompt goes by its input length at the first's tokens a
    character, and its completion likewise by output length, at most its
    ``max_tokens``; a request whose every choice stopped for ``length`` counts its
    ``max_tokens`` unless the first stopped for ``length`` too, with fewer (a context
    full before ``max_tokens``), where it counts as many as the first."""
    first_prompt, first_completion = usage[0], usage[1]
    first_input = _input_chars(requests[0])
    first_output = _output_chars(choices[0], skip_length=False)
    first_stopped = all(c.get("finish_reason") == "length" for c in choices[0])
    prompts = [first_prompt]
    completions = [first_completion]
    for request, answered in zip(requests[1:], choices[1:], strict=True):
        chars = _input_chars(request)
        prompts.append(round(chars * first_prompt / first_input) if first_input else first_prompt)
        spec = request.spec
        most = spec.max_tokens * len(answered)
        stopped = all(c.get("finish_reason") == "length" for c in answered)
        if stopped and spec.max_tokens_given:
            completions.append(min(most, first_completion) if first_stopped else most)
            continue
        output = _output_chars(answered, skip_length=False)
        estimate = round(output * first_completion / first_output) if first_output else 0
        completions.append(min(most, estimate) if spec.max_tokens_given else estimate)
    return prompts, completions


# -- errors --------------------------------------------------------------------------


def error_message(data: Any, fallback: str) -> str:
    """The human message of an OpenAI/vLLM error body, in any of its shapes."""
    if isinstance(data, Mapping):
        error = data.get("error", data)
        if isinstance(error, Mapping):
            return str(error.get("message") or error.get("detail") or fallback)
        if isinstance(error, str):
            return error
        if "message" in data:
            return str(data["message"])
    return fallback


def error_from_response(status: int, headers: Mapping[str, str], content: bytes) -> APIStatusError:
    """The typed error for an HTTP error response, with the server's own message."""
    try:
        data: Any = json.loads(content) if content else None
    except ValueError:
        data = content.decode("utf-8", "replace")[:500]
    fallback = f"HTTP {status}" + (f": {data}" if isinstance(data, str) and data else "")
    return status_error_type(status)(
        error_message(data, fallback),
        status_code=status,
        body=data,
        retry_after=retry_after(headers),
        should_retry=_SHOULD_RETRY.get(headers.get("x-should-retry", "").strip().lower()),
    )


#: ``x-should-retry``: the server's own word on whether to retry (OpenAI sends it).
_SHOULD_RETRY = {"true": True, "false": False}


# -- what servers say in their error messages -----------------------------------------

#: The input's token count in a too-long refusal (each kind's words for the refusal
#: are in its module of ``_servers``), which rules out prompts too short to have it.
_INPUT_TOKENS = re.compile(
    r"(?P<a>\d+) in the messages"
    r"|has (?P<b>\d+) input tokens"
    r"|(?P<c>\d+) tokens from the input"
    r"|input \((?P<d>\d+) tokens\)"
    r"|Given: (?P<e>\d+) `inputs` tokens"
)


@dataclass(frozen=True, slots=True)
class TooLong:
    """A server's refusal of a prompt longer than its context."""

    limit: int | None
    """The context length it names (None: it does not say)."""
    input_tokens: int | None
    """How many tokens the offending input has (None: it does not say)."""


def too_long(message: str) -> TooLong | None:
    """Whether an error message says a prompt exceeds the context, and the counts."""
    for rule in TOO_LONG:
        match = rule.search(message)
        if match is not None:
            limit = match.groupdict().get("limit")
            counted = _INPUT_TOKENS.search(message)
            tokens = next((g for g in counted.groups() if g), None) if counted else None
            return TooLong(
                int(limit) if limit else None, int(tokens) if tokens is not None else None
            )
    return None


#: vLLM's refusal of a list of prompts longer than ``VLLM_MAX_COMPLETION_PROMPTS``:
#: "prompt list length 1500 exceeds the maximum allowed count of 1024. ..."
_PROMPT_CAP = re.compile(r"list length \d+ exceeds the maximum allowed count of (\d+)")


def prompt_cap(message: str) -> int | None:
    """The most prompts a list may hold, when an error message says so."""
    match = _PROMPT_CAP.search(message)
    return int(match.group(1)) if match is not None and int(match.group(1)) > 0 else None


def priority_refused(message: str) -> bool:
    """The server refuses the ``priority`` field (vLLM without priority scheduling)."""
    return any(rule.search(message) for rule in PRIORITY_REFUSED)


# -- streams -------------------------------------------------------------------------


class StreamDecoder:
    """The server-sent events of one streamed completion or chat: bytes in, one chunk
    (:class:`CompletionChunk` or :class:`ChatCompletionChunk`) per event out, with the
    text, finish reason, ids and usage kept as they arrive for the final answer.

    ``chunks=False`` hands out each event's text instead (empty if it has none):
    what ``stream()`` reads, without making an object per event. ``feed`` takes any
    chunking of the body; ``feed_line`` one line without its newline. An error
    event (vLLM reports failures after the 200 in the stream) raises the matching
    :class:`APIStatusError`.
    """

    def __init__(self, *, chat: bool = False, chunks: bool = True) -> None:
        self._buffer = b""
        self._kind = ChatCompletionChunk if chat else CompletionChunk
        self._chunks = chunks
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.id = ""
        self.model = ""
        self.created = 0
        self.role = "assistant"
        self.usage: RawUsage = (0, 0, 0, False)
        self.cached = 0
        self.done = False
        """``data: [DONE]`` arrived."""

    @property
    def text(self) -> str:
        """Everything generated so far."""
        return "".join(self.parts)

    def feed(self, data: bytes) -> list[Chunk | str]:
        """The chunks (or texts) of the complete lines in ``data`` (plus what was
        buffered)."""
        lines = (self._buffer + data).split(b"\n")
        self._buffer = lines.pop()
        out: list[Chunk | str] = []
        for line in lines:
            item = self.feed_line(line.rstrip(b"\r"))
            if item is not None:
                out.append(item)
        return out

    def feed_line(self, line: bytes) -> Chunk | str | None:
        """The chunk of one line (or its text, with ``chunks=False``); None for
        comments, blank lines and ``[DONE]``."""
        if not line.startswith(b"data:"):
            return None
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return None
        if not payload:
            return None
        event = _load(payload)
        if not isinstance(event, Mapping):
            return None
        if "error" in event:
            error = event["error"]
            code = error.get("code") if isinstance(error, Mapping) else None
            status = code if isinstance(code, int) and code >= 400 else 500
            raise status_error_type(status)(
                error_message(event, "error in stream"), status_code=status, body=event
            )
        self.id = str(event.get("id", self.id))
        self.model = str(event.get("model", self.model))
        created = event.get("created")
        if isinstance(created, int):
            self.created = created
        text = ""
        for choice in event.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                piece = delta.get("content")
                role = delta.get("role")
                if isinstance(role, str):
                    self.role = role
            else:
                piece = choice.get("text")
            if isinstance(piece, str) and piece:
                self.parts.append(piece)
                text += piece
            finish = choice.get("finish_reason")
            if isinstance(finish, str):
                self.finish_reason = finish
        if event.get("usage"):
            self.usage = _usage(event)
            self.cached = cached_tokens(event)
        if not self._chunks:
            return text
        chunk: Chunk = make_chunk(self._kind, event, text)
        return chunk

    def choice(self, *, chat: bool) -> dict[str, Any]:
        """The accumulated answer as the non-streaming response's choice dict."""
        if chat:
            return {
                "index": 0,
                "message": {"role": self.role, "content": self.text},
                "finish_reason": self.finish_reason,
            }
        return {"index": 0, "text": self.text, "finish_reason": self.finish_reason}
