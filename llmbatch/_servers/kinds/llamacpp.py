"""llama.cpp's server (its README, tools/server).

It lists its models with ``"owned_by": "llamacpp"`` and has no priority. It states
how many sequences it runs at once: ``total_slots`` in ``GET /props`` (its
``--parallel``). With ``--metrics`` it exports its queue and its generation
totals, whose change between two reads is each slot's time per output token. It
constrains an answer with a ``json_schema`` field (both endpoints; a list of
prompts included), and ignores ``response_format`` on ``/v1/completions``; a GBNF
``grammar`` field constrains it to a grammar. vLLM's ``guided_json``,
``guided_grammar`` and ``guided_choice`` are sent as those (a choice as a grammar
of its strings); it has no regex constraint, so ``guided_regex`` is refused. Its
``usage`` for a list of prompts counts the first prompt alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llmbatch._servers.kinds.base import (
    Dialect,
    ServerKind,
    Version,
    gbnf_choice,
    json_schema_format,
)

__all__ = ["DIALECT"]


class _LlamaCpp(Dialect):
    def stated_seats(self, info: object) -> int | None:
        if isinstance(info, Mapping):
            slots = info.get("total_slots")
            if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0:
                return slots
        return None

    def schema_fields(
        self, schema: Mapping[str, Any], name: str, version: Version | None
    ) -> dict[str, Any]:
        return {"json_schema": dict(schema)}

    def guided(self, name: str, value: Any) -> dict[str, Any] | None:
        if name == "guided_json":
            return {"json_schema": json_schema_format(value)["json_schema"]["schema"]}
        if name == "guided_grammar":
            return {"grammar": value}
        if name == "guided_choice":
            return {"grammar": gbnf_choice(value)}
        return None

    def guided_refusal(self, name: str) -> str:
        if name == "guided_regex":
            return (
                "guided_regex: llama.cpp's server has no regex constraint and would "
                "answer unconstrained; write it as a GBNF grammar (extra_body="
                '{"grammar": ...})'
            )
        return super().guided_refusal(name)


DIALECT = _LlamaCpp(
    kind=ServerKind.LLAMA_CPP,
    owners=("llamacpp",),
    info_path="/props",
    too_long=(
        # exceed_context_size_error: "the request exceeds the available context
        # size, try increasing it" (no count in the text).
        re.compile(r"exceeds the available context size"),
    ),
    # Its logical batch (-b), 2,048 by default: the prompt tokens one decode call takes.
    step_tokens=2048,
    # A list of prompts is answered with the first prompt's response object, the
    # other choices appended to it: its usage is the first prompt's alone.
    usage_of_first=True,
    metrics={
        "llamacpp:requests_deferred": "waiting",
        "llamacpp:requests_processing": "running",
        "llamacpp:tokens_predicted_seconds_total": "tpot_sum",
        "llamacpp:tokens_predicted_total": "tpot_count",
    },
)
"""llama.cpp's server's rules."""
