"""llmbatch's public calls, measured in steady state.

:func:`steady` serves every steady-state job kind, here and in :mod:`.hotpath.references`:
the client (or session) is opened and warmed up through the same path first, and
closed after the measurement stops. So CPU per prompt is the per-prompt cost, not
connection setup or first-call imports, and the repeated rounds of a scenario
compare like with like. Only the public ``llmbatch`` API is used: ``Client(...,
batching=, limits=, transport=)``, ``map``, ``map_unordered``, ``imap``,
``complete`` and ``stats()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar, cast

import llmbatch
from llmbatch_bench.jobs import (
    WARMUP_OFFSET,
    Job,
    chat_inputs,
    embedding_inputs,
    prompts,
    watchdog,
    within_limit,
)
from llmbatch_bench.metrics import Recorder, RunMetrics, Tally, measure
from llmbatch_bench.server import read_api_posts

__all__ = [
    "BATCH_WAIT",
    "PROFILE_ENV",
    "Workload",
    "make_client",
    "run_llmbatch",
    "stats_extra",
    "steady",
    "workload",
]

T = TypeVar("T")
#: What a steady-state job does with its target: send ``inputs``, record into ``rec``.
Workload = Callable[[T, Iterator[Any], Recorder], Awaitable[None]]

#: Names a file: the measured workload (not the warm-up) runs under cProfile and its
#: statistics are written there, for ``python -m pstats`` (that run's CPU is inflated).
PROFILE_ENV = "LLMBATCH_BENCH_PROFILE"

#: ``BatchPolicy.max_wait`` of the measured tier. Batches fill long before it in
#: these workloads; it only holds the last, partial batch (wall time, not CPU).
BATCH_WAIT = 0.05


async def steady(
    job: Job,
    opened: AbstractAsyncContextManager[T],
    workload: Workload[T],
    *,
    warm: Workload[T] | None = None,
    describe: Callable[[T], Mapping[str, Any]] | None = None,
) -> RunMetrics:
    """Open ``opened``, warm up with ``job.warmup`` inputs (through ``warm``, default
    ``workload``), then measure ``workload`` over ``job.n`` inputs alone.

    With ``job.time_limit`` the workload is cancelled after that long and what it had
    not answered counts as unfinished. With ``job.count_requests`` the server's count
    of API requests is read before and after the measurement (outside it).
    """
    rec = Recorder()
    async with opened as target:
        if job.warmup:
            await (warm or workload)(target, _inputs(job, job.warmup, WARMUP_OFFSET), Recorder())
        before = _api_posts(job)
        with measure() as meter, watchdog(job, rec, meter), _profiled():
            work = workload(target, _inputs(job, job.n, 0), rec)
            timed_out = await within_limit(work, job.time_limit)
        after = _api_posts(job)
        extra = dict(describe(target)) if describe is not None else {}
    if before is not None and after is not None:
        extra["server_requests"] = after - before
    extra.update(
        timed_out=timed_out,
        repeat=job.repeat,
        gc_s=round(meter.gc_s, 6),
        gc_collections=meter.gc_collections,
    )
    return job.finish(
        rec,
        meter=meter,
        extra=extra,
    )


def _inputs(job: Job, n: int, start: int) -> Iterator[Any]:
    if job.inputs == "chat":
        return chat_inputs(n, start)
    return embedding_inputs(n, start) if job.inputs == "input" else prompts(n, start)


@contextlib.contextmanager
def _profiled() -> Iterator[None]:
    path = os.environ.get(PROFILE_ENV)
    if not path:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(path)


def _api_posts(job: Job) -> int | None:
    # A blocking read: it happens outside the measurement, with nothing in flight.
    return read_api_posts(job.base_url, job.api_key) if job.count_requests else None


def make_client(job: Job) -> llmbatch.Client:
    """The client a ``llmbatch`` job measures.

    Bulk calls get ``BatchPolicy(max_batch_size=job.batch)`` on their tier and, with
    ``job.max_in_flight``, ``Limits(max_in_flight=..., reserved_realtime=0)``: all of
    it usable by the measured tier, so llmbatch keeps exactly as many prompts in
    flight as the probe it is compared with. ``single`` keeps the library's default
    policies: the per-tier defaults (no wait for realtime) are what is measured.
    """
    batching = None
    if job.api != "single":
        policy = llmbatch.BatchPolicy(max_batch_size=job.batch, max_wait=BATCH_WAIT)
        batching = {job.priority: policy}
    limits = llmbatch.DEFAULT_LIMITS
    if job.max_in_flight is not None:
        limits = llmbatch.Limits(max_in_flight=job.max_in_flight, reserved_realtime=0)
    return llmbatch.Client(
        job.base_url,
        model=job.model,
        api_key=job.api_key,
        batching=cast(Any, batching),
        limits=limits,
        transport=cast(Any, job.transport),
        priority_scheduling=job.priority_scheduling,
        # Closing comes after the measurement; leftovers of a timed-out run are dropped.
        on_close="cancel",
    )


async def run_llmbatch(job: Job) -> RunMetrics:
    """Measure the public call ``job.api`` names."""
    return await steady(job, make_client(job), workload(job), describe=_describe)


def workload(job: Job) -> Workload[llmbatch.Client]:
    """The workload of public call ``job.api``, with ``job``'s tier and parameters."""
    return _WORKLOADS[job.api](job)


def _describe(client: llmbatch.Client) -> dict[str, Any]:
    return stats_extra(client.stats())


def stats_extra(snapshot: Any) -> dict[str, Any]:
    """llmbatch's own view of a run (its ``stats()``, warm-up included): how prompts
    were batched and how long they queued inside the client. Fields the snapshot
    lacks are left out, so the bench outlives changes to ``Stats``."""
    out: dict[str, Any] = {}
    for key, name in (
        ("http_requests", "batches_sent"),
        ("mean_batch_size", "mean_batch_size"),
        ("max_batch_size", "max_batch_size"),
    ):
        value = getattr(snapshot, name, None)
        if isinstance(value, int | float):
            out[key] = round(value, 2)
    for tier, counters in (getattr(snapshot, "tiers", None) or {}).items():
        wait = getattr(getattr(counters, "queue_wait", None), "p99", None)
        if getattr(counters, "done", 0) and isinstance(wait, float):
            # Time spent queued inside llmbatch, apart from the server's own time.
            out[f"{getattr(tier, 'value', tier)}_queue_wait_p99_ms"] = round(wait * 1e3, 2)
    return out


# -- the workloads: each is one public call, consumed the way a user would ----------------
#
# Results are counted with a Tally (two integer additions), never with a latency
# sample per prompt: the probe they are compared with pays nothing per prompt either.


def _map_params(job: Job) -> dict[str, Any]:
    """A map's keywords: ``max_tokens`` and the job's parameters (for embeddings
    the parameters alone, e.g. ``encoding_format``)."""
    if job.inputs == "input":
        return dict(job.params)
    return {"max_tokens": job.max_tokens, **job.params}


def _recorder(job: Job) -> Callable[[llmbatch.Result[Any], Tally, Recorder], None]:
    return _record_embedding if job.inputs == "input" else _record


def _map(job: Job) -> Workload[llmbatch.Client]:
    params, record = _map_params(job), _recorder(job)

    async def run(client: llmbatch.Client, inputs: Iterator[Any], rec: Recorder) -> None:
        results = await client.map(inputs, priority=job.priority, **params)
        counts = rec.tally("batch")
        for result in results:
            record(result, counts, rec)

    return run


def _map_unordered(job: Job) -> Workload[llmbatch.Client]:
    params, record = _map_params(job), _recorder(job)

    async def run(client: llmbatch.Client, inputs: Iterator[Any], rec: Recorder) -> None:
        results = client.map_unordered(inputs, priority=job.priority, **params)
        # aclosing: a timed-out run must stop the map's feeder at once.
        async with contextlib.aclosing(results):
            counts = rec.tally("batch")
            async for _, result in results:
                record(result, counts, rec)

    return run


def _imap(job: Job) -> Workload[llmbatch.Client]:
    params, record = _map_params(job), _recorder(job)

    async def run(client: llmbatch.Client, inputs: Iterator[Any], rec: Recorder) -> None:
        results = client.imap(inputs, priority=job.priority, **params)
        async with contextlib.aclosing(results):
            counts = rec.tally("batch")
            async for result in results:
                record(result, counts, rec)

    return run


def _gather(job: Job) -> Workload[llmbatch.Client]:
    """Every input as its own ``complete()`` call, all started at once (the burst)."""

    async def run(client: llmbatch.Client, inputs: Iterator[Any], rec: Recorder) -> None:
        counts = rec.tally("batch")

        async def one(text: str) -> None:
            try:
                value = await client.complete(
                    text, priority=job.priority, max_tokens=job.max_tokens, **job.params
                )
            except llmbatch.LLMBatchError as exc:
                rec.failure(exc)
                return
            counts.ok += 1
            counts.tokens += value.usage.completion_tokens

        await asyncio.gather(*(one(text) for text in inputs))

    return run


def _single(job: Job) -> Workload[llmbatch.Client]:
    """One ``complete()`` at a time, as a web handler makes them; latency per call."""

    async def run(client: llmbatch.Client, inputs: Iterator[Any], rec: Recorder) -> None:
        for text in inputs:
            start = time.perf_counter()
            try:
                value = await client.complete(
                    text, priority=job.priority, max_tokens=job.max_tokens, **job.params
                )
            except llmbatch.LLMBatchError as exc:
                rec.failure(exc)
                continue
            rec.success("single", time.perf_counter() - start, value.usage.completion_tokens)

    return run


def _record(result: llmbatch.Result[Any], counts: Tally, rec: Recorder) -> None:
    value = result.value
    if value is not None:
        counts.ok += 1
        counts.tokens += value.usage.completion_tokens
    else:
        rec.failure(result.error or "NoValue")


def _record_embedding(result: llmbatch.Result[Any], counts: Tally, rec: Recorder) -> None:
    """An embedding counts once its vector is read, as a program reads it (a base64
    vector is decoded then, as openai-python decodes it on arrival)."""
    value = result.value
    if value is not None and value.embedding:
        counts.ok += 1
    else:
        rec.failure(result.error or "NoVector")


_WORKLOADS: dict[str, Callable[[Job], Workload[llmbatch.Client]]] = {
    "map": _map,
    "map_unordered": _map_unordered,
    "imap": _imap,
    "gather": _gather,
    "single": _single,
}
