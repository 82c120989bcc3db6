"""The hot-path scenarios as lists of jobs: what runs, under which label, in what order.

Each function returns the jobs of one scenario for the zero-latency server. Repeated
measurements are interleaved (round 1 runs every label once, then round 2, ...) so
a change in the machine's load during the run spreads over every label instead of
landing on one; the report takes the median of the rounds. Targets and the report
find runs by the labels defined here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from llmbatch_bench.config import BenchConfig
from llmbatch_bench.jobs import Job

__all__ = [
    "BARE",
    "CHAT",
    "COMPLETIONS",
    "DROPIN",
    "DROPIN_OPENAI",
    "EMBED",
    "EMBED_BASE64",
    "GATHER",
    "IMAP",
    "MAP",
    "MAP_UNORDERED",
    "OPENAI",
    "OPENAI_EMBED",
    "PROBE",
    "RAW",
    "SINGLE_NORMAL",
    "SINGLE_REALTIME",
    "interleave",
    "jobs_for",
    "per_request_n",
]

MAP = "llmbatch map"
MAP_UNORDERED = "llmbatch map_unordered"
IMAP = "llmbatch imap"
PROBE = "probe"
OPENAI = "openai"
GATHER = "llmbatch gather(complete)"
BARE = "bare gather"
RAW = "raw aiohttp"
SINGLE_REALTIME = "llmbatch realtime"
SINGLE_NORMAL = "llmbatch normal"
COMPLETIONS = "llmbatch map (completions)"
CHAT = "llmbatch map (chat)"
EMBED = "llmbatch map (embeddings)"
EMBED_BASE64 = "llmbatch map (embeddings, base64)"
OPENAI_EMBED = "openai embeddings.create"
#: The drop-in scenario's one program, by where ``AsyncOpenAI`` is imported from.
DROPIN_OPENAI = "openai.AsyncOpenAI"
DROPIN = "llmbatch.openai.AsyncOpenAI"

#: Prompts sent before measuring, through the same path: enough for every
#: connection of the pool to open and every code path to run a few times.
WARMUP = 512
#: Sequential calls before measuring ``single``.
SINGLE_WARMUP = 50
#: Calls the drop-in scenario's program makes (gathered) before measuring.
DROPIN_WARMUP = 200

#: Makes a job for the hot-path server with the run's common fields filled in.
JobFactory = Callable[..., Job]


def interleave(jobs: Sequence[Job], repeat: int) -> list[Job]:
    """Every job ``repeat`` times, round by round: a, b, c, a, b, c, ..."""
    return [dataclasses.replace(job, repeat=r) for r in range(repeat) for job in jobs]


def per_request_n(n: int) -> int:
    """Prompts for a client that sends one request per prompt: a tenth of ``n``
    (at least 100). CPU per prompt is a rate; a tenth measures it as well and keeps
    a run of the slow clients from taking ten times as long."""
    return min(n, max(100, n // 10))


def jobs_for(scenario: str, config: BenchConfig, job: JobFactory) -> list[Job]:
    """The jobs of hot-path ``scenario``, in the order to run them."""
    plans: dict[str, Callable[[BenchConfig, JobFactory], list[Job]]] = {
        "overhead": _overhead,
        "chat": _chat,
        "embed": _embed,
        "single": _single,
        "burst": _burst,
        "dropin": _dropin,
        "transport": _transport,
        "scale": _scale,
    }
    return plans[scenario](config, job)


def _batched(config: BenchConfig, **fields: Any) -> dict[str, Any]:
    """llmbatch and the probe send the same batches with the same prompts in flight."""
    return {
        "batch": config.overhead_batch,
        "max_in_flight": config.overhead_in_flight,
        "concurrency": config.overhead_in_flight,
        "max_tokens": config.overhead_max_tokens,
        "warmup": WARMUP,
        **fields,
    }


def _overhead(c: BenchConfig, job: JobFactory) -> list[Job]:
    common = _batched(c, scenario="overhead", n=c.overhead_n)
    plan = [
        job(kind="llmbatch", contender="llmbatch", label=label, api=api, **common)
        for label, api in ((MAP, "map"), (MAP_UNORDERED, "map_unordered"), (IMAP, "imap"))
    ]
    plan.append(job(kind="probe", contender="probe", label=PROBE, **common))
    if "openai" in c.contenders:
        plan.append(
            job(
                kind="per_prompt",
                contender="openai",
                label=OPENAI,
                scenario="overhead",
                n=per_request_n(c.overhead_n),
                max_tokens=c.overhead_max_tokens,
                concurrency=c.concurrency,
                warmup=c.concurrency,
            )
        )
    return interleave(plan, c.repeat)


def _chat(c: BenchConfig, job: JobFactory) -> list[Job]:
    common = _batched(c, scenario="chat", n=c.chat_n, kind="llmbatch", contender="llmbatch")
    plan = [
        job(label=COMPLETIONS, api="map", inputs="prompt", **common),
        job(label=CHAT, api="map", inputs="chat", **common),
    ]
    return interleave(plan, c.repeat)


def _embed(c: BenchConfig, job: JobFactory) -> list[Job]:
    """``map`` over ``{"input": text}`` items beside ``map`` over the same texts as
    prompts, same batches and prompts in flight; the vectors as floats (llmbatch's
    default) and as base64 (openai-python's); openai's ``embeddings.create`` per
    text as the baseline (one request each, so a tenth of the texts)."""
    common = _batched(c, scenario="embed", n=c.embed_n, kind="llmbatch", contender="llmbatch")
    plan = [
        job(label=COMPLETIONS, api="map", inputs="prompt", **common),
        job(label=EMBED, api="map", inputs="input", params={}, **common),
        job(
            label=EMBED_BASE64,
            api="map",
            inputs="input",
            params={"encoding_format": "base64"},
            **common,
        ),
    ]
    if "openai" in c.contenders:
        plan.append(
            job(
                kind="program",
                contender="openai",
                label=OPENAI_EMBED,
                scenario="embed",
                inputs="input",
                n=per_request_n(c.embed_n),
                concurrency=c.concurrency,
                warmup=c.concurrency,
            )
        )
    return interleave(plan, c.repeat)


def _dropin(c: BenchConfig, job: JobFactory) -> list[Job]:
    """One program, ``dropin_n`` concurrent ``completions.create`` calls, run with
    ``openai.AsyncOpenAI`` and with ``llmbatch.openai.AsyncOpenAI`` (both are the
    openai SDK's client: without it there is nothing to run)."""
    if "openai" not in c.contenders:
        return []
    common = {
        "kind": "program",
        "contender": "openai",
        "scenario": "dropin",
        "n": c.dropin_n,
        "max_tokens": c.overhead_max_tokens,
        "concurrency": None,
        "warmup": min(c.dropin_n, DROPIN_WARMUP),
    }
    plan = [
        job(label=DROPIN_OPENAI, sdk="openai", **common),
        job(label=DROPIN, sdk="llmbatch.openai", **common),
    ]
    return interleave(plan, c.repeat)


def _single(c: BenchConfig, job: JobFactory) -> list[Job]:
    # max_tokens=1: a web handler's short answer, so the server's time is negligible.
    # The library's default limits: --max-in-flight is for the server scenarios.
    common = {
        "scenario": "single",
        "n": c.single_n,
        "max_tokens": 1,
        "warmup": SINGLE_WARMUP,
        "max_in_flight": None,
    }
    plan = [
        job(kind="raw", contender="raw", label=RAW, **common),
        job(
            kind="llmbatch",
            contender="llmbatch",
            label=SINGLE_REALTIME,
            api="single",
            priority="realtime",
            **common,
        ),
        job(
            kind="llmbatch",
            contender="llmbatch",
            label=SINGLE_NORMAL,
            api="single",
            priority="normal",
            **common,
        ),
    ]
    return interleave(plan, c.repeat)


def _burst(c: BenchConfig, job: JobFactory) -> list[Job]:
    """Once each (100,000 calls take long enough): the memory baseline, then llmbatch's
    ways in over the same prompts, then the unbounded gather baselines."""
    common = _batched(
        c,
        scenario="burst",
        n=c.burst_n,
        max_tokens=c.burst_max_tokens,
        time_limit=c.burst_time_limit,
        api="gather",
    )
    plan = []
    if "gather" in c.burst_modes:
        plan.append(job(kind="bare", contender="bare", label=BARE, **common))
        plan.append(job(kind="llmbatch", contender="llmbatch", label=GATHER, **common))
    if "map" in c.burst_modes:
        plan.append(
            job(kind="llmbatch", contender="llmbatch", label=MAP, **{**common, "api": "map"})
        )
    for name in c.burst_baselines:
        if name in c.contenders and name != "llmbatch":
            plan.append(
                job(
                    kind="bulk",
                    scenario="burst",
                    contender=name,
                    label=f"{name} (unbounded)",
                    n=c.burst_n,
                    max_tokens=c.burst_max_tokens,
                    time_limit=c.burst_time_limit,
                    concurrency=None,
                )
            )
    return plan


def _transport(c: BenchConfig, job: JobFactory) -> list[Job]:
    """llmbatch's ``map`` per transport, one prompt per request vs batched."""
    plan = []
    for transport in ("aiohttp", "httpx"):
        for batch in (1, c.overhead_batch):
            n = c.overhead_n if batch > 1 else per_request_n(c.overhead_n)
            fields = _batched(c, scenario="transport", n=n, batch=batch, transport=transport)
            label = f"{transport}, {batch}/request"
            plan.append(job(kind="llmbatch", contender="llmbatch", label=label, **fields))
    return interleave(plan, c.repeat)


def _scale(c: BenchConfig, job: JobFactory) -> list[Job]:
    fields = _batched(c, scenario="scale", n=c.scale_n, time_limit=c.scale_time_limit)
    return [
        job(
            kind="llmbatch",
            contender="llmbatch",
            label=MAP_UNORDERED,
            api="map_unordered",
            **fields,
        )
    ]
