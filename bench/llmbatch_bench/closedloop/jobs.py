"""The closed-loop jobs that need a server of their own: ``outage`` and ``control``.

Both start their simulator in the worker process (``Job.sim_args`` plus
``--enable-admin``), because they take it down: ``outage`` makes it answer 503 for
``outage_seconds`` (its admin route) or kills it and restarts it on the same port
that long after, while a ``map`` runs through a :class:`~.wirelog.RecordingTransport`;
``control`` runs bulk work alone, then with realtime arrivals, through a 503 outage
and its recovery, sampling the controller (:class:`~.trace.Trace`) all along. The
simulator is another process, so the worker's CPU is still the client's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import llmbatch
from llmbatch_bench.closedloop.trace import Trace, column
from llmbatch_bench.closedloop.wirelog import (
    RecordingTransport,
    aiohttp_transport,
    per_second,
    rate,
    resume,
)
from llmbatch_bench.contenders import LlmbatchContender
from llmbatch_bench.jobs import (
    Job,
    poisson_arrivals,
    prompts,
    realtime_prompt,
    within_limit,
)
from llmbatch_bench.metrics import Recorder, RunMetrics, measure, record_stream
from llmbatch_bench.server import discover

__all__ = ["metrics_url", "own_simulator", "record_result", "run_control", "run_outage"]


def metrics_url(base_url: str) -> str:
    """vLLM serves ``/metrics`` at the root, not under ``/v1``."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}/metrics"


@contextlib.asynccontextmanager
async def own_simulator(job: Job) -> AsyncIterator[Any]:
    """The job's own simulator, with the admin route, or its own vLLM (started off the
    event loop)."""
    from llmbatch_server.testing import SimulatorProcess
    from llmbatch_server.vllm_process import VLLMProcess

    sim: SimulatorProcess | VLLMProcess
    if job.vllm is not None:
        model, args, profile, vllm_bin = job.vllm
        sim = VLLMProcess(model, args, profile=profile, vllm_bin=vllm_bin)
    else:
        assert job.sim_args is not None, "an outage or control job brings its own server"
        sim = SimulatorProcess((*job.sim_args, "--enable-admin"))
    await asyncio.to_thread(sim.start)
    try:
        yield sim
    finally:
        await asyncio.to_thread(sim.stop)


class _Outage:
    """Takes the server down once and records when it was down and back."""

    def __init__(self, sim: Any, mode: str, seconds: float) -> None:
        self.sim, self.mode, self.seconds = sim, mode, seconds
        self.down: float | None = None
        self.back: float | None = None

    async def __call__(self) -> None:
        if self.mode == "503":
            before = time.monotonic()
            await asyncio.to_thread(self.sim.outage, self.seconds, "503")
            # The simulator's timer started while it handled the admin request.
            self.down = (before + time.monotonic()) / 2
            await asyncio.sleep(max(0.0, self.down + self.seconds - time.monotonic()))
            self.back = self.down + self.seconds
        else:
            await asyncio.to_thread(self.sim.kill)
            self.down = time.monotonic()
            await asyncio.sleep(self.seconds)
            # Back when it answers /health again (restart() waits for that).
            await asyncio.to_thread(self.sim.restart)
            self.back = time.monotonic()


async def run_outage(job: Job) -> RunMetrics:
    """A ``map`` of ``job.n`` prompts that meets an outage after a fifth of them."""
    rec = Recorder()
    seen: Counter[int] = Counter()
    async with own_simulator(job) as sim:
        outage = _Outage(sim, job.outage_mode, job.outage_seconds)
        wire = RecordingTransport(aiohttp_transport())
        client = llmbatch.Client(sim.base_url, transport=wire)  # the library's defaults
        trace = Trace(time.monotonic())
        with measure() as meter:
            async with client:
                tracing = asyncio.ensure_future(trace.run(client.stats, metrics_url(sim.base_url)))
                taking_down: list[asyncio.Task[None]] = []

                async def consume() -> None:
                    results = client.map_unordered(
                        prompts(job.n, job.prompt_start), max_tokens=job.max_tokens, **job.params
                    )
                    async with contextlib.aclosing(results):
                        async for index, result in results:
                            seen[index] += 1
                            record_result(rec, result)
                            if rec.ok + rec.failed == max(1, job.n // 5) and not taking_down:
                                taking_down.append(asyncio.create_task(outage()))

                timed_out = await within_limit(consume(), job.time_limit)
                for task in taking_down:
                    await task
                await _stop(tracing)
                server = client.stats().server
    extra: dict[str, Any] = {
        "timed_out": timed_out,
        "mode": job.outage_mode,
        "outage_seconds": job.outage_seconds,
        "missing": job.n - len(seen),
        "duplicates": sum(c - 1 for c in seen.values() if c > 1),
        "breaker": server.breaker if server else None,
        "outages": server.outages if server else None,
        "trace": trace.to_json(),
    }
    origin = trace.origin
    extra["exchanges"] = [e.to_json(origin) for e in wire.log]
    if outage.down is not None and outage.back is not None:
        down, back = outage.down, outage.back
        data = trace.to_json()
        opened = _opened(data, down - origin, back - origin)
        during = [e for e in wire.log if down <= e.sent < back]
        extra.update(
            down_at=round(down - origin, 3),
            back_at=round(back - origin, 3),
            down_s=round(back - down, 3),
            per_second=per_second(wire.log, down, back),
            sent_during=dict(Counter(f"{e.method} {e.path}" for e in during)),
            # While the breaker held everything: what the server saw per second.
            opened_at=None if opened is None else round(opened, 3),
            sent_before_open=None
            if opened is None
            else sum(e.sent < origin + opened for e in during),
            open_rate=None if opened is None else rate(wire.log, origin + opened, back),
            resume=resume(wire.log, back).to_json(),
            refill_s=_refill(data, down - origin, back - origin),
        )
    return job.finish(
        rec,
        meter=meter,
        contender="llmbatch",
        extra=extra,
    )


def record_result(rec: Recorder, result: llmbatch.Result[Any]) -> None:
    """One map result into ``rec``: its latency and output tokens, or its error."""
    value = result.value
    if value is None:
        rec.failure(result.error or "NoValue")
    else:
        rec.success("batch", value.timings.latency, value.usage.completion_tokens)


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _opened(trace: dict[str, Any], down: float, back: float) -> float | None:
    """When (trace seconds) the client's breaker was first seen open in the outage."""
    for x, state in zip(column(trace, "t"), column(trace, "breaker"), strict=True):
        if down <= x < back and state not in (None, "closed"):
            return float(x)
    return None


def _refill(trace: dict[str, Any], down: float, back: float) -> float | None:
    """Seconds after ``back`` until the server ran 90 % of what it ran in the 3 s
    before ``down`` (None if it never did, or the trace has no server gauges)."""
    t, running = column(trace, "t"), column(trace, "running")
    before = [r for x, r in zip(t, running, strict=True) if down - 3 <= x < down and r is not None]
    if not before:
        return None
    level = 0.9 * sum(before) / len(before)
    for x, r in zip(t, running, strict=True):
        if x >= back and r is not None and r >= level:
            return round(float(x) - back, 3)
    return None


async def run_control(job: Job) -> RunMetrics:
    """Bulk alone, realtime joins, a 503 outage, recovery: the limit following load."""
    bulk_only, with_realtime, outage_s, recovery = job.phases
    rec = Recorder()
    rows: list[list[float | None]] = []
    async with own_simulator(job) as sim:
        served = await asyncio.to_thread(discover, sim.base_url, None, None)
        contender = LlmbatchContender(
            sim.base_url,
            model=served.model,
            params=job.params,
            priority_scheduling=job.priority_scheduling,
            slo_tpot=job.slo_tpot,
        )
        trace = Trace(time.monotonic())
        origin = trace.origin
        outage = _Outage(sim, "503", outage_s)

        async def take_down() -> None:
            await asyncio.sleep(with_realtime)
            await outage()

        with measure() as meter:
            async with contender:
                tracing = asyncio.ensure_future(
                    trace.run(contender.stats, metrics_url(sim.base_url))
                )
                bulk = asyncio.ensure_future(
                    contender.bulk(prompts(None), job.max_tokens, Recorder())
                )
                await asyncio.sleep(bulk_only)
                span = with_realtime + outage_s + recovery
                offsets = poisson_arrivals(job.realtime_rate, span, job.seed)
                down = asyncio.ensure_future(take_down())
                stream = _stream(contender, job, rec, rows, origin)
                await _arrive(offsets, job, stream)
                await down
                await _stop(bulk)
                await _stop(tracing)
    extra: dict[str, Any] = {
        "phases": list(job.phases),
        "slo_tpot": job.slo_tpot,
        "trace": trace.to_json(),
        # One row per realtime stream: [arrived, done, ttft, tpot, answered] (seconds).
        "realtime": rows,
        "down_at": None if outage.down is None else round(outage.down - origin, 3),
        "back_at": None if outage.back is None else round(outage.back - origin, 3),
    }
    return job.finish(
        rec,
        meter=meter,
        requested=len(offsets),
        contender="llmbatch",
        extra=extra,
    )


def _stream(
    contender: LlmbatchContender,
    job: Job,
    rec: Recorder,
    rows: list[list[float | None]],
    origin: float,
) -> Callable[[int], Awaitable[None]]:
    """One realtime stream, recorded in ``rec`` and as a row of its own timings."""

    async def one(i: int) -> None:
        arrived = time.monotonic()
        start = time.perf_counter()
        timing = None
        deltas = contender.client.stream(
            realtime_prompt(i),
            priority="realtime",
            max_tokens=job.realtime_max_tokens,
            **job.params,
        )
        try:
            timing = await record_stream(rec, deltas, start)
        except asyncio.CancelledError:
            rec.unfinished("realtime", time.perf_counter() - start)
            raise
        finally:
            ttft, tpot = timing if timing is not None else (None, None)
            row = [arrived - origin, time.monotonic() - origin, ttft, tpot]
            rows.append([None if x is None else round(x, 4) for x in row] + [timing is not None])

    return one


async def _arrive(offsets: list[float], job: Job, start: Callable[[int], Awaitable[None]]) -> None:
    """Start ``start(i)`` at each offset from now; give stragglers ``realtime_grace``."""
    begin = time.monotonic()
    tasks = []
    for i, offset in enumerate(offsets):
        delay = begin + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(start(i)))
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=job.realtime_grace)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
