"""A spending limit's ledger: dollars spent under one ``max_cost`` and dollars
reserved by requests not yet settled.

Pure: no clock, no I/O. A request reserves the most it could cost when it is queued
(its prompt's estimated tokens and ``max_tokens`` for every choice, at the model's
price) and settles with what its usage says it cost. A request may go when what is
spent and reserved leaves room for its estimate; it waits while only reservations
stand in its way (they settle, mostly for less); it is refused once what is spent
alone leaves no room, since nothing can give that back.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol

__all__ = ["Spender", "SpendingLedger", "Verdict", "reserve", "settle", "verdict_of"]


class Verdict(enum.Enum):
    GO = "go"
    WAIT = "wait"
    REFUSE = "refuse"


class SpendingLedger:
    """One ``max_cost``: ``limit`` dollars, for ``scope`` (``"client"``, ``"map"``)."""

    __slots__ = ("changes", "holders", "limit", "reserved", "scope", "spent")

    def __init__(self, limit: float, scope: str) -> None:
        self.limit = limit
        self.scope = scope
        self.spent = 0.0
        """Dollars the answers so far cost (a failed attempt's usage included)."""
        self.reserved = 0.0
        """Dollars reserved by requests queued or in flight, not yet settled."""
        self.holders = 0
        """Requests holding a reservation (the sum is reset to 0 when none is left,
        so rounding cannot accumulate)."""
        self.changes = 0
        """Counts settlements: a request waiting for room looks again when it moved."""

    def verdict(self, estimate: float) -> Verdict:
        """Whether a request that could cost ``estimate`` may be queued now."""
        if self.spent + self.reserved + estimate <= self.limit:
            return Verdict.GO
        if self.spent + estimate > self.limit or not self.holders:
            return Verdict.REFUSE
        return Verdict.WAIT

    def reserve(self, estimate: float) -> None:
        self.reserved += estimate
        self.holders += 1

    def settle(self, estimate: float, cost: float) -> None:
        """A request that reserved ``estimate`` ended, costing ``cost`` (0: no answer)."""
        self.holders -= 1
        self.reserved = max(0.0, self.reserved - estimate) if self.holders else 0.0
        self.spent += cost
        self.changes += 1

    def spend(self, cost: float) -> None:
        """An answer came for a request settled already (its caller left while it was
        in flight): the server did the work, so it is paid for."""
        self.spent += cost
        self.changes += 1


def verdict_of(
    ledgers: Iterable[SpendingLedger], estimate: float
) -> tuple[Verdict, SpendingLedger | None]:
    """The verdict of every ledger a request is under: refused by any, waiting for
    any, else free to go; with the ledger that refuses or holds it."""
    waiting: SpendingLedger | None = None
    for ledger in ledgers:
        verdict = ledger.verdict(estimate)
        if verdict is Verdict.REFUSE:
            return verdict, ledger
        if verdict is Verdict.WAIT and waiting is None:
            waiting = ledger
    return (Verdict.WAIT, waiting) if waiting is not None else (Verdict.GO, None)


class Spender(Protocol):
    """What a request holds of its spending limits."""

    spending: tuple[SpendingLedger, ...]
    est_cost: float
    reserved: bool


def reserve(request: Spender) -> None:
    """Reserve what ``request`` may cost under each of its limits."""
    for ledger in request.spending:
        ledger.reserve(request.est_cost)
    request.reserved = True


def settle(request: Spender, cost: float) -> None:
    """``request`` ended, costing ``cost`` (0: no answer): its limits take what it
    cost in place of what it reserved; one settled already (its caller left while it
    was in flight, and its answer came) is still paid for."""
    if request.reserved:
        request.reserved = False
        for ledger in request.spending:
            ledger.settle(request.est_cost, cost)
    elif cost:
        for ledger in request.spending:
            ledger.spend(cost)
