"""What the admission controller may believe of a server, and on what evidence.

A single gauge reading proves little: vLLM admits a request's prompts at its next
engine step, so a scrape that lands between arrival and step shows them waiting
even while seats are free. So every inference the controller draws from a signal
(that a queue is real, how many sequences the server can run, that the SLO is out
of reach) needs a reading that persists: at least ``MIN_SAMPLES`` samples in a row
spanning at least ``MIN_STEPS`` step times. It is unlearnt when later readings
contradict it (a queue that empties; a server seen running more than its learnt
seats). What the server states itself (llama.cpp's slots, a configured
``max_num_seqs``) is used as stated. Pure: time is passed in.
"""

from __future__ import annotations

from llmbatch._stats import Inference

__all__ = ["Capacity", "Persistence"]

#: A reading must hold in this many samples in a row ...
MIN_SAMPLES = 3
#: ... spanning this many step times ...
MIN_STEPS = 5
#: ... or, while the step time is not known yet, this many seconds.
MIN_SPAN = 0.5


class Persistence:
    """Whether a condition seen in successive samples has lasted long enough to be
    believed: ``MIN_SAMPLES`` samples in a row spanning ``MIN_STEPS`` step times.

    One sample that does not show it ends the episode: a transient reading is
    *dismissed* (counted), a believed one is *unlearnt*."""

    __slots__ = ("confirmed", "dismissed", "high", "last", "low", "samples", "since", "unlearnt")

    def __init__(self) -> None:
        self.since: float | None = None
        self.last = 0.0
        self.samples = 0
        self.confirmed = False
        self.dismissed = 0
        self.unlearnt = 0
        self.low = self.high = 0.0

    def observe(self, now: float, holds: bool, step: float | None, value: float = 0.0) -> bool:
        """One sample at ``now``: whether the condition holds in it (``value``: the
        reading, for the evidence's range). Returns whether it is believed now."""
        if not holds:
            if self.samples:
                if self.confirmed:
                    self.unlearnt += 1
                else:
                    self.dismissed += 1
            self.since, self.samples, self.confirmed = None, 0, False
            return False
        if self.since is None:
            self.since, self.low, self.high = now, value, value
        self.samples += 1
        self.last = now
        self.low, self.high = min(self.low, value), max(self.high, value)
        span = MIN_STEPS * step if step else MIN_SPAN
        if self.samples >= MIN_SAMPLES and now - self.since >= span:
            self.confirmed = True
        return self.confirmed

    def describe(self, what: str, step: float | None) -> str:
        """The episode in words: ``waiting 12-30 over 4 samples in 1.3 s (52 steps)``."""
        if not self.samples or self.since is None:
            return ""
        seconds = self.last - self.since
        steps = f", {seconds / step:.0f} steps" if step else ""
        reading = f"{self.low:g}" if self.low == self.high else f"{self.low:g}-{self.high:g}"
        return f"{what} {reading} over {self.samples} samples in {seconds:.2f} s{steps}"


class Capacity:
    """How many sequences the server runs at once: stated (by the server or the
    configuration), or learnt as the most it ran while a real queue waited, and
    dropped when it is seen running more."""

    __slots__ = ("dropped", "evidence", "seats", "source")

    def __init__(self, stated: int | None = None, stated_by: str = "") -> None:
        self.seats = stated
        self.source = "stated" if stated is not None else "none"
        self.evidence = stated_by if stated is not None else ""
        self.dropped = 0

    def state(self, seats: int, by: str) -> None:
        """The server (or the configuration) says how many it runs at once."""
        self.seats, self.source, self.evidence = seats, "stated", by

    def learn(self, running: int, evidence: str) -> None:
        """A real queue waited while ``running`` ran: the server is full at that."""
        if self.source == "stated":
            return
        if self.seats is None or running > self.seats:
            self.seats, self.source, self.evidence = running, "learnt", evidence

    def contradict(self, running: int) -> bool:
        """The server runs ``running``: a learnt capacity below it is dropped (a
        stated one stands). Returns whether it was dropped."""
        if self.source != "learnt" or self.seats is None or running <= self.seats:
            return False
        self.evidence = f"dropped: ran {running}, more than the {self.seats} learnt"
        self.seats, self.source = None, "none"
        self.dropped += 1
        return True

    def forget(self) -> None:
        """Learn afresh (a server back from an outage may have other settings)."""
        if self.source == "learnt":
            self.seats, self.source, self.evidence = None, "none", ""

    def inference(self) -> Inference:
        return Inference(
            "seats",
            None if self.seats is None else float(self.seats),
            self.source,
            self.evidence or "no queue has lasted beside what runs",
            self.dropped,
        )
