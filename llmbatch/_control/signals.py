"""Where what the client knows of a server's speed and load comes from, and whether
each source is still speaking.

Servers differ in what they report: vLLM sends a load header on each answer and
serves gauges and latency histograms at ``/metrics``; an older vLLM or a proxy may
serve the gauges alone; most other servers report nothing, and the client learns
only from its own answers' timings and from 429/503. Each source is recorded here
on its own when it delivers a sample, and a source is *live* while its last sample
is recent. The controller then takes each quantity from the best live source (the
server's step-time histogram over streamed timings over answer latencies), so a
missing source never switches off another, and one that stops reporting gives way
by itself. Pure: time is passed in.
"""

from __future__ import annotations

from llmbatch._stats import SignalSource

__all__ = ["LIVE_FOR", "STEP_TIME_SOURCES", "Signals"]

#: Seconds a source stays live after its last sample (``/metrics`` is read every
#: 0.5 s while the client has work on the server).
LIVE_FOR = 5.0


#: Where the step time may come from, best first: the server's own histogram, then
#: streamed per-token times, then answers' latency per token.
STEP_TIME_SOURCES = (
    SignalSource.METRICS_STEP_TIME,
    SignalSource.STREAM_TIMING,
    SignalSource.ANSWER_LATENCY,
)


class Signals:
    """When each source last delivered a sample to one server's model."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[SignalSource, float] = {}

    def saw(self, source: SignalSource, now: float) -> None:
        """``source`` delivered a sample at ``now``."""
        self._seen[source] = now

    def is_live(self, source: SignalSource, now: float) -> bool:
        """Whether ``source`` delivered a sample within the last ``LIVE_FOR`` s."""
        seen = self._seen.get(source)
        return seen is not None and now - seen <= LIVE_FOR

    def best(self, now: float, sources: tuple[SignalSource, ...]) -> SignalSource | None:
        """The first of ``sources`` that is live (None if none is)."""
        return next((source for source in sources if self.is_live(source, now)), None)

    def live(self, now: float) -> tuple[str, ...]:
        """The live sources' names, in ``SignalSource`` order."""
        return tuple(source.value for source in SignalSource if self.is_live(source, now))

    def forget(self) -> None:
        """Hear every source afresh (a server back from an outage may be another
        build, behind another proxy)."""
        self._seen.clear()
