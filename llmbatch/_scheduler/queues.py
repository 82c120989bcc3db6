"""The tier queues: compatible requests grouped, oldest first, and the callers who
wait for room in a full tier.

Pure bookkeeping; the scheduler decides what leaves and when.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

from llmbatch._calls.request import Request, State
from llmbatch._config import BatchPolicy

__all__ = ["Group", "TierQueue", "WaitingLine"]

_QUEUED, _FINISHED, _WAITING = State.QUEUED, State.FINISHED, State.WAITING


class WaitingLine:
    """Callers waiting for room in a full tier: a line per tenant, oldest first.

    Each free place goes to the line of the tenant served least (``pop_next``), so
    a tenant arriving behind another's thousands of waiting calls is not held
    behind them (one line: arrival order). Removal is lazy, as in a group."""

    __slots__ = ("lines",)

    def __init__(self) -> None:
        self.lines: dict[str | None, deque[Request]] = {}

    def append(self, request: Request) -> None:
        line = self.lines.get(request.spec.tenant)
        if line is None:
            line = self.lines[request.spec.tenant] = deque()
        line.append(request)

    def __iter__(self) -> Iterator[Request]:
        for line in self.lines.values():
            yield from line

    def pop_next(self, served: Callable[[str | None], float]) -> Request | None:
        """The oldest live request of the least-served tenant's line (None: none)."""
        lines = self.lines
        while lines:
            name = next(iter(lines)) if len(lines) == 1 else min(lines, key=served)
            line = lines[name]
            while line and line[0].state != _WAITING:
                line.popleft()  # its caller went away while it waited
            if line:
                return line.popleft()
            del lines[name]
        return None


class Group:
    """Compatible queued requests of one tier and one tenant, oldest first.

    Removal is lazy (a cancelled request stays in ``items`` until it reaches the
    head), so a storm of cancellations costs O(1) each; ``live`` and ``tokens``
    count only requests still queued. Groups that differ only in their tenant share
    a ``family``: one batch may take requests of several of them.
    """

    __slots__ = ("family", "items", "live", "served", "tenant", "tokens")

    def __init__(self, family: str = "", tenant: str | None = None, served: float = 0.0) -> None:
        self.items: deque[Request] = deque()
        self.live = 0
        self.tokens = 0
        self.family = family
        self.tenant = tenant
        self.served = served
        """Tokens sent from it (estimated), from the tier's level when it was made."""

    def head(self) -> Request:
        items = self.items
        while items[0].state != _QUEUED:
            items.popleft()
        return items[0]


#: Emptied groups whose service a tier remembers at most (the most recent).
_LEFT_KEPT = 256


class TierQueue:
    """One tier: its compatible groups, in turn order, and the callers waiting for
    room.

    Groups share the tier by the tokens each has sent (``Group.served``): the
    scheduler sends from the ready group that has sent the fewest, and among equals
    the first in turn order. A group that has just sent a batch goes to the back of
    the line (``served``), and a new group joins just ahead of it, level with the
    least-served group queued. A group that empties and fills again while others
    wait resumes from its own service if that is more (``left``): emptying forgives
    no debt, so a caller that sends in bursts cannot overtake a backlogged one at
    every burst. In creation order, a group that never empties (a long map
    refilling it) would hold every later group of its tier behind it for as long as
    it runs; by service, a later group gets half the tier at once (one batch of
    another group, at most, goes between two of its own)."""

    __slots__ = (
        "families",
        "groups",
        "last_served",
        "left",
        "policy",
        "size",
        "tenanted",
        "vtime",
        "waiting",
        "waiting_live",
    )

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.groups: OrderedDict[str, Group] = OrderedDict()
        self.families: dict[str, dict[str, Group]] = {}
        """Each family's groups (by group key)."""
        self.tenanted = 0
        """Groups of named tenants: while there are none, the groups' own service decides."""
        self.vtime = 0.0
        """The service of the group served last: where a new group starts when no
        other is queued."""
        self.last_served: str | None = None
        """The key of the group that sent the latest batch (the back of the line)."""
        self.left: dict[str, float] = {}
        """The service of groups that emptied while others stayed queued, by key: where
        each resumes if it fills again first (forgotten once the tier empties)."""
        self.size = 0
        self.waiting = WaitingLine()
        self.waiting_live = 0

    def enqueue(self, request: Request, now: float) -> Group:
        key = request.group_key
        group = self.groups.get(key)
        if group is None:
            group = self._new_group(key, request)
        group.items.append(request)
        group.live += 1
        group.tokens += request.est_tokens
        self.size += 1
        request.state = _QUEUED
        request.enqueued_at = now
        return group

    def requeue(self, requests: tuple[Request, ...] | list[Request]) -> None:
        """Put requests back at the head of their group, in their order; their batch
        timers keep running from when they first arrived."""
        for request in reversed(requests):
            key = request.group_key
            group = self.groups.get(key)
            if group is None:
                group = self._new_group(key, request)
                self.groups.move_to_end(key, last=False)
            group.items.appendleft(request)
            group.live += 1
            group.tokens += request.est_tokens
            self.size += 1
            request.state = _QUEUED

    def isolate(self) -> None:
        """Move queued requests that might not fit the context into groups of their own.

        The groups they leave are rebuilt rather than lazily skipped: lazy removal
        tells a dead entry by its state, and these stay queued (elsewhere)."""
        for key, group in list(self.groups.items()):
            moved = [r for r in group.items if r.state == _QUEUED and r.might_not_fit]
            if not moved:
                continue
            group.items = deque(
                r for r in group.items if r.state == _QUEUED and not r.might_not_fit
            )
            group.live = len(group.items)
            group.tokens = sum(r.est_tokens for r in group.items)
            if not group.live:
                self._drop(key)
            for request in moved:
                request.travel_alone()
                alone = self._new_group(request.group_key, request)
                alone.items.append(request)
                alone.live = 1
                alone.tokens = request.est_tokens  # (its batch timer keeps running)

    def _new_group(self, key: str, request: Request) -> Group:
        """A group joining the line: ahead of the one served last, behind the rest."""
        groups = self.groups
        tenant = request.spec.tenant
        family = request.family_key
        # It starts level with the least-served group queued (or where the last one
        # served left off): no credit for having had nothing queued, no debt either.
        start = min((g.served for g in groups.values()), default=self.vtime)
        if self.left:
            start = max(start, self.left.pop(key, start))
        group = groups[key] = Group(family, tenant, start)
        members = self.families.get(family)
        if members is None:
            self.families[family] = {key: group}
        else:
            members[key] = group
        if tenant is not None:
            self.tenanted += 1
        last = self.last_served
        if last is not None and last in groups:
            groups.move_to_end(last)
        return group

    def _drop(self, key: str) -> None:
        """An emptied group leaves the line and its family."""
        groups = self.groups
        group = groups.pop(key)
        left = self.left
        if not groups:
            left.clear()  # nobody waits: every group starts afresh
        else:
            if len(left) >= _LEFT_KEPT:
                del left[next(iter(left))]  # the longest gone
            left[key] = group.served
        members = self.families[group.family]
        del members[key]
        if not members:
            del self.families[group.family]
        if group.tenant is not None:
            self.tenanted -= 1

    def served(self, group: Group, key: str, tokens: int = 0) -> None:
        """``group`` (under ``key``) sent a batch of ``tokens``: its next turn comes
        after the others' (if it still has work), and its service grows."""
        group.served += tokens
        self.vtime = group.served
        if group.live and key in self.groups:
            self.groups.move_to_end(key)
            self.last_served = key
        else:
            self.last_served = None
            if key in self.left:  # it emptied with this batch: it resumes after it
                self.left[key] = group.served

    def unqueue(self, request: Request) -> None:
        """Take a queued request out (lazily: its group skips it later)."""
        key = request.group_key
        group = self.groups[key]
        group.live -= 1
        group.tokens -= request.est_tokens
        self.size -= 1
        request.state = _FINISHED
        if group.live == 0:
            self._drop(key)

    def pop(self, group: Group) -> Request:
        request = group.head()
        group.items.popleft()
        group.live -= 1
        group.tokens -= request.est_tokens
        self.size -= 1
        if group.live == 0:
            self._drop(request.group_key)
        return request

    def ready_groups(self, now: float, flush: bool, idle: bool) -> Iterator[Group]:
        """Every group that has hit a trigger, in turn order. With tenants, a group
        whose family holds a full batch between its tenants is ready too."""
        policy = self.policy
        if flush or (idle and policy.send_when_idle):
            yield from self.groups.values()
            return
        size, wait, tokens = policy.max_batch_size, policy.max_wait, policy.max_batch_tokens
        full: set[str] = set()
        if self.tenanted:
            for family, members in self.families.items():
                if len(members) > 1 and (
                    sum(g.live for g in members.values()) >= size
                    or sum(g.tokens for g in members.values()) >= tokens
                ):
                    full.add(family)
        for group in self.groups.values():
            if (
                group.live >= size
                or group.head().enqueued_at + wait <= now
                or group.tokens >= tokens
                or (full and group.family in full)
            ):
                yield group

    def next_trigger(self) -> float | None:
        wait = self.policy.max_wait
        return min((g.head().enqueued_at + wait for g in self.groups.values()), default=None)
