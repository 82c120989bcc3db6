"""The wire format on bytes alone: bodies out, each request's answer in.

(What servers say in their error messages: test_wire_messages.py.)
"""

from __future__ import annotations

import json

import pytest
from factories import make_request as make

from llmbatch import RateLimitError, ServerError
from llmbatch._servers.wire import (
    StreamDecoder,
    completion_body,
    error_from_response,
    parse_chat_batch,
    parse_completions,
    split_usage,
)


def test_one_prompt_is_a_string_several_a_list_and_the_priority_is_appended() -> None:
    one = json.loads(completion_body([make(prompt="a")], None))
    assert one["prompt"] == "a"
    assert "priority" not in one
    several = json.loads(completion_body([make(prompt="a"), make(prompt="b")], 2))
    assert several["prompt"] == ["a", "b"]
    assert several["priority"] == 2
    assert several["max_tokens"] == 10


def test_a_list_prompts_choices_come_back_to_their_requests_by_index() -> None:
    requests = [make(prompt=p) for p in ("a", "b", "c")]
    body = {
        "id": "cmpl-1",
        "model": "m",
        "created": 7,
        # Out of order on purpose: vLLM indexes choices prompt_idx * n + j.
        "choices": [
            {"index": 2, "text": "C", "finish_reason": "stop"},
            {"index": 0, "text": "A", "finish_reason": "length"},
            {"index": 1, "text": "B", "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
    }
    answers = parse_completions(json.dumps(body).encode(), requests)
    assert [c[0]["text"] for c in answers.choices] == ["A", "B", "C"]
    assert answers.usage[:3] == (9, 6, 15)
    prompts, completions = split_usage(answers.usage, requests, answers.choices)
    assert sum(prompts) == 9  # apportioned, and exactly the server's totals
    assert sum(completions) == 6


def test_a_usage_of_the_first_prompt_alone_is_estimated_for_the_others() -> None:
    # llama.cpp's server answers a list of prompts with its first prompt's response
    # object, the other choices appended: usage counts the first alone.
    requests = [make(prompt=p, max_tokens=8) for p in ("abcd", "abcdefgh", "ab")]
    choices = [
        ({"index": 0, "text": "x" * 16, "finish_reason": "stop"},),
        ({"index": 1, "text": "y" * 8, "finish_reason": "stop"},),
        ({"index": 2, "text": "z" * 99, "finish_reason": "length"},),
    ]
    usage = (2, 4, 6, False)
    prompts, completions = split_usage(usage, requests, choices, of_first=True)
    assert prompts == [2, 4, 1]  # the first's tokens a character: 0.5
    assert completions == [4, 2, 8]  # its 0.25 a character; length: max_tokens
    # Read as the whole list's, the same counts are spread thin.
    assert sum(split_usage(usage, requests, choices)[1]) == 4


def test_a_first_prompt_cut_short_by_its_context_bounds_the_others_that_were() -> None:
    # Each stopped for length before max_tokens (the slot's context was full).
    requests = [make(prompt="ab", max_tokens=64) for _ in range(3)]
    choices = [({"index": i, "text": "w" * 40, "finish_reason": "length"},) for i in range(3)]
    prompts, completions = split_usage((6, 48, 54, False), requests, choices, of_first=True)
    assert prompts == [6, 6, 6]
    assert completions == [48, 48, 48]


def test_the_chat_batch_route_answers_conversation_i_with_choice_i() -> None:
    requests = [make(), make()]
    body = {
        "id": "chat-1",
        "model": "m",
        "created": 1,
        "choices": [
            {"index": 1, "message": {"role": "assistant", "content": "second"}},
            {"index": 0, "message": {"role": "assistant", "content": "first"}},
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
    answers = parse_chat_batch(json.dumps(body).encode(), requests)
    assert [c[0]["message"]["content"] for c in answers.choices] == ["first", "second"]


def test_an_error_response_is_typed_with_the_servers_message_and_retry_after() -> None:
    error = error_from_response(
        429, {"retry-after": "2"}, b'{"error": {"message": "slow down", "code": 429}}'
    )
    assert isinstance(error, RateLimitError)
    assert error.message == "slow down"
    assert error.retry_after == 2.0
    plain = error_from_response(502, {}, b"<html>bad gateway</html>")
    assert isinstance(plain, ServerError)
    assert "bad gateway" in plain.message


def test_a_stream_decodes_across_any_chunking_and_keeps_the_answer() -> None:
    events = [
        {"id": "s", "model": "m", "created": 3, "choices": [{"index": 0, "text": "Hel"}]},
        {"id": "s", "model": "m", "created": 3, "choices": [{"index": 0, "text": "lo"}]},
        {
            "id": "s",
            "model": "m",
            "created": 3,
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
        },
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    raw += b"data: [DONE]\n\n"
    decoder = StreamDecoder(chunks=False)
    texts: list[object] = []
    for i in range(0, len(raw), 7):  # arbitrary chunk boundaries
        texts += decoder.feed(raw[i : i + 7])
    assert "".join(t for t in texts if isinstance(t, str)) == "Hello"
    assert decoder.text == "Hello"
    assert decoder.finish_reason == "stop"
    assert decoder.done


def test_an_error_event_after_the_200_raises_the_matching_error() -> None:
    decoder = StreamDecoder()
    with pytest.raises(ServerError):
        decoder.feed_line(b'data: {"error": {"message": "engine died", "code": 500}}')


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after-ms": "1500", "retry-after": "2"}, 1.5),  # the finer one wins
        ({"retry-after-ms": "junk", "retry-after": "2"}, 2.0),
        ({"retry-after-ms": "-5", "retry-after": "3"}, 3.0),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_the_wait_a_server_asks_for(headers: dict[str, str], wait: float | None) -> None:
    assert error_from_response(429, headers, b"").retry_after == wait


@pytest.mark.parametrize(
    ("value", "should"), [("true", True), ("False", False), (" false ", False), ("maybe", None)]
)
def test_the_servers_word_on_retrying_is_kept(value: str, should: bool | None) -> None:
    assert error_from_response(500, {"x-should-retry": value}, b"").should_retry is should
    assert error_from_response(500, {}, b"").should_retry is None
