"""vLLM (docs.vllm.ai, "OpenAI-Compatible Server" and "Structured Outputs").

It lists its models with ``"owned_by": "vllm"`` and says its release at
``GET /version``. It takes ``priority`` as an int, lower first, under
``--scheduling-policy priority``, and refuses it with a 400 on ``fcfs`` ("Priority
scheduling is not enabled."), which the dispatcher notices and stops sending.
Structured outputs: ``structured_outputs: {"json": schema}`` on both endpoints
from 0.10.2; before, ``guided_json``, which 0.12 removed (and still accepts,
ignoring it: a 200 with unconstrained text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llmbatch._servers.base import Dialect, PriorityField, ServerKind, Version, parse_version

__all__ = ["DIALECT", "GUIDED_REMOVED", "STRUCTURED_OUTPUTS"]

STRUCTURED_OUTPUTS: Version = (0, 10, 2)
"""The first release that takes ``structured_outputs``."""
GUIDED_REMOVED: Version = (0, 12, 0)
"""The first release that ignores the ``guided_*`` fields."""


class _VLLM(Dialect):
    def priority_field(self, info: object) -> PriorityField | None:
        return PriorityField(lower_first=True)

    def version(self, info: object) -> Version | None:
        return parse_version(info.get("version")) if isinstance(info, Mapping) else None

    def schema_fields(
        self, schema: Mapping[str, Any], name: str, version: Version | None
    ) -> dict[str, Any]:
        if version is not None and version < STRUCTURED_OUTPUTS:
            return {"guided_json": dict(schema)}
        return {"structured_outputs": {"json": dict(schema)}}


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
    },
)
"""vLLM's rules."""
