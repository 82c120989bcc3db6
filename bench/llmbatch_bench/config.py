"""What a bench run is asked to do: :class:`BenchConfig` and the scenario names.

Scenarios come in three groups by the server they need. The *server* scenarios
(sweep, bulk, mixed) measure throughput and latency on a server with realistic
timing: ``--url``, or the simulator at ``DEFAULT_SIM_ARGS``. The *closed-loop*
scenarios (slo, saturate, outage, control) judge the client's admission controller
and circuit breaker on a slower simulator (``CLOSED_SIM_ARGS``) whose step timing
this machine can hold, so the bound its step model predicts is the real one;
``outage`` and ``control`` start their own simulator, since they take it down. The
*replicas* scenario (on request) starts several simulators in each of its jobs
(``REPLICAS_SIM_ARGS``, one killed in the failover job) and judges routing across
them. The *hot-path* scenarios (overhead, chat, single, burst, dropin, and on request embed,
transport and scale) measure llmbatch's own cost per call: they run against a zero-latency server
(``--overhead-url``, or ``llmbatch-server sim --zero-latency``), in a process of
their own, so the client's CPU is all that the measurement contains.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from llmbatch_bench.contenders import CONTENDERS

__all__ = [
    "CLOSED_SCENARIOS",
    "CLOSED_SIM_ARGS",
    "DEFAULT_SIM_ARGS",
    "EXTRA_SCENARIOS",
    "HOSTED_SCENARIOS",
    "HOT_SCENARIOS",
    "HOT_SIM_ARGS",
    "REPLICAS_SIM_ARGS",
    "REPLICA_SCENARIOS",
    "SCENARIOS",
    "SERVER_SCENARIOS",
    "SMOKE",
    "BenchConfig",
]

SERVER_SCENARIOS = ("sweep", "bulk", "ceiling", "bulk-chat", "mixed")
CLOSED_SCENARIOS = ("slo", "saturate", "frontier", "outage", "control")
REPLICA_SCENARIOS = ("replicas",)
#: A hosted provider's limiter (the simulator playing it): llmbatch beside AsyncOpenAI.
HOSTED_SCENARIOS = ("hosted",)
HOT_SCENARIOS = ("overhead", "chat", "embed", "single", "burst", "dropin", "transport", "scale")
#: What "all" (the default) leaves out: scenarios without a target (bulk-chat, the
#: chat batch route against one request per chat; embed needs a
#: server with /v1/embeddings), diagnostics, the long 1M-prompt run, the
#: replicas scenario (four simulators at a time, minutes), the frontier (a sweep of
#: static settings, tens of minutes), the ceiling (vLLM's offline engine: it
#: needs --vllm) and hosted (two maps paced by a limiter, minutes).
EXTRA_SCENARIOS = (
    "bulk-chat", "ceiling", "frontier", "replicas", "hosted", "embed", "transport", "scale",
)  # fmt: skip
#: Every scenario, in the order a run takes them.
SCENARIOS = (
    *SERVER_SCENARIOS, *CLOSED_SCENARIOS, *REPLICA_SCENARIOS, *HOSTED_SCENARIOS, *HOT_SCENARIOS,
)  # fmt: skip
#: The simulator's calibrated default profile, 100x faster so a full run takes minutes.
DEFAULT_SIM_ARGS = ("--speed", "100")
#: The closed-loop scenarios' simulator: 10x faster than the modelled GPU, slow enough
#: that a 2-core machine holds its step timing while a client runs beside it.
CLOSED_SIM_ARGS = ("--speed", "10")
#: Each replica of the replicas scenario: the closed-loop speed, which this 2-core
#: machine holds for four simulators and the client (checked in every job).
REPLICAS_SIM_ARGS = ("--speed", "10")
#: The hot-path server: answers at once, so the client's CPU is the bottleneck.
HOT_SIM_ARGS = ("--zero-latency",)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Everything ``llmbatch bench`` was asked to do (recorded in the JSON report)."""

    url: str | None = None
    sim_args: tuple[str, ...] = DEFAULT_SIM_ARGS
    #: A real vLLM the bench starts itself (``--vllm MODEL [-- ARGS]``) through
    #: ``llmbatch-server vllm``, for every server and closed-loop scenario.
    vllm_model: str | None = None
    vllm_args: tuple[str, ...] = ()
    vllm_profile: str = "latency"
    vllm_bin: str | None = None
    #: ``standard`` prompts (about 40 tokens on a Llama tokenizer) or ``short`` ones
    #: (about 15 on the CI's tiny model), where the API server, not the engine, limits.
    prompts: str = "standard"
    api_key: str | None = None
    model: str | None = None
    scenarios: tuple[str, ...] = tuple(s for s in SCENARIOS if s not in EXTRA_SCENARIOS)
    contenders: tuple[str, ...] = CONTENDERS
    n: int = 10_000
    max_tokens: int = 64
    concurrency: int = 64
    sweep: tuple[int, ...] = (64, 96, 128, 192, 256, 384, 512)
    sweep_batch: int = 16
    #: Interleaved rounds of the bulk and ceiling scenarios (each client once a round,
    #: on prompts of its own); the report adds each client's median.
    bulk_rounds: int = 1
    realtime_rate: float = 20.0
    realtime_duration: float = 12.0
    realtime_warmup: float = 3.0
    realtime_max_tokens: int = 32
    realtime_grace: float = 10.0
    mixed_n: int | None = None
    # -- closed loop (slo, saturate, outage, control) -----------------------------------
    closed_sim_args: tuple[str, ...] = CLOSED_SIM_ARGS
    #: The SLO: this many times the idle per-token time (of the step model, or measured).
    slo_factor: float = 3.0
    slo_warmup: float = 8.0
    slo_duration: float = 20.0
    slo_baselines: tuple[str, ...] = ("aiohttp",)
    #: The slo scenario's SLOs pace bulk for its prefill (``SLO(pace=True)``).
    slo_pace: bool = False
    #: Seconds a server step grows per prompt token it prefills, stated to the paced
    #: client (``Replica(prefill_seconds_per_token=)``; None: not stated; "fit":
    #: measured on the server before the scenario, by ``llmbatch-server fit``'s probe).
    slo_prefill_cost: float | Literal["fit"] | None = None
    saturate_n: int = 2_000
    saturate_sweep: tuple[int, ...] = (192, 256, 320, 384)
    saturate_rounds: int = 3
    #: The frontier: static settings of ``frontier_caps`` bulk sequences (plus
    #: :data:`.closedloop.frontier.RESERVE` for realtime) in batches of at most
    #: ``frontier_batches`` prompts, and the controller under the SLO, each run
    #: ``frontier_rounds`` times in alternated order; every run has the same warm-up
    #: and window, with non-streamed 16-token realtime calls at ``frontier_rate``/s.
    #: Then ``frontier_confirm`` more alternated rounds of the controller and the
    #: static settings near the bound (:func:`.closedloop.frontier.contested`): the
    #: verdict's medians rest on more calls than the far end's.
    frontier_caps: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    frontier_batches: tuple[int, ...] = (8, 64)
    frontier_rounds: int = 2
    frontier_confirm: int = 2
    frontier_warmup: float = 5.0
    frontier_duration: float = 15.0
    frontier_rate: float = 2.0
    #: The SLO the controller is given: ``both`` (TTFT and per-token, 3x idle) or
    #: ``tpot`` (per-token alone; the bound then takes the TTFT the client derives).
    frontier_slo: Literal["both", "tpot"] = "both"
    outage_n: int = 3_000
    outage_503: float = 15.0
    outage_restart: float = 20.0
    #: Seconds of bulk alone, with realtime arrivals, of a 503 outage, of recovery.
    control_phases: tuple[float, float, float, float] = (8.0, 12.0, 6.0, 12.0)
    # -- hosted (each contender starts a simulator playing the limiter) ------------------
    #: Chat conversations of each map (max_tokens 16), and the limiter's requests and
    #: tokens a minute and header family (``openai``, ``anthropic``, ``together``).
    hosted_conversations: int = 3_000
    hosted_rpm: int = 6_000
    hosted_tpm: int = 90_000
    hosted_headers: str = "openai"
    # -- replicas (each job starts its own simulators) ---------------------------------
    replicas_sim_args: tuple[str, ...] = REPLICAS_SIM_ARGS
    #: Replicas of the fleet (the throughput job compares them with one).
    replicas: int = 4
    #: Bulk prompts per replica of the throughput jobs (one replica gets this many,
    #: the fleet this many times ``replicas``: ~22 s each at ``--speed 10``).
    replicas_bulk_n: int = 3_000
    #: Prompts of each prefix-heavy job, and its shared system prompts.
    replicas_prefix_n: int = 12_000
    replicas_prefixes: int = 32
    replicas_prefix_chars: int = 4_000
    #: Each replica's ``--kv-cache-tokens`` in the prefix jobs (None: sized from the
    #: prompts, :func:`.replicas.plan.prefix_kv_tokens`).
    replicas_kv_tokens: int | None = None
    #: Streamed requests a second beside the prefix jobs' map (the TTFT sample).
    replicas_stream_rate: float = 4.0
    #: Prompts of the failover map (one replica is killed halfway).
    replicas_failover_n: int = 20_000
    #: Seconds of bulk alone, then of realtime arrivals (20/s per replica) in the SLO
    #: job; 0 seconds of arrivals leaves the job out.
    replicas_slo_warmup: float = 8.0
    replicas_slo_duration: float = 20.0
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
    #: Texts per embed measurement (``map`` over embeddings and over prompts).
    embed_n: int = 10_000
    single_n: int = 5_000
    burst_n: int = 100_000
    burst_max_tokens: int = 16
    burst_modes: tuple[str, ...] = ("map", "gather")
    burst_baselines: tuple[str, ...] = ("aiohttp",)
    burst_time_limit: float = 120.0
    #: Concurrent ``completions.create`` calls of the drop-in scenario's program.
    dropin_n: int = 2_000
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


#: The closed-loop and replicas scenarios' short form (``--smoke``): the same jobs,
#: each a few seconds, for CI. Options given explicitly still win.
SMOKE: dict[str, Any] = {
    "slo_warmup": 3.0,
    "slo_duration": 4.0,
    "slo_baselines": (),
    "frontier_caps": (1, 4, 16, 64),
    "frontier_batches": (8,),
    "frontier_warmup": 2.0,
    "frontier_duration": 4.0,
    "frontier_confirm": 0,
    "saturate_n": 400,
    "saturate_sweep": (256, 384),
    "saturate_rounds": 1,
    "outage_n": 600,
    "outage_503": 3.0,
    "outage_restart": 3.0,
    "control_phases": (3.0, 4.0, 3.0, 4.0),
    "replicas_bulk_n": 300,
    "replicas_prefix_n": 1_500,
    "replicas_failover_n": 2_000,
    "replicas_slo_warmup": 3.0,
    "replicas_slo_duration": 4.0,
    "hosted_conversations": 300,
}
