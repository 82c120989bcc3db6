"""The default SLO (``Client(slo="auto")``): realtime held within a multiple of the
latency the client measured itself on the idle server, once realtime is seen. Pure,
with time passed in; the admission controller asks it for the SLO to follow.

- **Dormant** until a realtime call is seen, and again :data:`ACTIVE_WINDOW` seconds
  after the last one: no target, so the controller keeps the server full and a
  bulk-only workload loses nothing.
- **Idle samples** are every step-time sample (and realtime TTFT) taken while this
  client has at most one bulk sequence and :data:`QUIET_REALTIME` realtime ones on
  the server, from :data:`QUIET_SETTLE` seconds on: before bulk starts, between
  jobs, or in a quiet it makes. The reference is the median of the latest, fresh
  for :data:`REFRESH` seconds after the last.
- **Measuring** when realtime is seen and the reference is missing or stale: bulk is
  held to one sequence until what was in flight has drained (at most
  :data:`QUIET_MAX` seconds) and :data:`QUIET_SAMPLES` idle samples have come (at
  most :data:`QUIET_AFTER_DRAIN` seconds more; one sample where nothing had to
  drain). The first realtime answers wait
  behind what was already running, as they would without the default. The step
  time just before, under load, is kept beside the reference.
- **Active**: the target is ``SLO(tpot=MULTIPLE x idle step, ttft=MULTIPLE x idle
  TTFT)`` (the TTFT where realtime answers measured one in the quiet), never below
  :data:`MIN_TPOT` and :data:`MIN_TTFT`, followed by the controller like any stated
  SLO; bulk resumes at the load the line from the idle step to the loaded one
  puts at the target (:meth:`AutoTarget.start_limit`); where the loaded step was
  not measured, from a few sequences, doubling while the target holds; where
  nothing had to drain, as it was.
- **Stood down** where the quiet did not move the latency (the idle step is at least
  :data:`FOLLOWS_LOAD` of the loaded one, a hosted endpoint say, whose latency does
  not follow this client's load) or no idle step time came in the quiet: no target
  until the next try, :data:`REFRESH` seconds later, and ``stats()`` says why.

The step time is learnt from the server's answers only (its histogram, streamed
tokens or answer latencies), never from waits in the client.
"""

from __future__ import annotations

import enum
import statistics
from collections import deque
from dataclasses import dataclass

from llmbatch._config import SLO

__all__ = ["AutoTarget", "Phase"]

#: The SLO aims at this many times the idle latency (the bench's frontier judges the
#: controller at the same multiple).
MULTIPLE = 3.0
#: Seconds after the last realtime call that the target stays in force.
ACTIVE_WINDOW = 30.0
#: Seconds before the idle reference is measured again (at the next realtime call).
REFRESH = 600.0
#: Idle step-time samples the reference needs, and the most it keeps (the latest) ...
QUIET_SAMPLES = 3
IDLE_KEPT = 8
#: Seconds a measurement may hold bulk down for what was running to finish (a 64-token
#: answer at a loaded step of 0.3 s takes 19 s) ...
QUIET_MAX = 30.0
#: ... and then for the idle samples to come ...
QUIET_AFTER_DRAIN = 5.0
#: ... counted from this long after bulk went quiet: a sample read just after spans
#: the last loaded steps (vLLM's histogram is read every 0.5 s), and a realtime answer
#: that waited out the drain says how long the drain took, not the idle latency.
QUIET_SETTLE = 1.0
#: Realtime calls in flight a quiet allows: more (the backlog the drain held back, all
#: running at once) make a step as slow as bulk does.
QUIET_REALTIME = 2
#: The target is never tighter than this, seconds a token and to the first token: 100
#: tokens a second is faster than anyone reads and a tenth of a second goes unnoticed,
#: and a server that fast would lose more bulk to the target than realtime gains.
MIN_TPOT = 0.010
MIN_TTFT = 0.100
#: An idle step at least this share of the loaded one: the latency does not follow load ...
FOLLOWS_LOAD = 0.8
#: ... judged only where the loaded step had at least this many bulk sequences in
#: flight (a step taken under light load says nothing of what load does).
LOADED_IN_FLIGHT = 8


class Phase(enum.StrEnum):
    DORMANT = "dormant"
    MEASURING = "measuring"
    ACTIVE = "active"
    STOOD_DOWN = "stood_down"


@dataclass(slots=True)
class _Quiet:
    started: float
    loaded_step: float | None
    loaded_in_flight: int | None
    drained_at: float | None = None


class AutoTarget:
    """What ``slo="auto"`` aims at on one server now."""

    def __init__(self) -> None:
        self.phase = Phase.DORMANT
        self.idle_step: float | None = None
        self.idle_ttft: float | None = None
        self.loaded_step: float | None = None
        self.measured_at: float | None = None
        """When the latest idle sample came (None: none yet)."""
        self.reason = "no realtime call seen yet"
        self._last_realtime: float | None = None
        self._quiet: _Quiet | None = None
        self._loaded_in_flight = 0
        """Bulk sequences in flight when the last measurement began."""
        self._tried: float | None = None
        """When bulk was last held for a measurement."""
        self._quiet_since: float | None = 0.0
        """Since when at most one of this client's bulk sequences has been on the
        server (None: more are now)."""
        self._pending: list[float] = []
        """Step-time samples since the last update, taken while bulk was quiet."""
        self._pending_ttfts: list[float] = []
        self._realtime_in_flight = 0
        self._steps: deque[tuple[float, float]] = deque(maxlen=IDLE_KEPT)
        self._ttfts: deque[float] = deque(maxlen=IDLE_KEPT)
        self.slo: SLO | None = None

    # -- what the controller hands it -------------------------------------------------

    def on_realtime(self, now: float) -> None:
        """A realtime call is in flight or was answered at ``now``."""
        self._last_realtime = now

    def on_in_flight(self, now: float, bulk: int, realtime: int | None = None) -> None:
        """This client's bulk (and realtime) sequences on the server at ``now``."""
        if realtime is not None:
            self._realtime_in_flight = realtime
        if bulk > 1 or self._realtime_in_flight > QUIET_REALTIME:
            self._quiet_since = None
            self._pending.clear()
            self._pending_ttfts.clear()
        elif self._quiet_since is None:
            self._quiet_since = now

    def on_step_time(self, seconds: float) -> None:
        """A step-time sample: an idle one if bulk stays quiet (:meth:`_learn`)."""
        if self._quiet_since is not None:
            self._pending.append(seconds)

    def on_realtime_ttft(self, seconds: float) -> None:
        """A realtime answer's time to first token, likewise."""
        if self._quiet_since is not None:
            self._pending_ttfts.append(seconds)

    # -- what it decides --------------------------------------------------------------

    @property
    def holds_bulk(self) -> bool:
        """Bulk is held to one sequence while the idle latency is measured."""
        return self.phase is Phase.MEASURING

    def update(self, now: float, step: float | None, bulk_in_flight: int | None) -> SLO | None:
        """The target now (None: none), given the step time the controller believes
        and the bulk sequences in flight (None: not known)."""
        if bulk_in_flight is not None:
            self.on_in_flight(now, bulk_in_flight)
        self._learn(now)
        seen = self._last_realtime
        recent = seen is not None and now - seen <= ACTIVE_WINDOW
        fresh = self.measured_at is not None and now - self.measured_at < REFRESH
        if self.phase is Phase.MEASURING:
            self._measure(now, bulk_in_flight, step)
        elif not recent:
            if self.phase is not Phase.DORMANT:
                self.reason = f"no realtime call in the last {ACTIVE_WINDOW:.0f} s"
            self.phase = Phase.DORMANT
        elif not fresh:
            if (
                self.phase is not Phase.STOOD_DOWN
                or self._tried is None
                or now - self._tried >= REFRESH
            ):
                self.phase = Phase.MEASURING
                self._quiet = _Quiet(now, step, bulk_in_flight)
                self._tried = now
                self.reason = "measuring the idle latency: bulk held to one sequence"
                self._measure(now, bulk_in_flight, None)
        elif self.phase is not Phase.ACTIVE and self.phase is not Phase.STOOD_DOWN:
            self._settle()
        self.slo = self._target() if self.phase is Phase.ACTIVE else None
        return self.slo

    def _learn(self, now: float, enough: int = QUIET_SAMPLES) -> None:
        """The reference from the latest idle samples, once there are ``enough``."""
        since = self._quiet_since
        if since is not None and now - since >= QUIET_SETTLE:
            self._steps.extend((now, sample) for sample in self._pending)
            self._ttfts.extend(self._pending_ttfts)
        self._pending.clear()
        self._pending_ttfts.clear()
        recent = [s for t, s in self._steps if now - t < REFRESH]
        if len(recent) < enough:
            return
        self.idle_step = statistics.median(recent)
        self.idle_ttft = statistics.median(self._ttfts) if self._ttfts else None
        self.measured_at = max(t for t, _ in self._steps)

    def _measure(self, now: float, bulk_in_flight: int | None, step: float | None) -> None:
        quiet = self._quiet
        assert quiet is not None
        if quiet.drained_at is None and bulk_in_flight is not None and bulk_in_flight <= 1:
            quiet.drained_at = now
        elif quiet.drained_at is None and step is not None:
            # Still draining: the load realtime met, read as it was (a step time may
            # not have been measured yet when the measurement began).
            quiet.loaded_step = max(quiet.loaded_step or 0.0, step)
            quiet.loaded_in_flight = max(quiet.loaded_in_flight or 0, bulk_in_flight or 0)
        if (quiet.loaded_in_flight or 0) <= 1:
            # Nothing had to drain: a sample taken now is as idle as can be, and bulk
            # that arrived meanwhile waits for one, not three.
            self._learn(now, enough=1)
        measured = self.measured_at
        if measured is not None and measured >= quiet.started:
            loaded = quiet.loaded_in_flight or 0
            self.loaded_step = quiet.loaded_step if loaded >= LOADED_IN_FLIGHT else None
            self._loaded_in_flight = loaded
            self._quiet = None
            self._settle()
            return
        drained = quiet.drained_at
        if now - quiet.started > QUIET_MAX or (
            drained is not None and now - drained > QUIET_AFTER_DRAIN
        ):
            self._quiet = None
            self.phase = Phase.STOOD_DOWN
            self.reason = (
                "no step time measured with bulk held to one sequence; "
                f"no target until the next try in {REFRESH:.0f} s"
            )

    def _settle(self) -> None:
        """Active, or stood down where the quiet did not move the latency."""
        idle, loaded = self.idle_step, self.loaded_step
        if idle is None:
            self.phase = Phase.STOOD_DOWN
            return
        if loaded is not None and idle >= FOLLOWS_LOAD * loaded:
            self.phase = Phase.STOOD_DOWN
            self.reason = (
                f"the latency does not follow this client's load (step {idle * 1e3:.2f} ms "
                f"with bulk held to one sequence, {loaded * 1e3:.2f} ms before): "
                "no target; state an SLO to hold one"
            )
            return
        self.phase = Phase.ACTIVE
        target = self._target()
        self.reason = f"{MULTIPLE:g}x the idle latency: {_describe(target)}"

    @property
    def drained_load(self) -> bool:
        """The last measurement drained bulk work (more than one sequence was there)."""
        return self._loaded_in_flight > 1

    def start_limit(self) -> float | None:
        """Where bulk resumes after a measurement: the load at which the target's step
        time lies on the line from the idle step (one sequence) to the loaded one
        (the sequences then in flight); None where no loaded step was taken."""
        if self._loaded_in_flight <= 1:
            return None
        idle, loaded, slo = self.idle_step, self.loaded_step, self.slo
        quiet_from = self._loaded_in_flight
        if idle is None or loaded is None or slo is None or slo.tpot is None or not quiet_from:
            return None
        if loaded <= idle:
            return float(quiet_from)
        share = (slo.tpot - idle) / (loaded - idle)
        return max(1.0, min(float(quiet_from), 1.0 + share * (quiet_from - 1)))

    def _target(self) -> SLO:
        assert self.idle_step is not None
        ttft = None if self.idle_ttft is None else max(MIN_TTFT, MULTIPLE * self.idle_ttft)
        return SLO(tpot=max(MIN_TPOT, MULTIPLE * self.idle_step), ttft=ttft)


def _describe(slo: SLO) -> str:
    parts = [f"tpot {slo.tpot * 1e3:.2f} ms"] if slo.tpot is not None else []
    if slo.ttft is not None:
        parts.append(f"ttft {slo.ttft * 1e3:.1f} ms")
    return ", ".join(parts)
