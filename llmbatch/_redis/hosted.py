"""What processes sharing a ``RateLimit`` key tell each other of a hosted provider:
the limits its answers' headers state, and a 429's wait.

Every :data:`POLL` seconds each process says what it learnt since it last spoke
(numbers it had not said or heard before), the longest wait a 429 asked of it, and
whether 429s came, and hears what the others said: limits it has not learnt itself
become its budget (leased from the shared one: docs/shared-limits.md), a wait still
running holds every one of its servers until it ends, and the speed they all spend
the budget at, kept in Redis (cut for a burst of 429s, whoever met it, raised while
none come: another app spends the same key), sets the rate it leases at. A process
so hears of another's 429 within a poll; what it sent in that time may still meet
the limit.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Collection
from typing import Protocol

import anyio

from llmbatch._clock import Clock
from llmbatch._redis.link import RedisLink, SharedBudgetUnreachable
from llmbatch._redis.scripts import HOSTED_SHARE, hosted_keys
from llmbatch._scheduler.budgets import CUT, CUT_SPACING, RAISE, RAISE_AFTER, SLOWEST
from llmbatch._scheduler.core import Scheduler

__all__ = ["CoolsDown", "HostedSharing"]

logger = logging.getLogger("llmbatch")

#: Seconds between two exchanges with Redis.
POLL = 0.25
#: Seconds learnt limits stay in Redis after they were last said (a provider's limits
#: change with its tiers, rarely within a day).
KEEP = 86_400
#: The rule a shared learnt budget slows down and speeds up by, as a lone process's
#: does (budgets.py), for the script: cut, slowest, raise, then milliseconds between
#: cuts and from the last cut to the first raise.
SPEED_RULE = (CUT, SLOWEST, RAISE, round(CUT_SPACING * 1000), round(RAISE_AFTER * 1000))


class CoolsDown(Protocol):
    """A server as this needs it: when its 429's wait ends (``-inf``: none)."""

    cooldown_until: float


class HostedSharing:
    """One process's side of it; runs until cancelled."""

    def __init__(
        self,
        link: RedisLink,
        key: str,
        *,
        scheduler: Scheduler,
        servers: Callable[[], Collection[CoolsDown]],
        clock: Clock,
        wake: Callable[[], None],
    ) -> None:
        self._link = link
        self._key = key
        self._keys = hosted_keys(key)
        self._scheduler = scheduler
        self._servers = servers
        self._now = clock
        self._wake = wake
        self._said: tuple[int | None, int | None] | None = None
        """The limits last said or heard (what the scheduler learnt then)."""
        self._waited_until = -math.inf
        """The end of the latest wait said or heard."""
        self.heard_cooldowns = 0
        """Waits another process's 429 set that held this one."""

    async def run(self) -> None:
        while True:
            # Unreachable: the rate leaser says so, and how it goes on meanwhile.
            with contextlib.suppress(SharedBudgetUnreachable):
                await self.exchange()
            await anyio.sleep(POLL)

    async def exchange(self) -> None:
        """Say what is new, hear what the others said."""
        now = self._now()
        learnt = self._scheduler.rate_learnt
        new = learnt if learnt is not None and learnt != self._said else None
        until = max((s.cooldown_until for s in self._servers()), default=-math.inf)
        wait_ms = 0
        if until > self._waited_until and until > now:
            wait_ms = math.ceil((until - now) * 1000)
        rpm_said, tpm_said = new or (None, None)
        cut = self._scheduler.take_rate_cut()
        reply = await self._link.run(
            HOSTED_SHARE,
            self._keys,
            [rpm_said or 0, tpm_said or 0, wait_ms, KEEP, int(cut), *SPEED_RULE],
        )
        if new is not None:
            self._said = new
        if wait_ms:
            self._waited_until = until
        now = self._now()
        rpm, tpm, left_ms = int(float(reply[0])), int(float(reply[1])), int(reply[2])
        self._scheduler.set_rate_speed(float(reply[3]))
        heard = (rpm or None, tpm or None)
        if heard != (None, None) and heard != self._said:
            # Another process learnt them (or they changed there first).
            self._said = heard
            self._scheduler.learn_rate(
                *heard,
                source="shared",
                evidence=f"learnt by another process sharing the key {self._key!r}",
            )
        if left_ms > 0:
            held_until = now + left_ms / 1000
            if held_until > self._waited_until + 0.001:
                self.heard_cooldowns += 1
                self._waited_until = held_until
                for server in self._servers():
                    server.cooldown_until = max(server.cooldown_until, held_until)
                logger.info(
                    "a 429 another process sharing the rate limit met asked to wait: "
                    "holding every server %.2fs",
                    left_ms / 1000,
                )
                self._wake()
