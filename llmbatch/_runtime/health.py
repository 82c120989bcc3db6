"""The health policy over a client's servers: which may be sent work now, probes
of those that are down, their controllers' limits, and ejection of a server far
slower than its peers.

It holds the servers that take work, each with the dispatcher that talks to it
(the fleet joins them here, and nothing else keeps a list of them); the engine asks
it at each turn of its loop (``sync`` before polling the scheduler, ``control``
after), for a batch's server and dispatcher, and whether any server is left
(``all_over_tolerance``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

from llmbatch._calls.request import Request
from llmbatch._clock import Clock
from llmbatch._control.breaker import BreakerState
from llmbatch._exceptions import ServerOutageError
from llmbatch._scheduler import Scheduler
from llmbatch._servers.dispatcher import Dispatcher
from llmbatch._servers.server import METRICS_INTERVAL, Server

__all__ = ["Health"]

logger = logging.getLogger("llmbatch")

_N = TypeVar("_N", int, float)

#: A server whose step time is this many times its peers' median is ejected (sent
#: nothing) until a health probe and a trial batch re-admit it.
SLOW_FACTOR = 3.0


class Health:
    """Keeps each server's seats in line with what its breaker and controller say.

    ``on_back``: what to do once a probe finds a server up, before it takes work
    again (read afresh what it is and serves)."""

    def __init__(
        self,
        scheduler: Scheduler,
        clock: Clock,
        *,
        on_back: Callable[[Server], Awaitable[None]],
    ) -> None:
        self._scheduler = scheduler
        self._now = clock
        self._on_back = on_back
        self._servers: dict[int, Server] = {}
        self._refused: dict[int, int] = {}
        """Each server's 429s as last seen."""
        self._senders: dict[int, Dispatcher] = {}

    def join(self, server: Server, sender: Dispatcher) -> None:
        """``server`` takes work from now on, sent by ``sender``."""
        self._servers[server.index] = server
        self._senders[server.index] = sender

    def has_news(self) -> bool:
        """Whether a server's answers said something of its limits since the last sync."""
        return any(server.news for server in self._servers.values())

    @property
    def servers(self) -> Collection[Server]:
        """Every server that joined, in the scheduler's order (removed ones stay,
        marked)."""
        return self._servers.values()

    def server(self, index: int) -> Server:
        """The server at ``index`` in the scheduler (``Batch.replica``)."""
        return self._servers[index]

    def sender(self, index: int) -> Dispatcher:
        """What sends to the server at ``index``."""
        return self._senders[index]

    def live(self) -> list[Server]:
        return [server for server in self._servers.values() if not server.removed]

    def patient(self) -> bool:
        """A server that has not answered yet is worth waiting for: it is one of
        several, and one of them has answered (so it is starting or restarting, not
        misconfigured)."""
        servers = self._servers.values()
        return len(servers) > 1 and any(
            s.models is not None or s.breaker.ever_answered for s in servers
        )

    # -- each turn of the engine's loop ----------------------------------------------

    def sync(self, now: float, live: list[Server], tg: TaskGroup, wake: Callable[[], None]) -> None:
        """Open each server's seats as its breaker allows (closed: freely; half-open:
        one trial batch; open: nothing), none while it cools down after a 429; start
        the probes that are due; and give the scheduler the rate limits the servers'
        answers stated."""
        learnt: tuple[int | None, int | None] | None = None
        remaining: tuple[float | None, float | None] | None = None
        stating: list[str] = []
        refused = False
        for server in live:
            seats = server.seats
            server.news = False
            if server.refused != self._refused.get(server.index, 0):
                self._refused[server.index] = server.refused
                refused = True
            if server.learnt_rate is not None:
                learnt = _lower(learnt, server.learnt_rate)
                stating.append(server.replica.base_url)
            left = server.learnt_remaining
            if left is not None:
                server.learnt_remaining = None
                remaining = _lower(remaining, left)
            if server.cooldown_until != -math.inf:
                if now < server.cooldown_until:
                    seats.sendable = 0  # a 429 asked to wait: nothing goes before it ends
                    continue
                server.cooldown_until = -math.inf  # over (next_probe wakes for none)
            breaker = server.breaker
            if breaker.state is BreakerState.CLOSED:
                seats.sendable = None
                continue
            seats.sendable = 1 if breaker.allows() else 0
            if breaker.probe_due(now) and not server.probing:
                server.probing = True
                tg.start_soon(self._probe, server, wake)
        if learnt is not None:
            # One budget for the client: the servers' lowest stated limits.
            evidence = f"the rate-limit headers of {', '.join(stating)}"
            self._scheduler.learn_rate(*learnt, evidence=evidence)
        if remaining is not None:
            # And no more in hand than the latest answers say is left of it.
            self._scheduler.learn_remaining(now, *remaining)
        # A 429 with a learnt budget: others spend the same key (the budget is slowed
        # down, and speeds up again while none comes).
        self._scheduler.rate_answered(now, refused=refused)

    def control(self, now: float, live: list[Server], blocked: frozenset[int]) -> bool:
        """Feed each server's controller and apply its limit; True if one grew."""
        scheduler = self._scheduler
        grew = False
        for server in live:
            seats = server.seats
            changed = server.control(
                now,
                blocked=seats.index in blocked,
                realtime_in_flight=seats.realtime_in_flight,
                bulk_in_flight=seats.bulk_in_flight,
            )
            if changed:
                limit = server.bulk_limit
                grew = grew or limit > seats.bulk_cap
                scheduler.set_bulk_limit(limit, seats.index)
            scheduler.set_batch_prefill(server.batch_prefill, seats.index)
            pace = server.bulk_pace
            if pace is None:
                if seats.pace is not None:
                    scheduler.set_pace(None, replica=seats.index)
            else:
                scheduler.set_pace(pace.tokens_per_second, pace.slice_tokens, seats.index)
        if len(live) > 2:
            self._eject_slow(now, live)
        return grew

    def next_probe(self, live: list[Server], wakeup: float | None) -> float | None:
        """The earlier of ``wakeup``, the next probe due and the end of a cooldown."""
        for server in live:
            probe = server.breaker.next_probe()
            if probe is not None and (wakeup is None or probe < wakeup):
                wakeup = probe
            cooled = server.cooldown_until
            if cooled != -math.inf and (wakeup is None or cooled < wakeup):
                wakeup = cooled
        return wakeup

    def length_risk(self, live: list[Server]) -> bool:
        """A server has refused a prompt as too long."""
        return any(server.length_risk for server in live)

    # -- questions -------------------------------------------------------------------

    def all_over_tolerance(self) -> bool:
        """Every server has been unavailable for longer than the outage tolerance.
        Asked on every submit: the usual answer (a breaker is closed) costs neither a
        clock read nor a list."""
        now: float | None = None
        any_live = False
        for server in self._servers.values():
            breaker = server.breaker
            if breaker.state is BreakerState.CLOSED:
                if not server.removed:
                    return False
                continue
            if server.removed:
                continue
            if now is None:
                now = self._now()
            if not breaker.outage_over_tolerance(now):
                return False
            any_live = True
        return any_live

    def can_fail_over(self, server: Server) -> bool:
        """Another server than ``server`` takes batches now."""
        return any(
            other is not server and other.breaker.state is BreakerState.CLOSED
            for other in self.live()
        )

    def outage_error(self, request: Request) -> ServerOutageError:
        live = self.live() or list(self._servers.values())
        now = self._now()
        # The server that has been back most recently names the outage's length.
        server = min(live, key=lambda s: s.breaker.outage_seconds(now))
        breaker = server.breaker
        where = (
            server.base_url
            if len(live) == 1
            else f"every server ({len(live)}; {server.base_url} the latest)"
        )
        return ServerOutageError(
            f"{where} has been unavailable for "
            f"{breaker.outage_seconds(now):.0f}s, longer than the outage tolerance of "
            f"{breaker.outage_tolerance:.0f}s (RetryPolicy.outage_tolerance); last error: "
            f"{breaker.last_error}",
            request_id=request.id,
            attempts=request.attempts,
        )

    # -- background work -------------------------------------------------------------

    async def watch_metrics(self, server: Server, wake: Callable[[], None]) -> None:
        """Read a server's /metrics while it has work, for its controller."""
        seats = server.seats
        sent = seats.sent
        while server.has_metrics is not False and not server.removed:
            await anyio.sleep(METRICS_INTERVAL)
            # Work there now, or sent since the last look: short requests one at a
            # time (bulk held to one sequence on a fast server) are mostly between
            # two sends whenever one looks, and their steps are the idle ones.
            busy = seats.in_flight > 0 or seats.sent != sent
            sent = seats.sent
            if busy and server.breaker.state is BreakerState.CLOSED:
                await server.read_metrics(self._now())
                wake()

    async def _probe(self, server: Server, wake: Callable[[], None]) -> None:
        """One /health probe of an unavailable server."""
        try:
            healthy = await server.probe_health()
            if healthy:
                await self._on_back(server)
            server.breaker.on_probe(self._now(), healthy)
            if healthy:
                logger.warning("%s answers /health again; resuming", server.base_url)
        finally:
            server.probing = False
            wake()

    def _eject_slow(self, now: float, live: list[Server]) -> None:
        """Send nothing to a server far slower than its peers until it proves itself
        again (a health probe, then a trial batch): a server on a failing GPU or a
        hot host would otherwise drag every batch routed to it."""
        steps = [
            (s.controller.step_time, s) for s in live if s.breaker.state is BreakerState.CLOSED
        ]
        known = sorted(t for t, _ in steps if t is not None)
        if len(known) < 3:
            return
        median = known[len(known) // 2]
        for step, server in steps:
            if step is not None and step > SLOW_FACTOR * median:
                server.eject(now, f"step time {step:.3f}s vs {median:.3f}s on its peers")


def _lower(
    a: tuple[_N | None, _N | None] | None, b: tuple[_N | None, _N | None]
) -> tuple[_N | None, _N | None]:
    """Each of ``a`` and ``b`` (requests, tokens), the lower where both state it."""
    if a is None:
        return b

    def low(x: _N | None, y: _N | None) -> _N | None:
        return y if x is None else x if y is None else min(x, y)

    return low(a[0], b[0]), low(a[1], b[1])
