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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Dialect", "PriorityField", "ServerKind", "Version", "parse_version"]


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

Version = tuple[int, int, int]
"""A release as ``(major, minor, patch)``."""


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

    def __repr__(self) -> str:
        return f"<Dialect {self.kind}>"

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
        silently ignore and that has no exact replacement."""
        return fields

    def session_field(self, version: Version | None) -> str | None:
        """The body field that carries a caller's session (a tenant), where the
        server reads one (None: none)."""
        return None

    def schema_fields(
        self, schema: Mapping[str, Any], name: str, version: Version | None
    ) -> dict[str, Any]:
        """The body fields that constrain an answer to the JSON ``schema``: OpenAI's
        ``response_format``, which OpenAI-compatible servers take."""
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": dict(schema), "strict": True},
            }
        }
