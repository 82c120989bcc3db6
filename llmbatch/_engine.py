"""The async driver: runs the scheduler against the event loop's clock.

It owns three promises to callers:

- backpressure: :meth:`Engine.submit` waits while the tier's queue is full;
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
from llmbatch._exceptions import DeadlineExceeded, QueueFull, RequestCancelled, RequestError
from llmbatch._request import Request
from llmbatch._scheduler import Batch, Scheduler
from llmbatch._stats import Stats, StatsRecorder

__all__ = ["Engine"]

logger = logging.getLogger("llmbatch")


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
        self._wake = anyio.Event()
        self._progress = anyio.Event()
        self._space = {p: anyio.Event() for p in Priority}
        self.flushing = False
        self.closed = False

    # -- callers ---------------------------------------------------------------------

    async def submit(self, request: Request, *, nowait: bool) -> None:
        """Queue ``request``, waiting for room unless ``nowait`` (then raise QueueFull)."""
        tier = request.priority
        request.enqueued_at = request.created_at
        if not self._scheduler.has_room(tier):
            while not self._scheduler.has_room(tier):
                if nowait:
                    raise QueueFull(
                        f"the {tier.value!r} queue is full "
                        f"({self._scheduler.limits.max_queued} requests waiting)"
                    )
                await self._space[tier].wait()
            # Batch wait timers start when the request enters the queue.
            request.enqueued_at = self._now()
        if self.closed:
            # The client closed (while this caller waited for room, say): nobody would
            # ever serve the queue it is about to join.
            self._cancel(request, "the client closed before the request was sent")
            return
        if self._scheduler.add(request):
            self._wake.set()

    def abandon(self, request: Request) -> None:
        """The caller stopped waiting: drop the request from the queue or its flight."""
        if request.abandoned:
            return
        request.abandoned = True
        if not request.outcome.done:
            request.outcome.set_error(
                RequestCancelled(
                    "the caller went away", request_id=request.id, attempts=request.attempts
                )
            )
            self._stats.cancelled(request.priority)
        if self._scheduler.remove(request):
            self._signal_space()
            self._wake.set()
            self._signal_progress()
        elif request.flight is not None:
            request.flight.cancel_if_abandoned()

    def expire(self, request: Request) -> None:
        """Fail a request whose deadline passed (queued or in flight) and drop it."""
        timeout = request.spec.timeout
        if request.outcome.set_error(
            DeadlineExceeded(
                f"no answer within the request's timeout of {timeout}s",
                request_id=request.id,
                attempts=request.attempts,
            )
        ):
            self._stats.failed(request.priority, request.retried)
        self.abandon(request)

    # -- the loop --------------------------------------------------------------------

    async def run(self, tg: TaskGroup) -> None:
        """Poll the scheduler whenever woken or a trigger is due; runs until cancelled."""
        while True:
            self._wake = anyio.Event()
            now = self._now()
            poll = self._scheduler.poll(now, flush=self.flushing)
            for request in poll.expired:
                self.expire(request)
            for batch in poll.batches:
                for request in batch.requests:
                    request.dispatched_at = now
                    self._stats.dispatched(batch.priority, now - request.created_at)
                tg.start_soon(self._send, batch)
            if poll.batches or poll.expired:
                self._signal_space()
            if poll.next_wakeup is None:
                await self._wake.wait()
            else:
                with anyio.move_on_after(poll.next_wakeup - now):
                    await self._wake.wait()

    async def _send(self, batch: Batch) -> None:
        try:
            await self._dispatcher.send(batch)
        except Exception as exc:
            # A bug must cost this batch, not the client's task group and every caller.
            logger.exception("internal error while sending a batch of %d", len(batch.requests))
            for request in batch.requests:
                if request.outcome.set_error(
                    RequestError(
                        f"internal llmbatch error: {exc!r}",
                        request_id=request.id,
                        attempts=request.attempts,
                    )
                ):
                    self._stats.failed(request.priority, request.retried)
        finally:
            for request in batch.requests:
                self._scheduler.finish(request)
                # Reached only if the dispatcher was cancelled mid-flight (client closed
                # with on_close="cancel" or drain timeout): nobody may wait forever.
                if request.outcome.set_error(
                    RequestCancelled(
                        "the client closed before the request finished",
                        request_id=request.id,
                        attempts=request.attempts,
                    )
                ):
                    self._stats.failed(request.priority, request.retried)
            self._wake.set()
            self._signal_progress()

    # -- shutdown --------------------------------------------------------------------

    def start_flush(self) -> None:
        """Send everything queued now, whatever the batch triggers say (shutdown)."""
        self.flushing = True
        self._wake.set()

    async def wait_idle(self) -> None:
        """Return once nothing is queued or in flight."""
        while not self._scheduler.idle:
            await self._progress.wait()

    def cancel_queued(self) -> None:
        """Fail everything still queued, and every caller still waiting for queue room,
        with :class:`RequestCancelled`; the queues take nothing after this."""
        self.closed = True
        for request in list(self._scheduler.queued_requests()):
            self._scheduler.remove(request)
            self._cancel(request, "the client closed before the request was sent")
        for event in self._space.values():
            event.set()  # wake callers blocked by backpressure; they see ``closed``

    def _cancel(self, request: Request, reason: str) -> None:
        if request.outcome.set_error(
            RequestCancelled(reason, request_id=request.id, attempts=request.attempts)
        ):
            self._stats.failed(request.priority, False)

    def snapshot(self) -> Stats:
        return self._stats.snapshot(
            self._now(),
            {p: self._scheduler.queued(p) for p in Priority},
            dict(self._scheduler.in_flight_by_tier),
        )

    def _signal_space(self) -> None:
        for tier, event in self._space.items():
            if self._scheduler.has_room(tier):
                event.set()
                self._space[tier] = anyio.Event()

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()
