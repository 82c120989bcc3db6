"""What a client shares through Redis, started with its engine and closed with it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection, Mapping

import anyio
from anyio.abc import TaskGroup

from llmbatch._clock import Clock
from llmbatch._config import RateLimit, SharedInFlight, TenantLimits
from llmbatch._redis.hosted import CoolsDown, HostedSharing
from llmbatch._redis.in_flight import SeatHolder, SeatLeaser
from llmbatch._redis.link import RedisLink, require_redis
from llmbatch._redis.rate import RateBuckets, RateLeaser
from llmbatch._scheduler import Scheduler
from llmbatch._scheduler.tenants import TenantSeats
from llmbatch._stats import SharedStats

__all__ = ["SharedBudgets"]


class SharedBudgets:
    """A client's shared rate limit and shared in-flight budget (either may be unset)."""

    def __init__(
        self,
        rate_limit: RateLimit | None,
        in_flight: SharedInFlight | None,
        tenants: Mapping[str, TenantLimits] | None = None,
    ) -> None:
        self._rate_limit = rate_limit if rate_limit and rate_limit.redis_url else None
        self._in_flight = in_flight
        self._tenants = {
            name: limits for name, limits in (tenants or {}).items() if limits.redis_url
        }
        """Tenants whose rates are shared through Redis."""
        self.tenant_rates: dict[str, RateLeaser] = {}
        self.tenant_seats: dict[str, SeatLeaser] = {}
        if self:
            require_redis()  # at the call that asks for it, not when the client opens
        self._links: dict[str, RedisLink] = {}
        self.rate: RateLeaser | None = None
        self.hosted: HostedSharing | None = None
        self.seats: SeatLeaser | None = None
        # Unique per client, readable in Redis (which host and process holds what).
        self._member = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"

    def __bool__(self) -> bool:
        return self._rate_limit is not None or self._in_flight is not None or bool(self._tenants)

    def _link(self, url: str) -> RedisLink:
        link = self._links.get(url)
        if link is None:
            link = self._links[url] = RedisLink(url)
        return link

    def start(
        self,
        tg: TaskGroup,
        scheduler: Scheduler,
        wake: Callable[[], None],
        clock: Clock,
        servers: Callable[[], Collection[CoolsDown]] = tuple,
    ) -> None:
        """Lease for ``scheduler`` in ``tg`` from now on (and share what ``servers``'
        answers say of a hosted provider's limits)."""

        def rate(url: str, limit: RateLimit, buckets: RateBuckets) -> RateLeaser:
            leaser = RateLeaser(
                self._link(url), limit, buckets, member=self._member, wake=wake, clock=clock
            )
            tg.start_soon(leaser.run)
            return leaser

        def seats(config: SharedInFlight, holder: SeatHolder) -> SeatLeaser:
            assert config.redis_url is not None
            leaser = SeatLeaser(
                self._link(config.redis_url),
                config,
                holder,
                member=self._member,
                wake=wake,
                clock=clock,
            )
            tg.start_soon(leaser.run)
            return leaser

        limit = self._rate_limit
        if limit is not None:
            url, key = limit.redis_url, limit.key
            assert url is not None
            assert key is not None
            if scheduler.rate is not None:  # stated numbers
                self.rate = rate(url, limit, scheduler.rate.buckets)

            def learnt(budget: RateLimit) -> None:
                # A budget learnt from the provider's answers (here or in another
                # process): leased from the shared one at its rates.
                assert scheduler.rate is not None
                if self.rate is None:
                    self.rate = rate(url, budget, scheduler.rate.buckets)
                else:
                    self.rate.retarget(budget, scheduler.rate.buckets)

            scheduler.on_rate_learnt = learnt
            self.hosted = HostedSharing(
                self._link(url), key, scheduler=scheduler, servers=servers, clock=clock, wake=wake
            )
            tg.start_soon(self.hosted.run)
        shared_tenants = scheduler.tenants.shared()
        for name, limits in self._tenants.items():
            tenant = shared_tenants[name]
            assert limits.redis_url is not None
            assert limits.key is not None
            if limits.rate_limit is not None:
                assert tenant.rate is not None
                self.tenant_rates[name] = rate(
                    limits.redis_url, limits.rate_limit, tenant.rate.buckets
                )
            if limits.max_in_flight is not None:
                budget = SharedInFlight(
                    redis_url=limits.redis_url,
                    key=limits.key,
                    max_in_flight=limits.max_in_flight,
                    max_in_flight_tokens=limits.max_in_flight_tokens,
                )
                self.tenant_seats[name] = seats(budget, TenantSeats(tenant))
        if self._in_flight is not None:
            self.seats = seats(self._in_flight, scheduler)

    async def aclose(self) -> None:
        """Give back what is leased and unused, and close the connections."""
        try:
            if self.rate is not None:
                await self.rate.aclose()
            for leaser in self.tenant_rates.values():
                await leaser.aclose()
            for seat_leaser in self.tenant_seats.values():
                await seat_leaser.aclose()
            if self.seats is not None:
                await self.seats.aclose()
        finally:
            with anyio.CancelScope(shield=True):
                for link in self._links.values():
                    await link.aclose()

    def stats(self) -> SharedStats | None:
        if not self:
            return None
        samples = sorted(s for link in self._links.values() for s in link.samples)

        def pick(q: float) -> float | None:
            return samples[min(len(samples) - 1, int(q * len(samples)))] if samples else None

        rate, seats = self.rate, self.seats
        reachable = [r.reachable for r in (rate, seats) if r is not None]
        return SharedStats(
            round_trips=sum(link.round_trips for link in self._links.values()),
            failures=sum(link.failures for link in self._links.values()),
            round_trip_p50=pick(0.5),
            round_trip_p99=pick(0.99),
            reachable=all(r is not False for r in reachable),
            rate_sharers=rate.sharers if rate is not None else None,
            rate_refusals=rate.refusals if rate is not None else None,
            seats_allowed=seats.allowed if seats is not None else None,
            seats_held=seats.held[0] if seats is not None else None,
            seat_sharers=seats.sharers if seats is not None else None,
            cooldowns_heard=None if self.hosted is None else self.hosted.heard_cooldowns,
        )
