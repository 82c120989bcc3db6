"""The structured-output rules without a server: each kind's dialect, vLLM's
removed fields, and the re-ask loop (hypothesis: every answer sequence ends in
exactly one outcome, after at most ``max_reasks`` re-asks)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from llmbatch import InvalidRequestError, OutputTruncatedError, StructuredOutputError
from llmbatch._callspec import check_call
from llmbatch._servers import GENERIC, llamacpp, sglang, vllm
from llmbatch._structured import check_answer, reask_payload


class Point(BaseModel):
    x: int
    y: int


SCHEMA = Point.model_json_schema()


def test_each_kind_is_asked_in_its_own_dialect() -> None:
    compact = {"structured_outputs": {"json": SCHEMA}}
    assert vllm.DIALECT.schema_fields(SCHEMA, "Point", (0, 32, 0)) == compact
    assert vllm.DIALECT.schema_fields(SCHEMA, "Point", None) == compact
    assert vllm.DIALECT.schema_fields(SCHEMA, "Point", (0, 9, 2)) == {"guided_json": SCHEMA}
    assert llamacpp.DIALECT.schema_fields(SCHEMA, "Point", None) == {"json_schema": SCHEMA}
    for dialect in (sglang.DIALECT, GENERIC):
        fields = dialect.schema_fields(SCHEMA, "Point", None)
        assert fields["response_format"]["type"] == "json_schema"
        assert fields["response_format"]["json_schema"]["name"] == "Point"
        assert fields["response_format"]["json_schema"]["schema"] == SCHEMA


def _spec(kind: str = "completion", version: Any = (0, 32, 0), **params: Any) -> Any:
    return check_call(
        kind,  # type: ignore[arg-type]
        "call",
        params,
        default_model="m",
        dialect=vllm.DIALECT,
        version=version,
    )


def test_vllms_removed_fields_are_translated_where_it_no_longer_reads_them() -> None:
    spec = _spec(guided_json=SCHEMA, guided_whitespace_pattern=" ")
    assert spec.params == {"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "}}
    inside = _spec(extra_body={"guided_choice": ["a", "b"]})
    assert inside.params == {"structured_outputs": {"choice": ["a", "b"]}}
    # An older vLLM still reads them: sent as given.
    assert _spec(version=(0, 11, 0), guided_regex="a+").params == {"guided_regex": "a+"}
    with pytest.raises(InvalidRequestError, match="structured-outputs-config"):
        _spec(guided_json=SCHEMA, guided_decoding_backend="outlines")
    with pytest.raises(InvalidRequestError, match="differ"):
        _spec(guided_regex="a", structured_outputs={"regex": "b"})
    # Other kinds get what was given.
    other = check_call("completion", "call", {"guided_json": SCHEMA}, default_model="m")
    assert other.params == {"guided_json": SCHEMA}


def test_vllm_chat_gets_max_completion_tokens_and_a_session() -> None:
    spec = _spec("chat", max_tokens=50, tenant="agent-7")
    assert spec.params["max_completion_tokens"] == 50
    assert "max_tokens" not in spec.params
    assert spec.max_tokens == 50
    assert spec.max_tokens_given
    assert spec.params["session_id"] == "agent-7"
    assert spec.params["user"] == "agent-7"
    assert _spec(max_tokens=50).params == {"max_tokens": 50}  # completions keep max_tokens
    assert "session_id" not in _spec(version=(0, 20, 0), tenant="t").params


def test_a_response_model_asks_the_dialect_for_its_schema() -> None:
    spec = _spec(response_model=Point, max_tokens=100)
    assert spec.params["structured_outputs"]["json"] == SCHEMA
    assert spec.response_model is not None
    other = _spec(response_model=list[Point])
    assert other.compat_key != spec.compat_key  # two schemas never share a batch


class Answer:
    """A stand-in Completion: text, finish reason, timings."""

    def __init__(self, text: str, finish_reason: str = "stop") -> None:
        self.text = text
        self.finish_reason = finish_reason

        class _T:
            attempts = 1

        self.timings = _T()


def test_a_truncated_answer_is_its_own_error() -> None:
    spec = _spec(response_model=Point, max_tokens=4)
    verdict = check_answer(Answer('{"x": 1', "length"), spec, "p", reasks=0, request_id="r")
    assert isinstance(verdict.error, OutputTruncatedError)
    assert verdict.reask is None


def test_the_reask_shows_the_answer_and_what_was_wrong() -> None:
    chat = reask_payload([{"role": "user", "content": "q"}], '{"x": "a"}', "x: not an int")
    assert isinstance(chat, tuple)
    assert chat[1] == {"role": "assistant", "content": '{"x": "a"}'}
    assert chat[2]["role"] == "user"
    assert "x: not an int" in chat[2]["content"]
    text = reask_payload("Q: ", "oops", "answer: Invalid JSON")
    assert isinstance(text, str)
    assert text.startswith("Q: oops\n\n")
    assert "Invalid JSON" in text


@given(
    answers=st.lists(st.booleans(), min_size=1, max_size=8),
    max_reasks=st.integers(min_value=0, max_value=4),
)
def test_the_reask_loop_ends_once_within_its_budget(answers: list[bool], max_reasks: int) -> None:
    spec = _spec(response_model=Point, max_reasks=max_reasks)
    payload: Any = "Q"
    outcome = None
    reasks = 0
    for valid in answers:
        text = '{"x": 1, "y": 2}' if valid else '{"x": 1'
        verdict = check_answer(Answer(text), spec, payload, reasks=reasks, request_id="r")
        # Exactly one of: validated, sent back, failed.
        assert [verdict.ok, verdict.reask is not None, verdict.error is not None].count(True) == 1
        if verdict.reask is None:
            outcome = verdict
            break
        reasks += 1
        payload = verdict.reask.payload
    assert reasks <= max_reasks
    first_valid = answers.index(True) if True in answers else None
    if first_valid is not None and first_valid <= max_reasks:
        assert outcome is not None
        assert outcome.ok
        assert outcome.parsed == Point(x=1, y=2)
        assert reasks == first_valid
    elif len(answers) > max_reasks:
        assert outcome is not None
        assert isinstance(outcome.error, StructuredOutputError)
        assert outcome.error.reasks == max_reasks
        assert outcome.error.text == '{"x": 1'
