"""The async driver: runs the scheduler against the event loop's clock.

It owns three promises to callers:

- backpressure: a request that finds its tier's queue full waits, in arrival order,
  and is admitted when a place frees (the scheduler holds it; nobody polls);
- a caller that goes away (cancelled, or past its deadline) is out of the queue at
  once, and an HTTP exchange serving only such callers is cancelled;
- every request ends exactly once: answered, failed, expired or cancelled at close.

It drives one or more servers (``_servers.server.Server``), which the health policy
(``_runtime.health``) holds: the engine asks that policy at each turn what may be
sent where, and hands each batch to its server's dispatcher. The scheduler holds each
server's seats and routes batches among them.
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
from anyio.abc import TaskGroup

from llmbatch._calls.outcome import Outcomes
from llmbatch._calls.request import Flight, Request
from llmbatch._clock import Clock
from llmbatch._config import Priority
from llmbatch._control.breaker import BreakerState
from llmbatch._exceptions import DeadlineExceeded, RequestError, SpendingLimitReached
from llmbatch._recorder import StatsRecorder
from llmbatch._runtime.health import Health
from llmbatch._scheduler import Batch, Scheduler
from llmbatch._servers.server import Server
from llmbatch._spending.ledger import SpendingLedger
from llmbatch._stats import SharedStats, SpendingStats, Stats

__all__ = ["Engine"]

logger = logging.getLogger("llmbatch")


class _Sender:
    """A task that sends batches one after another, idling between them."""

    __slots__ = ("batch", "event")

    def __init__(self) -> None:
        self.batch: Batch | None = None
        self.event: anyio.Event | None = None


class Engine:
    """Queues requests, forms and dispatches batches, and tracks their lifetime."""

    def __init__(
        self,
        scheduler: Scheduler,
        stats: StatsRecorder,
        outcomes: Outcomes,
        health: Health,
        *,
        clock: Clock = time.monotonic,
        shared_stats: Callable[[], SharedStats | None] | None = None,
        spending: SpendingLedger | None = None,
    ) -> None:
        self._now = clock
        self._spending = spending
        """The client's spending limit (``max_cost``), shown in stats()."""
        self._scheduler = scheduler
        self._stats = stats
        self._outcomes = outcomes
        self._health = health
        self.routing = False
        """Several servers take work: requests carry prefix keys for affinity."""
        self._tg: TaskGroup | None = None
        self._isolating = False
        # Events are made only when someone is about to wait on them: a lone request
        # passes through here several times, and each anyio.Event costs.
        self._woken = False
        self._wake_event: anyio.Event | None = None
        self._context = contextvars.copy_context()
        """Where sender tasks start (the loop's, taken when it starts)."""
        self._sleep_until = math.inf
        """When the sleeping loop's timer fires (inf: it waits to be woken)."""
        self._turning = False
        """A turn is under way (one caller's inline turn must not nest in another)."""
        self._progress: anyio.Event | None = None
        # Idle sender tasks, most recently used last. Spawning a task per batch costs
        # several times handing a batch to an idle one: there is never more than one
        # sender per batch in flight, and idle ones wait for the next.
        self._idle: list[_Sender] = []
        self._inline: set[Flight] = set()
        """Exchanges their callers send from their own tasks (``send_inline``)."""
        self._new_scope: Callable[[], anyio.CancelScope] = anyio.CancelScope
        """Makes each exchange's cancel scope: the running backend's own class, read
        once the loop runs (``anyio.CancelScope()`` looks the backend up at every
        call, a measurable part of a lone call's work: docs/benchmarks.md,
        "Instructions")."""
        self.flushing = False
        self.closed = False
        self._shared_stats = shared_stats
        """The state of budgets shared through Redis, for ``stats()``."""

    def servers_changed(self, added: Server | None = None) -> None:
        """The fleet added a server (it takes work at once) or removed one."""
        if added is not None and self._tg is not None:
            self._tg.start_soon(self._health.watch_metrics, added, self.wake)
        self.routing = len(self._health.live()) > 1
        self.wake()

    # -- callers ---------------------------------------------------------------------

    def check_tenant_size(self, request: Request) -> None:
        """Raise :class:`InvalidRequestError` if ``request`` is larger than its
        tenant's whole token quota (it could never go)."""
        book = self._scheduler.tenants
        if book.caps_tokens:
            book.check_size(request)

    @property
    def stats(self) -> StatsRecorder:
        """The client's counters."""
        return self._stats

    def submit(
        self, request: Request, *, nowait: bool = False, more: bool = False, inline: bool = False
    ) -> Batch | None:
        """Queue ``request`` (it waits for room if its tier is full), or raise
        :class:`QueueFull` if ``nowait`` and the tier is full. Never blocks.
        ``more``: the caller is about to submit others (a map's feeder), so a
        realtime request waits for the loop's turn too, to share their batch, and
        its tenant's limits never refuse it (a map's items wait).

        ``inline``: the caller would send the request from its own task. If it goes
        at once and alone (a lone realtime call), its batch is returned instead of
        handed to a sender, and the caller must pass it to :meth:`send_inline`."""
        if self.closed:
            # The client is closing: nobody would ever serve the queue.
            self._outcomes.cancelled(request, "the client closed before the request was sent")
            return None
        if self._health.all_over_tolerance():
            # Past the outage tolerance new requests fail at once until a probe
            # finds the server back.
            self._outcomes.failed(request, self._health.outage_error(request))
            return None
        try:
            due = self._scheduler.add(request, nowait=nowait, must_wait=more)
        except SpendingLimitReached as exc:
            self._outcomes.failed(request, exc)
            return None
        if due:
            if request.priority is Priority.REALTIME and not more:
                return self._due(request if inline else None)
            self.wake()
        return None

    def _due(self, inline: Request | None) -> Batch | None:
        """A realtime request may be sent. While the loop sleeps, take its turn here,
        in the caller's task: the request then reaches its sender one event-loop
        iteration sooner (the hop to the loop's task was the largest part of what
        llmbatch added to a single call). The loop is woken only if that turn needs
        it: a limit grew, or the next trigger is earlier than the loop's timer.

        Realtime only: other tiers let the loop's turn wait until the caller's task
        yields, so that what a map or a gather queues in one go goes in one batch.
        Returns ``inline``'s batch if the turn sends it alone (see :meth:`submit`)."""
        tg = self._tg
        if self._wake_event is None or self._woken or self._turning or tg is None:
            self.wake()  # the loop is running (or about to): it will see the request
            return None
        wakeup, again, kept = self._turn(tg, inline)
        if again or (wakeup is not None and wakeup < self._sleep_until):
            self.wake()
        return kept

    def abandon(self, request: Request) -> None:
        """The caller stopped waiting: drop the request from the queue or its flight."""
        if request.abandoned:
            return
        request.abandoned = True
        self._outcomes.cancelled(request, "the caller went away")
        if self._scheduler.remove(request):
            self.wake()  # its place may admit a waiting caller
            self._signal_progress()
        elif request.flight is not None:
            request.flight.cancel_if_abandoned()

    def expire(self, request: Request) -> None:
        """Fail a request whose deadline passed (queued or in flight) and drop it."""
        self._outcomes.failed(
            request,
            DeadlineExceeded(
                f"no answer within the request's timeout of {request.spec.timeout}s",
                request_id=request.id,
                attempts=request.attempts,
            ),
        )
        self.abandon(request)

    # -- the loop --------------------------------------------------------------------

    async def run(self, tg: TaskGroup) -> None:
        """Poll the scheduler whenever woken or a trigger is due; runs until cancelled."""
        health = self._health
        self._tg = tg
        self._context = contextvars.copy_context()
        self._new_scope = type(anyio.CancelScope())
        for server in health.servers:
            tg.start_soon(health.watch_metrics, server, self.wake)
        while True:
            self._woken = False
            wakeup, again, _ = self._turn(tg)
            if again or self._woken:
                continue  # room for more, or something changed while polling: again
            event = self._wake_event = anyio.Event()
            self._sleep_until = math.inf if wakeup is None else wakeup
            if wakeup is None:
                await event.wait()
            else:
                with anyio.move_on_after(max(0.0, wakeup - self._now())):
                    await event.wait()
            self._wake_event = None

    def _turn(
        self, tg: TaskGroup, inline: Request | None = None
    ) -> tuple[float | None, bool, Batch | None]:
        """One turn of the loop: the servers' health, expiries, the batches to send
        (handed to senders), the controllers. Returns when to turn next (None: when
        woken), whether to turn again at once (a limit grew), and ``inline``'s batch
        if it goes alone (kept for its caller to send, not handed to a sender)."""
        scheduler, stats, health = self._scheduler, self._stats, self._health
        self._turning = True
        try:
            now = self._now()
            live = health.live()
            health.sync(now, live, tg, self.wake)
            if scheduler.has_queued and health.all_over_tolerance():
                self._give_up()
            if not self._isolating and health.length_risk(live):
                self._isolating = True
                scheduler.isolate_risky()
            poll = scheduler.poll(now, flush=self.flushing)
            for request in poll.expired:
                self.expire(request)
            for request, error in poll.refused:
                self._outcomes.failed(request, error)
            kept = None
            for batch in poll.batches:
                breaker = health.server(batch.replica).breaker
                if breaker.state is BreakerState.HALF_OPEN:
                    breaker.trial_sent()
                for request in batch.requests:
                    request.dispatched_at = now
                stats.dispatched(batch.priority, [now - r.created_at for r in batch.requests])
                if batch.requests[0] is inline and len(batch.requests) == 1:
                    kept = batch
                else:
                    self._dispatch(tg, batch)
            grew = health.control(now, live, poll.blocked_replicas)
            return health.next_probe(live, poll.next_wakeup), grew, kept
        finally:
            self._turning = False

    def requeue(self, requests: Sequence[Request]) -> None:
        """In-flight requests that met an outage wait in the queue for a server."""
        for request in requests:
            request.flight = None
        self._scheduler.requeue(list(requests))
        self.wake()

    def _give_up(self) -> None:
        """The outage outlasted the tolerance: fail what waits for the server."""
        for request in list(self._scheduler.queued_requests()):
            self._scheduler.remove(request)
            self._outcomes.failed(request, self._health.outage_error(request))
        self._signal_progress()

    def wake(self) -> None:
        """Ask the loop to poll again (now, or as soon as it is done polling): new
        work, freed seats, a shared budget that granted more."""
        self._woken = True
        event = self._wake_event
        if event is not None:
            event.set()

    def _dispatch(self, tg: TaskGroup, batch: Batch) -> None:
        if self._idle:
            sender = self._idle.pop()
            sender.batch = batch
            assert sender.event is not None
            sender.event.set()
        else:
            # In the engine's own context even when a caller's turn dispatches: a
            # sender serves many callers and must not carry one's context variables.
            self._context.run(tg.start_soon, self._sender, batch)

    async def _sender(self, batch: Batch) -> None:
        sender = _Sender()
        while True:
            await self._send(batch)
            sender.batch = None
            event = sender.event = anyio.Event()
            self._idle.append(sender)
            await event.wait()
            assert sender.batch is not None
            batch = sender.batch

    def send_inline(self, batch: Batch) -> Coroutine[Any, Any, None]:
        """Send the batch :meth:`submit` returned, from its caller's task: the request
        reaches the server without a hand-over to a sender task, and its caller
        resumes with the answer without a wake-up from one (two event-loop
        iterations less on every lone call). The caller's cancellation cancels the
        exchange, as it would once it was the last caller waiting on a sender's; a
        client that closes without waiting cancels it too (:meth:`cancel_inline`).
        (The coroutine itself, not one awaiting it: a frame less on the way.)"""
        return self._send(batch, inline=True)

    def cancel_inline(self) -> None:
        """Cancel the exchanges callers are sending from their own tasks (the client
        closes without waiting for them, as it cancels its senders)."""
        for flight in tuple(self._inline):
            flight.scope.cancel()

    async def _send(self, batch: Batch, *, inline: bool = False) -> None:
        flight = Flight(batch.requests, self._new_scope())
        for request in batch.requests:
            request.flight = flight
        if inline:
            self._inline.add(flight)
        try:
            handed_back = await self._health.sender(batch.replica).send(batch.requests, flight)
            if handed_back:
                self.requeue(handed_back)  # their server is down: they wait for one
        except Exception as exc:
            # A bug must cost this batch, not the client's task group and every caller.
            logger.exception("internal error while sending a batch of %d", len(batch.requests))
            for request in batch.requests:
                if request.flight is not flight:
                    continue
                self._outcomes.failed(
                    request,
                    RequestError(
                        f"internal llmbatch error: {exc!r}",
                        request_id=request.id,
                        attempts=request.attempts,
                    ),
                )
        finally:
            if inline:
                self._inline.discard(flight)
            scheduler = self._scheduler
            # Requeued requests (the server was down) are no longer this batch's.
            own = [request for request in batch.requests if request.flight is flight]
            scheduler.finish_batch(own, batch.priority, batch.replica)
            for request in own:
                # Request -> flight -> requests is a cycle: break it so that answered
                # requests are freed at once, not by the garbage collector.
                request.flight = None
                if request.done:
                    continue
                # Reached only if the dispatcher was cancelled mid-flight: the client
                # closed with on_close="cancel" or drain timeout, or the caller sending
                # it inline was cancelled. Nobody may wait forever.
                if inline and not flight.scope.cancel_called:
                    request.abandoned = True
                    reason = "the caller went away"
                else:
                    reason = "the client closed before the request finished"
                self._outcomes.cancelled(request, reason)
            if scheduler.has_queued or self._health.has_news():
                # The freed seats may let queued requests go; a provider's limits or
                # a 429 the answer brought are taken in at the next turn.
                self.wake()
            self._signal_progress()

    # -- shutdown --------------------------------------------------------------------

    def start_flush(self) -> None:
        """Send everything queued now, whatever the batch triggers say (shutdown)."""
        self.flushing = True
        self.wake()

    async def wait_idle(self) -> None:
        """Return once nothing is queued or in flight."""
        while not self._scheduler.idle:
            if self._progress is None:
                self._progress = anyio.Event()
            await self._progress.wait()

    def cancel_queued(self) -> None:
        """Fail everything still queued or waiting for room with
        :class:`RequestCancelled`; the queues take nothing after this."""
        self.closed = True
        for request in list(self._scheduler.queued_requests()):
            self._scheduler.remove(request)
            self._outcomes.cancelled(request, "the client closed before the request was sent")

    def snapshot(self) -> Stats:
        now = self._now()
        servers = tuple(server.stats(now) for server in self._health.live())
        return self._stats.snapshot(
            now,
            {p: self._scheduler.queued(p) for p in Priority},
            dict(self._scheduler.in_flight_by_tier),
            servers,
            None if self._shared_stats is None else self._shared_stats(),
            self._scheduler.tenants.counts(),
            self._scheduler.rate_stats(),
            self._spending_stats(),
        )

    def _spending_stats(self) -> SpendingStats | None:
        ledger = self._spending
        if ledger is None:
            return None
        return SpendingStats(
            max_cost=ledger.limit,
            spent=ledger.spent,
            reserved=ledger.reserved,
            held=self._scheduler.spending.live,
        )

    def _signal_progress(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None
