"""The async driver: runs the scheduler against the event loop's clock.

It owns three promises to callers:

- backpressure: a request that finds its tier's queue full waits, in arrival order,
  and is admitted when a place frees (the scheduler holds it; nobody polls);
- a caller that goes away (cancelled, or past its deadline) is out of the queue at
  once, and an HTTP exchange serving only such callers is cancelled;
- every request ends exactly once: answered, failed, expired or cancelled at close.
"""

from __future__ import annotations

import logging
import time

import anyio
from anyio.abc import TaskGroup

from llmbatch._clock import Clock
from llmbatch._config import Priority
from llmbatch._dispatcher import Dispatcher
from llmbatch._exceptions import DeadlineExceeded, RequestCancelled, RequestError
from llmbatch._request import Request
from llmbatch._scheduler import Batch, Scheduler
from llmbatch._stats import Stats, StatsRecorder

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
        dispatcher: Dispatcher,
        stats: StatsRecorder,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self._now = clock
        self._scheduler = scheduler
        self._dispatcher = dispatcher
        self._stats = stats
        # Events are made only when someone is about to wait on them: a lone request
        # passes through here several times, and each anyio.Event costs.
        self._woken = False
        self._wake_event: anyio.Event | None = None
        self._progress: anyio.Event | None = None
        # Idle sender tasks, most recently used last. Spawning a task per batch cost
        # ~30 µs in anyio, handing a batch to an idle one a few: there is never more
        # than one sender per batch in flight, and idle ones wait for the next.
        self._idle: list[_Sender] = []
        self.flushing = False
        self.closed = False

    # -- callers ---------------------------------------------------------------------

    def submit(self, request: Request, *, nowait: bool = False) -> None:
        """Queue ``request`` (it waits for room if its tier is full), or raise
        :class:`QueueFull` if ``nowait`` and the tier is full. Never blocks."""
        if self.closed:
            # The client is closing: nobody would ever serve the queue.
            self._stats.settle_error(
                request,
                RequestCancelled(
                    "the client closed before the request was sent", request_id=request.id
                ),
            )
            return
        if self._scheduler.add(request, nowait=nowait):
            self._wake()

    def abandon(self, request: Request) -> None:
        """The caller stopped waiting: drop the request from the queue or its flight."""
        if request.abandoned:
            return
        request.abandoned = True
        self._stats.settle_error(
            request,
            RequestCancelled(
                "the caller went away", request_id=request.id, attempts=request.attempts
            ),
        )
        if self._scheduler.remove(request):
            self._wake()  # its place may admit a waiting caller
            self._signal_progress()
        elif request.flight is not None:
            request.flight.cancel_if_abandoned()

    def expire(self, request: Request) -> None:
        """Fail a request whose deadline passed (queued or in flight) and drop it."""
        self._stats.settle_error(
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
        scheduler, stats = self._scheduler, self._stats
        while True:
            self._woken = False
            now = self._now()
            poll = scheduler.poll(now, flush=self.flushing)
            for request in poll.expired:
                self.expire(request)
            for batch in poll.batches:
                for request in batch.requests:
                    request.dispatched_at = now
                stats.dispatched(batch, now)
                self._dispatch(tg, batch)
            if self._woken:
                continue  # something changed while polling: poll again at once
            event = self._wake_event = anyio.Event()
            if poll.next_wakeup is None:
                await event.wait()
            else:
                with anyio.move_on_after(poll.next_wakeup - now):
                    await event.wait()
            self._wake_event = None

    def _wake(self) -> None:
        """Ask the loop to poll again (now, or as soon as it is done polling)."""
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
            tg.start_soon(self._sender, batch)

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

    async def _send(self, batch: Batch) -> None:
        try:
            await self._dispatcher.send(batch)
        except Exception as exc:
            # A bug must cost this batch, not the client's task group and every caller.
            logger.exception("internal error while sending a batch of %d", len(batch.requests))
            for request in batch.requests:
                self._stats.settle_error(
                    request,
                    RequestError(
                        f"internal llmbatch error: {exc!r}",
                        request_id=request.id,
                        attempts=request.attempts,
                    ),
                )
        finally:
            scheduler = self._scheduler
            for request in batch.requests:
                scheduler.finish(request)
                if not request.done:
                    # Reached only if the dispatcher was cancelled mid-flight (client
                    # closed with on_close="cancel" or drain timeout): nobody may wait
                    # forever.
                    self._stats.settle_error(
                        request,
                        RequestCancelled(
                            "the client closed before the request finished",
                            request_id=request.id,
                            attempts=request.attempts,
                        ),
                    )
            if scheduler.has_queued:
                self._wake()  # the freed seats may let queued requests go
            self._signal_progress()

    # -- shutdown --------------------------------------------------------------------

    def start_flush(self) -> None:
        """Send everything queued now, whatever the batch triggers say (shutdown)."""
        self.flushing = True
        self._wake()

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
            self._stats.settle_error(
                request,
                RequestCancelled(
                    "the client closed before the request was sent", request_id=request.id
                ),
            )

    def snapshot(self) -> Stats:
        return self._stats.snapshot(
            self._now(),
            {p: self._scheduler.queued(p) for p in Priority},
            dict(self._scheduler.in_flight_by_tier),
        )

    def _signal_progress(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None
