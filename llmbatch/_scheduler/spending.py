"""Requests held until their spending limits (``max_cost``) have room.

A request with spending limits reserves the most it may cost before it joins its
tier's queue. Where only reservations stand in its way it is held here, oldest
first, and looked at again whenever one of its limits has settled a request; where
what was spent alone leaves no room, it is refused (nothing can give that back).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from llmbatch._calls.request import Request, State
from llmbatch._config import Priority
from llmbatch._exceptions import SpendingLimitReached
from llmbatch._spending.ledger import SpendingLedger, Verdict, reserve, verdict_of

__all__ = ["SpendingHold"]


def refusal(request: Request, ledger: SpendingLedger) -> SpendingLimitReached:
    error = SpendingLimitReached(
        scope=ledger.scope, limit=ledger.limit, spent=ledger.spent, estimate=request.est_cost
    )
    error.request_id = request.id
    return error


class SpendingHold:
    """The held requests, oldest first (ones whose callers left, dropped lazily)."""

    __slots__ = ("_held", "_ledgers", "_seen", "live")

    def __init__(self) -> None:
        self._held: deque[Request] = deque()
        self._ledgers: dict[int, SpendingLedger] = {}
        """Every limit a held request counts against (by identity)."""
        self._seen = -1
        """Their settlements when the held requests were last looked at."""
        self.live = 0

    def enter(self, request: Request) -> bool:
        """Reserve what ``request`` may cost and return True, or hold it (False);
        raises :class:`SpendingLimitReached` where a limit can never take it."""
        verdict, ledger = verdict_of(request.spending, request.est_cost)
        if verdict is Verdict.GO:
            reserve(request)
            return True
        assert ledger is not None
        if verdict is Verdict.REFUSE:
            raise refusal(request, ledger)
        for each in request.spending:
            self._ledgers[id(each)] = each
        self._held.append(request)
        self.live += 1
        request.state = State.SPENDING
        return False

    def unhold(self, request: Request) -> None:
        """A held request's caller went away (or its deadline passed)."""
        request.state = State.FINISHED
        self.live -= 1

    def release(self) -> tuple[list[Request], list[tuple[Request, SpendingLimitReached]]]:
        """The held requests that may go now (reserved, in order), and those refused,
        where a limit they count against has settled something since last asked."""
        changes = sum(ledger.changes for ledger in self._ledgers.values())
        if changes == self._seen:
            return [], []
        self._seen = changes
        going: list[Request] = []
        refused: list[tuple[Request, SpendingLimitReached]] = []
        kept: deque[Request] = deque()
        for request in self._held:
            if request.state != State.SPENDING:
                continue
            verdict, ledger = verdict_of(request.spending, request.est_cost)
            if verdict is Verdict.WAIT:
                kept.append(request)
                continue
            self.live -= 1
            request.state = State.NEW
            if verdict is Verdict.GO:
                reserve(request)
                going.append(request)
            else:
                assert ledger is not None
                refused.append((request, refusal(request, ledger)))
        self._held = kept
        if not kept:
            self._ledgers.clear()
            self._seen = -1
        return going, refused

    def requests(self) -> Iterator[Request]:
        return (r for r in self._held if r.state == State.SPENDING)

    def count(self, priority: Priority) -> int:
        return sum(1 for r in self.requests() if r.priority is priority)
