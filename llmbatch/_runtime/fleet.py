"""The servers a client sends to: opening them together, adding and removing them
while it runs, and their health policy.

Each server (``_server.Server``) gets its own transport (connection pool), its
controller, breaker and signals, and a dispatcher; the engine routes batches among
them. Opening reads every server's ``/v1/models`` at once. It succeeds when at least
one answers; the others start out of rotation, are probed like a server in an
outage, and join when they come up. What no retry can fix (a wrong API key, a URL
missing its ``/v1``) fails the open whichever server says it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from llmbatch._clock import loop_clock
from llmbatch._config import SLO, Limits, RetryPolicy
from llmbatch._exceptions import (
    AuthenticationError,
    ClientClosedError,
    ConfigError,
    PermissionDeniedError,
    RequestError,
    ServerInfoError,
    UnknownModelError,
)
from llmbatch._replicas import Replica, with_default_key
from llmbatch._runtime.engine import Engine
from llmbatch._runtime.health import Health
from llmbatch._servers.dispatcher import Dispatcher
from llmbatch._servers.kinds import GENERIC, Dialect, Version
from llmbatch._servers.model_list import read_models
from llmbatch._servers.server import Server

if TYPE_CHECKING:
    from llmbatch._calls.outcome import Outcomes
    from llmbatch._clock import Clock
    from llmbatch._observers import Observers
    from llmbatch._recorder import StatsRecorder
    from llmbatch._scheduler import Scheduler
    from llmbatch._transports.base import Transport

__all__ = ["Endpoints", "Fleet"]

logger = logging.getLogger("llmbatch")

#: Errors from a model list that no retry fixes: the open fails with them.
_SURE = (ServerInfoError, AuthenticationError, PermissionDeniedError)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What every server is made with."""

    limits: Limits
    retry: RetryPolicy
    slo: SLO | None
    priority_scheduling: bool | None
    headers: Callable[[str | None], dict[str, str]]
    """The request headers for an API key (None: none)."""
    make_transport: Callable[[], Transport]
    refill: int = 0
    """One bulk batch: the bulk tiers' largest ``max_batch_size`` (``Server.refill``)."""


class Fleet:
    """Every server of one client, from opening to closing."""

    def __init__(self, config: ServerConfig, observers: Observers) -> None:
        self._config = config
        self._observers = observers
        self._servers: list[Server] = []
        self._transports: list[Transport] = []
        self._engine: Engine | None = None
        self._health: Health | None = None
        self._model: str | None = None
        self._parts: tuple[Scheduler, StatsRecorder, Outcomes, Clock] | None = None
        """What a new server's dispatcher is made with (set when the engine starts)."""

    # -- opening ---------------------------------------------------------------------

    async def open(self, replicas: Sequence[Replica], model: str | None) -> tuple[str, int | None]:
        """Read every server's model list at once; returns the model to use and its
        ``max_model_len`` (if a server said). Raises what makes every request fail."""
        servers = [self._server(replica) for replica in replicas]
        async with anyio.create_task_group() as tg:
            for server in servers:
                tg.start_soon(self._read, server)
        for server in servers:
            if isinstance(server.unread, _SURE):
                raise server.unread
        answered = [s for s in servers if s.models is not None]
        if not answered and model is None:
            raise _unreadable(servers)
        if model is None:
            listed = answered[0].models
            assert listed is not None
            if not listed:
                raise ServerInfoError(
                    f"{answered[0].base_url}/models lists no models, so there is "
                    "none to use by default"
                )
            model = str(listed[0]["id"])
        max_model_len = _check_model(model, answered)
        self._model = model
        self._servers = servers
        return model, max_model_len

    def start(
        self, scheduler: Scheduler, stats: StatsRecorder, outcomes: Outcomes, clock: Clock
    ) -> Engine:
        """The engine, driving every opened server; those that did not answer start
        out of rotation and join when a probe finds them up."""
        self._parts = (scheduler, stats, outcomes, clock)
        servers = self._servers
        self._servers = []
        health = self._health = Health(self._servers, scheduler, clock)
        engine = self._engine = Engine(scheduler, stats, outcomes, health, clock=clock)
        several = len(servers) > 1
        answered = any(s.models is not None for s in servers)
        for server in servers:
            self._join(server)
            if several and answered:
                # The others answered: this one is worth waiting for (a server still
                # starting, or restarting), not a configuration mistake.
                server.patient = True
                if server.models is None:
                    self._hold_out(server, clock())
        engine.servers_changed()
        return engine

    def _server(self, replica: Replica) -> Server:
        config = self._config
        transport = config.make_transport()
        if transport not in self._transports:
            self._transports.append(transport)
        return Server(
            replica,
            headers=config.headers(replica.api_key),
            transport=transport,
            limits=config.limits,
            retry=config.retry,
            slo=config.slo,
            refill=config.refill,
        )

    async def _read(self, server: Server) -> None:
        """Its model list into ``server.models``, or why not into ``server.unread``."""
        try:
            models, status, headers = await read_models(
                server.transport, server.base_url, server.probe_headers, server.replica.api_key
            )
        except (ServerInfoError, RequestError, ValueError, KeyError, TypeError) as exc:
            server.unread = exc
            return
        server.unread = None
        server.on_response(status, headers, loop_clock()())
        server.models = models
        await server.detect(models)

    def _join(self, server: Server) -> None:
        """Give a server its seats and dispatcher: it takes work from now on."""
        assert self._parts is not None
        assert self._health is not None
        scheduler, stats, outcomes, clock = self._parts
        health = self._health
        if not self._servers:
            server.seats = scheduler.seats[0]  # the scheduler starts with one server's
            scheduler.set_models(0, server.model_names)
        else:
            server.seats = scheduler.add_replica(server.model_names)
        scheduler.set_bulk_limit(server.bulk_limit, server.index)
        dispatcher = Dispatcher(
            server=server,
            retry=self._config.retry,
            stats=stats,
            outcomes=outcomes,
            observers=self._observers,
            rate=scheduler.rate,
            priority_scheduling=self._config.priority_scheduling,
            clock=clock,
        )
        dispatcher.fail_over = lambda: health.can_fail_over(server)
        server.dispatcher = dispatcher
        server.on_back = lambda: self._learn(server)
        self._servers.append(server)

    def _hold_out(self, server: Server, now: float) -> None:
        logger.warning(
            "%s did not answer at open (%s); probing it and sending it work once it is up",
            server.base_url,
            server.unread,
        )
        server.hold_out(now, f"not answering: {server.unread}")

    async def _learn(self, server: Server) -> None:
        """A server that was down is up again: read afresh which models it serves and
        what it is (a restart may bring another build, other adapters, another
        scheduling policy), and hear its signals anew."""
        server.signals.forget()
        await self._read(server)
        if server.models is not None and self._engine is not None and self._parts is not None:
            self._parts[0].set_models(server.index, server.model_names)
            self._engine.wake()

    # -- at runtime ------------------------------------------------------------------

    @property
    def dialect(self) -> tuple[Dialect, Version | None]:
        """How the servers read a body, and their release: the first that answered's
        (replicas serve the same models, so the same kind is assumed of them all)."""
        for server in self._servers:
            if server.models is not None:
                return server.dialect, server.version
        return GENERIC, None

    @property
    def replicas(self) -> list[Replica]:
        return [s.replica for s in self._servers if not s.removed]

    async def add(self, replica: Replica) -> None:
        """Start sending to ``replica``: at once if it answers, else once it is up."""
        engine = self._engine
        if engine is None or engine.closed:
            raise ClientClosedError("add replicas while the client is open")
        if replica in self.replicas:
            raise ConfigError(f"{replica.base_url!r} is already a replica", field="base_url")
        server = self._server(replica)
        await self._read(server)
        if isinstance(server.unread, _SURE):
            raise server.unread
        if server.models is not None and self._model is not None:
            _check_model(self._model, [server])
        self._join(server)
        engine.servers_changed(added=server)
        for other in self._servers:
            other.patient = True
        if server.models is None:
            assert self._parts is not None
            self._hold_out(server, self._parts[3]())

    def remove(self, replica: Replica) -> None:
        """Send nothing more to ``replica``; what it has in flight finishes there."""
        engine = self._engine
        if engine is None or engine.closed or self._parts is None:
            raise ClientClosedError("remove replicas while the client is open")
        server = next((s for s in self._servers if s.replica == replica and not s.removed), None)
        if server is None:
            raise ConfigError(f"{replica.base_url!r} is not one of the client's replicas")
        if sum(not s.removed for s in self._servers) == 1:
            raise ConfigError(
                f"{replica.base_url!r} is the client's last replica; add another first",
                field="base_url",
            )
        self._parts[0].remove_replica(server.index)
        engine.servers_changed()

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()


class Endpoints:
    """A client's replicas: iterate for the current ones (:class:`Replica`), ``add``
    and ``remove`` them while the client is open.

    Adding reads the replica's model list; it takes work as soon as it answers (or,
    if it does not answer yet, once a health probe finds it up). Removing sends it
    nothing more; requests in flight there finish there.
    """

    def __init__(self, fleet: Callable[[], Fleet | None], api_key: str | None) -> None:
        self._fleet = fleet
        self._api_key = api_key

    def _open(self) -> Fleet:
        fleet = self._fleet()
        if fleet is None:
            raise ClientClosedError("the client is not open: use its endpoints inside 'async with'")
        return fleet

    def __iter__(self) -> Iterator[Replica]:
        fleet = self._fleet()
        return iter(fleet.replicas if fleet is not None else ())

    def __len__(self) -> int:
        fleet = self._fleet()
        return len(fleet.replicas) if fleet is not None else 0

    def __repr__(self) -> str:
        return f"<llmbatch.Endpoints {list(self)!r}>"

    async def add(self, replica: str | Replica, *, api_key: str | None = None) -> Replica:
        """Send to another replica (a URL or a :class:`Replica`); returns it.

        ``api_key`` (or the replica's own) defaults to the client's. Raises
        :class:`ConfigError` if it is already one, and what opening would raise for
        what no retry fixes (a refused key, a URL missing ``/v1``, a model it does
        not serve).
        """
        fleet = self._open()
        if not isinstance(replica, Replica) or api_key is not None:
            url = replica.base_url if isinstance(replica, Replica) else replica
            replica = Replica(url, api_key=api_key)
        replica = with_default_key(replica, self._api_key)
        await fleet.add(replica)
        return replica

    async def remove(self, replica: str | Replica) -> None:
        """Send nothing more to ``replica`` (its URL, or the :class:`Replica`).

        Its in-flight requests finish there. Raises :class:`ConfigError` for a
        replica the client does not have, or for its last one.
        """
        fleet = self._open()
        fleet.remove(replica if isinstance(replica, Replica) else Replica(replica))


def _check_model(model: str, answered: Sequence[Server]) -> int | None:
    """``max_model_len`` of ``model`` where a server lists it; raises
    :class:`UnknownModelError` when servers list models and none of them this one."""
    lengths: list[int] = []
    available: list[str] = []
    for server in answered:
        for entry in server.models or ():
            available.append(str(entry["id"]))
            if entry.get("id") == model and isinstance(entry.get("max_model_len"), int):
                lengths.append(entry["max_model_len"])
    if available and model not in available:
        # A server listing nothing tells us nothing; one listing others is sure.
        raise UnknownModelError(
            model=model,
            available=tuple(dict.fromkeys(available)),
            base_url=", ".join(s.base_url for s in answered),
        )
    return min(lengths) if lengths else None


def _unreadable(servers: Sequence[Server]) -> ServerInfoError:
    """No server's model list could be read, and no model was named."""
    if len(servers) == 1:
        server = servers[0]
        error = ServerInfoError(
            f"could not read the model list at {server.base_url}/models "
            f"({server.unread}); is the server up? Pass model=... to skip this check"
        )
    else:
        each = "; ".join(f"{s.base_url}: {s.unread}" for s in servers)
        error = ServerInfoError(
            f"could not read the model list of any server ({each}); are they up? "
            "Pass model=... to skip this check"
        )
    error.__cause__ = servers[0].unread
    return error
