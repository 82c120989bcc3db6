"""Progress snapshots for map calls, the rich bar, and the ordered bounded ``imap``."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from fake_server import POISON, FakeServer

import llmbatch
from llmbatch import BatchPolicy, Client, InvalidRequestError, MapProgress, Result, RetryPolicy
from llmbatch._progress import ProgressTracker, describe, progress_line
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=1)


def client(handler: Any, **kw: Any) -> Client:
    kw.setdefault("retry", FAST_RETRY)
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(handler), **kw)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ok(tokens: int) -> Result[Any]:
    usage = llmbatch.Usage(completion_tokens=tokens)
    value = llmbatch.Completion(
        id="c",
        model="m",
        choices=(llmbatch.Choice(text="x"),),
        usage=usage,
        timings=llmbatch.Timings(queued=0, latency=0, batch_size=1, attempts=1),
    )
    return Result(index=0, value=value)


def test_tracker_throttles_and_computes_rates_and_eta() -> None:
    clock = FakeClock()
    seen: list[MapProgress] = []
    tracker = ProgressTracker(seen.append, total=10, clock=clock, interval=0.2)
    tracker.start()
    for _ in range(4):
        tracker.submitted()
    tracker.finished(ok(5))
    tracker.finished(Result(index=1, error=llmbatch.ServerError("boom")))
    clock.now += 0.1
    tracker.maybe_emit()  # too soon: nothing
    assert len(seen) == 1
    clock.now = 100.25
    tracker.maybe_emit()
    snap = seen[-1]
    assert (snap.done, snap.failed, snap.in_flight, snap.total) == (1, 1, 2, 10)
    assert snap.completed == 2
    assert snap.elapsed == pytest.approx(0.25)
    assert snap.prompts_per_s == pytest.approx(8.0)
    assert snap.tokens == 5
    assert snap.tokens_per_s == pytest.approx(20.0)
    assert snap.eta == pytest.approx(1.0)  # 8 left at 8/s
    assert not snap.finished
    tracker.close()
    tracker.close()
    tracker.finished(ok(1))  # after the end: ignored
    assert seen[-1].finished
    assert len(seen) == 3
    assert seen[-1].done == 1


def test_unknown_total_has_no_eta_and_a_readable_line() -> None:
    clock = FakeClock()
    tracker = ProgressTracker(lambda s: None, total=None, clock=clock)
    tracker.start()
    tracker.submitted()
    tracker.finished(ok(3))
    clock.now += 2
    snap = tracker.snapshot(clock.now)
    assert snap.eta is None
    assert "ETA ?" in describe(snap)
    assert "0 failed" in describe(snap)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.done = 5  # type: ignore[misc]


async def test_map_progress_callback_sees_every_item_and_a_final_snapshot() -> None:
    seen: list[MapProgress] = []
    prompts = [f"p{i}" for i in range(50)] + [POISON]
    async with client(FakeServer()) as c:
        results = await c.map(prompts, max_tokens=2, progress=seen.append)
    assert len(results) == 51
    first, last = seen[0], seen[-1]
    assert (first.done, first.failed, first.total) == (0, 0, 51)
    assert last.finished
    assert (last.done, last.failed, last.in_flight) == (50, 1, 0)
    assert last.tokens == 100
    assert last.eta == 0.0
    assert sum(s.finished for s in seen) == 1


async def test_generator_input_has_no_total() -> None:
    seen: list[MapProgress] = []
    async with client(FakeServer()) as c:
        async for _ in c.map_unordered((f"p{i}" for i in range(5)), progress=seen.append):
            pass
    assert seen[-1].total is None
    assert seen[-1].done == 5


async def test_a_failing_callback_raises_from_the_loop_not_the_dispatcher() -> None:
    calls = 0

    def callback(snapshot: MapProgress) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("render failed")

    async with client(FakeServer()) as c:
        with pytest.raises(RuntimeError, match="render failed"):
            await c.map([f"p{i}" for i in range(5)], progress=callback)
        # The client is unharmed.
        assert (await c.complete("still fine")).text == "echo:still fine:0"


async def test_bad_progress_argument_is_rejected() -> None:
    async with client(FakeServer()) as c:
        with pytest.raises(InvalidRequestError, match="progress"):
            await c.map(["a"], progress="yes")  # type: ignore[arg-type]


async def test_without_a_terminal_progress_is_a_periodic_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Logs and CI get a line at the start, every line_interval seconds, and at the end."""
    async with client(FakeServer()) as c:
        await c.map(["a", "b"], progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("llmbatch: 0/2 running")
    assert lines[-1].startswith("llmbatch: 2/2 done · 0 failed")
    assert len(lines) == 2  # the map took less than line_interval (10 s)


async def test_forced_progress_bar_redraws_one_line_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    monkeypatch.setenv("COLUMNS", "100")
    async with client(FakeServer()) as c:
        await c.map([f"p{i}" for i in range(7)], progress=llmbatch.ProgressBar(force=True))
    text = buffer.getvalue()
    assert text.startswith("\r")  # redrawn in place...
    assert text.endswith("\n")  # ...and ended with the last snapshot
    last = text.rsplit("\r", 1)[-1]
    assert "7/7 100%" in last
    assert "/s" in last
    assert max(len(line.split("\x1b")[0]) for line in text.split("\r")) < 100


def test_a_terminal_line_needs_no_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "rich.progress", None)
    assert llmbatch.ProgressBar(force=True).mode == "terminal"
    assert llmbatch.ProgressBar().mode == "lines"  # no terminal here
    # A notebook's bar is rich's: without it, the call says how to install it.
    monkeypatch.setitem(__import__("sys").modules, "ipykernel", object())
    with pytest.raises(ImportError, match=r"llmbatch\[progress\]"):
        llmbatch.ProgressBar()


SNAPSHOT = MapProgress(
    done=12_345,
    failed=3,
    in_flight=256,
    total=100_000,
    elapsed=15.2,
    prompts_per_s=812.4,
    tokens=200_000,
    tokens_per_s=25_987,
    eta=107,
)


@pytest.mark.parametrize("width", [40, 60, 80, 100, 140, 200])
def test_a_progress_line_fits_its_terminal_and_keeps_the_count(width: int) -> None:
    line = progress_line(SNAPSHOT, "requests.jsonl", width)
    assert len(line) < width  # the last column stays free: the terminal never wraps
    assert "12,348/100,000" in line  # never cut, however narrow
    assert line.isascii()
    if width >= 60:
        assert "ETA 1:47" in line
        assert "3 failed" in line
        assert "812/s" in line
    if width >= 80:
        assert "[#" in line  # a bar


def test_a_progress_line_drops_the_least_useful_figures_first() -> None:
    assert progress_line(SNAPSHOT, "requests.jsonl", 30) == "12,348/100,000 12% | ETA 1:47"
    wide = progress_line(SNAPSHOT, "requests.jsonl", 200)
    assert wide.startswith("requests.jsonl [###")
    assert wide.endswith(
        "12,348/100,000 12% | 3 failed | 812/s | 25,987 tok/s | 256 in flight | ETA 1:47"
    )
    done = dataclasses.replace(SNAPSHOT, done=99_997, finished=True, eta=0.0)
    assert progress_line(done, "x", 80).endswith(
        "100,000/100,000 100% | 3 failed | 812/s | 25,987 tok/s | 0:15"
    )


def test_in_a_notebook_the_bar_renders_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ipykernel", object())
    assert llmbatch.ProgressBar().mode == "notebook"


# -- imap: ordered, bounded -----------------------------------------------------------


class Gate:
    """A handler that holds every request containing ``p0`` until released."""

    def __init__(self) -> None:
        self.fake = FakeServer()
        self.release = anyio.Event()

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.body is not None and b'"p0"' in request.body:
            await self.release.wait()
        return self.fake(request)


def counted(n: int, pulled: list[int]) -> Iterator[str]:
    for i in range(n):
        pulled.append(i)
        yield f"p{i}"


ONE_PER_REQUEST = {"batch": BatchPolicy(max_batch_size=1, max_wait=0.0)}


async def test_imap_yields_in_input_order_and_stalls_a_window_ahead() -> None:
    gate, pulled, got = Gate(), [], []
    async with client(gate, batching=ONE_PER_REQUEST) as c:

        async def consume() -> None:
            async for result in c.imap(counted(40, pulled), window=4, max_tokens=1):
                got.append(result.index)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            # p0 is held: p1..p3 are done but wait in the reorder buffer, so the
            # feeder has pulled exactly one window and stopped.
            assert len(pulled) == 4
            assert got == []
            gate.release.set()
    assert got == list(range(40))


async def test_map_unordered_keeps_pulling_past_a_slow_item() -> None:
    gate, pulled, got = Gate(), [], []
    async with client(gate, batching=ONE_PER_REQUEST) as c:

        async def consume() -> None:
            async for index, _result in c.map_unordered(counted(40, pulled), window=4):
                got.append(index)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert len(pulled) == 40
            assert sorted(got) == list(range(1, 40))
            gate.release.set()
    assert sorted(got) == list(range(40))


async def test_imap_early_exit_cancels_the_rest() -> None:
    fake, pulled = FakeServer(), []
    async with client(fake) as c:
        results = c.imap(counted(10_000, pulled), window=8)
        async with contextlib.aclosing(results):
            async for result in results:
                assert result.index == 0
                break
        await anyio.wait_all_tasks_blocked()
        assert c.stats().tiers[llmbatch.Priority.BATCH].queued == 0
    assert len(pulled) <= 16


async def test_imap_turns_bad_items_into_results_in_place() -> None:
    async with client(FakeServer()) as c:
        results = [r async for r in c.imap(["a", 42, POISON, "b"])]  # type: ignore[list-item]
    assert [r.index for r in results] == [0, 1, 2, 3]
    assert [r.ok for r in results] == [True, False, False, True]
    assert isinstance(results[1].error, InvalidRequestError)


class HoldOdd:
    """Answers even prompts, holds odd ones until the test ends."""

    def __init__(self) -> None:
        self.fake = FakeServer()
        self.release = anyio.Event()

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        body = request.body or b""
        if body and any(f'"p{i}"'.encode() in body for i in range(1, 40, 2)):
            await self.release.wait()
        return self.fake(request)


@pytest.mark.parametrize("how", ["leave the loop", "cancel the task"])
async def test_cancelled_items_are_neither_done_nor_failed(how: str) -> None:
    """Leaving a map (or cancelling the task that reads it, as Ctrl-C does in
    `llmbatch run`) cancels what is in flight: the last snapshot counts what was
    answered, nothing failed, nothing in flight."""
    holder, seen = HoldOdd(), []
    with anyio.CancelScope() as scope:
        async with client(holder, batching=ONE_PER_REQUEST, on_close="cancel") as c:
            results = c.map_unordered([f"p{i}" for i in range(40)], progress=seen.append)
            taken = 0
            async for _ in results:
                taken += 1
                if taken == 20:
                    if how == "leave the loop":
                        break
                    scope.cancel()
            await results.aclose()
    holder.release.set()
    last = seen[-1]
    assert last.finished
    assert last.stopped  # ended before every input finished
    assert (last.done, last.failed, last.in_flight) == (20, 0, 0)
    line = progress_line(last, "job", 80)
    assert " 20/40 stopped " in line


async def test_a_map_that_ran_to_its_end_is_not_stopped() -> None:
    seen: list[MapProgress] = []
    async with client(FakeServer()) as c:
        await c.map(["a", "b"], progress=seen.append)
        assert len([r async for r in c.map_unordered(["c"], progress=seen.append)]) == 1
    finals = [s for s in seen if s.finished]
    assert [(s.completed, s.stopped) for s in finals] == [(2, False), (1, False)]
