"""The kinds of server llmbatch knows, one module each (``base`` says what a kind
holds). A server is recognised by its model list; one that names no kind here is
:data:`GENERIC`. What any server might say (a too-long refusal, a load series) is
matched against every kind's words: a gateway may front any of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from llmbatch._servers.kinds import generic, llamacpp, sglang, vllm
from llmbatch._servers.kinds.base import Dialect, PriorityField, ServerKind, Version, parse_version

__all__ = [
    "DIALECTS",
    "GENERIC",
    "METRICS",
    "PRIORITY_REFUSED",
    "TOO_LONG",
    "Dialect",
    "PriorityField",
    "ServerKind",
    "Version",
    "dialect_of",
    "kind_from_models",
    "parse_version",
]

DIALECTS: tuple[Dialect, ...] = (vllm.DIALECT, sglang.DIALECT, llamacpp.DIALECT)
"""Every kind a server may say it is."""
GENERIC = generic.DIALECT
"""A server that says nothing of what it is."""
_ALL = (*DIALECTS, GENERIC)
_BY_KIND = {dialect.kind: dialect for dialect in _ALL}

TOO_LONG: tuple[re.Pattern[str], ...] = tuple(rule for d in _ALL for rule in d.too_long)
"""Every kind's words for a prompt longer than the context."""
PRIORITY_REFUSED: tuple[re.Pattern[str], ...] = tuple(
    d.priority_refused for d in _ALL if d.priority_refused is not None
)
"""Every kind's words for refusing the ``priority`` field."""
METRICS: dict[str, str] = {name: key for d in _ALL for name, key in d.metrics.items()}
"""Every ``/metrics`` series llmbatch reads, by what it measures."""


def dialect_of(kind: ServerKind) -> Dialect:
    """The rules of a kind of server."""
    return _BY_KIND[kind]


def kind_from_models(models: Sequence[Mapping[str, object]]) -> Dialect | None:
    """The kind named by the models' ``owned_by`` (None when it names none known)."""
    for model in models:
        owner = str(model.get("owned_by", "")).lower()
        for dialect in DIALECTS:
            if owner in dialect.owners:
                return dialect
    return None
