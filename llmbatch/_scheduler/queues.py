"""The tier queues: compatible requests grouped, oldest first, and the callers who
wait for room in a full tier.

Pure bookkeeping; the scheduler decides what leaves and when.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator

from llmbatch._config import BatchPolicy
from llmbatch._request import Request, State

__all__ = ["Group", "TierQueue"]

_QUEUED, _FINISHED = State.QUEUED, State.FINISHED


class Group:
    """Compatible queued requests of one tier, oldest first.

    Removal is lazy (a cancelled request stays in ``items`` until it reaches the
    head), so a storm of cancellations costs O(1) each; ``live`` and ``tokens``
    count only requests still queued.
    """

    __slots__ = ("items", "live", "tokens")

    def __init__(self) -> None:
        self.items: deque[Request] = deque()
        self.live = 0
        self.tokens = 0

    def head(self) -> Request:
        items = self.items
        while items[0].state != _QUEUED:
            items.popleft()
        return items[0]


class TierQueue:
    """One tier: its compatible groups, in turn order, and the callers waiting for
    room.

    Groups take turns: a group that has just sent a batch goes to the back of the
    line (``served``), and a new group joins just ahead of it (it has had no turn
    yet; the others have waited longer since theirs). In creation order, a group
    that never empties (a long map refilling it) would hold every later group of its
    tier behind it for as long as it runs; in turns, each group with a batch ready
    waits at most one batch of every other group."""

    __slots__ = ("groups", "last_served", "policy", "size", "waiting", "waiting_live")

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.groups: OrderedDict[str, Group] = OrderedDict()
        self.last_served: str | None = None
        """The key of the group that sent the latest batch (the back of the line)."""
        self.size = 0
        self.waiting: deque[Request] = deque()
        self.waiting_live = 0

    def enqueue(self, request: Request, now: float) -> Group:
        key = request.group_key
        group = self.groups.get(key)
        if group is None:
            group = self._new_group(key)
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
                group = self.groups[key] = Group()
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
                del self.groups[key]
            for request in moved:
                request.travel_alone()
                alone = self._new_group(request.group_key)
                alone.items.append(request)
                alone.live = 1
                alone.tokens = request.est_tokens  # (its batch timer keeps running)

    def _new_group(self, key: str) -> Group:
        """A group joining the line: ahead of the one served last, behind the rest."""
        groups = self.groups
        group = groups[key] = Group()
        last = self.last_served
        if last is not None and last in groups:
            groups.move_to_end(last)
        return group

    def served(self, group: Group, key: str) -> None:
        """``group`` (under ``key``) sent a batch: its next turn comes after the
        others' (if it still has work)."""
        if group.live and key in self.groups:
            self.groups.move_to_end(key)
            self.last_served = key
        else:
            self.last_served = None

    def unqueue(self, request: Request) -> None:
        """Take a queued request out (lazily: its group skips it later)."""
        key = request.group_key
        group = self.groups[key]
        group.live -= 1
        group.tokens -= request.est_tokens
        self.size -= 1
        request.state = _FINISHED
        if group.live == 0:
            del self.groups[key]

    def pop(self, group: Group) -> Request:
        request = group.head()
        group.items.popleft()
        group.live -= 1
        group.tokens -= request.est_tokens
        self.size -= 1
        if group.live == 0:
            del self.groups[request.group_key]
        return request

    def ready_group(self, now: float, flush: bool, idle: bool) -> Group | None:
        """The oldest group that has hit a trigger, if any."""
        return next(self.ready_groups(now, flush, idle), None)

    def ready_groups(self, now: float, flush: bool, idle: bool) -> Iterator[Group]:
        """Every group that has hit a trigger, oldest first."""
        policy = self.policy
        if flush or (idle and policy.send_when_idle):
            yield from self.groups.values()
            return
        for group in self.groups.values():
            if (
                group.live >= policy.max_batch_size
                or group.head().enqueued_at + policy.max_wait <= now
                or group.tokens >= policy.max_batch_tokens
            ):
                yield group

    def next_trigger(self) -> float | None:
        wait = self.policy.max_wait
        return min((g.head().enqueued_at + wait for g in self.groups.values()), default=None)
