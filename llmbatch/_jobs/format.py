"""The OpenAI Batch API line format, as read by ``llmbatch run`` and written back.

Input, one JSON object per line (the format of OpenAI's Batch API and
``vllm run-batch``)::

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}

Output, one line per custom_id::

    {"id": "batch_req_...", "custom_id": "q1",
     "response": {"status_code": 200, "request_id": "...", "body": {...}}, "error": null}

A failed request has ``error: {"code", "message"}``; ``response`` keeps the HTTP
status and the server's error body when the server answered, else it is null.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch._exceptions import APIStatusError, LLMBatchError, RequestError
from llmbatch._models import ChatCompletion, Completion, Usage
from llmbatch._request import Kind

__all__ = [
    "ENDPOINTS",
    "JobLine",
    "MalformedLine",
    "failure_record",
    "parse_line",
    "success_record",
    "to_map_input",
]

#: The endpoints a job line may name, and the kind of request each is.
ENDPOINTS: Mapping[str, Kind] = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
# Keys a map item dict would read as llmbatch options, not request parameters.
_UNSUPPORTED_KEYS = ("priority", "timeout", "metadata")


class MalformedLine(LLMBatchError):
    """An input line that cannot become a request; ``line_no`` counts from 1."""

    def __init__(self, line_no: int, reason: str) -> None:
        super().__init__(f"line {line_no}: {reason}")
        self.line_no = line_no
        self.reason = reason


@dataclass(frozen=True, slots=True)
class JobLine:
    """One valid input line."""

    line_no: int
    custom_id: str
    kind: Kind
    model: str | None
    body: Mapping[str, Any]


def parse_line(raw: bytes, line_no: int) -> JobLine | None:
    """Parse one input line; None for a blank line, :class:`MalformedLine` if invalid."""
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise MalformedLine(line_no, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MalformedLine(line_no, "not a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise MalformedLine(line_no, "custom_id must be a non-empty string")
    if data.get("method", "POST") != "POST":
        raise MalformedLine(line_no, f"method must be POST, got {data.get('method')!r}")
    url = data.get("url")
    kind = ENDPOINTS.get(url) if isinstance(url, str) else None
    if kind is None:
        raise MalformedLine(line_no, f"url must be one of {', '.join(ENDPOINTS)}, got {url!r}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise MalformedLine(line_no, "body must be a JSON object")
    return JobLine(line_no, custom_id, kind, _check_body(body, kind, line_no), body)


def _check_body(body: Mapping[str, Any], kind: Kind, line_no: int) -> str | None:
    """Reject what llmbatch cannot run faithfully; return the body's model."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise MalformedLine(line_no, "body.model must be a non-empty string")
    if kind == "completion":
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            # vLLM also takes lists and token ids; llmbatch batches single str prompts.
            raise MalformedLine(line_no, "body.prompt must be a non-empty string")
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise MalformedLine(line_no, "body.messages must be a non-empty list")
        if body.get("n", 1) != 1:
            raise MalformedLine(line_no, "chat requests with n > 1 are not supported")
    if body.get("stream"):
        raise MalformedLine(line_no, "streaming requests cannot run in a batch job")
    for key in _UNSUPPORTED_KEYS:
        if key in body:
            raise MalformedLine(line_no, f"body.{key} is not supported by llmbatch run")
    return model


def to_map_input(line: JobLine) -> dict[str, Any]:
    """The ``Client.map`` item for a line; its custom_id rides along as metadata."""
    item = {k: v for k, v in line.body.items() if k not in ("model", "stream", "stream_options")}
    item["metadata"] = line.custom_id
    return item


def success_record(custom_id: str, value: Completion | ChatCompletion) -> dict[str, Any]:
    """The output line for an answered request, its body shaped like the server's."""
    body: dict[str, Any] = {"id": value.id}
    choices: list[dict[str, Any]]
    if isinstance(value, Completion):
        body["object"] = "text_completion"
        choices = [
            {"index": j, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
            for j, c in enumerate(value.choices)
        ]
    else:
        body["object"] = "chat.completion"
        choices = [
            {
                "index": 0,
                "message": {"role": value.message.role, "content": value.message.content},
                "logprobs": None,
                "finish_reason": value.finish_reason,
            }
        ]
    body["created"] = int(time.time())
    body["model"] = value.model
    body["choices"] = choices
    body["usage"] = _usage(value.usage)
    return {
        "id": _record_id(),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": value.id, "body": body},
        "error": None,
    }


def failure_record(custom_id: str, error: LLMBatchError) -> dict[str, Any]:
    """The output line for a failed request."""
    response = None
    if isinstance(error, APIStatusError):
        response = {
            "status_code": error.status_code,
            "request_id": error.request_id,
            "body": error.body,
        }
    message = error.message if isinstance(error, RequestError) else str(error)
    return {
        "id": _record_id(),
        "custom_id": custom_id,
        "response": response,
        "error": {"code": error_code(error), "message": message},
    }


def error_code(error: BaseException) -> str:
    """``BadRequestError`` -> ``"bad_request_error"``: a stable, greppable code."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _record_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"
