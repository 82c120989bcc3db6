"""An in-flight budget shared through Redis: an engine-side task holds this
process's share as a lease, renews it, and grants the scheduler's shared allowance
what the lease allows.

It renews every second (or every third of the lease, if shorter), four times a
second while some process holds less than its fair share (so seats move to where
work waits), and at once when work waits and this process holds nothing. A process
that dies stops renewing, and its seats are free when its lease ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import anyio

from llmbatch._clock import Clock
from llmbatch._config import SharedInFlight
from llmbatch._redis.link import RedisLink, SharedBudgetUnreachable
from llmbatch._redis.scripts import SEAT_LEASE, seat_keys
from llmbatch._scheduler.budgets import SharedAllowance

__all__ = ["SeatHolder", "SeatLeaser"]

logger = logging.getLogger("llmbatch")

#: Seconds between renewals while some process holds less than its fair share.
CONTENDED_INTERVAL = 0.25
#: Seconds between renewals otherwise (at most a third of the lease): how soon a
#: process that holds seats hears that another one wants its share.
RENEW_INTERVAL = 1.0
#: The least time between two renewals asked for by waiting work.
MIN_INTERVAL = 0.05


class SeatHolder(Protocol):
    """What holds the seats a lease allows: the scheduler (``SharedInFlight``), or one
    tenant (``TenantLimits`` with ``redis_url``)."""

    @property
    def in_flight(self) -> int: ...

    @property
    def in_flight_tokens(self) -> int: ...

    def seat_demand(self) -> tuple[int, int]:
        """Sequences and tokens it would have in flight now if the budget allowed."""
        ...

    def share_in_flight(
        self, *, limits_tokens: bool, on_full: Callable[[], None]
    ) -> SharedAllowance:
        """From now on send only what the allowance returned allows."""
        ...


class SeatLeaser:
    """Holds one process's share of a shared in-flight budget."""

    def __init__(
        self,
        link: RedisLink,
        config: SharedInFlight,
        scheduler: SeatHolder,
        *,
        member: str,
        wake: Callable[[], None],
        clock: Clock,
    ) -> None:
        self._link = link
        self._config = config
        self._keys = seat_keys(config.key)
        self._scheduler = scheduler
        self._member = member
        self._wake = wake
        self._now = clock
        # Nothing goes out before the first lease says how much may.
        self._allowance = scheduler.share_in_flight(
            limits_tokens=config.max_in_flight_tokens is not None, on_full=self._poke
        )
        self._due = anyio.Event()
        self._renew_interval = min(RENEW_INTERVAL, config.lease / 3)
        # Redis ends a share one renewal interval before the lease: a process killed
        # just after renewing loses it then, and the others, renewing that often, take
        # it up within the lease of the kill.
        self._expiry = config.lease - self._renew_interval
        self._valid_until: float | None = None
        """When the share last granted runs out unless renewed (local clock)."""
        self._renewed_at = -float("inf")
        self.contended = False
        self.sharers = 1
        self.held = (0, 0)
        """Seats and tokens this process holds in Redis."""
        self.reachable: bool | None = None

    @property
    def allowed(self) -> int:
        """Sequences this process may have in flight now."""
        return self._allowance.seats

    def _poke(self) -> None:
        # Work waits for the shared budget: worth a renewal now only while this
        # process holds nothing (the periodic renewals move seats otherwise).
        if self._allowance.seats == 0:
            self._due.set()

    async def run(self) -> None:
        """Renew the lease until cancelled."""
        while True:
            await self._renew()
            interval = CONTENDED_INTERVAL if self.contended else self._renew_interval
            if self.reachable is False:
                interval = min(interval, 1.0)
            with anyio.move_on_after(interval):
                await self._due.wait()
            self._due = anyio.Event()
            spacing = self._renewed_at + MIN_INTERVAL - self._now()
            if spacing > 0:
                await anyio.sleep(spacing)

    async def _renew(self) -> None:
        scheduler = self._scheduler
        want_seats, want_tokens = scheduler.seat_demand()
        # The scheduler may go on sending up to its allowance while the call is on its
        # way, so the seats in use by the time the script runs are up to that, not
        # just what is in flight now: the script must keep them held. (Reporting only
        # the in-flight count let a process shrink its hold below what it then sent,
        # and another process take the difference.) A share shrinks one renewal later.
        allowance = self._allowance
        in_use = max(scheduler.in_flight, allowance.seats)
        in_use_tokens = max(scheduler.in_flight_tokens, allowance.tokens or 0)
        await self._call(want_seats, want_tokens, in_use, in_use_tokens)

    async def _call(self, want_seats: int, want_tokens: int, seats: int, tokens: int) -> None:
        config = self._config
        sent_at = self._now()
        try:
            reply = await self._link.run(
                SEAT_LEASE,
                self._keys,
                [
                    self._member,
                    want_seats,
                    want_tokens if config.max_in_flight_tokens is not None else 0,
                    seats,
                    tokens,
                    config.max_in_flight,
                    config.max_in_flight_tokens or 0,
                    self._expiry,
                ],
            )
        except SharedBudgetUnreachable as exc:
            self._unreachable(exc)
            return
        self._renewed_at = sent_at
        if self.reachable is False:
            logger.warning(
                "Redis at %s answers again: sharing the in-flight budget %r again",
                self._link.where,
                config.key,
            )
        self.reachable = True
        self._valid_until = sent_at + self._expiry
        held_seats, allowed_seats, held_tokens, allowed_tokens = (int(float(v)) for v in reply[:4])
        self.held = (held_seats, held_tokens)
        self.contended = reply[4] == "1"
        self.sharers = max(1, int(reply[5]))
        if self._allowance.grant(allowed_seats, allowed_tokens):
            self._wake()

    def _unreachable(self, exc: SharedBudgetUnreachable) -> None:
        now = self._now()
        expired = self._valid_until is None or now >= self._valid_until
        first = self.reachable is not False
        self.reachable = False
        config = self._config
        if config.on_redis_error == "wait":
            if expired and self._allowance.seats:
                self._allowance.grant(0)
                logger.warning(
                    "Redis at %s cannot be reached (%s) and this process's share of the "
                    "in-flight budget %r has run out: nothing new is sent until Redis "
                    "answers (on_redis_error='wait')",
                    self._link.where,
                    exc,
                    config.key,
                )
            elif first:
                logger.warning(
                    "Redis at %s cannot be reached (%s): keeping this process's share of "
                    "the in-flight budget %r until its lease runs out, then sending "
                    "nothing new until Redis answers (on_redis_error='wait')",
                    self._link.where,
                    exc,
                    config.key,
                )
            return
        if first:
            if self._valid_until is None:
                # Never leased: go on with an equal share of the budget.
                sharers = self.sharers
                tokens = config.max_in_flight_tokens
                self._allowance.grant(
                    max(1, config.max_in_flight // sharers),
                    None if tokens is None else max(1, tokens // sharers),
                )
                self._wake()
            logger.warning(
                "Redis at %s cannot be reached (%s): this process goes on alone with its "
                "share of the in-flight budget %r, %d sequences (on_redis_error='local')",
                self._link.where,
                exc,
                config.key,
                self._allowance.seats,
            )

    async def aclose(self) -> None:
        """Give this process's share back at once (best effort)."""
        if self.reachable is not True:
            return
        with anyio.move_on_after(1.0, shield=True):
            await self._call(0, 0, 0, 0)
