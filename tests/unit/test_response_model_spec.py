"""``response_model=``: checked at the call into the spec its requests share."""

from __future__ import annotations

import enum
from typing import Literal

import pytest
from pydantic import BaseModel

from llmbatch import InvalidRequestError, InvalidTypeError
from llmbatch._calls.spec import SpecCache, check_call, response_model_of


class Person(BaseModel):
    name: str
    age: int


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize(
    "target", [Person, list[Person], Literal["yes", "no"], Colour, int], ids=str
)
def test_any_type_pydantic_takes_is_a_response_model(target: object) -> None:
    spec = check_call("chat", "chat", {"response_model": target}, default_model="m")
    assert spec.response_model is not None
    assert spec.response_model.target == target
    assert spec.response_model.schema  # a JSON schema
    assert spec.response_model.name.replace("_", "").replace("-", "").isalnum()
    assert "response_model" not in spec.params  # llmbatch's own, not a body field


def test_a_type_is_built_once() -> None:
    assert response_model_of(Person) is response_model_of(Person)
    assert response_model_of(None) is None


def test_what_pydantic_cannot_validate_is_a_type_error_naming_the_field() -> None:
    with pytest.raises(InvalidTypeError, match="response_model must be a type") as caught:
        check_call("chat", "chat", {"response_model": object()}, default_model="m")
    assert caught.value.field == "response_model"


@pytest.mark.parametrize(
    ("kind", "params", "stream"),
    [("embedding", {}, False), ("chat", {}, True), ("completion", {"n": 2}, False)],
)
def test_it_needs_one_text_answer(kind: str, params: dict[str, object], stream: bool) -> None:
    with pytest.raises(InvalidRequestError, match="one text answer"):
        check_call(
            kind,  # type: ignore[arg-type]
            "call",
            {**params, "response_model": Person},
            default_model="m",
            stream=stream,
        )


def test_the_spec_cache_keeps_one_spec_per_model() -> None:
    specs = SpecCache("m", None)
    first = specs.get("chat", "chat", "normal", {"response_model": Person})
    assert specs.get("chat", "chat", "normal", {"response_model": Person}) is first
    other = specs.get("chat", "chat", "normal", {"response_model": Colour})
    assert other is not first
    assert specs.get("chat", "chat", "normal", {}).response_model is None
