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
from collections.abc import Sequence

import anyio
from anyio.abc import TaskGroup

from llmbatch._breaker import BreakerState
from llmbatch._clock import Clock
from llmbatch._config import Priority
from llmbatch._dispatcher import Dispatcher
from llmbatch._endpoint import METRICS_INTERVAL, Endpoint
from llmbatch._exceptions import (
    DeadlineExceeded,
    RequestCancelled,
    RequestError,
    ServerOutageError,
)
from llmbatch._request import Flight, Request
from llmbatch._scheduler import Batch, Scheduler
from llmbatch._stats import ServerStats, Stats, StatsRecorder

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
        endpoint: Endpoint,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self._now = clock
        self._scheduler = scheduler
        self._dispatcher = dispatcher
        self._stats = stats
        self.endpoint = endpoint
        self.dispatcher = dispatcher
        """The dispatcher its batches go to (the client wires tracing into it)."""
        self.stats_recorder = stats
        """Its counters (the client wires tracing into them)."""
        scheduler.set_bulk_limit(endpoint.controller.limit)
        self._probing = False
        self._isolating = False
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
        if self.endpoint.breaker.outage_over_tolerance(self._now()):
            # Past the outage tolerance new requests fail at once until a probe
            # finds the server back.
            self._stats.settle_error(request, self._outage_error(request))
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
        endpoint = self.endpoint
        breaker, controller = endpoint.breaker, endpoint.controller
        tg.start_soon(self._watch_metrics)
        while True:
            self._woken = False
            now = self._now()
            if breaker.state is not BreakerState.CLOSED:
                if breaker.outage_over_tolerance(now) and scheduler.has_queued:
                    self._give_up()
                if breaker.probe_due(now) and not self._probing:
                    self._probing = True
                    tg.start_soon(self._probe)
            if endpoint.length_risk and not self._isolating:
                self._isolating = True
                scheduler.isolate_risky()
            trial = breaker.state is BreakerState.HALF_OPEN
            poll = scheduler.poll(
                now,
                flush=self.flushing,
                paused=not breaker.allows(),
                max_batches=1 if trial else None,
            )
            if trial and poll.batches:
                breaker.trial_sent()
            for request in poll.expired:
                self.expire(request)
            for batch in poll.batches:
                for request in batch.requests:
                    request.dispatched_at = now
                stats.dispatched(batch, now)
                self._dispatch(tg, batch)
            if poll.blocked:
                controller.on_blocked()
            controller.on_realtime_in_flight(now, scheduler.in_flight_by_tier[Priority.REALTIME])
            if controller.update(now):
                grew = controller.limit > scheduler.bulk_limit
                scheduler.set_bulk_limit(controller.limit)
                if grew:
                    continue  # room for more: poll again at once
            if self._woken:
                continue  # something changed while polling: poll again at once
            wakeup = poll.next_wakeup
            probe = breaker.next_probe()
            if probe is not None and (wakeup is None or probe < wakeup):
                wakeup = probe
            event = self._wake_event = anyio.Event()
            if wakeup is None:
                await event.wait()
            else:
                with anyio.move_on_after(max(0.0, wakeup - now)):
                    await event.wait()
            self._wake_event = None

    def requeue(self, requests: Sequence[Request]) -> None:
        """In-flight requests that met an outage wait in the queue for the server."""
        for request in requests:
            request.flight = None
        self._scheduler.requeue(list(requests))
        self._wake()

    async def _probe(self) -> None:
        """One /health probe of an unavailable server."""
        try:
            healthy = await self.endpoint.probe_health()
            self.endpoint.breaker.on_probe(self._now(), healthy)
            if healthy:
                logger.warning("%s answers /health again; resuming", self.endpoint.base_url)
        finally:
            self._probing = False
            self._wake()

    async def _watch_metrics(self) -> None:
        """Read the server's /metrics while it has work, for the controller."""
        endpoint = self.endpoint
        while endpoint.has_metrics is not False:
            await anyio.sleep(METRICS_INTERVAL)
            if self._scheduler.in_flight and endpoint.breaker.state is BreakerState.CLOSED:
                await endpoint.read_metrics(self._now())
                self._wake()

    def _give_up(self) -> None:
        """The outage outlasted the tolerance: fail what waits for the server."""
        for request in list(self._scheduler.queued_requests()):
            self._scheduler.remove(request)
            self._stats.settle_error(request, self._outage_error(request))
        self._signal_progress()

    def _outage_error(self, request: Request) -> ServerOutageError:
        breaker = self.endpoint.breaker
        return ServerOutageError(
            f"{self.endpoint.base_url} has been unavailable for "
            f"{breaker.outage_seconds(self._now()):.0f}s, longer than the outage tolerance of "
            f"{breaker.outage_tolerance:.0f}s (RetryPolicy.outage_tolerance); last error: "
            f"{breaker.last_error}",
            request_id=request.id,
            attempts=request.attempts,
        )

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
        flight = Flight(batch.requests)
        for request in batch.requests:
            request.flight = flight
        try:
            await self._dispatcher.send(batch.requests, flight)
        except Exception as exc:
            # A bug must cost this batch, not the client's task group and every caller.
            logger.exception("internal error while sending a batch of %d", len(batch.requests))
            for request in batch.requests:
                if request.flight is not flight:
                    continue
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
                if request.flight is not flight:
                    continue  # requeued (the server was down): it is not this batch's
                # Request -> flight -> requests is a cycle: break it so that answered
                # requests are freed at once, not by the garbage collector.
                request.flight = None
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
        endpoint = self.endpoint
        control = endpoint.controller.state()
        breaker = endpoint.breaker
        server = ServerStats(
            base_url=endpoint.base_url,
            bulk_limit=self._scheduler.bulk_limit,
            ceiling=control.ceiling,
            realtime_reserve=control.realtime_reserve,
            step_time=control.step_time,
            ttft=control.ttft,
            waiting=control.server_waiting,
            kv_cache_usage=control.kv_cache_usage,
            slo_met=control.slo_met,
            slo_missed=control.slo_missed,
            slo_aim=control.slo_aim,
            breaker=breaker.state.value,
            outages=breaker.opened,
        )
        return self._stats.snapshot(
            self._now(),
            {p: self._scheduler.queued(p) for p in Priority},
            dict(self._scheduler.in_flight_by_tier),
            server,
        )

    def _signal_progress(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None
