"""The closed-loop scenarios as runs: what each measures side by side, under which
labels (targets and the report find runs by them), and the context each run's
numbers are judged in (the SLO and the bound of the simulator's step model).

- ``slo``: realtime alone on the idle server (the reference), then a saturating bulk
  ``map`` with Poisson realtime streams, with ``SLO(tpot=factor x idle per-token
  time)`` and without, then the baselines under the same load.
- ``saturate``: llmbatch's bulk ``map`` with the library's defaults beside the lean
  probe at several concurrencies, in interleaved rounds (the report takes medians).
- ``frontier``: realtime alone on the idle server, streamed (the SLO: 3x its TTFT
  and per-token time) and as single calls; then every static setting of the grid
  (:mod:`.frontier`) and the controller under that SLO, each with a saturating bulk
  ``map_unordered`` and non-streamed 16-token realtime calls, in alternated rounds.
- ``outage``: a ``map`` that meets 503s for ``outage_503`` seconds, and one whose
  server is killed and restarted ``outage_restart`` seconds later.
- ``control``: the time series behind docs/concepts.md's plot.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from llmbatch_bench.closedloop import frontier as sweep
from llmbatch_bench.closedloop.stepmodel import SimModel, sim_model
from llmbatch_bench.config import BenchConfig
from llmbatch_bench.jobs import Job, prompt
from llmbatch_bench.metrics import RunMetrics
from llmbatch_bench.server import ServerInfo

__all__ = [
    "CONTROL",
    "FRONTIER_CONTROLLER",
    "FRONTIER_IDLE_CALL",
    "FRONTIER_IDLE_STREAM",
    "IDLE",
    "ON_THE_SERVER",
    "OUTAGE_503",
    "OUTAGE_RESTART",
    "SATURATE",
    "SLO_BOTH",
    "SLO_OFF",
    "SLO_ON",
    "control",
    "frontier",
    "model_of",
    "outage",
    "probe_label",
    "saturate",
    "slo",
    "static_label",
]

IDLE = "realtime alone (idle)"
SLO_ON = "llmbatch, SLO"
#: The same with a TTFT target too, for streamed realtime (both p99s are judged).
SLO_BOTH = "llmbatch, SLO ttft+tpot"
SLO_OFF = "llmbatch, no SLO"
SATURATE = "llmbatch (defaults)"
OUTAGE_503 = "503 outage"
OUTAGE_RESTART = "kill + restart"
CONTROL = "llmbatch, SLO"
FRONTIER_IDLE_STREAM = "realtime alone, streamed (idle)"
FRONTIER_IDLE_CALL = "realtime alone, single calls (idle)"
FRONTIER_CONTROLLER = "controller, SLO"
#: The closed-loop scenarios that share the one server (the others start their own).
ON_THE_SERVER = ("slo", "saturate", "frontier")


def static_label(setting: sweep.Setting) -> str:
    return f"static {setting.label}"


def probe_label(concurrency: int) -> str:
    return f"probe c={concurrency}"


class Runner(Protocol):
    """What the harness's runner offers a plan (see :mod:`.harness`)."""

    config: BenchConfig
    server: ServerInfo
    notes: list[str]

    def job(self, **fields: Any) -> Job: ...

    def run(self, job: Job, context: dict[str, Any] | None = None) -> RunMetrics | None: ...


def model_of(sim_args: tuple[str, ...] | None, max_tokens: int) -> SimModel | None:
    """The step model of a simulator the harness started (None for ``--url``)."""
    if sim_args is None:
        return None
    try:
        return sim_model(sim_args, max_tokens, [prompt(i) for i in range(1000, 1100)])
    except (RuntimeError, ValueError):
        return None


def slo(runner: Runner, contenders: list[str]) -> None:
    c = runner.config
    model = model_of(runner.server.sim_args, c.max_tokens)
    realtime = {
        "realtime_warmup": c.slo_warmup,
        "realtime_duration": c.slo_duration,
        "trace": True,
    }
    idle = runner.run(
        runner.job(kind="idle", scenario="slo", contender="llmbatch", label=IDLE, **realtime)
    )
    if model is not None:
        idle_token = model.idle_token_seconds
        source = "step model"
    else:
        measured = idle.tpot.get("realtime") if idle else None
        if measured is None or not math.isfinite(measured.p50):
            runner.notes.append("slo: no idle per-token time measured; scenario skipped")
            return
        idle_token, source = measured.p50, "measured idle p50"
    tpot = c.slo_factor * idle_token
    bound = model.bound(tpot) if model else None
    context = {
        "slo_tpot_s": tpot,
        "idle_token_s": idle_token,
        "idle_token_source": source,
        "slo_factor": c.slo_factor,
        "model": model.to_json() if model else None,
        "bound": bound.to_json() if bound else None,
    }
    # Bulk prompts to outlast warm-up and window at the server's full speed (llmbatch
    # reads them lazily; the baselines gather them all).
    full = model.bound(math.inf) if model else None
    seconds = c.slo_warmup + c.slo_duration
    n = max(1_000, math.ceil(full.prompts_per_s * seconds * 1.5)) if full else 50_000
    # TTFT: 3x what a realtime stream measured on the idle server (the step model has
    # no TTFT of its own: it depends on the prompt's prefill and the request path).
    idle_ttft = idle.ttft.get("realtime") if idle else None
    ttft = (
        c.slo_factor * idle_ttft.p50
        if idle_ttft is not None and math.isfinite(idle_ttft.p50)
        else None
    )
    context["slo_ttft_s"] = ttft
    prefill_cost = _prefill_cost(runner)
    context["prefill_cost_s"] = prefill_cost
    plan: list[tuple[str, str, float | None, float | None]] = [
        ("llmbatch", SLO_ON, tpot, None),
        ("llmbatch", SLO_OFF, None, None),
    ]
    if ttft is not None:
        plan.insert(1, ("llmbatch", SLO_BOTH, tpot, ttft))
    plan += [(b, b, None, None) for b in c.slo_baselines if b in contenders]
    for name, label, slo_tpot, slo_ttft in plan:
        job = runner.job(
            kind="mixed",
            scenario="slo",
            contender=name,
            label=label,
            n=n,
            max_tokens=c.max_tokens,
            slo_tpot=slo_tpot,
            slo_ttft=slo_ttft,
            slo_pace=c.slo_pace and slo_tpot is not None,
            prefill_cost=prefill_cost if slo_tpot is not None else None,
            **realtime,
        )
        runner.run(job, context)


def _prefill_cost(runner: Runner) -> float | None:
    """The prefill cost the SLO clients are told: as given, or measured now with
    ``llmbatch-server fit``'s prefill probe on the idle server ("fit")."""
    c = runner.config
    if c.slo_prefill_cost != "fit":
        return c.slo_prefill_cost
    import asyncio

    from llmbatch_server.fit.measure import Probe, prefill_cost

    # Lengths up to 1,024 tokens (those below half the context are sent): on a GPU a
    # few hundred tokens' prefill is lost in the request's own time.
    probe = Probe(prompt_lengths=(16, 256, 512, 1024))
    seconds, points = asyncio.run(
        prefill_cost(
            runner.server.base_url, api_key=c.api_key, model=runner.server.model, probe=probe
        )
    )
    runner.notes.append(
        f"slo: prefill cost measured on the server, {seconds * 1e6:.2f} µs a prompt token ("
        + ", ".join(f"{p.prompt_tokens} tokens {p.latency_s * 1e3:.1f} ms" for p in points)
        + ")"
    )
    return seconds


def frontier(runner: Runner, contenders: list[str]) -> None:
    """The frontier (:mod:`.frontier`): the idle server's latencies give the SLO; each
    static setting and the controller then run the same mixed workload, round after
    round, in order and then in reverse (drift on a shared machine falls on both
    ends alike)."""
    del contenders  # llmbatch's settings against each other: no baselines
    c = runner.config
    calls = {
        "contender": "llmbatch",
        "scenario": "frontier",
        "realtime_rate": c.frontier_rate,
        "realtime_max_tokens": sweep.REALTIME_TOKENS,
        "realtime_warmup": c.frontier_warmup,
        "realtime_duration": c.frontier_duration,
    }
    idle = runner.run(
        runner.job(kind="idle", label=FRONTIER_IDLE_STREAM, n=0, realtime_call="stream", **calls)
    )
    ttft = idle.ttft.get("realtime") if idle else None
    tpot = idle.tpot.get("realtime") if idle else None
    if ttft is None or tpot is None or not (math.isfinite(ttft.p50) and math.isfinite(tpot.p50)):
        runner.notes.append("frontier: no idle TTFT or per-token time measured; skipped")
        return
    runner.run(
        runner.job(kind="idle", label=FRONTIER_IDLE_CALL, n=0, realtime_call="complete", **calls)
    )
    slo_tpot = c.slo_factor * tpot.p50
    # With the per-token time alone the controller bounds the first token at what the
    # client derives from it, and every run is judged against that bound.
    tpot_only = c.frontier_slo == "tpot"
    slo_ttft = sweep.derived_ttft(slo_tpot) if tpot_only else c.slo_factor * ttft.p50
    context = {
        "slo_factor": c.slo_factor,
        "idle_ttft_s": ttft.p50,
        "idle_tpot_s": tpot.p50,
        "slo_ttft_s": slo_ttft,
        "slo_tpot_s": slo_tpot,
        "slo_ttft_derived": tpot_only,
        "bound_s": sweep.slo_bound(slo_ttft, slo_tpot),
    }
    model = model_of(runner.server.sim_args, c.max_tokens)
    full = model.bound(math.inf) if model else None
    seconds = c.frontier_warmup + c.frontier_duration
    n = max(2_000, math.ceil(full.prompts_per_s * seconds * 1.5)) if full else 50_000
    # Traced (the same 0.2 s reads in every run): the server's real step and the
    # requests its API process held say where a realtime call's time went.
    mixed = {**calls, "kind": "mixed", "n": n, "max_tokens": c.max_tokens, "trace": True}
    mixed["realtime_call"] = "complete"
    runs: list[dict[str, Any]] = [
        {
            "label": static_label(setting),
            "max_in_flight": setting.max_in_flight,
            "reserved_realtime": sweep.RESERVE,
            "adaptive": False,
            "bulk_batch": setting.batch,
        }
        for setting in sweep.grid(c.frontier_caps, c.frontier_batches)
    ]
    controller = {"label": FRONTIER_CONTROLLER, "slo_tpot": slo_tpot, "slo_pace": c.slo_pace}
    runs.append(controller if tpot_only else {**controller, "slo_ttft": slo_ttft})
    done: list[sweep.Point] = []
    for r in range(c.frontier_rounds):
        for fields in runs if r % 2 == 0 else reversed(runs):
            measured = runner.run(runner.job(**mixed, **fields, repeat=r), context)
            if measured is not None:
                latency = measured.latency.get("realtime")
                p99 = latency.p99 if latency is not None else None
                done.append(sweep.point(measured.label, p99, measured.prompts_per_s))
    if not c.frontier_confirm:
        return
    # The verdict turns on the controller and the settings near the bound: more rounds
    # of those, still alternated, so their medians rest on more calls.
    medians = sweep.median_points([done])
    near = set(sweep.contested([p for p in medians if p.label != FRONTIER_CONTROLLER],
                               context["bound_s"]))  # fmt: skip
    confirm = [f for f in runs if f["label"] in near or f["label"] == FRONTIER_CONTROLLER]
    runner.notes.append(
        f"frontier: {c.frontier_confirm} confirming rounds of "
        + ", ".join(f["label"] for f in confirm)
    )
    for k in range(c.frontier_confirm):
        r = c.frontier_rounds + k
        for fields in confirm if r % 2 == 0 else reversed(confirm):
            runner.run(runner.job(**mixed, **fields, repeat=r), context)


def saturate(runner: Runner, contenders: list[str]) -> None:
    """Default settings: no --max-in-flight, the library's priority_scheduling."""
    c = runner.config
    for r in range(c.saturate_rounds):
        for concurrency in c.saturate_sweep:
            runner.run(
                runner.job(
                    kind="probe",
                    scenario="saturate",
                    contender="probe",
                    label=probe_label(concurrency),
                    n=c.saturate_n,
                    max_tokens=c.max_tokens,
                    concurrency=concurrency,
                    batch=c.sweep_batch,
                    repeat=r,
                )
            )
        runner.run(
            runner.job(
                kind="bulk",
                scenario="saturate",
                contender="llmbatch",
                label=SATURATE,
                n=c.saturate_n,
                max_tokens=c.max_tokens,
                max_in_flight=None,
                priority_scheduling=None,
                trace=True,
                repeat=r,
            )
        )


def outage(runner: Runner, sim_args: tuple[str, ...] | None) -> None:
    c = runner.config
    vllm = (c.vllm_model, c.vllm_args, c.vllm_profile, c.vllm_bin) if c.vllm_model else None
    if sim_args is None and vllm is None:
        runner.notes.append("outage: needs the simulator (it kills it); skipped with --url")
        return
    modes = [("503", OUTAGE_503, c.outage_503), ("restart", OUTAGE_RESTART, c.outage_restart)]
    if vllm is not None:
        # vLLM has no route that makes it answer 503 for a while: kill and restart only.
        runner.notes.append(
            "outage: vLLM is killed and restarted; the 503 mode needs the simulator"
        )
        modes = modes[1:]
    for mode, label, seconds in modes:
        runner.run(
            runner.job(
                kind="outage",
                scenario="outage",
                contender="llmbatch",
                label=label,
                n=c.outage_n,
                max_tokens=c.max_tokens,
                sim_args=None if vllm else sim_args,
                vllm=vllm,
                outage_mode=mode,
                outage_seconds=seconds,
                # Generous: the map, the outage, and a slow recovery.
                time_limit=120.0 + seconds + c.outage_n / 10,
            )
        )


def control(runner: Runner, sim_args: tuple[str, ...] | None) -> None:
    c = runner.config
    model = None if c.vllm_model else model_of(sim_args, c.max_tokens)
    if sim_args is None or model is None:
        runner.notes.append("control: needs the simulator (it takes it down); skipped")
        return
    tpot = c.slo_factor * model.idle_token_seconds
    runner.run(
        runner.job(
            kind="control",
            scenario="control",
            contender="llmbatch",
            label=CONTROL,
            max_tokens=c.max_tokens,
            sim_args=sim_args,
            slo_tpot=tpot,
            phases=c.control_phases,
        ),
        {"slo_tpot_s": tpot, "model": model.to_json()},
    )
