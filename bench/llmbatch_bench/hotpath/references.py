"""What llmbatch is measured against, each in steady state (:func:`.hotpath.steady.steady`).

- :func:`run_probe`: the leanest client that can load a server: raw aiohttp,
  ``batch`` prompts per ``/v1/completions`` request, ``concurrency`` prompts in
  flight, JSON encode and decode, nothing else. The sweep uses it to find the
  server's capacity; the overhead scenario uses it with llmbatch's batches, as the
  floor of client CPU per prompt.
- :func:`run_per_prompt`: a baseline of :mod:`.baselines` (``AsyncOpenAI`` in the
  overhead scenario): one request per prompt under gather and a semaphore.
- :func:`run_raw`: one raw aiohttp request at a time with the body llmbatch sends
  for one prompt: the latency ``single`` subtracts.
- :func:`run_bare`: ``asyncio.gather`` over coroutines that only wait, in a process
  that has imported, opened and warmed up llmbatch exactly as the burst does: its peak
  RSS is the burst's baseline, so the difference is llmbatch's own per-call memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

from llmbatch_bench.baselines import GatherBaseline
from llmbatch_bench.contenders import contender_for
from llmbatch_bench.hotpath.steady import make_client, steady, workload
from llmbatch_bench.jobs import Job
from llmbatch_bench.metrics import Recorder, RunMetrics

__all__ = ["run_bare", "run_per_prompt", "run_probe", "run_raw"]

#: Generous, as LLM clients set them; a zero-latency server never comes near.
_TIMEOUT = aiohttp.ClientTimeout(total=600)


def _headers(job: Job) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if job.api_key:
        headers["Authorization"] = f"Bearer {job.api_key}"
    return headers


async def run_probe(job: Job) -> RunMetrics:
    """``batch`` prompts per request, ``concurrency`` prompts in flight."""
    workers = math.ceil((job.concurrency or 256) / job.batch)
    url = job.base_url.rstrip("/") + "/completions"
    headers = _headers(job)

    async def run(session: aiohttp.ClientSession, inputs: Iterator[Any], rec: Recorder) -> None:
        async def worker() -> None:
            while chunk := list(itertools.islice(inputs, job.batch)):
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
                tokens = int(json.loads(content)["usage"]["completion_tokens"])
                # One latency sample per request: its prompts all share it.
                rec.success_many("batch", len(chunk), tokens, time.perf_counter() - start)

        await asyncio.gather(*(worker() for _ in range(workers)))

    connector = aiohttp.TCPConnector(limit=workers)
    session = aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT)
    return await steady(
        job,
        session,
        run,
        describe=lambda _: {"concurrency": workers * job.batch, "batch": job.batch},
    )


async def run_per_prompt(job: Job) -> RunMetrics:
    """The baseline ``job.contender`` names, through its own bulk path."""
    baseline = contender_for(job)
    assert isinstance(baseline, GatherBaseline), f"{job.contender} is not a baseline"

    async def run(target: GatherBaseline, inputs: Iterator[Any], rec: Recorder) -> None:
        await target.bulk(inputs, job.max_tokens, rec)

    return await steady(job, baseline, run)


async def run_raw(job: Job) -> RunMetrics:
    """One request at a time: ``{"model", "prompt": text, "max_tokens", **params}``,
    the body llmbatch sends for a lone prompt."""
    url = job.base_url.rstrip("/") + "/completions"
    headers = _headers(job)

    async def run(session: aiohttp.ClientSession, inputs: Iterator[Any], rec: Recorder) -> None:
        for text in inputs:
            body = {"model": job.model, "prompt": text, "max_tokens": job.max_tokens}
            start = time.perf_counter()
            try:
                async with session.post(
                    url, data=json.dumps({**body, **job.params}), headers=headers
                ) as response:
                    content = await response.read()
                    status = response.status
            except (aiohttp.ClientError, OSError) as exc:
                rec.failure(exc)
                continue
            if status != 200:
                rec.failure(f"HTTP {status}")
                continue
            tokens = int(json.loads(content)["usage"]["completion_tokens"])
            rec.success("single", time.perf_counter() - start, tokens)

    return await steady(job, aiohttp.ClientSession(timeout=_TIMEOUT), run)


async def run_bare(job: Job) -> RunMetrics:
    """``n`` coroutines that wait on one event, all under one ``asyncio.gather``.

    The client is opened and warmed up with ``job.api`` (the burst's ``gather`` of
    ``complete()`` calls) as the burst's is, then left idle: only the waiting
    coroutines differ between the two processes.
    """

    async def run(client: Any, inputs: Iterator[Any], rec: Recorder) -> None:
        release = asyncio.Event()
        waiting = 0

        async def wait(text: str) -> None:
            nonlocal waiting
            waiting += 1
            if waiting == job.n:  # the last one in lets everyone go
                release.set()
            await release.wait()

        # Each holds its prompt, as each complete() call of the burst does.
        await asyncio.gather(*(wait(text) for text in inputs))
        rec.success_many("bare", waiting, 0)

    return await steady(job, make_client(job), run, warm=workload(job))
