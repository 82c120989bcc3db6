"""What a kind of server is: how to recognise it, and how it speaks.

Each kind of server is one module of this package holding one :class:`Dialect`:
its detection (``owned_by`` in ``GET /v1/models``), how it takes the ``priority``
field, the words it refuses prompts and fields with, the load signals its
``/metrics`` exports, and how it takes a JSON schema to constrain an answer. A new
kind is a module and its tests; ``__init__`` lists them. Sans I/O: answers in,
decisions out, so every rule is tested on recorded responses.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch._calls.spec import Version
from llmbatch._exceptions import InvalidRequestError
from llmbatch._servers.limits import read_limits
from llmbatch._stats import ProviderLimits

__all__ = [
    "Dialect",
    "PriorityField",
    "ServerKind",
    "Version",
    "gbnf_choice",
    "json_schema_format",
    "parse_version",
    "translate_guided",
]


class ServerKind(enum.StrEnum):
    """What kind of server answers (``stats().servers[i].kind``)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMA_CPP = "llama.cpp"
    GENERIC = "openai-compatible"


@dataclass(frozen=True, slots=True)
class PriorityField:
    """How a server reads the ``priority`` field: an int, and which end runs first."""

    lower_first: bool

    def value(self, rank: int) -> int:
        """The field's value for a tier's rank (0 realtime, 1 normal, 2 batch)."""
        return rank if self.lower_first else _LOWEST_RANK - rank


_LOWEST_RANK = 2


def parse_version(text: object) -> Version | None:
    """``"0.11.2"``, ``"0.12.0rc1"`` or ``"v0.9.1+cpu"`` as a tuple (None: not one)."""
    if not isinstance(text, str):
        return None
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


class Dialect:
    """One kind of server's rules. Subclasses override the methods whose answer
    depends on what the server says about itself. (A plain class, not a dataclass:
    each kind's module makes one at import.)"""

    __slots__ = (
        "info_path",
        "kind",
        "metrics",
        "owners",
        "priority_refused",
        "step_tokens",
        "too_long",
        "usage_of_first",
    )

    def __init__(
        self,
        *,
        kind: ServerKind,
        owners: tuple[str, ...] = (),
        info_path: str | None = None,
        too_long: tuple[re.Pattern[str], ...] = (),
        priority_refused: re.Pattern[str] | None = None,
        metrics: Mapping[str, str] | None = None,
        step_tokens: int | None = None,
        usage_of_first: bool = False,
    ) -> None:
        self.kind = kind
        self.owners = owners
        """What its ``/v1/models`` entries say as ``owned_by`` (lower case)."""
        self.info_path = info_path
        """A ``GET`` path (at the server's root) whose JSON says more about it, read
        once at open: its version, its settings (None: nothing to read)."""
        self.too_long = too_long
        """Its words for a prompt longer than the context; a group ``limit`` catches
        the context length, where it says it."""
        self.priority_refused = priority_refused
        """Its words for refusing the ``priority`` field."""
        self.metrics: Mapping[str, str] = metrics or {}
        """Its ``/metrics`` series llmbatch reads, by what they measure (``waiting``,
        ``running``, ``kv``, ``tpot_sum``/``tpot_count``, ``itl_*``, ``ttft_*``)."""
        self.step_tokens = step_tokens
        """The prompt tokens one engine step takes by default (vLLM's
        ``max_num_batched_tokens``): a batch's prompts are kept within it, so a batch
        is not one long prefill (None: not known, no such cap)."""
        self.usage_of_first = usage_of_first
        """Its ``usage`` for a list of prompts counts the first prompt alone (True), not
        the whole list: the others' counts are then estimated from the first's."""

    def __repr__(self) -> str:
        return f"<Dialect {self.kind}>"

    def provider_limits(self, headers: Mapping[str, str]) -> ProviderLimits | None:
        """What an answer's (lower-cased) headers say of the caller's rate limits
        (None: nothing). Every kind reads every provider's family (a proxy in front
        of anything may send any); a kind whose server sends another overrides this."""
        return read_limits(headers)

    def priority_field(self, info: object) -> PriorityField | None:
        """How it takes ``priority`` (None: send none); ``info`` is what
        :attr:`info_path` answered (None: not read)."""
        return None

    def stated_seats(self, info: object) -> int | None:
        """How many sequences it says it runs at once (None: not stated)."""
        return None

    def version(self, info: object) -> Version | None:
        """Its release, from what :attr:`info_path` answered (None: not known)."""
        return None

    def body_fields(
        self, fields: dict[str, Any], *, chat: bool, version: Version | None
    ) -> dict[str, Any]:
        """A call's body fields as this server reads them (``fields`` may be changed
        and returned); raises :class:`InvalidRequestError` for a field it would
        silently ignore and that has no exact replacement. vLLM's ``guided_*``
        fields go through :meth:`guided`."""
        if any(name.startswith("guided_") for name in fields):
            fields = translate_guided(self, fields)
        return fields

    def guided(self, name: str, value: Any) -> dict[str, Any] | None:
        """The body fields that say what vLLM's ``guided_*`` field ``name`` says, in
        this server's dialect (None: it has none, and the call is refused rather than
        sent to be ignored). The default: a JSON schema as OpenAI's
        ``response_format``, which OpenAI-compatible servers share; nothing else."""
        if name == "guided_json":
            return {"response_format": json_schema_format(value)}
        return None

    def guided_refusal(self, name: str) -> str:
        """Why a ``guided_*`` field this server has no field for is refused, and what
        to use instead."""
        return (
            f"{name}: vLLM's field, and this server ({self.kind}) has no field for it: "
            "it would ignore it and answer unconstrained; constrain the answer with "
            "response_model= (or response_format)"
        )

    def session_field(self, version: Version | None) -> str | None:
        """The body field that carries a caller's session (a tenant), where the
        server reads one (None: none)."""
        return None

    def schema_fields(
        self, schema: Mapping[str, Any], name: str, version: Version | None
    ) -> dict[str, Any]:
        """The body fields that constrain an answer to the JSON ``schema``: OpenAI's
        ``response_format``, which OpenAI-compatible servers take."""
        return {"response_format": json_schema_format(schema, name, strict=True)}


def json_schema_format(
    schema: object, name: str = "guided_json", *, strict: bool = False
) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a JSON schema (given as a dict, or as its JSON
    text, as ``guided_json`` may be)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise InvalidRequestError(
                "guided_json: not a JSON schema (a dict, or its JSON text)", field="guided_json"
            ) from None
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(
            "guided_json: not a JSON schema (a dict, or its JSON text)", field="guided_json"
        )
    body: dict[str, Any] = {"name": name, "schema": dict(schema)}
    if strict:
        body["strict"] = True
    return {"type": "json_schema", "json_schema": body}


def translate_guided(dialect: Dialect, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with each ``guided_*`` field replaced by what ``dialect`` reads in its
    place; raises :class:`InvalidRequestError` for one it has no field for, or for two
    that land on one field with different values (a call's own value included)."""
    translated: dict[str, Any] = {}
    for name in [name for name in fields if name.startswith("guided_")]:
        value = fields.pop(name)
        replacement = dialect.guided(name, value)
        if replacement is None:
            raise InvalidRequestError(dialect.guided_refusal(name), field=name)
        for key, new in replacement.items():
            old = translated.get(key, fields.get(key))
            if old is not None and old != new:
                raise InvalidRequestError(
                    f"{name} and {key} both constrain the answer, differently, on "
                    f"{dialect.kind} (which reads only {key}): give one",
                    field=name,
                )
            translated[key] = new
    fields.update(translated)
    return fields


def gbnf_choice(choices: object, name: str = "guided_choice") -> str:
    """A GBNF grammar (llama.cpp's, and SGLang's EBNF) whose answers are exactly one
    of ``choices``, as ``guided_choice`` constrains vLLM's."""
    if (
        not isinstance(choices, list | tuple)
        or not choices
        or not all(isinstance(choice, str) and choice for choice in choices)
    ):
        raise InvalidRequestError(
            f"{name} must be a non-empty list of non-empty strings", field=name
        )
    return "root ::= " + " | ".join(_gbnf_literal(choice) for choice in choices)


def _gbnf_literal(text: str) -> str:
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif char in _GBNF_ESCAPES:
            escaped.append(_GBNF_ESCAPES[char])
        elif ord(char) < 0x20 or char == "\x7f":
            escaped.append(f"\\x{ord(char):02x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


_GBNF_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
