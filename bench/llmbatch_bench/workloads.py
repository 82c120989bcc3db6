"""The contender workloads: each client under test driven the way its users drive it.

``bulk`` sends ``n`` prompts through a contender's bulk path (the bulk scenario, and
the burst's unbounded baselines with ``concurrency=None``); ``mixed`` adds streamed
realtime requests arriving as a Poisson process to saturating bulk work and measures
a window after a warm-up (the ``slo`` scenario too, with ``Job.slo_tpot`` and the
controller's time series); ``idle`` sends the same arrivals to an idle server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from llmbatch_bench.closedloop import jobs as closedloop
from llmbatch_bench.closedloop.trace import Trace, window_summary
from llmbatch_bench.contenders import Contender
from llmbatch_bench.hotpath import steady as hotpath
from llmbatch_bench.jobs import (
    Job,
    chat_inputs,
    poisson_arrivals,
    prompts,
    realtime_prompt,
    watchdog,
    within_limit,
)
from llmbatch_bench.metrics import STREAM_FIELDS, Recorder, RunMetrics, measure

__all__ = ["WORKLOADS", "run_workload"]


async def run_workload(job: Job, contender: Contender) -> RunMetrics:
    """Drive ``contender`` through ``job``'s workload (``bulk``, ``mixed`` or ``idle``)."""
    return await WORKLOADS[job.kind](job, contender)


def _extra(contender: Contender) -> dict[str, Any]:
    """llmbatch's own view of the run (baselines have none)."""
    stats = getattr(contender, "stats", None)
    return hotpath.stats_extra(stats()) if stats is not None else {}


async def _bulk(job: Job, contender: Contender) -> RunMetrics:
    rec = Recorder()
    with measure() as meter, watchdog(job, rec, meter):
        async with contender:
            if job.inputs == "chat":
                chats = chat_inputs(job.n, job.prompt_start)
                work = contender.bulk_chat(chats, job.max_tokens, rec)  # type: ignore[attr-defined]
            else:
                work = contender.bulk(prompts(job.n, job.prompt_start), job.max_tokens, rec)
            timed_out = await within_limit(work, job.time_limit)
            extra = _extra(contender)
    extra["timed_out"] = timed_out
    return job.finish(
        rec,
        meter=meter,
        extra=extra,
    )


async def _arrivals(
    job: Job,
    realtime: Callable[[int], Coroutine[Any, Any, None]],
    at_end: Callable[[], None] = lambda: None,
) -> tuple[float, float, int]:
    """Start ``realtime(i)`` at Poisson arrival times; wait for all of them.

    Returns (window start, window end, arrivals): the window spans the arrivals, and
    ``at_end`` runs when it closes (before the last calls finish). Calls still running
    ``realtime_grace`` seconds later are cancelled.
    """
    offsets = poisson_arrivals(job.realtime_rate, job.realtime_duration, job.seed)
    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tasks: list[asyncio.Task[None]] = []
        for i, offset in enumerate(offsets):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(tg.create_task(realtime(i)))
        end = max(time.perf_counter(), start + job.realtime_duration)
        if end > time.perf_counter():
            await asyncio.sleep(end - time.perf_counter())
        at_end()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=job.realtime_grace)
            for task in late:
                task.cancel()
    return start, end, len(offsets)


def _realtime(
    job: Job, contender: Contender, rec: Recorder
) -> Callable[[int], Coroutine[Any, Any, None]]:
    async def one(i: int) -> None:
        start = time.perf_counter()
        try:
            # Realtime prompts never repeat bulk ones (no accidental prefix sharing).
            await contender.realtime(realtime_prompt(i), job.realtime_max_tokens, rec)
        except asyncio.CancelledError:
            rec.unfinished("realtime", time.perf_counter() - start)
            raise

    return one


async def _mixed(job: Job, contender: Contender) -> RunMetrics:
    rec = Recorder()
    stats = getattr(contender, "stats", None)
    trace = Trace(time.monotonic()) if job.trace and stats is not None else None
    with measure() as meter:
        async with contender:
            tracing = (
                asyncio.ensure_future(trace.run(stats, closedloop.metrics_url(job.base_url)))
                if trace is not None and stats is not None
                else None
            )
            bulk = asyncio.ensure_future(
                contender.bulk(prompts(job.n, job.prompt_start), job.max_tokens, rec)
            )
            await asyncio.sleep(job.realtime_warmup)
            # Bulk completions are counted only while realtime traffic arrives.
            before = (rec.count("batch"), rec.tokens["batch"])
            window: dict[str, Any] = {"t0": time.monotonic()}

            def close_window() -> None:
                window["t1"] = time.monotonic()
                window["prompts"] = rec.count("batch") - before[0]
                window["tokens"] = rec.tokens["batch"] - before[1]
                # Bulk work that ran out early did not saturate the whole window.
                window["exhausted"] = bulk.done()

            start, end, arrivals = await _arrivals(
                job, _realtime(job, contender, rec), close_window
            )
            bulk.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bulk
            if tracing is not None:
                tracing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tracing
            extra = _extra(contender)
            if stats is not None:
                # What the controller believed at the end, with its evidence.
                servers = stats().servers
                if servers:
                    server = servers[0]
                    extra["inferences"] = server.model_dump(mode="json")["inferences"]
                    extra["slo_unreachable"] = server.slo_unreachable
                    extra["bulk_limit"] = server.bulk_limit
    if trace is not None:
        data = trace.to_json()
        # The window in the trace's time (it started with the client).
        w0, w1 = window["t0"] - trace.origin, window["t1"] - trace.origin
        extra.update(trace=data, window_in_trace=[w0, w1], controller=window_summary(data, w0, w1))
        # Each realtime stream in the trace's time: which waits made the tail, and when.
        extra["streams"] = {
            "fields": list(STREAM_FIELDS),
            "rows": [stream.row(trace.origin) for stream in rec.streams],
        }
        # And each realtime single call: (sent, latency), sent in the trace's time.
        extra["calls"] = {
            "fields": ["t", "latency"],
            "rows": [[round(at - trace.origin, 4), round(latency, 5)] for at, latency in rec.calls],
        }
    extra.update(
        realtime_requests=arrivals,
        realtime_ok=rec.count("realtime"),
        window_s=end - start,
        bulk_exhausted=window["exhausted"],
    )
    return job.finish(
        rec,
        meter=meter,
        requested=arrivals,
        prompts=window["prompts"],
        tokens=window["tokens"],
        window=end - start,
        extra=extra,
    )


async def _idle(job: Job, contender: Contender) -> RunMetrics:
    rec = Recorder()
    with measure() as meter:
        async with contender:
            start, end, arrivals = await _arrivals(job, _realtime(job, contender, rec))
            extra = _extra(contender)
    return job.finish(
        rec,
        meter=meter,
        requested=arrivals,
        window=end - start,
        extra=extra,
    )


WORKLOADS: dict[str, Callable[[Job, Contender], Coroutine[Any, Any, RunMetrics]]] = {
    "bulk": _bulk,
    "mixed": _mixed,
    "idle": _idle,
}
"""The workload of each contender-driven job kind."""
