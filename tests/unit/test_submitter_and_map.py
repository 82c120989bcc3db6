"""The submitter and the map runner on their seams: a checked call becomes a request
and its outcome; a map's inputs become results in their places, a bad item failing
alone, never more than ``window`` of them outstanding. The engine's loop runs for
real (on a real clock) over a fake transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup
from assembled import Parts
from fake_server import POISON, FakeServer

from llmbatch import BadRequestError, Priority
from llmbatch._runtime.map import MapRunner
from llmbatch._runtime.submitter import Submitter

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running(parts: Parts) -> AsyncIterator[tuple[Submitter, TaskGroup]]:
    """The fleet open, the engine's loop running in a task group, for the block."""
    submitter = await parts.open()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(parts.engine.run, tg)
            yield submitter, tg
            tg.cancel_scope.cancel()


def _spec(submitter: Submitter, **params: Any) -> Any:
    return submitter.specs.get("completion", "complete", "normal", params)


async def test_a_call_returns_its_answer() -> None:
    parts = Parts(FakeServer(), real_clock=True)
    async with running(parts) as (submitter, _):
        request = submitter.request(_spec(submitter, max_tokens=5), "hello")
        completion = await submitter.call(request)
    assert completion.choices[0].text
    assert request.done


async def test_a_refused_call_raises_its_error_and_nothing_else_is_lost() -> None:
    parts = Parts(FakeServer(), real_clock=True)
    async with running(parts) as (submitter, _):
        bad = submitter.request(_spec(submitter), f"x {POISON}")
        with pytest.raises(BadRequestError):
            await submitter.call(bad)
        good = submitter.request(_spec(submitter), "fine")
        assert (await submitter.call(good)).choices[0].text


async def test_a_prompt_far_too_long_for_the_context_travels_alone() -> None:
    parts = Parts(FakeServer(max_model_len=64), real_clock=True)
    submitter = await parts.open()
    spec = _spec(submitter, max_tokens=8)
    long = submitter.request(spec, "word " * 100)
    short = submitter.request(spec, "word")
    assert long.might_not_fit
    assert not short.might_not_fit
    # A queue group of its own: it is sent in a batch of one.
    assert long.group_key != short.group_key
    assert long.group_key != submitter.request(spec, "word " * 100).group_key


async def test_a_map_returns_every_result_in_its_place_and_a_bad_item_fails_alone() -> None:
    fake = FakeServer()
    parts = Parts(fake, real_clock=True)
    prompts = [f"p{i}" for i in range(20)]
    prompts[7] = f"p7 {POISON}"
    async with running(parts) as (submitter, tg):
        runner = MapRunner(submitter, tg)
        results = await runner.collect(prompts, Priority.BATCH, 64, {}, None)
    assert [r.index for r in results] == list(range(20))
    assert isinstance(results[7].error, BadRequestError)
    assert all(r.error is None for i, r in enumerate(results) if i != 7)
    assert len(fake.bodies) < 20  # batched, not one request an item


async def test_a_map_keeps_at_most_window_items_outstanding() -> None:
    fake = FakeServer()
    parts = Parts(fake, real_clock=True)
    async with running(parts) as (submitter, tg):
        runner = MapRunner(submitter, tg)
        results = await runner.collect([f"p{i}" for i in range(12)], Priority.BATCH, 3, {}, None)
    assert len(results) == 12
    sizes = [len(b["prompt"]) if isinstance(b["prompt"], list) else 1 for b in fake.bodies]
    assert max(sizes) <= 3
