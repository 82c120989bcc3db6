"""The structured-output rules without a server: each kind's dialect, vLLM's
removed fields, and the re-ask loop (hypothesis: every answer sequence ends in
exactly one outcome, after at most ``max_reasks`` re-asks)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from llmbatch import InvalidRequestError, OutputTruncatedError, StructuredOutputError
from llmbatch._calls.spec import check_call
from llmbatch._calls.structured import check_answer, reask_payload
from llmbatch._servers.kinds import GENERIC, llamacpp, sglang, vllm
from llmbatch._servers.kinds.base import gbnf_choice


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


def _on(dialect: Any, **params: Any) -> dict[str, Any]:
    spec = check_call("completion", "call", params, default_model="m", dialect=dialect)
    return dict(spec.params)


def _refused(dialect: Any, name: str, value: Any, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as raised:
        _on(dialect, extra_body={name: value})
    assert raised.value.field == name


def test_every_other_kind_translates_vllms_guided_fields_or_refuses_them() -> None:
    """Never sent to a server that would ignore them (and answer unconstrained)."""
    choice = ["yes", 'say "no"', "a\\b\n"]
    grammar = 'root ::= "yes" | "say \\"no\\"" | "a\\\\b\\n"'
    # llama.cpp: json_schema, and GBNF grammars.
    assert _on(llamacpp.DIALECT, guided_json=SCHEMA) == {"json_schema": SCHEMA}
    as_text = _on(llamacpp.DIALECT, extra_body={"guided_json": json.dumps(SCHEMA)})
    assert as_text == {"json_schema": SCHEMA}
    assert _on(llamacpp.DIALECT, guided_choice=choice) == {"grammar": grammar}
    assert _on(llamacpp.DIALECT, guided_grammar='root ::= "a"') == {"grammar": 'root ::= "a"'}
    _refused(llamacpp.DIALECT, "guided_regex", "a+", "no regex constraint.*GBNF grammar")
    # SGLang: response_format, regex, ebnf.
    rf = _on(sglang.DIALECT, guided_json=SCHEMA)["response_format"]
    assert rf == {"type": "json_schema", "json_schema": {"name": "guided_json", "schema": SCHEMA}}
    assert _on(sglang.DIALECT, guided_regex="a+") == {"regex": "a+"}
    assert _on(sglang.DIALECT, guided_choice=choice) == {"ebnf": grammar}
    assert _on(sglang.DIALECT, guided_grammar='root ::= "a"') == {"ebnf": 'root ::= "a"'}
    # Any other server: a schema as OpenAI's response_format, nothing else.
    assert _on(GENERIC, guided_json=SCHEMA)["response_format"] == rf
    for name, value in [("guided_regex", "a+"), ("guided_choice", ["a"]), ("guided_grammar", "g")]:
        _refused(GENERIC, name, value, f"{name}: vLLM's field.*would ignore it")
    # What none of them has.
    for dialect in (llamacpp.DIALECT, sglang.DIALECT, GENERIC):
        for name in ("guided_whitespace_pattern", "guided_decoding_backend", "guided_other"):
            _refused(dialect, name, "x", f"{name}: vLLM's field.*response_model=")


def test_guided_fields_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="guided_choice and grammar both"):
        _on(llamacpp.DIALECT, guided_grammar='root ::= "a"', guided_choice=["b"])
    with pytest.raises(InvalidRequestError, match="guided_json and json_schema both"):
        _on(llamacpp.DIALECT, guided_json=SCHEMA, extra_body={"json_schema": {"type": "string"}})
    # Saying the same thing twice is not a contradiction.
    same = _on(llamacpp.DIALECT, guided_json=SCHEMA, extra_body={"json_schema": SCHEMA})
    assert same == {"json_schema": SCHEMA}
    for bad in ([], [""], "yes", [1]):
        _refused(llamacpp.DIALECT, "guided_choice", bad, "non-empty list of non-empty strings")
    _refused(GENERIC, "guided_json", "{not json", "not a JSON schema")


def _read_gbnf_literal(text: str) -> tuple[str, str]:
    """One double-quoted GBNF literal at the start of ``text``: its string, and the
    rest (a reader for the test, from llama.cpp's grammar README)."""
    assert text[0] == '"'
    out, i = [], 1
    simple = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
    while text[i] != '"':
        if text[i] == "\\":
            if text[i + 1] == "x":
                out.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
            else:
                out.append(simple[text[i + 1]])
                i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out), text[i + 1 :]


@given(st.lists(st.text(min_size=1), min_size=1, max_size=5))
def test_a_choice_grammar_reads_back_as_its_strings(choices: list[str]) -> None:
    grammar = gbnf_choice(choices)
    assert grammar.startswith("root ::= ")
    rest, read = grammar.removeprefix("root ::= "), []
    while True:
        value, rest = _read_gbnf_literal(rest)
        read.append(value)
        if not rest:
            break
        assert rest.startswith(" | ")
        rest = rest[3:]
    assert read == choices


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
    verdict = check_answer(
        Answer('{"x": 1', "length"), spec, "p", reasks=0, request_id="r", attempts=1
    )
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
        verdict = check_answer(
            Answer(text), spec, payload, reasks=reasks, request_id="r", attempts=reasks + 1
        )
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
