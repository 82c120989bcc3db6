"""The servers a client sends to: opening them together, adding and removing them
while it runs.

Each server (``_servers.server.Server``) gets its own transport (connection pool),
its seats in the scheduler, its controller, breaker and signals, and a dispatcher;
both join the health policy (``health``), which the engine asks where a batch goes.
Opening reads every server's ``/v1/models`` at once. It succeeds when at least one
answers; the others start out of rotation, are probed like a server in an outage,
and join when they come up. What no retry can fix (a wrong API key, a URL missing
its ``/v1``) fails the open whichever server says it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from llmbatch._clock import loop_clock
from llmbatch._config import Limits, RetryPolicy, SLOSetting
from llmbatch._control.retry import Retries
from llmbatch._exceptions import (
    AuthenticationError,
    ConfigError,
    PermissionDeniedError,
    RequestError,
    ServerInfoError,
    UnknownModelError,
)
from llmbatch._replicas import Replica
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
    from llmbatch._scheduler import Scheduler, Seats
    from llmbatch._transports.base import Transport

__all__ = ["Fleet", "ServerConfig"]

logger = logging.getLogger("llmbatch")

#: Errors from a model list that no retry fixes: the open fails with them.
_SURE = (ServerInfoError, AuthenticationError, PermissionDeniedError)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What every server is made with."""

    limits: Limits
    retry: RetryPolicy
    slo: SLOSetting
    priority_scheduling: bool | None
    headers: Callable[[str | None], dict[str, str]]
    """The request headers for an API key (None: none)."""
    make_transport: Callable[[], Transport]
    refill: int = 0
    """One bulk batch: the bulk tiers' largest ``max_batch_size`` (``Server.refill``)."""


class Fleet:
    """Every server of one client, from opening to closing: each made with its seats
    in the scheduler, read, and joined to the health policy with its dispatcher."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        scheduler: Scheduler,
        recorder: StatsRecorder,
        outcomes: Outcomes,
        observers: Observers,
        clock: Clock,
    ) -> None:
        self._config = config
        self._scheduler = scheduler
        self._recorder = recorder
        self._outcomes = outcomes
        self._observers = observers
        self._now = clock
        self._retries = Retries(config.retry)
        self.health = Health(scheduler, clock, on_back=self._learn)
        """The servers that take work, with their dispatchers and health policy."""
        self._transports: list[Transport] = []
        self._model: str | None = None
        self._listed: Sequence[Server] = ()

    # -- opening ---------------------------------------------------------------------

    async def open(self, replicas: Sequence[Replica], model: str | None) -> tuple[str, int | None]:
        """Read every server's model list at once and join them all; returns the model
        to use and its ``max_model_len`` (if a server said). Raises what makes every
        request fail. Servers that did not answer start out of rotation, and join the
        work when a probe finds them up."""
        servers = [
            self._server(replica, self._scheduler.seats[0] if i == 0 else None)
            for i, replica in enumerate(replicas)
        ]
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
        self._listed = answered
        for server in servers:
            self._join(server)
        if len(servers) > 1 and answered:
            for server in servers:
                # The others answered: this one is worth waiting for (a server still
                # starting, or restarting), not a configuration mistake.
                if server.models is None:
                    self._hold_out(server)
        return model, max_model_len

    def model_identity(self, model: str) -> dict[str, object]:
        """What the servers' model lists said of ``model`` at opening (for cache keys)."""
        return model_identity(model, self._listed)

    def _server(self, replica: Replica, seats: Seats | None = None) -> Server:
        """A server for ``replica``, with ``seats`` (default: new ones, which take no
        batch until it joins)."""
        config = self._config
        transport = config.make_transport()
        if transport not in self._transports:
            self._transports.append(transport)
        return Server(
            replica,
            headers=config.headers(replica.api_key),
            transport=transport,
            seats=seats or self._scheduler.add_replica(active=False),
            limits=config.limits,
            retry=config.retry,
            slo=config.slo,
            refill=config.refill,
            priority_scheduling=config.priority_scheduling,
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
        """``server`` takes work from now on, sent by a dispatcher of its own."""
        scheduler, health = self._scheduler, self.health
        index = server.index
        scheduler.set_models(index, server.model_names)
        scheduler.set_bulk_limit(server.bulk_limit, index)
        dispatcher = Dispatcher(
            server=server,
            retries=self._retries,
            stats=self._recorder,
            outcomes=self._outcomes,
            observers=self._observers,
            rate=lambda: scheduler.rate,
            fail_over=functools.partial(health.can_fail_over, server),
            patient=health.patient,
            clock=self._now,
        )
        health.join(server, dispatcher)
        scheduler.activate(index)

    def _hold_out(self, server: Server) -> None:
        logger.warning(
            "%s did not answer at open (%s); probing it and sending it work once it is up",
            server.base_url,
            server.unread,
        )
        server.hold_out(self._now(), f"not answering: {server.unread}")

    async def _learn(self, server: Server) -> None:
        """A server that was down is up again: read afresh which models it serves and
        what it is (a restart may bring another build, other adapters, another
        scheduling policy), and hear its signals anew. (The health policy wakes the
        engine once it is back.)"""
        server.signals.forget()
        await self._read(server)
        if server.models is not None:
            self._scheduler.set_models(server.index, server.model_names)

    # -- at runtime ------------------------------------------------------------------

    @property
    def dialect(self) -> tuple[Dialect, Version | None]:
        """How the servers read a body, and their release: the first that answered's
        (replicas serve the same models, so the same kind is assumed of them all)."""
        for server in self.health.servers:
            if server.models is not None:
                return server.dialect, server.version
        return GENERIC, None

    @property
    def replicas(self) -> list[Replica]:
        return [s.replica for s in self.health.live()]

    async def add(self, replica: Replica) -> Server:
        """Start sending to ``replica``: at once if it answers, else once it is up.
        Returns its server (the engine is to be told)."""
        if replica in self.replicas:
            raise ConfigError(f"{replica.base_url!r} is already a replica", field="base_url")
        server = self._server(replica)
        try:
            await self._read(server)
            if isinstance(server.unread, _SURE):
                raise server.unread
            if server.models is not None and self._model is not None:
                _check_model(self._model, [server])
        except BaseException:
            self._scheduler.remove_replica(server.index)  # it never took work
            raise
        self._join(server)
        if server.models is None:
            self._hold_out(server)
        return server

    def remove(self, replica: Replica) -> None:
        """Send nothing more to ``replica``; what it has in flight finishes there."""
        live = self.health.live()
        server = next((s for s in live if s.replica == replica), None)
        if server is None:
            raise ConfigError(f"{replica.base_url!r} is not one of the client's replicas")
        if len(live) == 1:
            raise ConfigError(
                f"{replica.base_url!r} is the client's last replica; add another first",
                field="base_url",
            )
        self._scheduler.remove_replica(server.index)

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()


#: What a model list entry says of the model itself, as a cache key holds it: not
#: ``created`` (vLLM's is the server's start), nor ``permission`` (fresh ids each time).
_IDENTITY_FIELDS = ("id", "root", "parent", "revision", "max_model_len")


def model_identity(model: str, servers: Sequence[Server]) -> dict[str, object]:
    """``model`` as the first server that lists it describes it (its ``root``: the
    weights' path or name, its revision where it states one); its name alone
    where none lists it."""
    for server in servers:
        for entry in server.models or ():
            if entry.get("id") == model:
                return {
                    name: entry[name]
                    for name in _IDENTITY_FIELDS
                    if isinstance(entry.get(name), str | int)
                }
    return {"id": model}


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
