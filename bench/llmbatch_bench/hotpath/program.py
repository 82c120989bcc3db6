"""An unmodified openai-python program, measured: the drop-in scenario's two runs and
the embed scenario's per-text baseline.

The program is what people write with the SDK: one ``AsyncOpenAI``, and
``asyncio.gather`` over one ``completions.create(model=, prompt=, max_tokens=)``
call per prompt (or ``embeddings.create(model=, input=)`` per text), all at once or
under a semaphore of ``job.concurrency``. Nothing else is sent: no ``extra_body``,
no headers, the SDK's own defaults. ``job.sdk`` says where ``AsyncOpenAI`` comes
from, ``openai`` or ``llmbatch.openai``: that import is the only difference between
the drop-in scenario's two runs. The client is opened and warmed up through the same
program first (:func:`.hotpath.steady.steady`), so the run measures the calls, not imports
or the first connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from llmbatch_bench.hotpath.steady import Workload, steady
from llmbatch_bench.jobs import Job
from llmbatch_bench.metrics import Recorder, RunMetrics

__all__ = ["run_program"]


async def run_program(job: Job) -> RunMetrics:
    """Run the program with ``AsyncOpenAI`` imported from ``job.sdk``."""
    sdk = importlib.import_module(job.sdk)
    client = sdk.AsyncOpenAI(base_url=job.base_url, api_key=job.api_key or "EMPTY")
    return await steady(job, client, _gather(job), describe=lambda _: {"sdk": job.sdk})


def _gather(job: Job) -> Workload[Any]:
    """One call per input under ``asyncio.gather``; answers are tallied, an SDK error
    counts as that call's failure."""

    async def run(client: Any, inputs: Iterator[Any], rec: Recorder) -> None:
        counts = rec.tally("batch")
        call = _call(job, client)
        limit = asyncio.Semaphore(job.concurrency) if job.concurrency else None

        async def one(item: Any) -> None:
            try:
                async with limit if limit is not None else contextlib.nullcontext():
                    answered, tokens = await call(item)
            except Exception as exc:  # openai.APIError and its transport errors
                rec.failure(exc)
                return
            if answered:
                counts.ok += 1
                counts.tokens += tokens
            else:
                rec.failure("EmptyAnswer")

        await asyncio.gather(*(one(item) for item in inputs))

    return run


def _call(job: Job, client: Any) -> Callable[[Any], Awaitable[tuple[bool, int]]]:
    """The program's one call: (whether it was answered, completion tokens)."""
    if job.inputs == "input":

        async def embed(item: dict[str, str]) -> tuple[bool, int]:
            answer = await client.embeddings.create(model=job.model, input=item["input"])
            return bool(answer.data and len(answer.data[0].embedding)), 0

        return embed

    async def complete(text: str) -> tuple[bool, int]:
        answer = await client.completions.create(
            model=job.model, prompt=text, max_tokens=job.max_tokens
        )
        usage = answer.usage
        return bool(answer.choices), usage.completion_tokens if usage is not None else 0

    return complete
