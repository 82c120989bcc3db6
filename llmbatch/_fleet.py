"""The servers a client sends to: opening them together, and adding and removing
them while it runs.

Each server (replica) gets its own transport (connection pool), endpoint (admission
controller, breaker, load signals) and dispatcher; the engine routes batches among
them. Opening reads every replica's ``/v1/models`` at once. It succeeds when at
least one answers; the others start out of rotation, are probed like a server in an
outage, and join when they come up. What no retry can fix (a wrong API key, a URL
missing its ``/v1``) fails the open whichever replica says it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from llmbatch._clock import loop_clock
from llmbatch._config import SLO, Limits, RetryPolicy
from llmbatch._dispatcher import Dispatcher
from llmbatch._endpoint import Endpoint
from llmbatch._engine import Engine, Server
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
from llmbatch._serverinfo import ModelList, read_models

if TYPE_CHECKING:
    from llmbatch._clock import Clock
    from llmbatch._scheduler import Scheduler
    from llmbatch._stats import StatsRecorder
    from llmbatch._transports.base import Transport

__all__ = ["Endpoints", "Fleet"]

logger = logging.getLogger("llmbatch")

#: Errors from a model list that no retry fixes: the open fails with them.
_SURE = (ServerInfoError, AuthenticationError, PermissionDeniedError)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What every replica's endpoint and dispatcher are made with."""

    limits: Limits
    retry: RetryPolicy
    slo: SLO | None
    priority_scheduling: bool | None
    headers: Callable[[str | None], dict[str, str]]
    """The request headers for an API key (None: none)."""
    make_transport: Callable[[], Transport]


class _Member:
    """A replica being opened or added: its parts before the engine drives it."""

    __slots__ = ("endpoint", "models", "replica", "server", "transport", "unread")

    def __init__(self, replica: Replica, transport: Transport, endpoint: Endpoint) -> None:
        self.replica = replica
        self.transport = transport
        self.endpoint = endpoint
        self.models: ModelList | None = None
        self.unread: Exception | None = None
        """Why its model list could not be read."""
        self.server: Server | None = None


class Fleet:
    """Every replica of one client, from opening to closing."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._members: list[_Member] = []
        self._transports: list[Transport] = []
        self._engine: Engine | None = None
        self._model: str | None = None
        self._parts: tuple[Scheduler, StatsRecorder, Clock] | None = None
        """What a new replica's dispatcher is made with (set when the engine starts)."""

    # -- opening ---------------------------------------------------------------------

    async def open(self, replicas: Sequence[Replica], model: str | None) -> tuple[str, int | None]:
        """Read every replica's model list at once; returns the model to use and its
        ``max_model_len`` (if a server said). Raises what makes every request fail."""
        members = [self._member(replica) for replica in replicas]
        async with anyio.create_task_group() as tg:
            for member in members:
                tg.start_soon(self._read, member)
        for member in members:
            if isinstance(member.unread, _SURE):
                raise member.unread
        answered = [m for m in members if m.models is not None]
        if not answered and model is None:
            raise _unreadable(members)
        if model is None:
            listed = answered[0].models
            assert listed is not None
            if not listed:
                raise ServerInfoError(
                    f"{answered[0].replica.base_url}/models lists no models, so there is "
                    "none to use by default"
                )
            model = str(listed[0]["id"])
        max_model_len = _check_model(model, answered)
        self._model = model
        self._members = members
        return model, max_model_len

    def start(self, scheduler: Scheduler, stats: StatsRecorder, clock: Clock) -> Engine:
        """The engine, driving every opened replica; those that did not answer start
        out of rotation and join when a probe finds them up."""
        self._parts = (scheduler, stats, clock)
        members = self._members
        several = len(members) > 1
        answered = any(m.models is not None for m in members)
        first = members[0]
        dispatcher = self._dispatcher(first.endpoint)
        engine = self._engine = Engine(scheduler, dispatcher, stats, first.endpoint, clock=clock)
        first.server = engine.servers[0]
        engine.set_models(first.server, _names(first.models))
        for member in members[1:]:
            dispatcher = self._dispatcher(member.endpoint)
            member.server = engine.add_server(member.endpoint, dispatcher, _names(member.models))
        for member in members:
            assert member.server is not None
            self._wire(member.server)
            if several and answered:
                # The others answered: this one is worth waiting for (a replica still
                # starting, or restarting), not a configuration mistake.
                member.endpoint.patient = True
                if member.models is None:
                    self._hold_out(member, clock())
        return engine

    def _member(self, replica: Replica) -> _Member:
        config = self._config
        transport = config.make_transport()
        if transport not in self._transports:
            self._transports.append(transport)
        endpoint = Endpoint(
            base_url=replica.base_url,
            headers=config.headers(replica.api_key),
            transport=transport,
            limits=config.limits,
            retry=config.retry,
            slo=config.slo,
        )
        return _Member(replica, transport, endpoint)

    async def _read(self, member: _Member) -> None:
        """Its model list into ``member.models``, or why not into ``member.unread``."""
        endpoint = member.endpoint
        try:
            models, status, headers = await read_models(
                member.transport, endpoint.base_url, endpoint.probe_headers, member.replica.api_key
            )
        except (ServerInfoError, RequestError, ValueError, KeyError, TypeError) as exc:
            member.unread = exc
            return
        endpoint.on_response(status, headers, loop_clock()())
        member.models = models
        await endpoint.detect(models)

    def _dispatcher(self, endpoint: Endpoint) -> Dispatcher:
        assert self._parts is not None
        scheduler, stats, clock = self._parts
        dispatcher = Dispatcher(
            endpoint=endpoint,
            retry=self._config.retry,
            stats=stats,
            rate=scheduler.rate,
            priority_scheduling=self._config.priority_scheduling,
            clock=clock,
        )
        if self._engine is not None:
            dispatcher.tracer = self._engine.dispatcher.tracer
        return dispatcher

    def _wire(self, server: Server) -> None:
        engine = self._engine
        assert engine is not None
        server.dispatcher.fail_over = lambda: engine.can_fail_over(server)
        server.learn = lambda: self._learn(server)

    def _hold_out(self, member: _Member, now: float) -> None:
        logger.warning(
            "%s did not answer at open (%s); probing it and sending it work once it is up",
            member.replica.base_url,
            member.unread,
        )
        member.endpoint.hold_out(now, f"not answering: {member.unread}")

    async def _learn(self, server: Server) -> None:
        """A replica that was down is up again: read afresh which models it serves and
        what it is (a restart may bring another build, other adapters, another
        scheduling policy), and hear its signals anew."""
        member = next(m for m in self._members if m.server is server)
        member.endpoint.signals.forget()
        await self._read(member)
        if member.models is not None and self._engine is not None:
            self._engine.set_models(server, _names(member.models))

    # -- at runtime ------------------------------------------------------------------

    @property
    def replicas(self) -> list[Replica]:
        return [m.replica for m in self._members if m.server is None or not m.server.removed]

    async def add(self, replica: Replica) -> None:
        """Start sending to ``replica``: at once if it answers, else once it is up."""
        engine = self._engine
        if engine is None or engine.closed:
            raise ClientClosedError("add replicas while the client is open")
        if replica in self.replicas:
            raise ConfigError(f"{replica.base_url!r} is already a replica", field="base_url")
        member = self._member(replica)
        await self._read(member)
        if isinstance(member.unread, _SURE):
            raise member.unread
        if member.models is not None and self._model is not None:
            _check_model(self._model, [member])
        self._members.append(member)
        dispatcher = self._dispatcher(member.endpoint)
        member.server = engine.add_server(member.endpoint, dispatcher, _names(member.models))
        self._wire(member.server)
        member.endpoint.patient = True
        for other in self._members:
            other.endpoint.patient = True
        if member.models is None:
            self._hold_out(member, engine.clock())

    def remove(self, replica: Replica) -> None:
        """Send nothing more to ``replica``; what it has in flight finishes there."""
        engine = self._engine
        if engine is None or engine.closed:
            raise ClientClosedError("remove replicas while the client is open")
        member = next((m for m in self._members if m.replica == replica and not _removed(m)), None)
        if member is None:
            raise ConfigError(f"{replica.base_url!r} is not one of the client's replicas")
        if sum(not _removed(m) for m in self._members) == 1:
            raise ConfigError(
                f"{replica.base_url!r} is the client's last replica; add another first",
                field="base_url",
            )
        assert member.server is not None
        engine.remove_server(member.server)

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


def _removed(member: _Member) -> bool:
    return member.server is not None and member.server.removed


def _names(models: ModelList | None) -> frozenset[str] | None:
    """The model ids of a list (None: not read, or empty: the server said nothing)."""
    if not models:
        return None
    return frozenset(str(m["id"]) for m in models)


def _check_model(model: str, answered: Sequence[_Member]) -> int | None:
    """``max_model_len`` of ``model`` where a server lists it; raises
    :class:`UnknownModelError` when servers list models and none of them this one."""
    lengths: list[int] = []
    available: list[str] = []
    for member in answered:
        for entry in member.models or ():
            available.append(str(entry["id"]))
            if entry.get("id") == model and isinstance(entry.get("max_model_len"), int):
                lengths.append(entry["max_model_len"])
    if available and model not in available:
        # A server listing nothing tells us nothing; one listing others is sure.
        raise UnknownModelError(
            model=model,
            available=tuple(dict.fromkeys(available)),
            base_url=", ".join(m.replica.base_url for m in answered),
        )
    return min(lengths) if lengths else None


def _unreadable(members: Sequence[_Member]) -> ServerInfoError:
    """No replica's model list could be read, and no model was named."""
    if len(members) == 1:
        member = members[0]
        error = ServerInfoError(
            f"could not read the model list at {member.replica.base_url}/models "
            f"({member.unread}); is the server up? Pass model=... to skip this check"
        )
    else:
        each = "; ".join(f"{m.replica.base_url}: {m.unread}" for m in members)
        error = ServerInfoError(
            f"could not read the model list of any server ({each}); are they up? "
            "Pass model=... to skip this check"
        )
    error.__cause__ = members[0].unread
    return error
