"""The public observer hook (``llmbatch.Observer``), used as a third party would: an
exporter that records what it is told, against the in-process fake server.

``llmbatch.otel`` is built on the same hook (tests/client/test_otel.py); these tests
hold the hook's own promises: every request that starts ends once, with what was
kept for it; an HTTP request's report carries its requests' kept values; retries
are reported; an observer that raises fails nothing; observers come and go while
the client runs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from fake_server import POISON, FailsFirstPost, FakeServer

import llmbatch
from llmbatch import ObservedBatch, ObservedRequest, Observer
from llmbatch.transports import HTTPRequest, MockTransport

pytestmark = pytest.mark.anyio

RETRY = llmbatch.RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.001)


class Recorder(Observer):
    """Keeps a numbered token per request and per HTTP request, and every report."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.started: dict[str, int] = {}
        self.ended: dict[str, tuple[int, str]] = {}
        self.batches: list[tuple[ObservedBatch, list[object]]] = []
        self.answered: list[tuple[int, int | None, str | None]] = []
        self.retries: list[tuple[ObservedBatch, str, float]] = []
        self.parents: list[object] = []
        self._next = 0

    def capture(self) -> object:
        return "the map's caller"

    def request_started(self, request: ObservedRequest, parent: object) -> object:
        self._next += 1
        self.started[request.id] = self._next
        self.parents.append(parent)
        return self._next

    def request_ended(self, request: ObservedRequest, kept: object) -> None:
        assert request.id not in self.ended, "ended twice"
        outcome = "ok" if request.error is None else type(request.error).__name__
        assert isinstance(kept, int)
        self.ended[request.id] = (kept, outcome)

    def batch_sent(self, batch: ObservedBatch, kept: Sequence[object]) -> object:
        self.batches.append((batch, list(kept)))
        return len(self.batches)

    def batch_answered(
        self, batch: ObservedBatch, kept: object, status: int | None, error: BaseException | None
    ) -> None:
        assert isinstance(kept, int)
        self.answered.append((kept, status, None if error is None else type(error).__name__))

    def batch_retrying(self, batch: ObservedBatch, error: BaseException, wait: float) -> None:
        self.retries.append((batch, type(error).__name__, wait))


def client(handler: Any, **kw: Any) -> llmbatch.Client:
    kw.setdefault("retry", RETRY)
    return llmbatch.Client("http://127.0.0.1:1/v1", transport=MockTransport(handler), **kw)


async def test_every_request_ends_once_with_what_was_kept_for_it() -> None:
    seen = Recorder()
    async with client(FakeServer(), observers=[seen]) as c:
        answer = await c.complete("hi", priority="realtime", max_tokens=3, tenant="t1")
        results = await c.map(["a", "b", f"bad {POISON}", "c"], max_tokens=2)
        chunks = [delta async for delta in c.stream("s", max_tokens=2)]
    assert answer.text
    assert chunks
    assert [r.ok for r in results] == [True, True, False, True]
    assert seen.ended.keys() == seen.started.keys()
    assert len(seen.started) == 6  # the call, four map items, the stream
    assert all(seen.ended[i][0] == seen.started[i] for i in seen.started)
    outcomes = sorted(outcome for _, outcome in seen.ended.values())
    assert outcomes == ["BadRequestError", "ok", "ok", "ok", "ok", "ok"]
    # A map's requests get back what capture() kept in the caller's task.
    assert seen.parents.count("the map's caller") == 4
    # Each HTTP request is reported with the kept values of what it carries.
    for batch, kept in seen.batches:
        assert batch.url.startswith("http://127.0.0.1:1/v1/")
        assert batch.path in ("/completions", "/chat/completions")
        assert kept == [seen.started[r.id] for r in batch.requests]
        assert batch.attempt >= 1
    assert [n for n, _, _ in seen.answered] == list(range(1, len(seen.batches) + 1))
    # The 400 of the poisoned batch is reported as its status; the halves as 200 or 400.
    assert {status for _, status, _ in seen.answered} == {200, 400}


async def test_what_a_request_says_to_an_observer() -> None:
    class Reads(Observer):
        def request_ended(self, request: ObservedRequest, kept: object) -> None:
            self.read = (
                request.kind,
                request.model,
                request.priority,
                request.tenant,
                request.max_tokens,
                request.stream,
                request.attempts,
                request.value.text,
                request.error,
                request.created_at > 0,
            )

    seen = Reads()
    async with client(FakeServer(), observers=[seen]) as c:
        await c.complete("hi", priority="batch", max_tokens=3, tenant="team-a")
    assert seen.read == (
        "completion",
        "fake-model",
        llmbatch.Priority.BATCH,
        "team-a",
        3,
        False,
        1,
        "echo:hi:0",
        None,
        True,
    )


async def test_a_retry_is_reported_before_the_batch_is_sent_again() -> None:
    seen = Recorder()
    async with client(FailsFirstPost(), observers=[seen]) as c:
        assert (await c.complete("hi", max_tokens=2)).text
    [(batch, error, wait)] = seen.retries
    assert (batch.attempt, batch.path, error) == (1, "/completions", "ServerError")
    assert batch.url == "http://127.0.0.1:1/v1/completions"
    assert 0 <= wait <= 0.001
    assert [status for _, status, _ in seen.answered] == [500, 200]
    assert [b.attempt for b, _ in seen.batches] == [1, 2]


async def test_an_observer_that_raises_fails_nothing_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Observer):
        def request_started(self, request: ObservedRequest, parent: object) -> object:
            raise RuntimeError("exporter bug")

        def batch_sent(self, batch: ObservedBatch, kept: Sequence[object]) -> object:
            raise RuntimeError("exporter bug")

    seen = Recorder()
    with caplog.at_level(logging.ERROR, logger="llmbatch"):
        async with client(FakeServer(), observers=[Broken(), seen]) as c:
            results = await c.map([f"p{i}" for i in range(20)], max_tokens=2)
    assert all(r.ok for r in results)
    assert len(seen.ended) == 20  # the other observer is told everything
    logged = [r for r in caplog.records if "an observer's" in r.getMessage()]
    assert len(logged) == 1  # at most once a minute
    assert "exporter bug" in (logged[0].exc_text or "")


async def test_observers_come_and_go_while_the_client_runs() -> None:
    early, late = Recorder(), Recorder()
    async with client(FakeServer()) as c:
        assert c.observers == ()
        c.add_observer(early)
        c.add_observer(early)  # once
        view = c.with_options(priority="realtime")
        assert view.observers == (early,)
        await c.complete("one", max_tokens=2)
        view.add_observer(late)  # a view's observers are its client's
        assert c.observers == (early, late)
        await c.complete("two", max_tokens=2)
        assert c.remove_observer(early)
        assert not c.remove_observer(early)
        await c.complete("three", max_tokens=2)
    assert len(early.ended) == 2
    assert len(late.ended) == 2


async def test_a_removed_observer_still_ends_what_it_started() -> None:
    class Holding:
        def __init__(self) -> None:
            self.fake = FakeServer()
            self.release: Any = None

        async def __call__(self, request: HTTPRequest) -> Any:
            if request.method == "POST":
                await self.release.wait()
            return self.fake(request)

    holding = Holding()
    holding.release = anyio.Event()
    seen = Recorder()
    async with client(holding, observers=[seen]) as c, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(c.complete, "held", max_tokens=2))
        await anyio.wait_all_tasks_blocked()
        assert len(seen.started) == 1
        c.remove_observer(seen)
        holding.release.set()
    assert len(seen.ended) == 1


async def test_observers_must_be_observers() -> None:
    with pytest.raises(llmbatch.ConfigTypeError, match="put the one in a list"):
        llmbatch.Client("http://127.0.0.1:1/v1", observers=Recorder())  # type: ignore[arg-type]
    with pytest.raises(llmbatch.ConfigTypeError, match=r"subclass of llmbatch\.Observer, got"):
        llmbatch.Client("http://127.0.0.1:1/v1", observers=[object()])  # type: ignore[list-item]
    c = client(FakeServer())
    with pytest.raises(llmbatch.ConfigTypeError, match=r"subclass of llmbatch\.Observer"):
        c.add_observer(print)  # type: ignore[arg-type]
