"""Structured outputs: the JSON schema a request asks for, and an answer that is a
valid instance of it (as a server with constrained decoding gives).

The simulator imitates vLLM 0.32: it reads ``structured_outputs`` (``json``,
``json_object``, ``choice``) and ``response_format`` (``json_schema``,
``json_object``), and ignores the ``guided_*`` fields as vLLM has since 0.12. It
also reads llama.cpp's ``json_schema`` field, so one simulator serves clients
written for either. A ``regex`` or ``grammar`` constraint is not imitated (the
answer is ordinary text). Answers are drawn from the output's seed, so the same
prompt gets the same answer; ``--invalid-json SHARE`` breaks that share of them
(cut in half: not JSON), each drawn from its own seed.
"""

from __future__ import annotations

import json
import math
import random
import string
from collections.abc import Mapping
from typing import Any

__all__ = ["Constraint", "answer_pieces", "constraint_of", "instance"]

#: Deeper than this, a schema's recursion takes the shortest way out.
_MAX_DEPTH = 6
_WORDS = ("alpha", "river", "stone", "cloud", "maple", "ember", "delta", "orbit")


class Constraint:
    """What a request constrains its answer to: a JSON ``schema``, or one of
    ``choices``."""

    __slots__ = ("choices", "schema")

    def __init__(
        self, schema: Mapping[str, Any] | None = None, choices: list[str] | None = None
    ) -> None:
        self.schema = schema
        self.choices = choices


def constraint_of(body: Mapping[str, Any]) -> Constraint | None:
    """The constraint in a request body (None: free text)."""
    outputs = body.get("structured_outputs")
    if isinstance(outputs, Mapping):
        schema = outputs.get("json")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                schema = None
        if isinstance(schema, Mapping):
            return Constraint(schema=schema)
        choices = outputs.get("choice")
        if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
            return Constraint(choices=choices)
        if outputs.get("json_object"):
            return Constraint(schema={"type": "object"})
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            if isinstance(schema, Mapping):
                return Constraint(schema=schema)
        if kind == "json_object":
            return Constraint(schema={"type": "object"})
    schema = body.get("json_schema")  # llama.cpp's server's own field
    if isinstance(schema, Mapping):
        return Constraint(schema=schema)
    return None


def answer_pieces(constraint: Constraint, seed: int, invalid_share: float) -> tuple[str, ...]:
    """The answer's tokens (pieces of at most four characters): a valid instance,
    or with probability ``invalid_share`` its first half (not valid JSON)."""
    rng = random.Random(seed)
    if constraint.choices is not None:
        text = rng.choice(constraint.choices)
    else:
        assert constraint.schema is not None
        text = json.dumps(instance(constraint.schema, rng), separators=(", ", ": "))
    if invalid_share > 0 and rng.random() < invalid_share:
        text = text[: max(1, len(text) // 2)]
    return tuple(text[i : i + 4] for i in range(0, len(text), 4)) or ("",)


def instance(schema: Mapping[str, Any], rng: random.Random) -> Any:
    """A value that validates against ``schema`` (JSON Schema as pydantic writes
    it: ``$defs`` and ``$ref``, ``anyOf``, ``enum``/``const``, bounds)."""
    return _value(schema, schema, rng, 0)


def _value(
    schema: Mapping[str, Any], root: Mapping[str, Any], rng: random.Random, depth: int
) -> Any:
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(list(schema["enum"]))
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            if depth >= _MAX_DEPTH:  # the shortest way out: a null or a scalar
                options = sorted(options, key=lambda o: 0 if o.get("type") == "null" else 1)
                return _value(options[0], root, rng, depth + 1)
            return _value(rng.choice(options), root, rng, depth + 1)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part["$ref"], root) if "$ref" in part else part)
        return _value(merged, root, rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice([k for k in kind if k != "null"] or kind)
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        return _object(schema, root, rng, depth)
    if kind == "array":
        return _array(schema, root, rng, depth)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    node: Any = root
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return dict(node)


def _object(
    schema: Mapping[str, Any], root: Mapping[str, Any], rng: random.Random, depth: int
) -> dict[str, Any]:
    properties: Mapping[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    out: dict[str, Any] = {}
    for name, sub in properties.items():
        if name in required or (depth < _MAX_DEPTH and rng.random() < 0.5):
            out[name] = _value(sub, root, rng, depth + 1)
    return out


def _array(
    schema: Mapping[str, Any], root: Mapping[str, Any], rng: random.Random, depth: int
) -> list[Any]:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list):  # a tuple
        return [_value(item, root, rng, depth + 1) for item in prefix]
    low = int(schema.get("minItems", 0))
    high = int(schema.get("maxItems", low + 3))
    count = low if depth >= _MAX_DEPTH else rng.randint(low, max(low, min(high, low + 3)))
    items = schema.get("items", {})
    return [_value(items, root, rng, depth + 1) for _ in range(count)]


def _bounds(schema: Mapping[str, Any]) -> tuple[float, float, bool, bool]:
    """(low, high, low exclusive, high exclusive); a missing end is 100 away."""
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is None and high is None:
        low, high = -1, 99
    elif low is None:
        low = high - 100
    elif high is None:
        high = low + 100
    return (
        float(low),
        float(high),
        "minimum" not in schema and "exclusiveMinimum" in schema,
        "maximum" not in schema and "exclusiveMaximum" in schema,
    )


def _integer(schema: Mapping[str, Any], rng: random.Random) -> int:
    low_f, high_f, low_open, high_open = _bounds(schema)
    low = int(low_f) + 1 if low_open else math.ceil(low_f)
    high = int(high_f) - 1 if high_open else math.floor(high_f)
    step = int(schema.get("multipleOf", 1)) or 1
    first = low + (-low) % step  # the smallest multiple of step >= low
    count = max(0, (high - first) // step)
    return first + step * rng.randint(0, count)


def _number(schema: Mapping[str, Any], rng: random.Random) -> float:
    low, high, low_open, high_open = _bounds(schema)
    margin = (high - low) / 1000 or 0.001
    low = low + margin if low_open else low
    high = high - margin if high_open else high
    return min(max(round(rng.uniform(low, high), 3), low), high)


def _string(schema: Mapping[str, Any], rng: random.Random) -> str:
    form = schema.get("format")
    if form == "date-time":
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"
    if form == "date":
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if form == "time":
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
    if form == "uuid":
        return "-".join(
            "".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
        )
    low = int(schema.get("minLength", 1))
    high = int(schema.get("maxLength", max(low, 12)))
    text = rng.choice(_WORDS)
    while len(text) < low:
        text += rng.choice(string.ascii_lowercase)
    return text[: max(low, min(high, len(text)))]
