"""Per-request fault decisions drawn from the current :class:`FaultRates`."""

from __future__ import annotations

import enum
import random

from llmbatch_server.sim.config import FaultRates


class Fault(enum.Enum):
    """What goes wrong with one HTTP request (at most one of these)."""

    NONE = "none"
    ERROR_500 = "500"
    ERROR_429 = "429"
    ERROR_503 = "503"
    DROP = "drop"
    STREAM_ERROR = "stream_error"


class FaultInjector:
    """Holds the live fault rates (the admin API replaces them) and draws faults."""

    def __init__(self, rates: FaultRates, seed: int = 0) -> None:
        self.rates = rates
        self._rng = random.Random(seed)
        self.injected: dict[str, int] = {
            fault.value: 0 for fault in Fault if fault is not Fault.NONE
        }
        self.injected["spike"] = 0

    def draw(self, *, stream: bool) -> tuple[Fault, float]:
        """The fault for one request and the extra delay (latency spike) before it."""
        rates = self.rates
        delay = 0.0
        if rates.spike and self._rng.random() < rates.spike:
            delay = rates.spike_seconds
            self.injected["spike"] += 1
        roll = self._rng.random()
        fault = Fault.NONE
        for candidate, rate in (
            (Fault.ERROR_500, rates.error_500),
            (Fault.ERROR_429, rates.error_429),
            (Fault.ERROR_503, rates.error_503),
            (Fault.DROP, rates.drop),
        ):
            if roll < rate:
                fault = candidate
                break
            roll -= rate
        if fault is Fault.NONE and stream and self._rng.random() < rates.stream_error:
            fault = Fault.STREAM_ERROR
        if fault is not Fault.NONE:
            self.injected[fault.value] += 1
        return fault, delay
