"""Simulator settings: engine limits, the step-time model and fault rates.

The step-time constants fit a published throughput-vs-batch table for a 70B
model on 4xA100 (batch 1: 45 tok/s, 8: 248, 32: 587, 64: 743, 128: 821): a
decode step costs ``22.25 ms + 1.065 ms`` per running sequence (within 5% of
every row). Prefill costs 200 µs per prompt token: a forward pass costs about
2 FLOPs per parameter per token, 140 GFLOP for 70B; four A100s give 4 x 312 TFLOPS
(dense BF16, NVIDIA's datasheet), so 112 µs per token at full use, and prefill runs
near 56 % of peak (docs/simulator.md cites the figures). ``speed`` divides every
modelled duration so tests run the same schedule faster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from llmbatch_server.launcher.profiles import PROFILES
from llmbatch_server.sim.outage import OutagePlan

#: Published decode throughput (tokens/s) by batch size that the defaults fit.
REFERENCE_TABLE: dict[int, float] = {1: 45.0, 8: 248.0, 32: 587.0, 64: 743.0, 128: 821.0}

DEFAULT_MODEL = "llmbatch-sim"


@dataclass(frozen=True, kw_only=True)
class StepModel:
    """Modelled GPU time of one engine step, in seconds before ``speed`` applies."""

    base: float = 0.02225
    per_sequence: float = 0.001065
    per_prefill_token: float = 0.000_2
    #: API-server work per HTTP request and per prompt in it (parsing,
    #: tokenizing, detokenizing): serial, like vLLM's single front-end process.
    per_request: float = 0.0015
    per_prompt: float = 0.000_1
    #: A step's spread: each lasts its modelled time times a draw uniform in
    #: ``[1 - jitter, 1 + jitter]`` (0: every step as modelled; ``fit`` measures it).
    jitter: float = 0.0
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def step_seconds(self, sequences: int, prefill_tokens: int, draw: float = 0.5) -> float:
        """Wall time of one step with ``sequences`` in the batch; ``draw`` in [0, 1)
        places it in the jitter's spread (0.5: the modelled time)."""
        if sequences == 0:
            return 0.0
        modelled = (
            self.base + self.per_sequence * sequences + self.per_prefill_token * prefill_tokens
        )
        if self.jitter:
            modelled *= 1.0 + self.jitter * (2.0 * draw - 1.0)
        return modelled / self.speed

    def frontend_seconds(self, prompts: int) -> float:
        """Wall time the API server spends on one HTTP request of ``prompts`` prompts."""
        return (self.per_request + self.per_prompt * prompts) / self.speed


ZERO_LATENCY = StepModel(
    base=0.0, per_sequence=0.0, per_prefill_token=0.0, per_request=0.0, per_prompt=0.0
)


@dataclass(frozen=True, kw_only=True)
class EngineLimits:
    """vLLM's scheduler limits (same names as its flags)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    max_model_len: int = 4096
    #: KV-cache capacity in tokens (4xA100 80GB with a 70B model holds ~400k).
    kv_cache_tokens: int = 400_000
    #: Past this many waiting requests the server answers 503 (None: unbounded).
    max_num_queued_reqs: int | None = None
    scheduling_policy: str = "fcfs"
    #: Tokens per KV block (vLLM's ``--block-size``, 16 on GPUs).
    block_size: int = 16
    #: vLLM's automatic prefix caching (on by default in vLLM V1).
    enable_prefix_caching: bool = True
    #: KV blocks as vLLM allocates them: a sequence gets its prompt's when admitted
    #: and one more as its output fills each, and when none is free a running
    #: sequence is preempted (its blocks freed, to be recomputed when readmitted).
    #: Off: each sequence reserves its prompt and ``max_tokens`` when admitted and is
    #: never preempted (the simulator's older, simpler model).
    preemption: bool = False

    def __post_init__(self) -> None:
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be 'fcfs' or 'priority'")
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "kv_cache_tokens",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kv_cache_tokens < self.max_model_len:
            raise ValueError("kv_cache_tokens must hold at least one max_model_len sequence")


@dataclass(kw_only=True)
class FaultRates:
    """Per-HTTP-request fault probabilities; changeable at runtime via the admin API."""

    error_500: float = 0.0
    error_429: float = 0.0
    error_503: float = 0.0
    #: Connection closed after part of the response was sent.
    drop: float = 0.0
    #: An error event inside a 200 stream (vLLM sends ``data: {"error": ...}``).
    stream_error: float = 0.0
    spike: float = 0.0
    spike_seconds: float = 1.0
    retry_after: float = 1.0
    #: Prompts containing any of these strings are rejected with 400.
    poison: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        rates = ("error_500", "error_429", "error_503", "drop", "stream_error", "spike")
        for name in rates:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if self.error_500 + self.error_429 + self.error_503 + self.drop > 1.0:
            raise ValueError("error_500 + error_429 + error_503 + drop must not exceed 1")
        if self.spike_seconds < 0 or self.retry_after < 0:
            raise ValueError("spike_seconds and retry_after must be >= 0")

    def update(self, **changes: object) -> FaultRates:
        """A validated copy with ``changes`` applied (unknown names raise)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown fault setting(s): {sorted(unknown)}")
        if "poison" in changes:
            changes["poison"] = tuple(changes["poison"])  # type: ignore[arg-type]
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


#: When ``--queue-gauge`` reads the running and waiting gauges.
QUEUE_GAUGES = ("step", "live")
#: What ``--metrics`` may ask ``/metrics`` to expose, most first.
METRICS_LEVELS = ("full", "gauges", "none")


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Everything one simulator instance needs."""

    model: str = DEFAULT_MODEL
    limits: EngineLimits = field(default_factory=EngineLimits)
    step: StepModel = field(default_factory=StepModel)
    faults: FaultRates = field(default_factory=FaultRates)
    api_key: str | None = None
    enable_admin: bool = False
    seed: int = 0
    #: Serve ``POST /v1/chat/completions/batch`` (vLLM 0.19+); off emulates older servers.
    chat_batch: bool = True
    #: Play a hosted provider's rate limiter (``limiter.py``): requests and tokens a
    #: minute, enforced per second, with that provider's headers (None: no limit).
    rate_limit_rpm: int | None = None
    rate_limit_tpm: int | None = None
    rate_limit_headers: str = "openai"
    #: Count requests in flight for ``GET /load`` (vLLM's ``--enable-server-load-tracking``).
    server_load_tracking: bool = False
    #: What ``/metrics`` exposes: ``"full"`` (vLLM's gauges and latency histograms),
    #: ``"gauges"`` (the gauges alone, as an older vLLM or a filtering proxy) or
    #: ``"none"`` (404, as most other OpenAI-compatible servers).
    metrics: str = "full"
    #: When the running and waiting gauges (``/metrics`` and the load report) are read:
    #: ``"step"`` as vLLM v1 publishes them, the scheduler's state after each step
    #: (a request that arrives during a step is in neither until the next step
    #: schedules it, so a step's arrivals never show as waiting while seats are
    #: free); ``"live"`` every request not yet running, a step's arrivals included
    #: (as a server that counts its HTTP queue shows them).
    queue_gauge: str = "step"
    #: Answer the ``endpoint-load-metrics-format`` request header with a load report
    #: (vLLM's ORCA header); off emulates servers that send none.
    load_header: bool = True
    #: Report ``usage.prompt_tokens_details.cached_tokens`` (vLLM's
    #: ``--enable-prompt-tokens-details``, off by default there too).
    enable_prompt_tokens_details: bool = False
    #: Which of several replicas in one process (``--replicas``): their fault
    #: draws differ, their answers do not (they serve the same model).
    replica: int = 0
    #: Length of the vectors ``/v1/embeddings`` returns.
    embedding_dim: int = 384
    #: A Hugging Face ``tokenizer.json`` for exact prompt counts (None: the estimate).
    tokenizer: str | None = None
    #: An outage to start by itself (``--outage-*`` flags).
    outage: OutagePlan = field(default_factory=OutagePlan)
    #: What ``--fitted`` loaded, in words, for the start-up line (None: the defaults).
    fitted: str | None = None
    #: The share of structured answers (a schema asked for) that come back as
    #: invalid JSON, each drawn on its own, to exercise a client's re-asks.
    invalid_json: float = 0.0
    #: The longest list of prompts ``/v1/completions`` takes (vLLM's
    #: ``VLLM_MAX_COMPLETION_PROMPTS``); a longer one is refused with a 400.
    max_completion_prompts: int = 1024

    def __post_init__(self) -> None:
        if self.embedding_dim < 1:
            raise ValueError("embedding_dim must be >= 1")
        if self.metrics not in METRICS_LEVELS:
            raise ValueError(f"metrics must be one of {', '.join(METRICS_LEVELS)}")
        if self.max_completion_prompts < 1:
            raise ValueError("max_completion_prompts must be >= 1")
        if self.queue_gauge not in QUEUE_GAUGES:
            raise ValueError(f"queue_gauge must be one of {', '.join(QUEUE_GAUGES)}")
        if not 0.0 <= self.invalid_json <= 1.0:
            raise ValueError(f"invalid_json must be a share in [0, 1], got {self.invalid_json!r}")

    def __repr__(self) -> str:
        # The API key must never reach logs.
        key = "'***'" if self.api_key else "None"
        return (
            f"SimConfig(model={self.model!r}, limits={self.limits!r}, step={self.step!r}, "
            f"faults={self.faults!r}, api_key={key}, enable_admin={self.enable_admin})"
        )


def profile_limits(profile: str) -> dict[str, int | str]:
    """The engine limits of a launcher profile, so the simulator mirrors a real server."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    flags = PROFILES[profile]
    return {
        "max_num_seqs": int(str(flags["--max-num-seqs"])),
        "max_num_batched_tokens": int(str(flags["--max-num-batched-tokens"])),
        "max_model_len": int(str(flags["--max-model-len"])),
        "scheduling_policy": str(flags.get("--scheduling-policy", "fcfs")),
    }
