"""The frontier: the best trade between realtime's latency and bulk's throughput that
an engine allows, found by sweeping static settings, and the controller judged
against it rather than against a fixed line.

A static setting holds bulk to ``cap`` sequences in batches of at most ``batch``
prompts, with :data:`RESERVE` seats kept for realtime and the controller pinned (the
sweep measures the engine, not the controller). Realtime's end-to-end p99 is held to
the SLO's bound for a 16-token answer (:func:`slo_bound`); the *oracle* is the static
setting with the most bulk among those that meet it, read from the measured points
(no interpolation). Pure: points in, verdicts out; the runs that make the points are
the scenario's.

A p99 of the few dozen realtime calls one window holds is close to their slowest, so
a setting's rounds spread as widely as the settings differ. The verdict rests on a
few points only (the controller, and the static settings near the bound that could
meet it or fail it in another round, :func:`contested`): those get confirming rounds,
so their medians rest on more calls than the rest of the grid's.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BATCH_SIZES",
    "CAPS",
    "RESERVE",
    "Chance",
    "Point",
    "Setting",
    "Sweep",
    "Verdict",
    "by_chance",
    "contested",
    "from_runs",
    "frontier",
    "grid",
    "judge",
    "median_points",
    "oracle",
    "point",
    "slo_bound",
]

#: Bulk sequences a static setting allows: wide enough to bracket an SLO on a small
#: CPU engine (one or two sequences) and on a GPU (hundreds).
CAPS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Prompts a bulk batch holds at most.
BATCH_SIZES = (8, 64)
#: Seats kept for realtime in every static setting (``Limits.reserved_realtime``).
RESERVE = 8
#: Realtime's answer, in tokens: its first, then this many less one at the per-token time.
REALTIME_TOKENS = 16
#: How far over the bound the controller's p99 may be, and the least share of the
#: oracle's bulk it must keep, to meet the target.
P99_SLACK = 1.1
BULK_SHARE = 0.9
#: A static setting whose median p99 is within this factor of the bound could meet
#: the bound in another round, or fail it: the confirming rounds run it again.
CONTESTED = 1.5
#: Where no static setting is that near, the confirming rounds run this many of the
#: fastest (the controller is then judged against the fastest's p99).
FASTEST = 3
#: Draws of :func:`by_chance`, and its seed (the same rounds read the same twice).
CHANCE_DRAWS = 10_000
CHANCE_SEED = 46


@dataclass(frozen=True, slots=True)
class Setting:
    """A static setting of the sweep."""

    cap: int
    batch: int

    @property
    def label(self) -> str:
        return f"cap {self.cap}, batch {self.batch}"

    @property
    def max_in_flight(self) -> int:
        """``Limits(max_in_flight=...)``: the bulk cap and the realtime reserve."""
        return self.cap + RESERVE


@dataclass(frozen=True, slots=True)
class Point:
    """One run (or the median of a setting's rounds) on the frontier's plane."""

    label: str
    realtime_p99: float
    """Realtime's end-to-end p99, seconds."""
    bulk: float
    """Bulk prompts a second."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The controller's run against the frontier."""

    met: bool
    bound: float
    p99_vs_bound: float
    """The controller's realtime p99 over the bound."""
    oracle: Point | None
    """The static setting with the most bulk that met the bound (None: none did)."""
    bulk_share: float | None
    """The controller's bulk over the oracle's (None without an oracle)."""
    reason: str


@dataclass(frozen=True, slots=True)
class Chance:
    """What chance alone makes of "within 1.1x of the best static p99", read from the
    rounds of the settings near the bound (:func:`by_chance`)."""

    settings: int
    rounds: int
    """Their rounds, pooled."""
    best: float
    """The median, over the draws, of the best of their medians (p99s, seconds)..."""
    best_low: float
    best_high: float
    """... and its 10th and 90th percentiles."""
    pooled: float
    """The median of the pooled rounds: what a setting like them measures."""
    within: float
    """The share of draws in which one more setting like them, with the controller's
    rounds, is within :data:`P99_SLACK` of the best of them."""

    def describe(self, bound: float) -> str:
        """In words, against the bound."""
        return (
            f"were the {self.settings} settings near the bound one setting (their "
            f"{self.rounds} rounds pooled, median {self.pooled / bound:.2f}x the bound), "
            f"the best of their medians would be {self.best / bound:.2f}x "
            f"({self.best_low / bound:.2f}-{self.best_high / bound:.2f}x, 10th-90th "
            f"percentile) and a setting like them within {P99_SLACK}x of it in "
            f"{self.within:.0%} of draws"
        )


def by_chance(
    rounds: Mapping[str, Sequence[float]],
    controller_rounds: int,
    *,
    draws: int = CHANCE_DRAWS,
    seed: int = CHANCE_SEED,
) -> Chance | None:
    """Were the settings of ``rounds`` (each setting's p99 per round) one setting, whose
    rounds spread as all of theirs do: the best of their medians, and how often a
    setting like them (``controller_rounds`` rounds) is within :data:`P99_SLACK` of
    it. Where no static setting meets the bound the controller is held to the best
    one's p99, and that best is the lowest of several medians of a few rounds each:
    on an engine whose settings sit within each other's spread it is low by chance,
    and a setting exactly like the rest misses the 1.1x line more often than not.
    Bootstrap (draws with replacement), seeded: pure. None with fewer than two
    settings, a round that is not finite, or no round for the controller."""
    if draws < 1:
        raise ValueError("draws must be >= 1")
    sizes = [len(v) for v in rounds.values()]
    pool = [float(x) for v in rounds.values() for x in v]
    if len(sizes) < 2 or min(sizes) < 1 or controller_rounds < 1:
        return None
    if not all(math.isfinite(x) for x in pool):
        return None
    rng = random.Random(seed)
    bests: list[float] = []
    within = 0
    for _ in range(draws):
        best = min(statistics.median(rng.choices(pool, k=n)) for n in sizes)
        like = statistics.median(rng.choices(pool, k=controller_rounds))
        bests.append(best)
        within += like <= P99_SLACK * best
    bests.sort()
    return Chance(
        settings=len(sizes),
        rounds=len(pool),
        best=statistics.median(bests),
        best_low=bests[int(0.1 * (draws - 1))],
        best_high=bests[int(0.9 * (draws - 1))],
        pooled=statistics.median(pool),
        within=within / draws,
    )


def point(label: str, p99: float | None, bulk: float) -> Point:
    """A run on the frontier's plane. No realtime answer at all is as slow as can be,
    never a point that met the SLO."""
    if p99 is None or not math.isfinite(p99):
        return Point(label, math.inf, bulk)
    return Point(label, float(p99), bulk)


def grid(caps: Iterable[int] = CAPS, batches: Iterable[int] = BATCH_SIZES) -> list[Setting]:
    """Every static setting of the sweep, smallest cap first."""
    sizes = tuple(batches)
    return [Setting(cap, batch) for cap in caps for batch in sizes]


#: The first token's bound the client derives for an SLO stated with ``tpot`` alone:
#: this many per-token times, at least DERIVED_TTFT_MIN seconds (``ServerStats.slo``;
#: tests/bench/test_frontier.py holds them equal, as the bench imports nothing private).
DERIVED_TTFT_STEPS = 6.0
DERIVED_TTFT_MIN = 0.1


def derived_ttft(tpot: float) -> float:
    """The first token's bound of an SLO stated with ``tpot`` alone, as the client
    derives it."""
    return max(DERIVED_TTFT_MIN, DERIVED_TTFT_STEPS * tpot)


def slo_bound(ttft: float, tpot: float, tokens: int = REALTIME_TOKENS) -> float:
    """What a non-streamed realtime answer of ``tokens`` tokens may take end to end
    under ``SLO(ttft, tpot)``: its first token, then the rest at the per-token time."""
    if ttft < 0 or tpot < 0 or tokens < 1:
        raise ValueError("ttft and tpot must be >= 0 and tokens >= 1")
    return ttft + (tokens - 1) * tpot


def median_points(rounds: Sequence[Sequence[Point]]) -> list[Point]:
    """Each label's median over alternated rounds (p99 and bulk apart), in the order
    the labels first appear."""
    by_label: dict[str, list[Point]] = {}
    for points in rounds:
        for point in points:
            by_label.setdefault(point.label, []).append(point)
    return [
        Point(
            label,
            statistics.median(p.realtime_p99 for p in points),
            statistics.median(p.bulk for p in points),
        )
        for label, points in by_label.items()
    ]


def oracle(statics: Iterable[Point], bound: float) -> Point | None:
    """The static point with the most bulk among those whose p99 is within ``bound``
    (the lower p99 among equals); None when none is."""
    best: Point | None = None
    for point in statics:
        if point.realtime_p99 > bound:
            continue
        if best is None or (point.bulk, -point.realtime_p99) > (best.bulk, -best.realtime_p99):
            best = point
    return best


def contested(statics: Sequence[Point], bound: float) -> list[str]:
    """The labels of the static settings the verdict could turn on, in the order
    given: each whose p99 is within :data:`CONTESTED` times the bound (it may be the
    oracle, or become it); where none is, the :data:`FASTEST` fastest (the best static
    p99 the controller is held to when none meets the bound). Settings far over the
    bound only draw the frontier's far end: another round of them changes no verdict."""
    if bound <= 0:
        raise ValueError("the bound must be > 0")
    near = {p.label for p in statics if p.realtime_p99 <= CONTESTED * bound}
    if not near:
        fastest = sorted(statics, key=lambda p: p.realtime_p99)[:FASTEST]
        near = {p.label for p in fastest if math.isfinite(p.realtime_p99)}
    return [p.label for p in statics if p.label in near]


def frontier(points: Iterable[Point]) -> list[Point]:
    """The points no other beats on both counts (lower p99 and more bulk), fastest
    realtime first: the line a plot draws."""
    ordered = sorted(points, key=lambda p: (p.realtime_p99, -p.bulk))
    line: list[Point] = []
    for point in ordered:
        if not line or point.bulk > line[-1].bulk:
            line.append(point)
    return line


def judge(
    controller: Point,
    statics: Sequence[Point],
    bound: float,
    *,
    unreachable: bool,
) -> Verdict:
    """The controller's run at the SLO against the static points. Where some static
    setting met the bound, the controller must too (p99 within :data:`P99_SLACK`
    of it) with at least :data:`BULK_SHARE` of the oracle's bulk, and saying the SLO
    is unreachable is a miss. Where none did, it must say the SLO is unreachable and
    keep realtime's p99 within :data:`P99_SLACK` of the best static setting's."""
    if bound <= 0:
        raise ValueError("the bound must be > 0")
    if not statics:
        raise ValueError("no static points to judge against")
    p99_vs_bound = controller.realtime_p99 / bound
    best = oracle(statics, bound)
    if best is None:
        fastest = min(p.realtime_p99 for p in statics)
        within = controller.realtime_p99 <= P99_SLACK * fastest
        if not unreachable:
            reason = "no static setting met the SLO, and the client did not say it is unreachable"
        elif not within:
            reason = (
                f"no static setting met the SLO; realtime p99 {controller.realtime_p99:.3f} s "
                f"is over {P99_SLACK}x the best static setting's {fastest:.3f} s"
            )
        else:
            reason = "no static setting met the SLO; the client said so and kept realtime fast"
        return Verdict(unreachable and within, bound, p99_vs_bound, None, None, reason)
    share = controller.bulk / best.bulk if best.bulk > 0 else 0.0
    if unreachable:
        reason = f"the client said the SLO is unreachable, but {best.label} met it"
        met = False
    elif p99_vs_bound > P99_SLACK:
        reason = f"realtime p99 is {p99_vs_bound:.2f}x the bound ({best.label} met it)"
        met = False
    elif share < BULK_SHARE:
        reason = f"bulk is {share:.2f}x the oracle's ({best.label})"
        met = False
    else:
        reason = f"p99 {p99_vs_bound:.2f}x the bound, bulk {share:.2f}x {best.label}'s"
        met = True
    return Verdict(met, bound, p99_vs_bound, best, share, reason)


@dataclass(frozen=True, slots=True)
class Sweep:
    """A frontier scenario's runs read back: the bound, each static setting's and
    the controller's medians, and whether the controller said the SLO was
    unreachable (in at least half its rounds, as a median would have it)."""

    bound: float
    statics: list[Point]
    controller: Point | None
    unreachable: bool
    rounds: int
    """Every setting's rounds at least."""
    confirmed: int
    """The controller's rounds: more than :attr:`rounds` where confirming rounds ran
    (it and the static settings near the bound, :func:`contested`)."""
    p99s: Mapping[str, Sequence[float]] = field(default_factory=dict)
    """Each setting's realtime p99 round by round, seconds."""

    @property
    def medians_of(self) -> str:
        """How many rounds the medians rest on, in words."""
        text = f"medians of {self.rounds} round{'s' if self.rounds != 1 else ''}"
        if self.confirmed > self.rounds:
            text += f" ({self.confirmed} for the controller and the settings near the bound)"
        return text

    def verdict(self) -> Verdict | None:
        """The controller against the static points (None without both)."""
        if self.controller is None or not self.statics:
            return None
        return judge(self.controller, self.statics, self.bound, unreachable=self.unreachable)

    def chance(self) -> Chance | None:
        """Where no static setting met the bound (the controller is then held to the
        best one's p99): :func:`by_chance` over the settings near the bound. None
        where one met it, or without the rounds."""
        controller = self.controller
        if controller is None or oracle(self.statics, self.bound) is not None:
            return None
        near = contested(self.statics, self.bound)
        rounds = {label: self.p99s[label] for label in near if label in self.p99s}
        return by_chance(rounds, len(self.p99s.get(controller.label, ())))


def from_runs(runs: Iterable[Mapping[str, Any]], controller_label: str) -> Sweep | None:
    """The frontier scenario's runs (their JSON form) as a :class:`Sweep`: mixed runs
    labelled ``static ...`` are the grid, ``controller_label`` the controller's; a
    run's point is realtime's end-to-end p99 and its bulk prompts a second. None
    when no run carries the bound."""
    mixed = [r for r in runs if r.get("scenario") == "frontier" and r["extra"].get("bound_s")]
    if not mixed:
        return None
    bound = float(mixed[0]["extra"]["bound_s"])
    points: list[Point] = []
    said = 0
    for run in mixed:
        latency = run.get("latency", {}).get("realtime")
        p99 = latency.get("p99") if latency else None
        points.append(point(run["label"], p99, float(run.get("prompts_per_s") or 0.0)))
        if run["label"] == controller_label and run["extra"].get("slo_unreachable"):
            said += 1
    medians = median_points([[p] for p in points])
    statics = [p for p in medians if p.label.startswith("static ")]
    controller = next((p for p in medians if p.label == controller_label), None)
    p99s: dict[str, list[float]] = {}
    for p in points:
        p99s.setdefault(p.label, []).append(p.realtime_p99)
    counts = {label: len(rounds) for label, rounds in p99s.items()}
    unreachable = said > 0 and 2 * said >= counts.get(controller_label, 0)
    fewest = min(counts[p.label] for p in [*statics, *([controller] if controller else [])])
    return Sweep(
        bound,
        statics,
        controller,
        unreachable,
        fewest,
        counts.get(controller_label, fewest),
        p99s,
    )
