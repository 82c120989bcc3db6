"""SGLang (docs.sglang.io, "SGLang Native APIs" and "Structured Outputs").

It lists its models with ``"owned_by": "sglang"`` and serves its server arguments
at ``GET /get_server_info``. It honours ``priority`` only with
``--enable-priority-scheduling`` (otherwise it ignores it, or refuses it with
``--abort-on-priority-when-disabled``), and runs higher values first unless
``--schedule-low-priority-values-first``. It takes a JSON schema as OpenAI's
``response_format``, and ``regex`` and ``ebnf`` (a GBNF-style grammar) as fields of
their own; vLLM's ``guided_json``, ``guided_regex``, ``guided_grammar`` and
``guided_choice`` are sent as those (a choice as a grammar of its strings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llmbatch._servers.kinds.base import (
    Dialect,
    PriorityField,
    ServerKind,
    Version,
    gbnf_choice,
    parse_version,
)

__all__ = ["DIALECT"]


class _SGLang(Dialect):
    def priority_field(self, info: object) -> PriorityField | None:
        if not isinstance(info, Mapping) or not info.get("enable_priority_scheduling"):
            return None
        return PriorityField(lower_first=bool(info.get("schedule_low_priority_values_first")))

    def version(self, info: object) -> Version | None:
        return parse_version(info.get("version")) if isinstance(info, Mapping) else None

    def guided(self, name: str, value: Any) -> dict[str, Any] | None:
        if name == "guided_regex":
            return {"regex": value}
        if name == "guided_grammar":
            return {"ebnf": value}
        if name == "guided_choice":
            return {"ebnf": gbnf_choice(value)}
        return super().guided(name, value)


DIALECT = _SGLang(
    kind=ServerKind.SGLANG,
    owners=("sglang",),
    info_path="/get_server_info",
    too_long=(
        # Its tokenizer manager (and OpenAI-compatible gateways): "The input (5000
        # tokens) is longer than the model's context length (4096 tokens)."
        re.compile(r"input \((?P<input>\d+) tokens\) is longer than the model's context length"),
    ),
)
"""SGLang's rules."""
