"""Structured outputs on the simulator: a valid instance of the schema asked for,
in each dialect it reads; the invalid share switch; vLLM's list cap."""

from __future__ import annotations

import datetime
import enum
import json
import random
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from llmbatch_server.sim.schema import Constraint, answer_pieces, constraint_of, instance
from llmbatch_server.testing import run_simulator


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    number: Annotated[int, Field(ge=1, le=999)]
    postcode: str | None = None


class Person(BaseModel):
    name: Annotated[str, Field(min_length=3, max_length=20)]
    age: Annotated[int, Field(ge=0, lt=130)]
    height: Annotated[float, Field(gt=0.5, le=2.5)]
    colour: Colour
    kind: Literal["friend", "colleague"]
    tags: Annotated[list[str], Field(max_length=4)]
    address: Address
    born: datetime.date
    seen: datetime.datetime | None = None
    id: uuid.UUID
    pair: tuple[int, bool]
    scores: dict[str, int] = {}


class Tree(BaseModel):
    label: str
    children: list[Tree] = []


TARGETS: list[Any] = [
    Person,
    list[Person],
    Tree,
    Colour,
    Literal["yes", "no"],
    Annotated[int, Field(le=-5)],
    Annotated[float, Field(lt=-1.0)],
    bool,
    Annotated[int, Field(multiple_of=5, ge=7)],
]


@pytest.mark.parametrize("target", TARGETS, ids=str)
@given(seed=st.integers(min_value=0, max_value=2**32))
@settings(max_examples=40, deadline=None)
def test_every_generated_instance_validates(target: Any, seed: int) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(target)
    value = instance(adapter.json_schema(), random.Random(seed))
    adapter.validate_python(value)  # raises if the generator broke the schema
    # ... and survives the trip through the JSON the simulator sends.
    pieces = answer_pieces(Constraint(schema=adapter.json_schema()), seed, 0.0)
    assert all(len(piece) <= 4 for piece in pieces)
    adapter.validate_json("".join(pieces))


@given(seed=st.integers(min_value=0, max_value=2**32))
def test_an_invalid_answer_is_not_json(seed: int) -> None:
    schema = TypeAdapter(Person).json_schema()
    text = "".join(answer_pieces(Constraint(schema=schema), seed, 1.0))
    with pytest.raises(ValidationError):
        TypeAdapter(Person).validate_json(text)


SCHEMA = TypeAdapter(Address).json_schema()


@pytest.mark.parametrize(
    "body",
    [
        {"structured_outputs": {"json": SCHEMA}},
        {"structured_outputs": {"json": json.dumps(SCHEMA)}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "A", "schema": SCHEMA},
            }
        },
        {"json_schema": SCHEMA},
    ],
    ids=["structured_outputs", "structured_outputs-str", "response_format", "json_schema"],
)
def test_each_dialect_is_read(body: dict[str, Any]) -> None:
    constraint = constraint_of(body)
    assert constraint is not None
    assert constraint.schema == SCHEMA


def test_free_text_where_no_schema_is_read() -> None:
    # vLLM >= 0.12 ignores the guided_* fields; so does the simulator, which imitates 0.32.
    assert constraint_of({"guided_json": SCHEMA}) is None
    assert constraint_of({"response_format": {"type": "text"}}) is None
    assert constraint_of({}) is None
    choice = constraint_of({"structured_outputs": {"choice": ["a", "b"]}})
    assert choice is not None
    assert choice.choices == ["a", "b"]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with (
        run_simulator(
            "--speed", "200", "--invalid-json", "0.5", "--max-completion-prompts", "8"
        ) as sim,
        httpx.Client(base_url=sim.url, timeout=30) as client,
    ):
        yield client


def test_the_simulator_answers_the_schema_and_the_invalid_share(http: httpx.Client) -> None:
    prompts = [f"Address number {i}" for i in range(8)]
    body = {"prompt": prompts, "max_tokens": 200, "structured_outputs": {"json": SCHEMA}}
    answer = http.post("/v1/completions", json=body).json()
    valid = 0
    for choice in answer["choices"]:
        assert choice["finish_reason"] == "stop"
        try:
            TypeAdapter(Address).validate_json(choice["text"])
            valid += 1
        except ValidationError:
            pass
    assert 0 < valid < 8  # half drawn invalid, each on its own
    # The same prompt gets the same answer; a token budget too small cuts it.
    again = http.post("/v1/completions", json=body).json()
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in answer["choices"]]
    cut = http.post("/v1/completions", json={**body, "max_tokens": 2}).json()
    assert {c["finish_reason"] for c in cut["choices"]} == {"length"}
    assert cut["usage"]["completion_tokens"] == 16


def test_chat_answers_the_schema(http: httpx.Client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "Address", "schema": SCHEMA}}
    texts = []
    for i in range(6):
        body = {
            "messages": [{"role": "user", "content": f"where {i}"}],
            "response_format": fmt,
            "max_completion_tokens": 200,
        }
        texts.append(http.post("/v1/chat/completions", json=body).json()["choices"][0])
    assert all(t["message"]["content"].startswith("{") for t in texts)


def test_a_list_longer_than_the_cap_is_refused_in_vllms_words(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": ["x"] * 9, "max_tokens": 1})
    assert r.status_code == 400
    assert "prompt list length 9 exceeds the maximum allowed count of 8" in r.text
    assert http.post("/v1/completions", json={"prompt": ["x"] * 8, "max_tokens": 1}).is_success
