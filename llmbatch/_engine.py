"""The async driver: runs the scheduler against the event loop's clock.

It owns three promises to callers:

- backpressure: a request that finds its tier's queue full waits, in arrival order,
  and is admitted when a place frees (the scheduler holds it; nobody polls);
- a caller that goes away (cancelled, or past its deadline) is out of the queue at
  once, and an HTTP exchange serving only such callers is cancelled;
- every request ends exactly once: answered, failed, expired or cancelled at close.

It drives one or more servers (replicas), each a :class:`Server`: its endpoint
(controller, breaker, load signals), its dispatcher, its probes. The scheduler holds
each one's in-flight ledger and routes batches among them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

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
from llmbatch._signals import STEP_TIME_SOURCES
from llmbatch._stats import ServerStats, SharedStats, Stats, StatsRecorder

__all__ = ["Engine"]

logger = logging.getLogger("llmbatch")


#: A replica whose step time is this many times its peers' median is ejected (sent
#: nothing) until a health probe and a trial batch re-admit it.
SLOW_FACTOR = 3.0


class Server:
    """One replica as the engine drives it."""

    __slots__ = ("dispatcher", "endpoint", "index", "learn", "probing", "removed")

    def __init__(self, index: int, endpoint: Endpoint, dispatcher: Dispatcher) -> None:
        self.index = index
        """Its index in the scheduler's replicas (``Batch.replica``)."""
        self.endpoint = endpoint
        self.dispatcher = dispatcher
        self.probing = False
        self.removed = False
        self.learn: Callable[[], Awaitable[None]] | None = None
        """Read what it serves once it is up (for a replica that was down at open)."""


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
        self.clock = clock
        self._scheduler = scheduler
        self._stats = stats
        self.stats_recorder = stats
        """Its counters (the client wires tracing into them)."""
        self.servers: list[Server] = [Server(0, endpoint, dispatcher)]
        """Every replica, in the scheduler's order (removed ones stay, marked)."""
        self.routing = False
        """Several replicas take work: requests carry prefix keys for affinity."""
        scheduler.set_bulk_limit(endpoint.controller.limit)
        self._tg: TaskGroup | None = None
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
        self.shared_stats: Callable[[], SharedStats | None] | None = None
        """The state of budgets shared through Redis, for ``stats()``."""

    @property
    def endpoint(self) -> Endpoint:
        """The first server's endpoint."""
        return self.servers[0].endpoint

    @property
    def dispatcher(self) -> Dispatcher:
        """The first server's dispatcher."""
        return self.servers[0].dispatcher

    def live_servers(self) -> list[Server]:
        return [server for server in self.servers if not server.removed]

    def add_server(
        self, endpoint: Endpoint, dispatcher: Dispatcher, models: frozenset[str] | None
    ) -> Server:
        """Start sending to another replica (at once: its ledger is open)."""
        index = self._scheduler.add_replica(models).index
        server = Server(index, endpoint, dispatcher)
        self.servers.append(server)
        self._scheduler.set_bulk_limit(endpoint.controller.limit, index)
        if self._tg is not None:
            self._tg.start_soon(self._watch_metrics, server)
        self.routing = len(self.live_servers()) > 1
        self._wake()
        return server

    def remove_server(self, server: Server) -> None:
        """Send nothing more to ``server``; what it has in flight finishes there."""
        server.removed = True
        self._scheduler.remove_replica(server.index)
        self.routing = len(self.live_servers()) > 1
        self._wake()

    def set_models(self, server: Server, models: frozenset[str] | None) -> None:
        self._scheduler.set_models(server.index, models)
        self._wake()

    def _all_over_tolerance(self) -> bool:
        """Every replica has been unavailable for longer than the outage tolerance.
        Asked on every submit: the usual answer (a breaker is closed) costs neither a
        clock read nor a list."""
        now: float | None = None
        any_live = False
        for server in self.servers:
            if server.removed:
                continue
            breaker = server.endpoint.breaker
            if breaker.state is BreakerState.CLOSED:
                return False
            if now is None:
                now = self._now()
            if not breaker.outage_over_tolerance(now):
                return False
            any_live = True
        return any_live

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
        if self._all_over_tolerance():
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
        seats = scheduler.seats
        self._tg = tg
        for server in self.servers:
            tg.start_soon(self._watch_metrics, server)
        while True:
            self._woken = False
            now = self._now()
            live = self.live_servers()
            for server in live:
                breaker = server.endpoint.breaker
                if breaker.state is BreakerState.CLOSED:
                    seats[server.index].sendable = None
                    continue
                # Open: nothing; half-open: the one trial batch.
                seats[server.index].sendable = 1 if breaker.allows() else 0
                if breaker.probe_due(now) and not server.probing:
                    server.probing = True
                    tg.start_soon(self._probe, server)
            if scheduler.has_queued and self._all_over_tolerance():
                self._give_up()
            if not self._isolating and any(s.endpoint.length_risk for s in live):
                self._isolating = True
                scheduler.isolate_risky()
            poll = scheduler.poll(now, flush=self.flushing)
            for request in poll.expired:
                self.expire(request)
            for batch in poll.batches:
                breaker = self.servers[batch.replica].endpoint.breaker
                if breaker.state is BreakerState.HALF_OPEN:
                    breaker.trial_sent()
                for request in batch.requests:
                    request.dispatched_at = now
                stats.dispatched(batch, now)
                self._dispatch(tg, batch)
            if self._control(now, live, poll.blocked_replicas):
                continue  # room for more: poll again at once
            if self._woken:
                continue  # something changed while polling: poll again at once
            wakeup = poll.next_wakeup
            for server in live:
                probe = server.endpoint.breaker.next_probe()
                if probe is not None and (wakeup is None or probe < wakeup):
                    wakeup = probe
            event = self._wake_event = anyio.Event()
            if wakeup is None:
                await event.wait()
            else:
                with anyio.move_on_after(max(0.0, wakeup - now)):
                    await event.wait()
            self._wake_event = None

    def _control(self, now: float, live: list[Server], blocked: frozenset[int]) -> bool:
        """Feed each replica's controller and apply its limit; True if one grew."""
        scheduler = self._scheduler
        grew = False
        for server in live:
            controller = server.endpoint.controller
            seats = scheduler.seats[server.index]
            if server.index in blocked:
                controller.on_blocked()
            controller.on_realtime_in_flight(now, seats.realtime_in_flight)
            unreachable = controller.slo_unreachable
            if controller.update(now):
                grew = grew or controller.limit > seats.bulk_cap
                scheduler.set_bulk_limit(controller.limit, server.index)
            if controller.slo_unreachable and not unreachable:
                # Once per episode: the limit alone, sitting at 1, would not say why.
                logger.warning(
                    "%s is over the SLO (%s) with bulk down to one sequence: the server "
                    "is too slow for it (step %s); loosen the SLO or add capacity",
                    server.endpoint.base_url,
                    controller.slo,
                    "unknown" if controller.step_time is None else f"{controller.step_time:.4f}s",
                )
        if len(live) > 2:
            self._eject_slow(now, live)
        return grew

    def _eject_slow(self, now: float, live: list[Server]) -> None:
        """Send nothing to a replica far slower than its peers until it proves itself
        again (a health probe, then a trial batch): a replica on a failing GPU or a
        hot host would otherwise drag every batch routed to it."""
        steps = [
            (s.endpoint.controller.step_time, s)
            for s in live
            if s.endpoint.breaker.state is BreakerState.CLOSED
        ]
        known = sorted(t for t, _ in steps if t is not None)
        if len(known) < 3:
            return
        median = known[len(known) // 2]
        for step, server in steps:
            if step is not None and step > SLOW_FACTOR * median:
                server.endpoint.eject(now, f"step time {step:.3f}s vs {median:.3f}s on its peers")

    def requeue(self, requests: Sequence[Request]) -> None:
        """In-flight requests that met an outage wait in the queue for a server."""
        for request in requests:
            request.flight = None
        self._scheduler.requeue(list(requests))
        self._wake()

    def can_fail_over(self, server: Server) -> bool:
        """Another replica than ``server`` takes batches now."""
        return any(
            other is not server and other.endpoint.breaker.state is BreakerState.CLOSED
            for other in self.live_servers()
        )

    async def _probe(self, server: Server) -> None:
        """One /health probe of an unavailable server."""
        endpoint = server.endpoint
        try:
            healthy = await endpoint.probe_health()
            if healthy and server.learn is not None:
                await server.learn()
            endpoint.breaker.on_probe(self._now(), healthy)
            if healthy:
                logger.warning("%s answers /health again; resuming", endpoint.base_url)
        finally:
            server.probing = False
            self._wake()

    async def _watch_metrics(self, server: Server) -> None:
        """Read a server's /metrics while it has work, for its controller."""
        endpoint = server.endpoint
        seats = self._scheduler.seats[server.index]
        while endpoint.has_metrics is not False and not server.removed:
            await anyio.sleep(METRICS_INTERVAL)
            if seats.in_flight and endpoint.breaker.state is BreakerState.CLOSED:
                await endpoint.read_metrics(self._now())
                self._wake()

    def _give_up(self) -> None:
        """The outage outlasted the tolerance: fail what waits for the server."""
        for request in list(self._scheduler.queued_requests()):
            self._scheduler.remove(request)
            self._stats.settle_error(request, self._outage_error(request))
        self._signal_progress()

    def _outage_error(self, request: Request) -> ServerOutageError:
        live = self.live_servers() or self.servers
        now = self._now()
        # The server that has been back most recently names the outage's length.
        server = min(live, key=lambda s: s.endpoint.breaker.outage_seconds(now))
        breaker = server.endpoint.breaker
        where = (
            server.endpoint.base_url
            if len(live) == 1
            else f"every server ({len(live)}; {server.endpoint.base_url} the latest)"
        )
        return ServerOutageError(
            f"{where} has been unavailable for "
            f"{breaker.outage_seconds(now):.0f}s, longer than the outage tolerance of "
            f"{breaker.outage_tolerance:.0f}s (RetryPolicy.outage_tolerance); last error: "
            f"{breaker.last_error}",
            request_id=request.id,
            attempts=request.attempts,
        )

    def wake(self) -> None:
        """Ask the loop to poll again: a shared budget granted more."""
        self._wake()

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
            handed_back = await self.servers[batch.replica].dispatcher.send(batch.requests, flight)
            if handed_back:
                self.requeue(handed_back)  # their server is down: they wait for one
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
            # Requeued requests (the server was down) are no longer this batch's.
            own = [request for request in batch.requests if request.flight is flight]
            scheduler.finish_batch(own, batch.priority, batch.replica)
            for request in own:
                # Request -> flight -> requests is a cycle: break it so that answered
                # requests are freed at once, not by the garbage collector.
                request.flight = None
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
        servers = tuple(self._server_stats(s) for s in self.live_servers())
        return self._stats.snapshot(
            self._now(),
            {p: self._scheduler.queued(p) for p in Priority},
            dict(self._scheduler.in_flight_by_tier),
            servers,
            self.shared_stats() if self.shared_stats is not None else None,
        )

    def _server_stats(self, server: Server) -> ServerStats:
        endpoint = server.endpoint
        now = self._now()
        best = endpoint.signals.best(now, STEP_TIME_SOURCES)
        control = endpoint.controller.state()
        breaker = endpoint.breaker
        seats = self._scheduler.seats[server.index]
        return ServerStats(
            base_url=endpoint.base_url,
            kind=endpoint.kind.value,
            in_flight=seats.in_flight,
            bulk_limit=seats.bulk_cap,
            ceiling=control.ceiling,
            realtime_reserve=control.realtime_reserve,
            step_time=control.step_time,
            ttft=control.ttft,
            waiting=control.server_waiting,
            kv_cache_usage=control.kv_cache_usage,
            slo_met=control.slo_met,
            slo_missed=control.slo_missed,
            slo_aim=control.slo_aim,
            slo_unreachable=control.slo_unreachable,
            signals=endpoint.signals.live(now),
            step_time_source=None if best is None else best.value,
            breaker=breaker.state.value,
            outages=breaker.opened,
            ejected=endpoint.ejected,
        )

    def _signal_progress(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None
