"""The measured workloads. Each :class:`Job` is one contender in one scenario and
runs in a process of its own (:mod:`llmbatch_bench.worker`).

Job kinds:

- ``bulk``: ``n`` prompts through the contender's bulk path (the bulk, overhead and
  burst scenarios; burst sets ``concurrency=None`` for an unbounded gather);
- ``probe``: the capacity sweep's lean client: raw aiohttp, ``batch`` prompts per
  ``/v1/completions`` request, ``concurrency`` prompts in flight, nothing else;
- ``mixed``: a saturating bulk workload plus streamed realtime requests arriving as
  a Poisson process, measured over a window after a warm-up;
- ``idle``: the same realtime arrivals on an otherwise idle server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from llmbatch_bench.contenders import Contender, make_contender
from llmbatch_bench.metrics import Meter, Recorder, RunMetrics, measure

__all__ = ["Job", "poisson_arrivals", "prompt", "prompts", "run_job"]

JobKind = Literal["bulk", "probe", "mixed", "idle"]


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
    max_in_flight: int | None = None
    priority_scheduling: bool = False
    #: Prompts per request for ``probe``.
    batch: int = 16
    realtime_rate: float = 20.0
    realtime_duration: float = 12.0
    realtime_warmup: float = 3.0
    realtime_max_tokens: int = 32
    #: After the window, realtime calls still running get this long, then count as
    #: unfinished (a shared semaphore can hold them behind the whole bulk backlog).
    realtime_grace: float = 10.0
    #: Stop a ``bulk`` job after this many seconds; what is left counts as unfinished.
    time_limit: float | None = None
    seed: int = 0

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


def prompt(i: int) -> str:
    """The ``i``-th benchmark prompt: distinct, about 40 tokens."""
    return f"Request {i}. {_FILLER}"


def prompts(n: int | None, start: int = 0) -> Iterator[str]:
    """``n`` prompts lazily (forever when ``n`` is None)."""
    indices = itertools.count(start) if n is None else range(start, start + n)
    return (prompt(i) for i in indices)


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


async def run_job(job: Job, contender: Contender | None = None) -> RunMetrics:
    """Run ``job`` in this process; ``contender`` overrides the one the job names."""
    if job.kind == "probe":
        return await _probe(job)
    if contender is None:
        contender = make_contender(
            job.contender,
            job.base_url,
            model=job.model,
            api_key=job.api_key,
            params=job.params,
            concurrency=job.concurrency,
            mode=job.mode,
            max_in_flight=job.max_in_flight,
            priority_scheduling=job.priority_scheduling,
        )
    runner = {"bulk": _bulk, "mixed": _mixed, "idle": _idle}[job.kind]
    return await runner(job, contender)


def _extra(contender: Contender) -> dict[str, Any]:
    """llmbatch's own view of the run: how prompts were batched."""
    stats = getattr(contender, "stats", None)
    if stats is None:
        return {}
    snapshot = stats()
    out: dict[str, Any] = {
        "http_requests": snapshot.batches_sent,
        "mean_batch_size": round(snapshot.mean_batch_size, 2),
        "max_batch_size": snapshot.max_batch_size,
    }
    for tier, counters in snapshot.tiers.items():
        if counters.done:
            # Time spent queued inside llmbatch, apart from the server's own time.
            out[f"{tier.value}_queue_wait_p99_ms"] = round(counters.queue_wait.p99 * 1e3, 2)
    return out


#: Set by the worker process: hands over partial metrics and ends the process. Used
#: when a timed-out job cannot even be cancelled in time (httpx's connection pool with
#: 100,000 waiting requests spends minutes on the cancellations alone).
hard_stop: Callable[[RunMetrics], None] | None = None
#: How long cancellation after ``time_limit`` may take before ``hard_stop``.
HARD_STOP_GRACE = 30.0


async def _bulk(job: Job, contender: Contender) -> RunMetrics:
    rec = Recorder()
    timed_out = False
    with measure() as meter, _watchdog(job, rec, meter):
        async with contender:
            work = contender.bulk(prompts(job.n), job.max_tokens, rec)
            if job.time_limit is None:
                await work
            else:
                try:
                    await asyncio.wait_for(work, job.time_limit)
                except TimeoutError:
                    timed_out = True
            extra = _extra(contender)
    extra["timed_out"] = timed_out
    return rec.finish(
        scenario=job.scenario,
        contender=job.contender,
        label=job.name,
        requested=job.n,
        meter=meter,
        extra=extra,
    )


@contextlib.contextmanager
def _watchdog(job: Job, rec: Recorder, meter: Meter) -> Iterator[None]:
    """Past ``time_limit + HARD_STOP_GRACE``, report what was done and stop (worker only)."""
    stop = hard_stop
    if job.time_limit is None or stop is None:
        yield
        return

    def give_up() -> None:
        stop(
            rec.finish(
                scenario=job.scenario,
                contender=job.contender,
                label=job.name,
                requested=job.n,
                meter=meter.stop(),
                extra={"timed_out": True, "hard_stopped": True},
            )
        )

    timer = threading.Timer(job.time_limit + HARD_STOP_GRACE, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


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
            await contender.realtime(prompt(10_000_000 + i), job.realtime_max_tokens, rec)
        except asyncio.CancelledError:
            rec.unfinished("realtime", time.perf_counter() - start)
            raise

    return one


async def _mixed(job: Job, contender: Contender) -> RunMetrics:
    rec = Recorder()
    with measure() as meter:
        async with contender:
            bulk = asyncio.ensure_future(contender.bulk(prompts(job.n), job.max_tokens, rec))
            await asyncio.sleep(job.realtime_warmup)
            # Bulk completions are counted only while realtime traffic arrives.
            before = (rec.count("batch"), rec.tokens["batch"])
            window: dict[str, Any] = {}

            def close_window() -> None:
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
            extra = _extra(contender)
    extra.update(
        realtime_requests=arrivals,
        realtime_ok=rec.count("realtime"),
        window_s=end - start,
        bulk_exhausted=window["exhausted"],
    )
    return rec.finish(
        scenario=job.scenario,
        contender=job.contender,
        label=job.name,
        requested=arrivals,
        meter=meter,
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
    return rec.finish(
        scenario=job.scenario,
        contender=job.contender,
        label=job.name,
        requested=arrivals,
        meter=meter,
        window=end - start,
        extra=extra,
    )


async def _probe(job: Job) -> RunMetrics:
    """The leanest client that can load the server: used to find its capacity."""
    import aiohttp

    concurrency = job.concurrency or 256
    workers = math.ceil(concurrency / job.batch)
    url = job.base_url.rstrip("/") + "/completions"
    headers = {"Content-Type": "application/json"}
    if job.api_key:
        headers["Authorization"] = f"Bearer {job.api_key}"
    todo = prompts(job.n)
    rec = Recorder()

    async def worker(session: aiohttp.ClientSession) -> None:
        while chunk := list(itertools.islice(todo, job.batch)):
            body = {"model": job.model, "prompt": chunk, "max_tokens": job.max_tokens}
            start = time.perf_counter()
            try:
                async with session.post(
                    url, data=json.dumps({**body, **job.params}), headers=headers
                ) as response:
                    content = await response.read()
                    status = response.status
            except (aiohttp.ClientError, OSError) as exc:
                for _ in chunk:
                    rec.failure(exc)
                continue
            if status != 200:
                for _ in chunk:
                    rec.failure(f"HTTP {status}")
                continue
            latency = time.perf_counter() - start
            total = int(json.loads(content)["usage"]["completion_tokens"])
            share, rest = divmod(total, len(chunk))
            for i in range(len(chunk)):
                rec.success("batch", latency, share + (1 if i < rest else 0))

    with measure() as meter:
        connector = aiohttp.TCPConnector(limit=workers)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(worker(session) for _ in range(workers)))
    return rec.finish(
        scenario=job.scenario,
        contender="probe",
        label=job.name,
        requested=job.n,
        meter=meter,
        extra={"concurrency": concurrency, "batch": job.batch},
    )
