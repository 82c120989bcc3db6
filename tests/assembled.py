"""The runtime's parts assembled as ``_runtime/runtime.py`` assembles them, around a
fake transport, for the unit tests of the fleet, the engine, the submitter and the
map runner."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmbatch import Limits, Replica, RetryPolicy
from llmbatch._calls.outcome import Outcomes
from llmbatch._calls.spec import SpecCache
from llmbatch._observers import Observers
from llmbatch._recorder import StatsRecorder
from llmbatch._runtime.engine import Engine
from llmbatch._runtime.fleet import Fleet, ServerConfig
from llmbatch._runtime.submitter import Submitter
from llmbatch._scheduler import Scheduler
from llmbatch.transports import MockResponse, MockTransport

LIMITS = Limits(max_in_flight=16, reserved_realtime=2)


@dataclass
class Parts:
    """The runtime's parts for one server kind of handler, built in the runtime's
    order: scheduler, recorder and outcomes, fleet, engine, specs and submitter.
    ``now`` is the clock (a list the test moves) unless ``real_clock``: an engine
    loop that runs (a map) sleeps on real time and needs it."""

    handler: Callable[..., MockResponse]
    now: list[float] = field(default_factory=lambda: [100.0])
    real_clock: bool = False

    def __post_init__(self) -> None:
        clock: Callable[[], float] = time.monotonic if self.real_clock else lambda: self.now[0]
        self.transport = MockTransport(self.handler)
        self.scheduler = Scheduler(limits=LIMITS)
        self.recorder = StatsRecorder(clock())
        observers = Observers()
        self.outcomes = Outcomes(self.recorder, observers)
        config = ServerConfig(
            limits=LIMITS,
            retry=RetryPolicy(attempts=1),
            slo=None,
            priority_scheduling=None,
            headers=lambda key: {},
            make_transport=lambda: self.transport,
        )
        self.fleet = Fleet(
            config,
            scheduler=self.scheduler,
            recorder=self.recorder,
            outcomes=self.outcomes,
            observers=observers,
            clock=clock,
        )
        self.engine = Engine(
            self.scheduler, self.recorder, self.outcomes, self.fleet.health, clock=clock
        )
        self.observers = observers
        self.clock = clock

    async def open(self, replicas: int = 1, model: str | None = None) -> Submitter:
        """Open the fleet on ``replicas`` servers; the submitter for its model."""
        urls = [Replica(f"http://s{i}:8000/v1") for i in range(replicas)]
        model, context = await self.fleet.open(urls, model)
        self.engine.servers_changed()
        specs = SpecCache(model, context)
        return Submitter(self.engine, specs, clock=self.clock, loop=None, observers=self.observers)
