"""What a bench run is asked to do: :class:`BenchConfig` and the scenario names.

Scenarios come in two groups by the server they need. The *server* scenarios
(sweep, bulk, mixed) measure throughput and latency on a server with realistic
timing: ``--url``, or the simulator at ``DEFAULT_SIM_ARGS``. The *hot-path*
scenarios (overhead, chat, single, burst, and on request transport and scale)
measure llmbatch's own cost per call: they run against a zero-latency server
(``--overhead-url``, or ``llmbatch-server sim --zero-latency``), in a process of
their own, so the client's CPU is all that the measurement contains.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llmbatch_bench.contenders import CONTENDERS

__all__ = [
    "DEFAULT_SIM_ARGS",
    "EXTRA_SCENARIOS",
    "HOT_SCENARIOS",
    "HOT_SIM_ARGS",
    "SCENARIOS",
    "SERVER_SCENARIOS",
    "BenchConfig",
]

SERVER_SCENARIOS = ("sweep", "bulk", "mixed")
HOT_SCENARIOS = ("overhead", "chat", "single", "burst", "transport", "scale")
#: What "all" (the default) leaves out: diagnostics and the long 1M-prompt run.
EXTRA_SCENARIOS = ("transport", "scale")
#: Every scenario, in the order a run takes them.
SCENARIOS = (*SERVER_SCENARIOS, *HOT_SCENARIOS)
#: The simulator's calibrated default profile, 100x faster so a full run takes minutes.
DEFAULT_SIM_ARGS = ("--speed", "100")
#: The hot-path server: answers at once, so the client's CPU is the bottleneck.
HOT_SIM_ARGS = ("--zero-latency",)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Everything ``llmbatch bench`` was asked to do (recorded in the JSON report)."""

    url: str | None = None
    sim_args: tuple[str, ...] = DEFAULT_SIM_ARGS
    api_key: str | None = None
    model: str | None = None
    scenarios: tuple[str, ...] = tuple(s for s in SCENARIOS if s not in EXTRA_SCENARIOS)
    contenders: tuple[str, ...] = CONTENDERS
    n: int = 10_000
    max_tokens: int = 64
    concurrency: int = 64
    sweep: tuple[int, ...] = (64, 96, 128, 192, 256, 384, 512)
    sweep_batch: int = 16
    realtime_rate: float = 20.0
    realtime_duration: float = 12.0
    realtime_warmup: float = 3.0
    realtime_max_tokens: int = 32
    realtime_grace: float = 10.0
    mixed_n: int | None = None
    # -- hot path (zero-latency server) -------------------------------------------------
    #: Rounds of every repeated hot-path measurement; the report shows the median.
    repeat: int = 3
    overhead_n: int = 20_000
    overhead_max_tokens: int = 16
    #: Prompts per HTTP request for llmbatch (BatchPolicy) and the probe alike.
    overhead_batch: int = 64
    #: Prompts in flight for llmbatch (Limits.max_in_flight) and the probe alike.
    overhead_in_flight: int = 256
    overhead_url: str | None = None
    chat_n: int = 10_000
    single_n: int = 5_000
    burst_n: int = 100_000
    burst_max_tokens: int = 16
    burst_modes: tuple[str, ...] = ("map", "gather")
    burst_baselines: tuple[str, ...] = ("aiohttp",)
    burst_time_limit: float = 120.0
    scale_n: int = 1_000_000
    scale_time_limit: float = 900.0
    # -- llmbatch settings for the server scenarios -------------------------------------
    max_in_flight: int | None = None
    priority_scheduling: bool | None = None
    isolate: bool = True
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["api_key"] = "***" if self.api_key else None
        return data
