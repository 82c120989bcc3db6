"""The replicas scenario's jobs: a fleet of the job's own simulators, one workload,
and every replica's ``/metrics`` read throughout (:class:`~.fleetmetrics.FleetSampler`).

The simulators are processes of their own, started and stopped off the event loop,
so the worker's CPU is still the client's alone. Workloads (``Job.workload``):

- ``uniform``: ``n`` distinct prompts through ``map_unordered`` of one
  ``llmbatch.Client`` over every replica, with the library's defaults;
- ``prefix``: prompts sharing a few long system prompts, through one client over
  every replica (``routing="llmbatch"``) or dealt in turn to one client per replica,
  each mapping its share at the same time (``"round_robin"``); beside them, streamed
  requests of the same kind arrive at ``realtime_rate`` (their time to first token
  is measured per request, which a ``map`` item's timings do not carry);
- ``failover``: ``uniform`` with replica :data:`~.replicaplan.KILLED` killed
  (SIGKILL) once half the results are in; the client's own view of the killed
  replica (in flight, breaker) is sampled too;
- ``slo``: the ``mixed`` job (bulk plus Poisson realtime streams, with
  ``SLO(tpot=...)``) over every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

import llmbatch
from llmbatch_bench.closedloop.jobs import metrics_url, record_result
from llmbatch_bench.closedloop.stepmodel import SimModel, sim_model
from llmbatch_bench.contenders import LlmbatchContender
from llmbatch_bench.jobs import Job, prefix_prompts, prompts, within_limit
from llmbatch_bench.metrics import Recorder, RunMetrics, measure, record_stream
from llmbatch_bench.replicas.fleetmetrics import FleetSampler, absorbed, histogram_quantile
from llmbatch_bench.replicas.plan import KILLED
from llmbatch_bench.server import discover, machine_busy, process_cpu
from llmbatch_bench.workloads import run_workload

__all__ = ["own_fleet", "run_replicas"]

#: Streamed sample prompts are numbered from here (never a bulk prompt's number).
STREAM_OFFSET = 10_000_000
#: The streamed sample stops arriving once this share of the map is answered, so
#: no stream meets an emptying fleet.
STREAM_UNTIL = 0.9


@contextlib.asynccontextmanager
async def own_fleet(job: Job) -> AsyncIterator[list[Any]]:
    """``job.replicas`` simulators of the job's own (started off the event loop), or
    with ``job.vllm`` as many real vLLMs, replica ``i`` pinned to CPU ``i``."""
    from llmbatch_server.testing import run_simulators

    if job.vllm is not None:
        async with _own_vllms(job) as servers:
            yield servers
        return
    assert job.sim_args is not None, "a replicas job brings its own simulators"
    with contextlib.ExitStack() as stack:
        sims = await asyncio.to_thread(
            stack.enter_context, run_simulators(job.replicas, *job.sim_args)
        )
        try:
            yield sims
        finally:
            await asyncio.to_thread(stack.close)


@contextlib.asynccontextmanager
async def _own_vllms(job: Job) -> AsyncIterator[list[Any]]:
    """Pinned, so that two replicas on two cores measure scale-out rather than two
    engines contending for both cores."""
    from llmbatch_server.vllm_process import VLLMProcess

    assert job.vllm is not None
    model, args, profile, vllm_bin = job.vllm
    servers = [
        VLLMProcess(model, args, profile=profile, vllm_bin=vllm_bin, cpus=str(i))
        for i in range(job.replicas)
    ]
    try:
        for server in servers:  # one at a time: loading takes both cores anyway
            await asyncio.to_thread(server.start)
        yield servers
    finally:
        for server in servers:
            await asyncio.to_thread(server.stop)


def _server_pids(server: Any) -> list[int | None]:
    """A simulator's process, or a vLLM's API server and engine processes."""
    processes = getattr(server, "processes", None)
    if processes is None:
        return [server.pid]
    api, engine = processes()
    return [api, *engine]


async def run_replicas(job: Job) -> RunMetrics:
    """Start the fleet, run the job's workload, add what each replica did."""
    workload = {
        "uniform": _uniform,
        "prefix": _prefix,
        "failover": _failover,
        "slo": _slo,
    }[job.workload]
    model = _model(job)
    async with own_fleet(job) as sims:
        urls = [sim.base_url for sim in sims]
        sampler = FleetSampler([metrics_url(url) for url in urls])
        await sampler.read()
        sampling = asyncio.ensure_future(sampler.run())
        load = _MachineLoad([pid for sim in sims for pid in _server_pids(sim)])
        try:
            metrics = await workload(job, sims, sampler)
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
        machine = load.summary()
        await sampler.read()
    ttft = sampler.ttft_buckets()
    extra = {
        **metrics.extra,
        "replicas": job.replicas,
        "routing": job.routing,
        "workload": job.workload,
        "per_replica": sampler.summaries(model),
        "server_ttft_p50_s": histogram_quantile(ttft, 0.5),
        "server_ttft_p99_s": histogram_quantile(ttft, 0.99),
        "server_ttft_buckets": ttft,
        "gauges": sampler.to_json(),
        **machine,
    }
    return dataclasses.replace(metrics, extra=extra)


class _MachineLoad:
    """What the machine's CPUs did while the workload ran, in cores: the fleet's
    simulators, this process (the client, the sampling), and the rest
    (``other_load_cores``: other work on a shared machine, as the harness reports it
    for the other scenarios). A killed simulator's CPU after its last reading is lost."""

    def __init__(self, pids: list[int | None]) -> None:
        self.pids = [p for p in pids if p is not None]
        self.wall = time.perf_counter()
        self.own = time.process_time()
        self.busy = machine_busy()
        self.fleet = {p: process_cpu(p) for p in self.pids}

    def summary(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall
        own = time.process_time() - self.own
        fleet = 0.0
        for pid, before in self.fleet.items():
            after = process_cpu(pid)
            if before is not None and after is not None:
                fleet += after - before
        busy = machine_busy()
        if busy is None or self.busy is None or wall <= 0:
            return {}
        total = (busy - self.busy) / wall
        return {
            "server_cpu_s": round(fleet, 3),
            "machine_busy_cores": round(total, 2),
            "other_load_cores": round(total - (own + fleet) / wall, 2),
        }


def _model(job: Job) -> SimModel | None:
    if job.vllm is not None:
        return None
    assert job.sim_args is not None
    try:
        return sim_model(job.sim_args, job.max_tokens)
    except (RuntimeError, ValueError):
        return None


def _client(job: Job, urls: list[str]) -> llmbatch.Client:
    """A client as its README shows, over ``urls``: the library's defaults."""
    return llmbatch.Client(urls, priority_scheduling=job.priority_scheduling)


class _Tally:
    """Results of one or more maps: each input exactly once, and when each came."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.seen: Counter[int] = Counter()
        self.times = array("d")

    async def consume(
        self,
        results: AsyncIterator[tuple[int, llmbatch.Result[Any]]],
        index: Callable[[int], int] = lambda i: i,
        after: Callable[[], None] = lambda: None,
    ) -> None:
        async with contextlib.aclosing(results) as stream:  # type: ignore[type-var]
            async for i, result in stream:
                self.seen[index(i)] += 1
                record_result(self.rec, result)
                self.times.append(time.monotonic())
                after()

    def extra(self, n: int) -> dict[str, Any]:
        return {
            "missing": n - len(self.seen),
            "duplicates": sum(c - 1 for c in self.seen.values() if c > 1),
        }


def _map(client: llmbatch.Client, inputs: Iterable[str], job: Job) -> Any:
    return client.map_unordered(inputs, max_tokens=job.max_tokens, **job.params)


def _finish(
    job: Job, rec: Recorder, meter: Any, window: float, extra: dict[str, Any], streams: int = 0
) -> RunMetrics:
    """Rates count the map's prompts over the map's time; ``requested`` counts the
    streamed sample too (it is in the recorder's realtime tier)."""
    extra["bulk_ok"] = rec.count("batch")
    return job.finish(
        rec,
        meter=meter,
        requested=job.n + streams,
        prompts=rec.count("batch"),
        tokens=rec.tokens["batch"],
        window=window,
        extra=extra,
    )


async def _uniform(job: Job, sims: list[Any], sampler: FleetSampler) -> RunMetrics:
    rec = Recorder()
    tally = _Tally(rec)
    with measure() as meter:
        async with _client(job, [s.base_url for s in sims]) as client:
            start = time.perf_counter()
            timed_out = await within_limit(
                tally.consume(_map(client, prompts(job.n), job)), job.time_limit
            )
            window = time.perf_counter() - start
    return _finish(job, rec, meter, window, {**tally.extra(job.n), "timed_out": timed_out})


async def _prefix(job: Job, sims: list[Any], sampler: FleetSampler) -> RunMetrics:
    rec = Recorder()
    tally = _Tally(rec)
    urls = [s.base_url for s in sims]
    make = prefix_prompts(job.n, job.prefixes, job.prefix_chars, job.seed)
    # Enough streamed prompts for the longest the job may take, and then some.
    most = int(2 * job.realtime_rate * (job.time_limit or 600.0)) + 100
    sample = prefix_prompts(most, job.prefixes, job.prefix_chars, job.seed + 1, STREAM_OFFSET)
    if job.routing == "llmbatch":
        clients = [_client(job, urls)]
    else:
        clients = [_client(job, [url]) for url in urls]
    share = len(clients)
    enough = asyncio.Event()

    def check() -> None:
        if rec.count("batch") + rec.failed >= STREAM_UNTIL * job.n:
            enough.set()

    def dealt(k: int) -> Iterator[str]:
        return (make(i) for i in range(k, job.n, share))

    with measure() as meter:
        async with contextlib.AsyncExitStack() as stack:
            for client in clients:
                await stack.enter_async_context(client)
            start = time.perf_counter()
            streams = asyncio.ensure_future(_streams(job, clients, sample, rec, enough))
            maps = _all(
                *(
                    tally.consume(
                        _map(client, dealt(k), job),
                        index=lambda i, k=k: k + i * share,  # type: ignore[misc]
                        after=check,
                    )
                    for k, client in enumerate(clients)
                )
            )
            timed_out = await within_limit(maps, job.time_limit)
            window = time.perf_counter() - start
            enough.set()
            streamed = await streams
    extra = {**tally.extra(job.n), "timed_out": timed_out, "streams": streamed}
    return _finish(job, rec, meter, window, extra, streamed)


async def _all(*work: Awaitable[None]) -> None:
    await asyncio.gather(*work)


async def _streams(
    job: Job,
    clients: list[llmbatch.Client],
    sample: Callable[[int], str],
    rec: Recorder,
    enough: asyncio.Event,
) -> int:
    """Streamed realtime requests at Poisson arrivals until ``enough`` (in turn over
    ``clients``); each one's TTFT lands in ``rec``'s realtime tier. Returns how many."""
    import random

    rng = random.Random(job.seed)
    tasks: list[asyncio.Task[Any]] = []

    async def one(i: int) -> None:
        start = time.perf_counter()
        deltas = clients[i % len(clients)].stream(
            sample(STREAM_OFFSET + i),
            priority="realtime",
            max_tokens=job.realtime_max_tokens,
            **job.params,
        )
        await record_stream(rec, deltas, start)

    while not enough.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(enough.wait(), rng.expovariate(job.realtime_rate))
            break
        tasks.append(asyncio.ensure_future(one(len(tasks))))
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=job.realtime_grace)
        for task in late:
            task.cancel()
            rec.unfinished("realtime", job.realtime_grace)
        await asyncio.gather(*late, return_exceptions=True)
    return len(tasks)


async def _failover(job: Job, sims: list[Any], sampler: FleetSampler) -> RunMetrics:
    rec = Recorder()
    tally = _Tally(rec)
    killing: list[asyncio.Task[float]] = []
    watched: list[list[Any]] = []

    async def kill() -> float:
        before = time.monotonic()
        await asyncio.to_thread(sims[KILLED].kill)
        return (before + time.monotonic()) / 2

    def halfway() -> None:
        if not killing and rec.ok + rec.failed >= job.n // 2:
            killing.append(asyncio.ensure_future(kill()))

    with measure() as meter:
        async with _client(job, [s.base_url for s in sims]) as client:
            watching = asyncio.ensure_future(_watch(client, KILLED, sampler.origin, watched))
            start = time.perf_counter()
            work = tally.consume(_map(client, prompts(job.n), job), after=halfway)
            timed_out = await within_limit(work, job.time_limit)
            window = time.perf_counter() - start
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    extra: dict[str, Any] = {**tally.extra(job.n), "timed_out": timed_out, "killed": KILLED}
    if killing:
        killed_at = await killing[0] - sampler.origin
        extra["killed_at"] = round(killed_at, 3)
        extra["client"] = {"fields": ["t", "in_flight", "breaker"], "rows": watched}
        extra["handback_s"] = _handback(watched, killed_at)
        model = _model(job)
        seqs = model.max_num_seqs if model else 256
        extra.update(absorbed(sampler.rows, KILLED, killed_at, seqs))
        extra["per_second"] = _per_second(tally.times, sampler.origin + killed_at)
    return _finish(job, rec, meter, window, extra)


async def _watch(
    client: llmbatch.Client, replica: int, origin: float, rows: list[list[Any]]
) -> None:
    """The client's view of one replica every 50 ms: in flight there, its breaker."""
    while True:
        servers = client.stats().servers
        if replica < len(servers):
            s = servers[replica]
            rows.append([round(time.monotonic() - origin, 3), s.in_flight, s.breaker])
        await asyncio.sleep(0.05)


def _handback(rows: list[list[Any]], killed_at: float) -> float | None:
    """Seconds from the kill until the client had nothing in flight on the killed
    replica (every request it held there failed over) and its breaker was open."""
    for t, in_flight, breaker in rows:
        if t >= killed_at and in_flight == 0 and breaker != "closed":
            return round(float(t) - killed_at, 3)
    return None


def _per_second(times: Iterable[float], at: float, before: int = 5, after: int = 10) -> list[int]:
    """Results per second from ``before`` seconds before ``at`` to ``after`` after."""
    counts = [0] * (before + after)
    for t in times:
        k = int((t - at) // 1) + before
        if 0 <= k < len(counts):
            counts[k] += 1
    return counts


async def _slo(job: Job, sims: list[Any], sampler: FleetSampler) -> RunMetrics:
    urls = [s.base_url for s in sims]
    served = await asyncio.to_thread(discover, urls[0], None, None)
    contender = LlmbatchContender(
        urls,
        model=served.model,
        params=job.params,
        priority_scheduling=job.priority_scheduling,
        slo_tpot=job.slo_tpot,
    )
    mixed = dataclasses.replace(job, kind="mixed", base_url=urls[0], trace=False)
    return await run_workload(mixed, contender)
