"""vLLM (docs.vllm.ai, "OpenAI-Compatible Server" and "Structured Outputs").

It lists its models with ``"owned_by": "vllm"`` and says its release at
``GET /version``. It takes ``priority`` as an int, lower first, under
``--scheduling-policy priority``, and refuses it with a 400 on ``fcfs`` ("Priority
scheduling is not enabled."), which the dispatcher notices and stops sending.
Structured outputs: ``structured_outputs: {"json": schema}`` on both endpoints
from 0.10.2; before, ``guided_json``. 0.12 removed the ``guided_*`` fields and
still accepts them, ignoring them: a 200 with unconstrained text (its logs warn).
So they are translated into ``structured_outputs`` for a vLLM that no longer reads
them, and ``guided_decoding_backend``, now the server's own setting, is refused.
Chat takes ``max_completion_tokens`` (``max_tokens`` is deprecated there), and
``session_id`` carries a caller's session (0.32's request models have it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llmbatch._exceptions import InvalidRequestError
from llmbatch._servers.kinds.base import Dialect, PriorityField, ServerKind, Version, parse_version

__all__ = ["DIALECT", "GUIDED_REMOVED", "SESSION_ID", "STRUCTURED_OUTPUTS"]

STRUCTURED_OUTPUTS: Version = (0, 10, 2)
"""The first release that takes ``structured_outputs``."""
GUIDED_REMOVED: Version = (0, 12, 0)
"""The first release that ignores the ``guided_*`` fields."""
SESSION_ID: Version = (0, 32, 0)
"""The first release seen to take ``session_id`` (older ones ignore the field)."""
#: Each removed ``guided_*`` field's place in ``structured_outputs``.
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "guided_whitespace_pattern": "whitespace_pattern",
}


class _VLLM(Dialect):
    def priority_field(self, info: object) -> PriorityField | None:
        return PriorityField(lower_first=True)

    def version(self, info: object) -> Version | None:
        return parse_version(info.get("version")) if isinstance(info, Mapping) else None

    def body_fields(
        self, fields: dict[str, Any], *, chat: bool, version: Version | None
    ) -> dict[str, Any]:
        removed = version is None or version >= GUIDED_REMOVED
        if removed and any(name.startswith("guided_") for name in fields):
            fields = _translate_guided(fields)
        if chat and "max_tokens" in fields and "max_completion_tokens" not in fields:
            fields["max_completion_tokens"] = fields.pop("max_tokens")
        return fields

    def session_field(self, version: Version | None) -> str | None:
        return "session_id" if version is None or version >= SESSION_ID else None

    def schema_fields(
        self, schema: Mapping[str, Any], name: str, version: Version | None
    ) -> dict[str, Any]:
        if version is not None and version < STRUCTURED_OUTPUTS:
            return {"guided_json": dict(schema)}
        return {"structured_outputs": {"json": dict(schema)}}


def _translate_guided(fields: dict[str, Any]) -> dict[str, Any]:
    """``guided_*`` fields moved into ``structured_outputs``, which has each one."""
    if "guided_decoding_backend" in fields:
        raise InvalidRequestError(
            "guided_decoding_backend: vLLM 0.12 removed it and ignores it; the backend is "
            "now the server's setting (vllm serve --structured-outputs-config.backend ...)",
            field="guided_decoding_backend",
        )
    unknown = [name for name in fields if name.startswith("guided_") and name not in _GUIDED]
    if unknown:
        raise InvalidRequestError(
            f"{unknown[0]}: vLLM 0.12 removed the guided_* fields and ignores them; "
            "use structured_outputs={...}",
            field=unknown[0],
        )
    given = fields.get("structured_outputs")
    merged = dict(given) if isinstance(given, Mapping) else {}
    for name, key in _GUIDED.items():
        if name not in fields:
            continue
        value = fields.pop(name)
        if key in merged and merged[key] != value:
            raise InvalidRequestError(
                f"{name} and structured_outputs.{key} differ: give one (vLLM 0.12 reads "
                "only structured_outputs)",
                field=name,
            )
        merged[key] = value
    fields["structured_outputs"] = merged
    return fields


DIALECT = _VLLM(
    kind=ServerKind.VLLM,
    owners=("vllm",),
    info_path="/version",
    too_long=(
        # serving_engine's validation: "This model's maximum context length is 4096
        # tokens. However, you requested 4200 tokens (4100 in the messages, 100 in
        # the completion)"; OpenAI's own API words it the same way.
        re.compile(r"maximum context length is (?P<limit>\d+)"),
        # >= 0.10 (and SGLang): "Requested token count exceeds the model's maximum
        # context length of 32768 tokens. You requested a total of 67298 tokens: ..."
        re.compile(r"maximum context length of (?P<limit>\d+)"),
    ),
    priority_refused=re.compile(r"priority scheduling is not enabled", re.IGNORECASE),
    # max_num_batched_tokens: vLLM's API server defaults to 2,048 on most hardware and
    # 8,192 on an H100 (engine/arg_utils.py, 0.32); 8,192 is also the launcher's
    # latency profile. A middle value: it keeps long prompts from one long prefill.
    step_tokens=8192,
    metrics={
        "vllm:num_requests_waiting": "waiting",
        "vllm:num_requests_running": "running",
        "vllm:kv_cache_usage_perc": "kv",
        "vllm:gpu_cache_usage_perc": "kv",
        # Inter-token latencies under two names; the newer wins when both are there.
        "vllm:inter_token_latency_seconds_sum": "itl_sum",
        "vllm:inter_token_latency_seconds_count": "itl_count",
        "vllm:time_per_output_token_seconds_sum": "tpot_sum",
        "vllm:time_per_output_token_seconds_count": "tpot_count",
        "vllm:time_to_first_token_seconds_sum": "ttft_sum",
        "vllm:time_to_first_token_seconds_count": "ttft_count",
        # Requests finished by the engine (every finish reason): against what the
        # client has had back, the prompts a batched answer still waits to send.
        "vllm:request_success_total": "finished",
    },
)
"""vLLM's rules."""
