"""Tenants: each one's fair-share position and, for tenants with limits, what it
holds against them and the requests it must hold back.

Pure, with time passed in; the scheduler asks and moves requests.

Fair shares follow the Virtual Token Counter of "Fairness in Serving Large Language
Models" (Sheng et al., OSDI 2024): each tenant counts the tokens it has been served
(prompt tokens plus ``max_tokens``, the same estimate the in-flight budget uses),
divided by its weight, and within a tier the tenant with the lowest count goes next.
A tenant that starts queueing again is lifted to the count of the last tenant
served (about the lowest of those with work), so idle time earns no credit: it
could otherwise take the whole tier for as long as it had been away.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping

from llmbatch._calls.request import Request, State
from llmbatch._config import Priority, TenantLimits
from llmbatch._exceptions import InvalidRequestError, TenantQuotaExceeded
from llmbatch._scheduler.budgets import RateBudget, SharedAllowance

__all__ = ["FORGET_AFTER", "Tenant", "TenantBook", "TenantSeats"]

#: Seconds a tenant with nothing queued, held or in flight is remembered; after that
#: its state (fair-share position, rate buckets) is dropped, so memory follows the
#: tenants that are active, not every name ever seen.
FORGET_AFTER = 300.0

_HELD, _FINISHED = State.HELD, State.FINISHED


class Tenant:
    """One tenant's fair-share count, and its holdings when it has limits."""

    __slots__ = (
        "admitted",
        "admitted_tokens",
        "held",
        "held_live",
        "in_flight",
        "last_active",
        "limits",
        "name",
        "pinned",
        "queued",
        "rate",
        "retry_at",
        "served",
        "shared",
        "weight",
    )

    def __init__(self, name: str | None, limits: TenantLimits | None, served: float) -> None:
        self.name = name
        self.limits = limits
        self.weight = 1.0 if limits is None else limits.weight
        self.served = served
        """Tokens served divided by the weight (the virtual token count)."""
        self.admitted = 0
        """Its requests queued or in flight (counted only when it has limits)."""
        self.admitted_tokens = 0
        self.held: deque[Request] = deque()
        """Requests held back by its limits, oldest first (cancelled ones lazily)."""
        self.held_live = 0
        rate_limit = None if limits is None else limits.rate_limit
        self.rate: RateBudget | None = None if rate_limit is None else RateBudget(rate_limit)
        self.retry_at = 0.0
        """When a held request may next pass the rate limits (inf: when a lease comes)."""
        self.last_active = 0.0
        self.queued = 0
        """Its requests client-side: held, waiting for room, or queued."""
        self.in_flight = 0
        self.pinned = False
        """Never forgotten (its limits are leased from Redis by tasks that hold it)."""
        self.shared: SharedAllowance | None = None
        """Its share of an in-flight budget held in Redis with other processes."""

    def blocking_limit(self, request: Request, now: float) -> tuple[str, float, float] | None:
        """The limit that keeps ``request`` out now, as (name, allowed, held), or None."""
        limits = self.limits
        assert limits is not None
        if limits.max_in_flight is not None and self.admitted >= limits.max_in_flight:
            return "max_in_flight", limits.max_in_flight, self.admitted
        cap = limits.max_in_flight_tokens
        if cap is not None and self.admitted and self.admitted_tokens + request.est_tokens > cap:
            return "max_in_flight_tokens", cap, self.admitted_tokens
        shared = self.shared
        if shared is not None:
            # This process's share of the tenant's budget across processes.
            seats, tokens = shared.room(self.admitted, self.admitted_tokens)
            if seats < 1 or (self.admitted and tokens < request.est_tokens):
                shared.on_full()
                if seats < 1:
                    return "max_in_flight", limits.max_in_flight or 0, self.admitted
                return "max_in_flight_tokens", cap or 0, self.admitted_tokens
        rate = self.rate
        if rate is not None:
            wait = rate.wait(now, request.est_tokens, request.priority)
            if wait > 0:
                self.retry_at = now + wait
                requests, _ = rate.buckets
                if requests is not None and requests.wait_time(now, 1) > 0:
                    return "requests_per_minute", limits.requests_per_minute or 0, 1
                return "tokens_per_minute", limits.tokens_per_minute or 0, request.est_tokens
        return None

    def admit(self, request: Request) -> None:
        self.admitted += 1
        self.admitted_tokens += request.est_tokens
        if self.rate is not None:
            self.rate.take(request.est_tokens)
        request.quota = self

    def readmit(self, request: Request) -> None:
        """Count ``request`` again without charging the rates (it was sent, met an
        outage and is queued again)."""
        self.admitted += 1
        self.admitted_tokens += request.est_tokens
        request.quota = self

    def release(self, request: Request) -> None:
        self.admitted -= 1
        self.admitted_tokens -= request.est_tokens
        request.quota = None


class TenantSeats:
    """One tenant as the leaser of its in-flight budget shared through Redis sees it
    (``llmbatch._redis.in_flight.SeatHolder``)."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    @property
    def in_flight(self) -> int:
        return self.tenant.admitted

    @property
    def in_flight_tokens(self) -> int:
        return self.tenant.admitted_tokens

    def seat_demand(self) -> tuple[int, int]:
        tenant = self.tenant
        limits = tenant.limits
        assert limits is not None
        held = [r for r in tenant.held if r.state == _HELD]
        seats = tenant.admitted + len(held)
        tokens = tenant.admitted_tokens + sum(r.est_tokens for r in held)
        if limits.max_in_flight is not None:
            seats = min(seats, limits.max_in_flight)
        if limits.max_in_flight_tokens is not None:
            tokens = min(tokens, limits.max_in_flight_tokens)
        return seats, tokens

    def share_in_flight(
        self, *, limits_tokens: bool, on_full: Callable[[], None]
    ) -> SharedAllowance:
        shared = self.tenant.shared = SharedAllowance(limits_tokens=limits_tokens, on_full=on_full)
        return shared


class TenantBook:
    """Every active tenant's state; ``limits`` as given to ``Client(tenants=...)``."""

    def __init__(
        self,
        limits: Mapping[str, TenantLimits] | None = None,
        *,
        forget_after: float = FORGET_AFTER,
    ) -> None:
        self._limits = dict(limits or {})
        self._any = self._limits.pop("*", None)
        every = [*self._limits.values(), *([] if self._any is None else [self._any])]
        self.caps_tokens = any(
            lim.max_in_flight_tokens is not None or lim.tokens_per_minute is not None
            for lim in every
        )
        """Some tenant has a token quota a single request could exceed."""
        self.forget_after = forget_after
        self.tenants: dict[str | None, Tenant] = {}
        self.vtime = 0.0
        """The count of the tenant served last: about the lowest of those with work."""
        self.holding: dict[str | None, Tenant] = {}
        """Tenants with requests held back by their limits."""
        self._next_sweep = 0.0
        for name, tenant_limits in self._limits.items():
            if tenant_limits.redis_url is not None:
                # Its rate buckets are filled by a leaser task that holds them.
                self.get(name).pinned = True

    def shared(self) -> dict[str, Tenant]:
        """The tenants whose limits are shared through Redis (leased by tasks that
        hold them)."""
        return {name: t for name, t in self.tenants.items() if name is not None and t.pinned}

    def limits_of(self, name: str | None) -> TenantLimits | None:
        """A tenant's limits: its own, else ``"*"``'s; none for the default tenant."""
        if name is None:
            return None
        return self._limits.get(name, self._any)

    def counts(self) -> dict[str, tuple[int, int]]:
        """Each named tenant's (queued, in flight) now."""
        return {
            name: (t.queued, t.in_flight)
            for name, t in self.tenants.items()
            if name is not None and (t.queued or t.in_flight)
        }

    def get(self, name: str | None) -> Tenant:
        tenant = self.tenants.get(name)
        if tenant is None:
            tenant = self.tenants[name] = Tenant(name, self.limits_of(name), self.vtime)
        return tenant

    def virtual(self, name: str | None) -> float:
        """A tenant's fair-share position (lower goes first)."""
        tenant = self.tenants.get(name)
        return self.vtime if tenant is None else tenant.served

    def lift(self, name: str | None) -> None:
        """``name`` starts queueing again: no credit for the time it had nothing queued."""
        tenant = self.get(name)
        if tenant.served < self.vtime:
            tenant.served = self.vtime

    def charge(self, name: str | None, tokens: int, now: float) -> None:
        """``name`` was sent ``tokens`` (estimated) more."""
        tenant = self.get(name)
        self.vtime = tenant.served
        tenant.served += tokens / tenant.weight
        tenant.last_active = now

    # -- limits ------------------------------------------------------------------------

    def check_size(self, request: Request) -> None:
        """A request no quota of its tenant could ever take fails at once."""
        limits = self.limits_of(request.spec.tenant)
        if limits is None:
            return
        tokens = request.est_tokens
        for name, cap in (
            ("max_in_flight_tokens", limits.max_in_flight_tokens),
            ("tokens_per_minute", limits.tokens_per_minute),
        ):
            if cap is not None and tokens > cap:
                raise InvalidRequestError(
                    f"this request needs about {tokens} tokens (prompt plus max_tokens), "
                    f"more than tenant {request.spec.tenant!r}'s whole {name} ({cap:g}): "
                    "lower max_tokens or raise the limit",
                    field="max_tokens",
                )

    def enter(
        self, tenant: Tenant, request: Request, now: float, *, nowait: bool, must_wait: bool
    ) -> bool:
        """Whether ``request`` of ``tenant`` (which has limits) may enter its tier's
        queue now (counted if so); if not it is held, or refused with
        :class:`TenantQuotaExceeded` (nothing held) when it may not wait: ``nowait``,
        or its tenant's ``overflow`` is ``"raise"``, unless ``must_wait`` (a map's
        item)."""
        tenant.last_active = now
        assert tenant.limits is not None
        may_raise = not must_wait and (nowait or tenant.limits.overflow == "raise")
        blocked = None if tenant.held_live else tenant.blocking_limit(request, now)
        if tenant.held_live or blocked is not None:
            if may_raise:
                if blocked is None:  # older requests of the tenant wait already
                    blocked = tenant.blocking_limit(request, now) or (
                        "max_in_flight",
                        tenant.limits.max_in_flight or 0,
                        tenant.admitted,
                    )
                limit, allowed, held = blocked
                raise TenantQuotaExceeded(
                    tenant=str(tenant.name), limit=limit, allowed=allowed, held=held
                )
            tenant.held.append(request)
            tenant.held_live += 1
            request.state = _HELD
            self.holding[tenant.name] = tenant
            return False
        tenant.admit(request)
        return True

    def unhold(self, request: Request) -> None:
        """A held request's caller went away."""
        tenant = self.tenants[request.spec.tenant]
        tenant.held_live -= 1
        request.state = _FINISHED
        if not tenant.held_live:
            tenant.held.clear()
            self.holding.pop(tenant.name, None)

    def admissible(self, now: float) -> Iterator[Request]:
        """Held requests whose tenant has room now, oldest first per tenant (each is
        counted as it is yielded)."""
        for tenant in list(self.holding.values()):
            if now < tenant.retry_at < math.inf:
                continue  # (inf: a lease of its shared budget may have come; look)
            held = tenant.held
            while held:
                request = held[0]
                if request.state != _HELD:
                    held.popleft()
                    continue
                if tenant.blocking_limit(request, now) is not None:
                    break
                held.popleft()
                tenant.held_live -= 1
                tenant.admit(request)
                tenant.last_active = now
                yield request
            if not tenant.held_live:
                held.clear()
                del self.holding[tenant.name]

    def next_retry(self) -> float | None:
        """The earliest time a rate limit lets a held request go (None: none waits
        for time; inf is left out, a lease wakes the driver)."""
        times = [t.retry_at for t in self.holding.values() if math.isfinite(t.retry_at)]
        return min(times, default=None) if times else None

    def held_requests(self) -> Iterator[Request]:
        for tenant in self.holding.values():
            yield from (r for r in tenant.held if r.state == _HELD)

    def held_count(self, priority: Priority) -> int:
        return sum(
            1
            for tenant in self.holding.values()
            for r in tenant.held
            if r.state == _HELD and r.priority is priority
        )

    # -- memory ------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Forget tenants idle for ``forget_after`` seconds (checked at most that often)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.forget_after
        cutoff = now - self.forget_after
        idle = [
            name
            for name, t in self.tenants.items()
            if t.last_active <= cutoff and not (t.queued or t.in_flight or t.pinned)
        ]
        for name in idle:
            del self.tenants[name]
