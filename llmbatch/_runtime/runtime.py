"""What a client builds when it opens: the fleet of servers, the scheduler and the
engine, the task group that runs them, and the way in from other threads.

One per client, shared by its ``with_options`` views. ``open`` and ``close`` are the
client's ``async with``; between them ``submitter()`` hands calls in. On asyncio a
client may also be opened by its first call (``open_on_first_use``), as
``AsyncOpenAI`` is, and closed by ``await client.close()``.

A client belongs to the event loop that opened it. When that loop ends with the
client open (``asyncio.run`` cancels its tasks on the way out), the client releases
its connections there. One its first call opened then opens again on the next
loop that calls it (a module-level client across ``asyncio.run`` calls, a test
framework's loop per test); one opened with ``async with``, or one whose loop still
runs elsewhere, refuses the call saying why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import enum
import threading
import warnings
import weakref
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio
import sniffio
from anyio.abc import TaskGroup

from llmbatch._calls.outcome import Outcomes
from llmbatch._calls.spec import SpecCache
from llmbatch._clock import loop_clock
from llmbatch._exceptions import ClientClosedError, ConfigError
from llmbatch._observers import Observers
from llmbatch._recorder import StatsRecorder
from llmbatch._redis.sharing import SharedBudgets
from llmbatch._replicas import Replica
from llmbatch._runtime.caching import AnswerCache, open_store
from llmbatch._runtime.config import ClientConfig
from llmbatch._runtime.engine import Engine
from llmbatch._runtime.fleet import Fleet
from llmbatch._runtime.map import MapRunner
from llmbatch._runtime.submitter import Submitter
from llmbatch._scheduler import Scheduler
from llmbatch._spending.ledger import SpendingLedger
from llmbatch._spending.prices import PriceBook, price_needed
from llmbatch._stats import Stats

__all__ = ["Runtime", "State"]

#: How long ``stats()`` called from another thread waits for the client's loop.
STATS_TIMEOUT = 5.0

T = TypeVar("T")
#: Closings of clients collected while open, kept until they finish.
_ABANDONED: set[asyncio.Task[None]] = set()


class State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Runtime:
    """One client's running parts, from ``async with`` to its end."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self.observers = Observers(config.observers)
        """What sees the client's requests (kept across a reopening on a new loop)."""
        self._reset()

    def _reset(self) -> None:
        """Unopened: every part its opening builds forgotten (the configuration and
        observers kept)."""
        config = self._config
        self.state = State.UNOPENED
        self.model = config.model
        """The model every request names (read from the server at open if None)."""
        self.max_model_len: int | None = None
        self.fleet: Fleet | None = None
        self.engine: Engine | None = None
        self.map: MapRunner | None = None
        self.cache: AnswerCache | None = None
        """The response cache (None: the client has none)."""
        self.task_group: TaskGroup | None = None
        self._submitter: Submitter | None = None
        self._stack: AsyncExitStack | None = None
        self._host: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[None] | None = None
        """The first call's opening, which later first calls wait for too."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_loop: _LoopCaller | None = None
        self._first_use = False
        """Opened by a call made without ``async with`` (may reopen on another loop)."""
        self._loop_ended = False
        """Its event loop ended while it was open (it was released there)."""
        self._shared = SharedBudgets(config.rate_limit, config.shared_in_flight, config.tenants)

    # -- lifetime --------------------------------------------------------------------

    async def open(self, *, first_call: bool = False) -> None:
        """Open (``async with``), or for a first call made without it (``first_call``)."""
        if self.state is State.OPEN or (self._opening is not None and not first_call):
            raise ClientClosedError(
                "the client is open already (its first call opened it): use it without "
                "'async with', and close it with 'await client.close()'"
            )
        if self.state is not State.UNOPENED:
            raise ClientClosedError("a Client can be opened only once; make a new one")
        config = self._config
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            now = loop_clock()
            stats = StatsRecorder(now(), frozenset(config.tenants))
            prices = PriceBook(config.prices, config.replicas[0].base_url)
            spending = (
                None if config.max_cost is None else SpendingLedger(config.max_cost, "client")
            )
            outcomes = Outcomes(stats, self.observers, prices)
            scheduler = Scheduler(
                policies=config.policies,
                limits=config.limits,
                rate_limit=config.rate_limit,
                tenants=config.tenants,
            )
            fleet = Fleet(
                config.server_config(),
                scheduler=scheduler,
                recorder=stats,
                outcomes=outcomes,
                observers=self.observers,
                clock=now,
            )
            stack.push_async_callback(fleet.aclose)
            self.model, self.max_model_len = await fleet.open(config.replicas, self.model)
            await prices.prepare([self.model])
            if spending is not None and self.model is not None and not prices.price(self.model):
                raise ConfigError(price_needed(self.model), field="max_cost")
            engine = Engine(
                scheduler,
                stats,
                outcomes,
                fleet.health,
                clock=now,
                shared_stats=self._shared.stats if self._shared else None,
                spending=spending,
            )
            engine.servers_changed()
            self.fleet = fleet
            loop = (
                asyncio.get_running_loop() if sniffio.current_async_library() == "asyncio" else None
            )
            dialect, version = fleet.dialect
            specs = SpecCache(
                self.model,
                self.max_model_len,
                tenant_as_user=config.send_tenant_as_user,
                dialect=dialect,
                version=version,
            )
            cache = None
            if config.cache is not None:
                store = await anyio.to_thread.run_sync(open_store, config.cache)
                # Closed before the fleet (the stack unwinds last in, first out):
                # what the writer holds is committed once nothing more can settle.
                stack.push_async_callback(anyio.to_thread.run_sync, store.close)
                cache = AnswerCache(
                    config.cache,
                    store,
                    endpoint=config.replicas[0].base_url,
                    identity=fleet.model_identity,
                    prices=prices,
                    observers=self.observers,
                    clock=now,
                )
            self.cache = cache
            self._submitter = Submitter(
                engine,
                specs,
                clock=now,
                loop=loop,
                observers=self.observers,
                prices=prices,
                spending=() if spending is None else (spending,),
                cache=cache,
            )
            if loop is not None:
                tg = await self._start_host(loop, engine)
            else:
                tg = await stack.enter_async_context(anyio.create_task_group())
                tg.start_soon(engine.run, tg)
            self.task_group = tg
            if self._shared:
                self._shared.start(tg, scheduler, engine.wake, now, lambda: fleet.health.servers)
                stack.push_async_callback(self._shared.aclose)
            self.map = MapRunner(self._submitter, tg)
            self.engine = engine
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._loop = loop
        self._in_loop = _loop_caller(loop)
        self._first_use = first_call
        self.state = State.OPEN

    async def open_on_first_use(self) -> None:
        """Open for a call made without ``async with`` (asyncio only). The opening
        runs in a task of its own, so a first caller that is cancelled does not
        abandon it half-done for the calls waiting on it; the background work then
        lives in the host task (``_start_host``) until ``close()``."""
        if self.state is State.OPEN:
            if not self.on_another_loop():
                return
            self._leave_stopped_loop()  # or raise: its loop runs elsewhere
        elif self.state is State.CLOSED and self._loop_ended and self._first_use:
            self._reset()  # its loop ended: open again on this one
        if self.state is not State.UNOPENED:
            raise self.not_open()
        if sniffio.current_async_library() != "asyncio":
            raise self.not_open()
        opening = self._opening
        if opening is None:
            opening = asyncio.get_running_loop().create_task(
                self.open(first_call=True), name="llmbatch client open"
            )
            self._opening = opening
            opening.add_done_callback(self._opened)
        await asyncio.shield(opening)

    def _opened(self, task: asyncio.Task[None]) -> None:
        self._opening = None
        if not task.cancelled():
            # Retrieved here too, for when every caller waiting on it was cancelled.
            # Not opened (the server could not be read, say): the next call tries again.
            task.exception()

    def on_another_loop(self) -> bool:
        """Open on an asyncio loop that is not the one running this call (cheap:
        asked before every call)."""
        loop = self._loop
        if loop is None:  # trio (the client lives in its nursery), or not open
            return False
        try:
            return asyncio.get_running_loop() is not loop
        except RuntimeError:
            # No asyncio loop here: a SyncClient's thread builds a generator that runs
            # on the client's loop (trio's own check is the transport's).
            return False

    def _leave_stopped_loop(self) -> None:
        """Called on a loop other than the client's: if the client's loop no longer
        runs (closed, or stopped without its tasks cancelled), nothing of the client
        can run again and it is forgotten, to open again here when its first call
        opened it; if that loop still runs (another thread's), the call is refused."""
        loop = self._loop
        assert loop is not None
        if loop.is_running():
            raise ClientClosedError(
                "the client was opened on another event loop, which is still running "
                "(another thread's?); a Client belongs to the loop that opened it: make "
                "one Client per event loop, or share a SyncClient between threads"
            )
        # Nothing can be awaited on a loop that no longer runs: its connections are
        # left to the garbage collector.
        self.state = State.CLOSED
        self._loop_ended = True
        if self.cache is not None:
            self.cache.store.close()  # its own threads: what it holds is written
        if self._first_use:
            self._reset()

    def not_open(self) -> ClientClosedError:
        """The error for a call on a client that is not open, saying what to do."""
        if self._loop_ended:
            return ClientClosedError(
                "the client's event loop ended while it was open (a second asyncio.run(), "
                "a new loop per test?); a client opened with 'async with' belongs to its "
                "loop: make a new one on this loop (a client opened by its first call, "
                "without 'async with', opens again on the next loop by itself)"
            )
        if self.state is State.UNOPENED:
            return ClientClosedError(
                "the client is unopened; on trio use it inside 'async with Client(...)' "
                "(nothing may outlive the nursery that runs it; on asyncio its first "
                "call opens it)"
            )
        return ClientClosedError(f"the client is {self.state.value}; make a new one")

    async def close(self, failed: bool) -> None:
        """Drain (unless ``failed`` or ``on_close="cancel"``), cancel the rest, and
        release everything; nobody is left waiting."""
        if self._opening is not None:  # a first call is opening it: let it finish
            with contextlib.suppress(Exception):
                await asyncio.shield(self._opening)
        if self.state is State.UNOPENED:
            self.state = State.CLOSED  # never opened: nothing to release, nothing to use
            return
        if self.state is not State.OPEN:
            return
        if self.on_another_loop():
            self._leave_stopped_loop()  # or raise: close it on its own loop
            self.state = State.CLOSED
            return
        self.state = State.CLOSING
        engine, stack, tg = self.engine, self._stack, self.task_group
        assert engine is not None
        assert stack is not None
        assert tg is not None
        try:
            if self._config.on_close == "drain" and not failed:
                engine.start_flush()
                with anyio.move_on_after(self._config.drain_timeout, shield=True):
                    await engine.wait_idle()
            engine.cancel_queued()
            tg.cancel_scope.cancel()
            engine.cancel_inline()
            if self._host is not None:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait({self._host})
                self._host.result()  # a bug in the background work surfaces here
        finally:
            self.state = State.CLOSED
            await stack.aclose()

    async def _start_host(self, loop: asyncio.AbstractEventLoop, engine: Engine) -> TaskGroup:
        """On asyncio, the client's background work runs in a task group hosted by a
        task of its own, so the client may be closed from another task than the one
        that opened it (a notebook runs each cell as a task; a drop-in transport opens
        its client inside a request). trio has no task without a nursery: there the
        task group lives in the task that opens the client."""
        started: asyncio.Future[TaskGroup] = loop.create_future()
        # Weak: a client dropped while open must still be collected (see __del__).
        runtime = weakref.ref(self)

        async def host() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(engine.run, tg)
                    started.set_result(tg)
                    await anyio.sleep_forever()  # until close() cancels the task group
            except asyncio.CancelledError:
                # Cancelled from outside, not by close(): the loop is ending with the
                # client open (asyncio.run cancels every task on its way out).
                alive = runtime()
                if alive is not None and alive.state is State.OPEN:
                    await alive._release_with_loop(engine)
                raise

        self._host = loop.create_task(host(), name="llmbatch client")
        waiting: set[asyncio.Future[Any]] = {self._host, started}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            self._host.result()  # it failed before starting: raise why
        return started.result()

    async def _release_with_loop(self, engine: Engine) -> None:
        """Its loop is ending with the client open: settle what waits as cancelled and
        release the connections while the loop can still run that."""
        self.state = State.CLOSING
        try:
            engine.cancel_queued()
            engine.cancel_inline()
            if self._stack is not None:
                with anyio.CancelScope(shield=True):
                    await self._stack.aclose()
        finally:
            self.state = State.CLOSED
            self._loop_ended = True

    # -- while open ------------------------------------------------------------------

    def replicas(self) -> list[Replica]:
        """The servers it sends to now (none until it opens)."""
        fleet = self.fleet
        return [] if fleet is None else fleet.replicas

    async def add_replica(self, replica: Replica) -> None:
        """Send to ``replica`` too (``client.endpoints.add``)."""
        fleet, engine = self._while_open("add replicas")
        server = await fleet.add(replica)
        engine.servers_changed(added=server)

    def remove_replica(self, replica: Replica) -> None:
        """Send nothing more to ``replica`` (``client.endpoints.remove``)."""
        fleet, engine = self._while_open("remove replicas")
        fleet.remove(replica)
        engine.servers_changed()

    def _while_open(self, what: str) -> tuple[Fleet, Engine]:
        fleet, engine = self.fleet, self.engine
        if self.state is not State.OPEN or fleet is None or engine is None or engine.closed:
            raise ClientClosedError(f"{what} while the client is open")
        return fleet, engine

    def submitter(self) -> Submitter:
        """The way calls go in; raises :class:`ClientClosedError` unless open."""
        if self.state is not State.OPEN or self._submitter is None:
            raise self.not_open()
        return self._submitter

    def __del__(self) -> None:
        # Collected open: nobody can call it or close it any more. Say so, as an
        # unclosed file does, and release what it holds on its loop.
        if self.state is not State.OPEN:
            return
        warnings.warn(
            "an llmbatch Client was garbage-collected while open: close it with "
            "'await client.close()', or use 'async with Client(...)'",
            ResourceWarning,
            stacklevel=1,
        )
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._close_abandoned, loop)

    def _close_abandoned(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.state is State.OPEN:
            closing = loop.create_task(self.close(failed=True))
            _ABANDONED.add(closing)  # the loop keeps only a weak reference to a task
            closing.add_done_callback(_ABANDONED.discard)

    def stats(self) -> Stats:
        """A snapshot, taken on the client's loop (waiting for it from other threads)."""
        engine = self.engine
        if engine is None:
            raise ClientClosedError("stats() is available once the client has been opened")
        if self.state is State.OPEN and self._in_loop is not None:
            return self._in_loop(self._snapshot)
        return self._snapshot()

    def _snapshot(self) -> Stats:
        engine = self.engine
        assert engine is not None
        snapshot = engine.snapshot()
        if self.cache is not None:
            snapshot = dataclasses.replace(snapshot, cache=self.cache.stats())
        return snapshot


class _LoopCaller:
    """Runs a function on the client's event loop from another thread and waits for
    its result; on the loop's own thread, just runs it."""

    __slots__ = ("_loop", "_thread", "_token")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, token: object) -> None:
        self._thread = threading.get_ident()
        self._loop = loop
        self._token = token

    def __call__(self, function: Callable[[], T]) -> T:
        if threading.get_ident() == self._thread:
            return function()
        if self._loop is None:
            import trio

            return trio.from_thread.run_sync(function, trio_token=self._token)  # type: ignore[arg-type]
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to the waiting thread
                    future.set_exception(exc)

        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop has closed: nothing mutates any more
            return function()
        return future.result(timeout=STATS_TIMEOUT)


def _loop_caller(loop: asyncio.AbstractEventLoop | None) -> _LoopCaller:
    if loop is not None:
        return _LoopCaller(loop, None)
    import trio

    return _LoopCaller(None, trio.lowlevel.current_trio_token())
