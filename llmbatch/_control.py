"""How much lower-tier work one server may have in flight: a controller fed what the
server reports, pure and driven by the time passed in.

vLLM runs every admitted sequence in each engine step, and a step takes longer the
more sequences run (on the simulator's calibrated model, 22 ms + 1.07 ms per
sequence; on real GPUs the same shape). It never preempts a running sequence for a
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
  aiming at 90 % of the target; it starts small and grows while the target holds;
  and it stays below what the server can run at once (learnt from its gauges: the
  most it ran while it also queued), less the realtime reserve, so that realtime
  finds a seat on the server and not only in the client;
- without one, keep the server full and its own queue short: grow while the limit
  is what holds work back and the server queues little, shrink toward what it is
  running when its queue grows or its KV cache fills;
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
from dataclasses import dataclass

from llmbatch._config import SLO

__all__ = ["AdmissionController", "ControllerState"]

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
#: A realtime request must find a seat at once: bulk leaves at least this many,
#: and more while realtime has recently used more (up to Limits.reserved_realtime).
MIN_RESERVE = 1
RESERVE_MEMORY = 10.0


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
    server_waiting: int | None
    """Requests in the server's own queue at the last report."""
    server_running: int | None
    kv_cache_usage: float | None
    slo_met: int
    """Realtime requests whose latency met the SLO."""
    slo_missed: int
    slo_aim: float | None
    """The share of the SLO latencies are held to now (None without an SLO)."""
    slo_unreachable: bool = False
    """With an SLO: the limit is at its floor of one sequence and the latencies are
    still over the target, so the server is too slow for it whatever bulk does."""


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + EWMA_WEIGHT * (sample - old)


class AdmissionController:
    """The bulk in-flight limit of one server. Not thread-safe; one loop owns it."""

    def __init__(
        self,
        *,
        ceiling: int,
        max_reserve: int,
        slo: SLO | None = None,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self.ceiling = ceiling
        self.slo = slo if slo is not None and (slo.ttft or slo.tpot) else None
        self._max_reserve = max_reserve
        self.interval = interval
        self._limit = float(min(ceiling, SLO_START) if self.slo else ceiling)
        self._slow_start = self.slo is not None
        self._last_change: float | None = None
        self.step_time: float | None = None
        self._last_step: float | None = None
        self._fresh = 0
        """Step-time samples since the limit last changed, taken while the server ran
        about what the limit allows: only those show what the limit does."""
        self.ttft: float | None = None
        self.waiting: int | None = None
        self.running: int | None = None
        self.kv_usage: float | None = None
        self.server_seats: int | None = None
        """The most sequences the server ran while it also queued some: what it can
        run at once (its ``--max-num-seqs``, or what its KV cache holds), learnt."""
        self._answers = 0
        self._overloads = 0
        self._blocked = False
        self._realtime_peak = 0
        self._realtime_seen: float | None = None
        self.slo_met = 0
        self.slo_missed = 0
        self.aim = SLO_HEADROOM
        """The share of the SLO the server's latencies are held to now."""
        self._aim_met = self._aim_missed = 0
        self._answers_since_cut = AIM_HOLD
        self.slo_unreachable = False
        """At the floor and still over the SLO at the last update (see ControllerState)."""

    # -- samples ---------------------------------------------------------------------

    def on_step_time(self, seconds: float) -> None:
        """The server's time per output token, measured over a recent span."""
        if math.isfinite(seconds) and seconds > 0:
            self.step_time = _ewma(self.step_time, seconds)
            self._last_step = seconds
            if self.running is not None and self.running >= CAUGHT_UP * self._limit:
                self._fresh += 1

    def forget_speed(self) -> None:
        """Measure the step time, TTFT and seats afresh (a server taken out and
        back, perhaps restarted with other settings)."""
        self.step_time = self._last_step = self.ttft = None
        self.server_seats = None
        self._fresh = 0

    def on_ttft(self, seconds: float) -> None:
        """A realtime request's time to first token."""
        if math.isfinite(seconds) and seconds >= 0:
            self.ttft = _ewma(self.ttft, seconds)

    def on_realtime_answer(self, ttft: float | None, tpot: float | None) -> None:
        """Count a realtime answer against the SLO (what it measured, None if unknown)."""
        slo = self.slo
        if slo is None:
            return
        missed = (slo.ttft is not None and ttft is not None and ttft > slo.ttft) or (
            slo.tpot is not None and tpot is not None and tpot > slo.tpot
        )
        if missed:
            self.slo_missed += 1
            self._aim_missed += 1
        else:
            self.slo_met += 1
            self._aim_met += 1
        self._answers_since_cut += 1
        self._adjust_aim()

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

    def on_load(self, *, waiting: int | None, running: int | None, kv_usage: float | None) -> None:
        """The server's own gauges (load header or /metrics)."""
        if waiting is not None:
            self.waiting = waiting
        if running is not None:
            self.running = running
        if waiting and running and running > (self.server_seats or 0):
            # A queue beside what runs: the server is full at this many.
            self.server_seats = running
        if kv_usage is not None:
            self.kv_usage = kv_usage

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
        seen = self._realtime_seen
        if count >= self._realtime_peak or seen is None or now - seen > RESERVE_MEMORY:
            self._realtime_peak = count
            self._realtime_seen = now

    # -- output ----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """Bulk sequences allowed in flight (realtime's reserve already left out)."""
        return max(1, min(int(self._limit), self.ceiling - self.reserve))

    @property
    def reserve(self) -> int:
        """Seats kept for realtime: one, or its recent peak plus one, up to the cap
        (``Limits.reserved_realtime``; 0 keeps none)."""
        wanted = max(MIN_RESERVE, self._realtime_peak + 1)
        return max(0, min(self._max_reserve, self.ceiling - 1, wanted))

    def update(self, now: float) -> bool:
        """Recompute the limit if ``interval`` has passed since the last change;
        returns whether it changed."""
        if self._last_change is not None and now - self._last_change < self.interval:
            return False
        before = self._limit
        overloads, answers = self._overloads, self._answers
        if overloads and overloads > OVERLOAD_SHARE * (overloads + answers):
            self._limit *= 0.5
            self._slow_start = False
        elif self.slo is not None:
            self._follow_slo()
        else:
            self._follow_queue()
        self._limit = min(float(self.ceiling), max(1.0, self._limit))
        self._blocked = False
        self._overloads = self._answers = 0
        if int(self._limit) != int(before):
            self._last_change = now
            self._fresh = 0
            return True
        return False

    def _follow_slo(self) -> None:
        assert self.slo is not None
        ratios = []
        # The latest sample as well as the average: a rise shows at once, a fall
        # only once it lasts.
        step = max(self.step_time or 0.0, self._last_step or 0.0) or None
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
        if self.waiting is not None and self.waiting > self._queue_allowance():
            # The server queues: past its capacity, whatever the latencies say yet.
            # (A few waiting is normal: requests arrive between steps.)
            ratios.append(MAX_SHRINK)
        if not ratios:
            return
        ratio = min(ratios)
        # Said in stats() rather than left as a limit sitting at 1 in silence.
        self.slo_unreachable = ratio < 1.0 and self._limit <= 1.0
        running = self.running
        if ratio < 1.0:
            # The latencies describe what runs on the server now. Sequences already
            # running cannot be recalled (vLLM does not preempt for priority), so the
            # limit shrinks from that count, not again and again while they drain.
            base = self._limit if running is None else float(running)
            self._limit = min(self._limit, base * max(MAX_SHRINK, ratio))
            self._slow_start = False
        elif self._blocked and (running is None or self._fresh >= FRESH_SAMPLES):
            # Grow only once the server has run about what the limit allows for a
            # while: before that the step time shows a lighter load than the limit
            # will make, and sequences admitted too many cannot be recalled.
            growth = 1.5 if self._slow_start else min(MAX_GROWTH, ratio)
            self._limit = max(self._limit + 1, self._limit * growth)
        seats = self.server_seats
        if seats is not None:
            # A realtime request must find a seat on the server, not only in the
            # client: with the server's seats all taken by bulk it waits in the
            # server's queue until a bulk sequence finishes, a whole generation
            # (docs/benchmarks.md, "Real vLLM"). Bulk leaves the reserve free there.
            self._limit = min(self._limit, max(1.0, float(seats - self.reserve)))

    def _queue_allowance(self) -> float:
        return max(4.0, QUEUE_ALLOWANCE * self._limit)

    def _follow_queue(self) -> None:
        allowance = self._queue_allowance()
        full = self.kv_usage is not None and self.kv_usage >= KV_FULL
        if self.waiting is not None and (self.waiting > allowance or full):
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
            server_waiting=self.waiting,
            server_running=self.running,
            kv_cache_usage=self.kv_usage,
            slo_met=self.slo_met,
            slo_missed=self.slo_missed,
            slo_aim=self.aim if self.slo is not None else None,
            slo_unreachable=self.slo_unreachable,
        )
