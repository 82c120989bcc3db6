"""The OpenAI-compatible wire format: request bodies, responses, errors, SSE.

Knows nothing of tiers or queues: it turns requests into JSON and JSON back into
per-request answers. vLLM specifics it honours (DESIGN.md): a list prompt yields
choices indexed ``prompt_idx * n + j`` and one ``usage`` for the whole request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from llmbatch._exceptions import APIStatusError, RemoteProtocolError, status_error_type
from llmbatch._models import Choice, Usage, trusted
from llmbatch._request import Request

__all__ = [
    "Answer",
    "chat_body",
    "completion_body",
    "error_from_response",
    "parse_chat",
    "parse_completions",
    "parse_sse_line",
    "split_usage",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server said for one request of a batch (usage not yet apportioned)."""

    id: str
    model: str
    choices: tuple[Choice, ...]
    role: str = "assistant"


def completion_body(requests: Sequence[Request], priority: int | None) -> bytes:
    """One /v1/completions body for compatible requests (a list prompt if several)."""
    spec = requests[0].spec
    prompts = [r.spec.prompt for r in requests]
    body: dict[str, Any] = dict(spec.params)
    body["model"] = spec.model
    body["prompt"] = prompts[0] if len(prompts) == 1 else prompts
    if priority is not None:
        body["priority"] = priority
    if spec.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def chat_body(request: Request, priority: int | None) -> bytes:
    """One /v1/chat/completions body (chat takes one conversation per request)."""
    spec = request.spec
    body: dict[str, Any] = dict(spec.params)
    body["model"] = spec.model
    body["messages"] = list(spec.messages or ())
    if priority is not None:
        body["priority"] = priority
    if spec.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def _load(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise RemoteProtocolError(f"the server sent invalid JSON: {content[:200]!r}") from exc


def _usage(data: Mapping[str, Any]) -> Usage:
    raw = data.get("usage") or {}
    try:
        return Usage(
            prompt_tokens=int(raw.get("prompt_tokens") or 0),
            completion_tokens=int(raw.get("completion_tokens") or 0),
            total_tokens=int(raw.get("total_tokens") or 0),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise RemoteProtocolError(f"the server sent a malformed usage: {raw!r}") from exc


def parse_completions(content: bytes, requests: Sequence[Request]) -> tuple[list[Answer], Usage]:
    """Demultiplex a (list-prompt) completions response into one Answer per request."""
    data = _load(content)
    n = requests[0].spec.n
    per_request: list[list[Choice | None]] = [[None] * n for _ in requests]
    try:
        for choice in data["choices"]:
            index = int(choice["index"])
            slot, j = divmod(index, n)
            per_request[slot][j] = trusted(
                Choice,
                text=str(choice.get("text") or ""),
                finish_reason=choice.get("finish_reason"),
            )
        response_id, model = str(data.get("id", "")), str(data.get("model", ""))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RemoteProtocolError(f"the server sent malformed choices: {exc!r}") from exc
    answers = []
    for choices in per_request:
        if any(c is None for c in choices):
            raise RemoteProtocolError("the server's response is missing choices for a prompt")
        answers.append(Answer(response_id, model, tuple(c for c in choices if c is not None)))
    return answers, _usage(data)


def parse_chat(content: bytes) -> tuple[Answer, Usage]:
    """A chat completion's first choice and usage."""
    data = _load(content)
    try:
        choice = data["choices"][0]
        message = choice["message"]
        answer = Answer(
            str(data.get("id", "")),
            str(data.get("model", "")),
            (
                Choice(
                    text=str(message.get("content") or ""),
                    finish_reason=choice.get("finish_reason"),
                ),
            ),
            role=str(message.get("role") or "assistant"),
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise RemoteProtocolError(f"the server sent a malformed chat response: {exc!r}") from exc
    return answer, _usage(data)


def parse_sse_line(line: bytes) -> Any | None:
    """The JSON of one ``data:`` line of a server-sent-event stream.

    Returns None for blank lines, comments and ``[DONE]``.
    """
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == b"[DONE]":
        return None
    return _load(payload)


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


def split_usage(
    usage: Usage, requests: Sequence[Request], answers: Sequence[Answer]
) -> list[Usage]:
    """Apportion one request's usage over its prompts.

    Prompt tokens go by prompt length. A choice that stopped for ``length`` used
    exactly the ``max_tokens`` it was sent with, so it gets that count; the rest
    of the completion tokens go by output length.
    """
    if len(requests) == 1:
        return [usage]
    prompt_parts = _largest_remainder(
        usage.prompt_tokens, [len(r.spec.prompt or "") for r in requests]
    )
    known = [
        sum(
            r.spec.max_tokens
            for c in a.choices
            if c.finish_reason == "length" and "max_tokens" in r.spec.params
        )
        for r, a in zip(requests, answers, strict=True)
    ]
    unknown_weights = [
        sum(len(c.text) for c in a.choices if c.finish_reason != "length")
        if "max_tokens" in r.spec.params
        else sum(len(c.text) for c in a.choices)
        for r, a in zip(requests, answers, strict=True)
    ]
    rest = usage.completion_tokens - sum(known)
    if rest < 0:  # the server counted differently; fall back to output length alone
        known = [0] * len(requests)
        unknown_weights = [sum(len(c.text) for c in a.choices) for a in answers]
        rest = usage.completion_tokens
    output_parts = [
        k + part for k, part in zip(known, _largest_remainder(rest, unknown_weights), strict=True)
    ]
    return [
        trusted(Usage, prompt_tokens=p, completion_tokens=c, total_tokens=p + c, estimated=True)
        for p, c in zip(prompt_parts, output_parts, strict=True)
    ]


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from datetime import UTC, datetime

        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


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
        retry_after=_retry_after(headers),
    )
