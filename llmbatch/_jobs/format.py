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

import difflib
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch._calls.params import ALLOWED, nearest_parameter
from llmbatch._calls.request import Kind
from llmbatch._calls.spec import OWN_OPTIONS, check_call
from llmbatch._calls.validate import check_messages, check_prompt
from llmbatch._exceptions import (
    APIStatusError,
    InvalidRequestError,
    InvalidTypeError,
    LLMBatchError,
    RequestError,
    StructuredOutputError,
)
from llmbatch._models import ChatCompletion, Completion, Embedding, Result, Usage

__all__ = [
    "ENDPOINTS",
    "JobLine",
    "MalformedLine",
    "SchemaLine",
    "answer_of",
    "asks_for_json",
    "failure_record",
    "parse_line",
    "result_record",
    "success_record",
    "to_map_input",
]

#: The endpoints a job line may name, and the kind of request each is.
ENDPOINTS: Mapping[str, Kind] = {
    "/v1/completions": "completion",
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embedding",
}
#: The keys of a line, as OpenAI's Batch API defines them.
LINE_KEYS = ("custom_id", "method", "url", "body")
#: The body field that holds a line's input, by kind.
INPUT_FIELD: Mapping[Kind, str] = {"completion": "prompt", "chat": "messages", "embedding": "input"}
# Keys a map item dict would read as llmbatch options, not request parameters (the
# runner sets the model itself, and sends extra_body as the server's own fields).
_UNSUPPORTED_KEYS = (OWN_OPTIONS - {"model", "extra_body"}) | {"metadata"}
# Body fields the runner sets or drops itself.
_RUNNER_FIELDS = frozenset({"model", "stream", "stream_options"})


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


def _json_problem(exc: json.JSONDecodeError) -> str:
    """Where a line stops being JSON, by its column in the file's line (the decoder's
    own "line 2 column 1" counts lines inside the record, which the file does not
    have: a record cut short reaches the line's end)."""
    if exc.pos >= len(exc.doc.rstrip()):
        return f"not valid JSON: the line ends before the record does ({exc.msg})"
    return f"not valid JSON at column {exc.pos + 1}: {exc.msg}"


def parse_line(raw: bytes, line_no: int) -> JobLine | None:
    """Parse and check one input line; None for a blank line, :class:`MalformedLine`
    if it could not run as written (its reason in the file's words: ``body.max_tokns
    is not a parameter of /v1/completions; did you mean max_tokens?``)."""
    if not raw.strip():
        return None
    try:
        # utf-8-sig: a byte-order mark some editors put before the first line is not
        # part of the record.
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        bad = raw[exc.start]
        raise MalformedLine(
            line_no, f"not valid JSON: byte {exc.start + 1} of the line (0x{bad:02x}) is not UTF-8"
        ) from None
    except json.JSONDecodeError as exc:
        raise MalformedLine(line_no, _json_problem(exc)) from None
    if not isinstance(data, dict):
        raise MalformedLine(line_no, "not a JSON object")
    for key in data:
        if key not in LINE_KEYS:
            close = difflib.get_close_matches(str(key), LINE_KEYS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise MalformedLine(
                line_no, f"unknown key {key!r}{hint} (a line has {', '.join(LINE_KEYS)})"
            )
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
        raise MalformedLine(line_no, f"body must be a JSON object, got {_json_type(body)}")
    assert isinstance(url, str)
    try:
        model = _check_body(body, kind, url)
    except (InvalidRequestError, InvalidTypeError) as exc:
        raise MalformedLine(line_no, _in_body(exc)) from None
    return JobLine(line_no, custom_id, kind, model, body)


def _check_body(body: Mapping[str, Any], kind: Kind, url: str) -> str | None:
    """Check a body as the client would check the call it becomes, so that nothing
    fails at run time for a reason the file shows; return the body's model."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidTypeError("model must be a non-empty string", field="model")
    if body.get("stream"):
        raise InvalidRequestError(
            "stream must be false or left out: streaming requests cannot run in a batch job",
            field="stream",
        )
    field = INPUT_FIELD[kind]
    if field not in body:
        raise InvalidRequestError(f"{field} is missing (a {url} body needs one)", field=field)
    params: dict[str, Any] = {}
    for key, value in body.items():
        if key == field or key in _RUNNER_FIELDS or key == "extra_body":
            continue
        if key in _UNSUPPORTED_KEYS:
            raise InvalidRequestError(f"{key} is not supported by llmbatch run", field=key)
        if key not in ALLOWED[kind]:
            close = nearest_parameter(kind, key)
            hint = f"; did you mean {close}?" if close else ""
            raise InvalidTypeError(f"{key} is not a parameter of {url}{hint}", field=key)
        params[key] = value
    if kind == "chat" and params.get("n", 1) != 1:
        raise InvalidRequestError("n: chat requests with n > 1 are not supported", field="n")
    spec = check_call(
        kind,
        "run",
        {**params, "extra_body": body.get("extra_body")},
        tier="batch",
        # Checked before the server is known (no dialect): its dialect (vLLM's
        # guided_* fields translated or refused, say) applies when the client sends it.
        default_model=model or "the job's model",
    )
    given = body[field]
    if kind == "chat":
        check_messages(given, n=spec.n, max_tokens=spec.max_tokens)
    elif kind == "embedding" and isinstance(given, list):
        # One line is one result: a list would need its answers joined back together.
        raise InvalidTypeError(
            f"input must be one string, got a list of {len(given)} (put each text on a "
            "line of its own: llmbatch run batches lines itself)",
            field="input",
        )
    else:
        # vLLM also takes lists and token ids; llmbatch batches single str prompts.
        check_prompt(given, n=spec.n, max_tokens=spec.max_tokens, name=field)
    return model


def _in_body(error: InvalidRequestError | InvalidTypeError) -> str:
    """A call-site error in the file's terms: ``body.max_tokens must be ...``."""
    message = str(error)
    leading = re.match(r"[A-Za-z_][\w\[\]]*", message)
    if leading and error.field is not None and leading.group().startswith(error.field):
        return f"body.{message}"
    return f"body: {message}"


def _json_type(value: object) -> str:
    names = {str: "a string", list: "an array", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


class SchemaLine(str):
    """A line's custom_id (a map item's metadata) whose body asks for an answer in a
    JSON schema (``response_format``): its answer's JSON goes beside it as ``parsed``."""

    __slots__ = ()


def asks_for_json(body: Mapping[str, Any]) -> bool:
    """The body names a JSON answer: ``response_format`` ``json_schema`` or ``json_object``."""
    response_format = body.get("response_format")
    return isinstance(response_format, Mapping) and response_format.get("type") in (
        "json_schema",
        "json_object",
    )


def to_map_input(line: JobLine) -> dict[str, Any]:
    """The ``Client.map`` item for a line; its custom_id rides along as metadata."""
    item = {k: v for k, v in line.body.items() if k not in _RUNNER_FIELDS}
    item["metadata"] = SchemaLine(line.custom_id) if asks_for_json(line.body) else line.custom_id
    return item


def success_record(
    custom_id: str, value: Completion | ChatCompletion | Embedding
) -> dict[str, Any]:
    """The output line for an answered request, its body shaped like the server's."""
    if isinstance(value, Embedding):
        return _record(custom_id, value.id, _embedding_body(value))
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
    return _record(custom_id, value.id, body)


def _embedding_body(value: Embedding) -> dict[str, Any]:
    """An /v1/embeddings answer holding the line's one input."""
    return {
        "id": value.id,
        "object": "list",
        "created": int(time.time()),
        "model": value.model,
        "data": [{"object": "embedding", "index": 0, "embedding": value.embedding}],
        "usage": {
            "prompt_tokens": value.usage.prompt_tokens,
            "total_tokens": value.usage.total_tokens,
        },
    }


def _record(custom_id: str, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": _record_id(),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def answer_of(result: Result[Any]) -> Any:
    """The server's answer behind a map's result: its ``response`` with a response
    model (whose value is the validated object), else the value itself."""
    return result.response if result.response is not None else result.value


def result_record(
    custom_id: str, result: Result[Any], *, json_answer: bool = False
) -> dict[str, Any]:
    """The output line for a map's result: the answer (with a response model, the
    server's answer, and the validated object as ``parsed`` beside it; with
    ``json_answer``, a body that asked for JSON, the answer's JSON as ``parsed``),
    or the error (with the answer it failed on, when there was one)."""
    answer = answer_of(result)
    if result.error is None:
        assert isinstance(answer, Completion | ChatCompletion | Embedding)
        record = success_record(custom_id, answer)
        if result.response is not None:
            record["parsed"] = result.to_dict()["value"]
        elif json_answer and not isinstance(answer, Embedding):
            try:
                record["parsed"] = json.loads(answer.text)
            except ValueError as exc:  # the server ignored the schema, or was cut off
                failed = failure_record(
                    custom_id,
                    StructuredOutputError(f"the answer is not JSON: {exc}", text=answer.text),
                )
                failed["response"] = record["response"]
                return failed
        return record
    record = failure_record(custom_id, result.error)
    if isinstance(answer, Completion | ChatCompletion):  # it answered, wrongly
        record["response"] = success_record(custom_id, answer)["response"]
    return record


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
