"""The clients under test: llmbatch and the baselines, behind one small interface.

A contender is an async context manager with two workloads:

- ``bulk(prompts, max_tokens, rec)``: every prompt, as fast as it goes;
- ``realtime(prompt, max_tokens, rec)``: one streamed call, recording latency and
  time to first token (llmbatch's may make it one non-streamed ``complete``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, Protocol

from llmbatch_bench.baselines import BASELINES
from llmbatch_bench.jobs import Job
from llmbatch_bench.metrics import Recorder, record_stream

__all__ = ["CONTENDERS", "Contender", "LlmbatchContender", "available", "contender_for"]

CONTENDERS = ("llmbatch", *BASELINES)


class Contender(Protocol):
    """What a scenario drives."""

    name: str

    async def __aenter__(self) -> Contender: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def bulk(self, prompts: Iterable[str], max_tokens: int, rec: Recorder) -> None: ...

    async def realtime(self, prompt: str, max_tokens: int, rec: Recorder) -> None: ...


class LlmbatchContender:
    """llmbatch used as its README shows: ``map`` for bulk, ``stream`` for realtime.

    ``mode="gather"`` submits bulk work the baselines' way instead, one
    ``client.complete`` per prompt all at once under ``asyncio.gather``.
    """

    name = "llmbatch"

    def __init__(
        self,
        base_url: str | list[str],
        *,
        model: str,
        api_key: str | None = None,
        params: dict[str, Any] | None = None,
        mode: Literal["map", "gather"] = "map",
        max_in_flight: int | None = None,
        reserved_realtime: int | None = None,
        adaptive: bool = True,
        bulk_batch: int | None = None,
        realtime_call: Literal["stream", "complete"] = "stream",
        priority_scheduling: bool | None = False,
        slo_tpot: float | None = None,
        slo_ttft: float | None = None,
        slo_pace: bool = False,
        prefill_cost: float | None = None,
        transport: Any = None,
    ) -> None:
        import llmbatch

        limits = llmbatch.DEFAULT_LIMITS
        if max_in_flight is not None:
            reserved = reserved_realtime
            if reserved is None:
                reserved = min(limits.reserved_realtime, max_in_flight // 4)
            limits = llmbatch.Limits(
                max_in_flight=max_in_flight, reserved_realtime=reserved, adaptive=adaptive
            )
        elif not adaptive:
            limits = llmbatch.Limits(adaptive=False)
        batching: dict[Any, llmbatch.BatchPolicy] | None = (
            {llmbatch.Priority.BATCH: llmbatch.BatchPolicy(max_batch_size=bulk_batch)}
            if bulk_batch is not None
            else None
        )
        self.mode = mode
        self.realtime_call = realtime_call
        self.params = dict(params or {})
        target: Any = base_url
        if prefill_cost is not None and isinstance(base_url, str):
            target = llmbatch.Replica(base_url, prefill_seconds_per_token=prefill_cost)
        self._client = llmbatch.Client(
            target,
            model=model,
            api_key=api_key,
            limits=limits,
            batching=batching,
            priority_scheduling=priority_scheduling,
            slo=(
                llmbatch.SLO(tpot=slo_tpot, ttft=slo_ttft, pace=slo_pace)
                if slo_tpot is not None or slo_ttft is not None
                else None
            ),
            transport=transport,
            # A mixed run ends by abandoning its bulk work; don't drain it.
            on_close="cancel",
        )

    async def __aenter__(self) -> LlmbatchContender:
        await self._client.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client.__aexit__(exc_type, exc, tb)

    async def bulk(self, prompts: Iterable[str], max_tokens: int, rec: Recorder) -> None:
        client = self._client
        params = {**self.params, "max_tokens": max_tokens}
        if self.mode == "map":
            await self._map(prompts, params, rec)
            return

        async def one(prompt: str) -> None:
            try:
                value = await client.complete(prompt, priority="batch", **params)
            except Exception as exc:
                rec.failure(exc)
                return
            rec.success("batch", value.timings.latency, value.usage.completion_tokens)

        await asyncio.gather(*(one(p) for p in prompts))

    async def bulk_chat(
        self, chats: Iterable[list[Mapping[str, Any]]], max_tokens: int, rec: Recorder
    ) -> None:
        """A ``map`` of conversations: one chat batch request per batch where the
        server serves ``/v1/chat/completions/batch``, else one request per chat."""
        await self._map(chats, {**self.params, "max_tokens": max_tokens}, rec)

    async def _map(self, inputs: Iterable[Any], params: dict[str, Any], rec: Recorder) -> None:
        """``map_unordered`` in the batch tier, each result recorded as it comes."""
        results = self._client.map_unordered(inputs, priority="batch", **params)
        # aclosing: a cancelled mixed run must stop the map's feeder right away.
        async with contextlib.aclosing(results):
            async for _, result in results:
                value = result.value
                if result.error is not None or value is None:
                    rec.failure(result.error or "NoValue")
                else:
                    rec.success("batch", value.timings.latency, value.usage.completion_tokens)

    async def realtime(self, prompt: str, max_tokens: int, rec: Recorder) -> None:
        start = time.perf_counter()
        if self.realtime_call == "complete":
            value = await self._client.complete(
                prompt, priority="realtime", max_tokens=max_tokens, **self.params
            )
            latency = time.perf_counter() - start
            rec.success("realtime", latency, value.usage.completion_tokens)
            rec.calls.append((time.monotonic() - latency, latency))
            # The part of it spent queued inside the client (the rest is the server's).
            rec.queued("realtime", value.timings.queued)
            return
        deltas: AsyncIterator[str] = self._client.stream(
            prompt, priority="realtime", max_tokens=max_tokens, **self.params
        )
        await record_stream(rec, deltas, start)

    @property
    def client(self) -> Any:
        """The :class:`llmbatch.Client` itself (the closed-loop jobs stream through it)."""
        return self._client

    def stats(self) -> Any:
        """The client's own :class:`llmbatch.Stats` (batch sizes for the report)."""
        return self._client.stats()


def available(name: str) -> bool:
    """Whether ``name``'s library is importable (``openai`` is an optional extra)."""
    import importlib.util

    module = {"llmbatch": "llmbatch", "httpx": "httpx", "aiohttp": "aiohttp", "openai": "openai"}
    return importlib.util.find_spec(module[name]) is not None


def contender_for(job: Job) -> Contender:
    """The contender ``job.contender`` names (``llmbatch``, ``httpx``, ``aiohttp`` or
    ``openai``), set up as the job says."""
    common: dict[str, Any] = {"model": job.model, "api_key": job.api_key, "params": job.params}
    if job.contender == "llmbatch":
        return LlmbatchContender(
            job.base_url,
            mode=job.mode,
            max_in_flight=job.max_in_flight,
            reserved_realtime=job.reserved_realtime,
            adaptive=job.adaptive,
            bulk_batch=job.bulk_batch,
            realtime_call=job.realtime_call,
            priority_scheduling=job.priority_scheduling,
            slo_tpot=job.slo_tpot,
            slo_ttft=job.slo_ttft,
            slo_pace=job.slo_pace,
            prefill_cost=job.prefill_cost,
            **common,
        )
    try:
        baseline = BASELINES[job.contender]
    except KeyError:
        raise ValueError(f"unknown contender {job.contender!r}; choose from {CONTENDERS}") from None
    return baseline(job.base_url, concurrency=job.concurrency, **common)
