"""The OpenAI Batch API line format: parsing input lines, building output records."""

from __future__ import annotations

import json

import pytest

from llmbatch import (
    BadRequestError,
    ChatCompletion,
    ChatMessage,
    Choice,
    Completion,
    ConnectError,
    InvalidRequestError,
    Timings,
    Usage,
)
from llmbatch._jobs.format import (
    MalformedLine,
    error_code,
    failure_record,
    parse_line,
    success_record,
    to_map_input,
)

TIMINGS = Timings(queued=0.0, latency=0.1, batch_size=2, attempts=1)


def raw(data: object) -> bytes:
    return json.dumps(data).encode() + b"\n"


def test_parses_a_completions_line_and_maps_it_to_a_map_item() -> None:
    line = parse_line(
        raw(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": False},
            }
        ),
        7,
    )
    assert line is not None
    assert (line.line_no, line.custom_id, line.kind, line.model) == (7, "a", "completion", "m")
    assert to_map_input(line) == {"prompt": "hi", "max_tokens": 3, "metadata": "a"}


def test_parses_a_chat_line_without_model_or_method() -> None:
    messages = [{"role": "user", "content": "hi"}]
    line = parse_line(
        raw({"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": messages}}), 1
    )
    assert line is not None
    assert (line.kind, line.model) == ("chat", None)
    assert to_map_input(line) == {"messages": messages, "metadata": "c"}


def test_a_server_specific_field_goes_in_extra_body() -> None:
    body = {"prompt": "p", "extra_body": {"my_field": 1}}
    line = parse_line(raw({**GOOD, "body": body}), 3)
    assert line is not None
    assert to_map_input(line) == {**body, "metadata": "x"}
    with pytest.raises(MalformedLine, match=r"body.extra_body must be a dict, got int"):
        parse_line(raw({**GOOD, "body": {"prompt": "p", "extra_body": 5}}), 3)


def test_a_line_is_checked_without_a_server_in_mind() -> None:
    # The line check runs before the server is known: vLLM's guided fields stay as
    # written, for the client to send in the dialect of the server it finds (they
    # would be refused if the line were checked as for an unknown server).
    body = {"prompt": "p", "extra_body": {"guided_regex": "[a-z]+", "guided_choice": ["a"]}}
    line = parse_line(raw({**GOOD, "body": body}), 3)
    assert line is not None
    assert to_map_input(line) == {**body, "metadata": "x"}


def test_parses_an_embeddings_line() -> None:
    line = parse_line(raw({**EMBED, "body": {"input": "t", "model": "e", "dimensions": 8}}), 2)
    assert line is not None
    assert (line.kind, line.model) == ("embedding", "e")
    assert to_map_input(line) == {"input": "t", "dimensions": 8, "metadata": "x"}


@pytest.mark.parametrize("blank", [b"\n", b"   \n", b""])
def test_blank_lines_are_skipped(blank: bytes) -> None:
    assert parse_line(blank, 3) is None


GOOD = {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}
CHAT = {
    "custom_id": "x",
    "url": "/v1/chat/completions",
    "body": {"messages": [{"role": "user", "content": "x"}]},
}
EMBED = {"custom_id": "x", "url": "/v1/embeddings", "body": {"input": "some text"}}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{not json\n", "not valid JSON"),
        (b"\xff\xfe\n", "not valid JSON"),
        (raw([1, 2]), "not a JSON object"),
        (raw({**GOOD, "custom_id": ""}), "custom_id must be a non-empty string"),
        (raw({**GOOD, "custom_id": 5}), "custom_id must be a non-empty string"),
        (raw({**GOOD, "method": "GET"}), "method must be POST"),
        (raw({**GOOD, "url": "/v1/responses"}), "url must be one of"),
        (raw({**GOOD, "body": "prompt"}), "body must be a JSON object, got a string"),
        (raw({**GOOD, "body": {"prompt": ["a", "b"]}}), "body.prompt must be a str"),
        (raw({**GOOD, "body": {"prompt": ""}}), "body.prompt must not be empty"),
        (raw({**GOOD, "body": {"max_tokens": 3}}), r"body.prompt is missing \(a /v1/completions"),
        (raw({**GOOD, "body": {"prompt": "p", "model": 3}}), "body.model must be"),
        (raw({**GOOD, "body": {"prompt": "p", "stream": True}}), "body.stream must be false"),
        (raw({**GOOD, "body": {"prompt": "p", "priority": 1}}), "body.priority is not"),
        (raw({**GOOD, "body": {"prompt": "p", "metadata": {}}}), "body.metadata is not"),
        (
            raw({**GOOD, "url": "/v1/chat/completions", "body": {"messages": []}}),
            "body.messages must not be empty",
        ),
        (
            raw(
                {
                    **GOOD,
                    "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": "x"}], "n": 2},
                }
            ),
            "n > 1",
        ),
        # What the client would refuse at run time is refused here, in the file's words.
        (
            raw({**GOOD, "body": {"prompt": "p", "max_tokns": 16}}),
            "^line 42: body.max_tokns is not a parameter of /v1/completions; "
            "did you mean max_tokens[?]$",
        ),
        (
            raw({**CHAT, "body": {**CHAT["body"], "temprature": 0.5}}),
            "body.temprature is not a parameter of /v1/chat/completions; did you mean temperature",
        ),
        (
            raw({**GOOD, "body": {"prompt": "p", "max_tokens": -5}}),
            "body.max_tokens must be a positive int, got -5$",
        ),
        (
            raw({**GOOD, "body": {"prompt": "p", "temperature": 500}}),
            "body.temperature must be a finite number",
        ),
        (raw({**GOOD, "body": {"prompt": "p", "stop": 3}}), "body.stop must be a str or a list"),
        (
            raw({**GOOD, "body": {"prompt": "p", "messages": []}}),
            "body.messages is not a parameter of /v1/completions",
        ),
        (
            raw({**GOOD, "body": {"prompt": "p", "input": "x"}}),
            "body.input is not a parameter of /v1/completions",
        ),
        (
            raw({**CHAT, "body": {"messages": [{"role": "wizard", "content": "x"}]}}),
            r"body.messages\[0\] has unknown role 'wizard'",
        ),
        (
            raw({**GOOD, "body": {"prompt": "p", "seed": float("nan")}}),
            "body: parameters must be JSON-serialisable",
        ),
        (
            raw({"custom_id": "x", "url": "/v1/completions", "bdy": {}}),
            "unknown key 'bdy'; did you mean body[?]",
        ),
        (
            raw({**EMBED, "body": {"input": ["a", "b"]}}),
            "body.input must be one string, got a list of 2",
        ),
        (
            raw({**EMBED, "body": {"input": "a", "temperature": 1}}),
            "body.temperature is not a parameter of /v1/embeddings",
        ),
        (raw({**EMBED, "body": {"prompt": "a"}}), "body.input is missing"),
    ],
)
def test_malformed_lines_name_their_line_and_reason(line: bytes, reason: str) -> None:
    with pytest.raises(MalformedLine, match=reason) as info:
        parse_line(line, 42)
    assert info.value.line_no == 42
    assert str(info.value).startswith("line 42: ")


def test_success_record_for_a_completion_has_the_openai_shape() -> None:
    value = Completion(
        id="cmpl-9",
        model="m",
        choices=(Choice(text="a", finish_reason="length"), Choice(text="b", finish_reason="stop")),
        usage=Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5, estimated=True),
        timings=TIMINGS,
    )
    record = success_record("q1", value)
    assert record["id"].startswith("batch_req_")
    assert record["custom_id"] == "q1"
    assert record["error"] is None
    response = record["response"]
    assert (response["status_code"], response["request_id"]) == (200, "cmpl-9")
    body = response["body"]
    assert (body["id"], body["object"], body["model"]) == ("cmpl-9", "text_completion", "m")
    assert isinstance(body["created"], int)
    assert body["choices"] == [
        {"index": 0, "text": "a", "logprobs": None, "finish_reason": "length"},
        {"index": 1, "text": "b", "logprobs": None, "finish_reason": "stop"},
    ]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_success_record_for_a_chat_completion() -> None:
    value = ChatCompletion(
        id="chat-1",
        model="m",
        message=ChatMessage(role="assistant", content="hello"),
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        timings=TIMINGS,
    )
    body = success_record("c", value)["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]


def test_failure_record_keeps_the_http_status_and_server_body() -> None:
    server_body = {"error": {"message": "too long", "code": 400}}
    error = BadRequestError("too long", body=server_body, request_id="req-7", attempts=1)
    record = failure_record("q", error)
    assert record["response"] == {"status_code": 400, "request_id": "req-7", "body": server_body}
    assert record["error"] == {"code": "bad_request_error", "message": "too long"}


def test_failure_record_without_an_http_answer_has_no_response() -> None:
    record = failure_record("q", ConnectError("refused", request_id="r", attempts=5))
    assert record["response"] is None
    assert record["error"] == {"code": "connect_error", "message": "refused"}
    invalid = failure_record("q", InvalidRequestError("max_tokens must be a positive int"))
    assert invalid["error"]["code"] == "invalid_request_error"


def test_error_codes_are_snake_case_class_names() -> None:
    assert error_code(BadRequestError("x")) == "bad_request_error"
    assert error_code(ValueError()) == "value_error"
