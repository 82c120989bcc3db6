"""One server's seats as the scheduler sees them: the narrow interface between the
pure scheduler and the server it sends to.

The engine sets what the server allows (``sendable``, ``models``, the bulk limit
from its controller); the scheduler books what it sends here and routes by it.
"""

from __future__ import annotations

import math

from llmbatch._config import Limits, Priority
from llmbatch._scheduler.buckets import TokenBucket

__all__ = ["Seats"]


class Seats:
    """One server's in-flight ledger: its seats, its bulk limit, who holds them."""

    __slots__ = (
        "active",
        "batch_prefill",
        "bulk_cap",
        "bulk_in_flight",
        "bulk_in_flight_tokens",
        "bulk_token_cap",
        "ceiling",
        "in_flight",
        "in_flight_tokens",
        "index",
        "models",
        "pace",
        "sendable",
        "sent",
        "token_ceiling",
    )

    def __init__(self, index: int, limits: Limits) -> None:
        self.index = index
        """Its place in the scheduler's list (``Batch.replica``)."""
        self.ceiling = limits.max_in_flight
        self.token_ceiling = limits.max_in_flight_tokens
        self.bulk_cap = 0
        self.bulk_token_cap = 0
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.bulk_in_flight = 0
        self.bulk_in_flight_tokens = 0
        self.sent = 0
        """Sequences sent here so far: whether it had work between two looks, where
        each went and came back between them."""
        self.models: frozenset[str] | None = None
        """The models it serves (None: unknown, so any)."""
        self.sendable: int | None = None
        """None: send freely; 0: send nothing (unavailable); n: at most n more batches
        (a trial while it may be back)."""
        self.active = True
        """False once removed: it takes nothing new, and its in-flight work drains."""
        self.pace: TokenBucket | None = None
        """Bulk prompt tokens it may be sent, refilled by time (None: unpaced)."""
        self.batch_prefill = math.inf
        """The most estimated prompt tokens one batch may carry here (one engine
        step's worth; a single prompt goes whatever its size)."""
        self.set_bulk_limit(limits.max_in_flight - limits.reserved_realtime)

    def set_bulk_limit(self, sequences: int) -> None:
        sequences = max(1, min(sequences, self.ceiling))
        self.bulk_cap = sequences
        share = sequences / self.ceiling
        self.bulk_token_cap = max(1, int(self.token_ceiling * share))

    def set_pace(self, tokens_per_second: float | None, slice_tokens: float = 0.0) -> None:
        """Pace bulk prompt tokens here: ``tokens_per_second``, at most ``slice_tokens``
        at once (None: unpaced). What the bucket holds carries over a change."""
        if tokens_per_second is None:
            self.pace = None
            return
        pace = self.pace
        if pace is None:
            self.pace = TokenBucket(tokens_per_second, slice_tokens)
        else:
            pace.rate = tokens_per_second
            pace.capacity = slice_tokens
            pace.level = min(pace.level, slice_tokens)

    @property
    def realtime_in_flight(self) -> int:
        return self.in_flight - self.bulk_in_flight

    @property
    def load(self) -> float:
        """How busy it is: its share of its seats in use."""
        return self.in_flight / self.ceiling

    def room(self, priority: Priority) -> tuple[int, int]:
        """Free seats and tokens for a batch of ``priority`` (negative: over)."""
        seqs = self.ceiling - self.in_flight
        tokens = self.token_ceiling - self.in_flight_tokens
        if priority is not Priority.REALTIME:
            seqs = min(seqs, self.bulk_cap - self.bulk_in_flight)
            tokens = min(tokens, self.bulk_token_cap - self.bulk_in_flight_tokens)
        return seqs, tokens

    def open_to(self, model: str | None) -> bool:
        """Takes new batches now, for ``model`` (None: any model)."""
        return (
            self.active
            and self.sendable != 0
            and (model is None or self.models is None or model in self.models)
        )

    def has_seat(self, priority: Priority) -> bool:
        """Takes new batches now and has a seat for ``priority``."""
        return self.active and self.sendable != 0 and self.room(priority)[0] > 0

    def bulk_held_back(self) -> bool:
        """Seats free, none for bulk: its bulk limit alone holds bulk work back."""
        return (
            self.active
            and self.sendable != 0
            and self.bulk_in_flight >= self.bulk_cap
            and self.in_flight < self.ceiling
        )

    def book(self, priority: Priority, count: int, tokens: int) -> None:
        """``count`` sequences of ``tokens`` went out here (positive) or came back."""
        self.in_flight += count
        self.in_flight_tokens += tokens
        if count > 0:
            self.sent += count
        if priority is not Priority.REALTIME:
            self.bulk_in_flight += count
            self.bulk_in_flight_tokens += tokens
