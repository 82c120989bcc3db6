"""Which server a batch goes to: prefix affinity, balanced by load.

A recurring prompt prefix has a home: the server its first batch went to. Its
batches go home while home has a seat and is not far busier than the least busy
server; otherwise, and for prompts without a home, to the less busy of two servers
picked at random (power of two choices). When a seat frees, the oldest ready group
at home there goes first, ahead of older groups at home elsewhere. Only servers
that serve the batch's model (or may: they have not said), and take batches now,
are considered.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator

from llmbatch._calls.request import Request
from llmbatch._config import Priority
from llmbatch._scheduler.queues import Group, TierQueue
from llmbatch._scheduler.seats import Seats

__all__ = ["Router"]

#: Prefix affinity yields to load when the affinity server runs this many more
#: sequences than the least busy one *and* this many times as many (both must hold,
#: so small counts never override affinity and large ones do).
AFFINITY_SLACK_SEQUENCES = 32
AFFINITY_SLACK_RATIO = 1.5
#: Ready groups of a tier looked at for one whose prefix belongs where a seat is free.
ROUTE_SCAN = 32
#: Seconds a group at home where a seat is free may overtake an older group: past
#: that the older one goes first, wherever there is room (so a server home to more
#: work than it can run is helped, and nobody waits without bound).
AFFINITY_PATIENCE = 1.0
#: Prefix keys remembered for affinity (least recently used dropped first).
AFFINITY_MEMORY = 65_536


class Router:
    """Routes groups among the servers' seats; remembers where each prefix lives."""

    def __init__(self, seats: list[Seats]) -> None:
        self._seats = seats
        """The scheduler's list (shared: servers added later are seen here)."""
        self._random = random.Random(0)
        self._affinity: OrderedDict[int, int] = OrderedDict()
        """Prefix key -> the server that last served a prompt with that prefix."""
        self._listed: frozenset[str] = frozenset()
        """Every model some active server lists."""
        self._unlisted = False
        """Some active server has not said what it serves (so it may serve any)."""

    def models_changed(self) -> None:
        """A server was added or removed, or said what it serves."""
        active = [s for s in self._seats if s.active]
        self._listed = frozenset().union(*(s.models for s in active if s.models is not None))
        self._unlisted = any(s.models is None for s in active)

    def pick(
        self, priority: Priority, tier: TierQueue, ready: Iterator[Group]
    ) -> tuple[Group, Seats] | None:
        """The group to send next and its server: the oldest ready group whose
        prefix is at home on a server with a seat; else, for the server the oldest
        ready group would be balanced to, a group at home there even if not yet
        ready (a smaller batch, but its prefix stays where it is cached); else that
        oldest ready group.

        Among servers that are all busy, seats free a few at a time; taking the
        group that belongs where the seat freed (rather than always the oldest) is
        what keeps each prefix on one server under saturation. A server takes
        another's prefix only when none of its own is queued, or when that prefix's
        work has waited ``AFFINITY_PATIENCE`` longer than its own."""
        fallback: tuple[Group, Seats] | None = None
        oldest: float | None = None
        for scanned, group in enumerate(ready):
            if scanned >= ROUTE_SCAN:
                break
            head = group.head()
            if oldest is None:
                oldest = head.enqueued_at
            elif head.enqueued_at - oldest > AFFINITY_PATIENCE:
                break  # younger groups may not overtake the oldest by more than this
            seats, affine = self.route(priority, group)
            if seats is None:
                continue
            if affine:
                return group, seats
            if fallback is None:
                fallback = group, seats
        if fallback is not None and oldest is not None:
            seats = fallback[1]
            for scanned, group in enumerate(tier.groups.values()):
                if scanned >= ROUTE_SCAN:
                    break
                head = group.head()
                if (
                    head.enqueued_at - oldest <= AFFINITY_PATIENCE
                    and self._home(head) == seats.index
                    and seats.open_to(self._model(head))
                ):
                    return group, seats
        return fallback

    def route(self, priority: Priority, group: Group) -> tuple[Seats | None, bool]:
        """The server the group's next batch goes to (None if none has a seat), and
        whether that is its prefix's home."""
        servers = self._seats
        head = group.head()
        if len(servers) == 1:
            only = servers[0]
            ok = only.open_to(None) and only.room(priority)[0] > 0
            return (only if ok else None), False
        model = self._model(head)
        open_ = [s for s in servers if s.open_to(model) and s.room(priority)[0] > 0]
        if not open_:
            return None, False
        home = self._home(head)
        if home is not None:
            preferred = servers[home]
            least = min(s.in_flight for s in open_)
            if preferred in open_ and not _imbalanced(preferred.in_flight, least):
                return preferred, True
            # Its home is full, far busier, or away: balance instead.
        if len(open_) == 1:
            return open_[0], False
        a, b = self._random.sample(open_, 2)
        return (a if a.load <= b.load else b), False

    def remember(self, seats: Seats, requests: tuple[Request, ...]) -> None:
        """The prefixes of these requests that have no home yet (or whose home was
        removed) are at home on ``seats``' server from now on. A home does not move
        when a batch is balanced elsewhere: a prefix that followed every such batch
        would leave its cache behind each time."""
        affinity = self._affinity
        servers = self._seats
        index = seats.index
        for request in requests:
            for key in request.prefix:
                home = affinity.get(key)
                if home is None or not servers[home].active:
                    affinity[key] = index
                else:
                    affinity.move_to_end(key)
        while len(affinity) > AFFINITY_MEMORY:
            affinity.popitem(last=False)

    def _home(self, head: Request) -> int | None:
        """The server where the longest of the request's prefixes is at home."""
        affinity = self._affinity
        for key in reversed(head.prefix):
            index = affinity.get(key)
            if index is not None:
                return index
        return None

    def _model(self, head: Request) -> str | None:
        """The model a server must serve to take this request (None: any)."""
        model = head.spec.model
        if model not in self._listed and not self._unlisted:
            return None  # no server may serve it: it goes anywhere, the server says why
        return model


def _imbalanced(preferred: int, least: int) -> bool:
    """The affinity server runs too many more sequences than the least busy one."""
    return preferred - least > AFFINITY_SLACK_SEQUENCES and preferred > AFFINITY_SLACK_RATIO * least
