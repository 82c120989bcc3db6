"""A client's configuration: every constructor argument checked once, into one
immutable value.

``Client.__init__`` builds it and nothing else; opening builds the runtime from it
(``_runtime``), and the public methods read its call defaults. Keeping it one value
is what lets a ``with_options`` view share it, and what keeps validation out of the
lifetime code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import sniffio

from llmbatch._calls.defaults import CallDefaults
from llmbatch._calls.validate import check_tenant
from llmbatch._config import (
    DEFAULT_BATCH_POLICIES,
    DEFAULT_TIMEOUT,
    SLO,
    BatchPolicy,
    Cache,
    Limits,
    Price,
    Priority,
    RateLimit,
    RetryPolicy,
    SharedInFlight,
    SLOSetting,
    TenantLimits,
    Timeout,
    parse_priority,
)
from llmbatch._exceptions import ConfigError, ConfigTypeError, InvalidRequestError
from llmbatch._observers import Observer
from llmbatch._replicas import Replica, check_api_key, env, resolve
from llmbatch._runtime.fleet import ServerConfig
from llmbatch._transports.base import Transport
from llmbatch._version import __version__

__all__ = ["ClientConfig"]


@dataclasses.dataclass(frozen=True, slots=True)
class ClientConfig:
    """What a :class:`Client` was made with, checked."""

    api_key: str | None = dataclasses.field(repr=False)
    replicas: tuple[Replica, ...]
    model: str | None
    policies: Mapping[Priority, BatchPolicy]
    limits: Limits
    retry: RetryPolicy
    rate_limit: RateLimit | None
    shared_in_flight: SharedInFlight | None
    timeout: Timeout
    """The transport's timeouts (connect, read, ...)."""
    call_defaults: CallDefaults | None
    """What each call gets for options it leaves out (``Client(timeout=30)``)."""
    default_headers: Mapping[str, str] = dataclasses.field(repr=False)
    slo: SLOSetting
    transport: Literal["aiohttp", "httpx"] | Transport | None
    priority_scheduling: bool | None
    verify: bool
    on_close: Literal["drain", "cancel"]
    drain_timeout: float
    tenants: Mapping[str, TenantLimits] = dataclasses.field(default_factory=dict)
    """Each named tenant's limits (``"*"``: every named tenant not listed)."""
    send_tenant_as_user: bool = True
    """A call's tenant goes to the server as OpenAI's ``user`` (unless it has one)."""
    observers: tuple[Observer, ...] = ()
    """What sees the client's requests as they happen (``llmbatch.Observer``)."""
    prices: Mapping[str, Price] = dataclasses.field(default_factory=dict)
    """Stated prices by model name (``"*"``: every model not named)."""
    max_cost: float | None = None
    cache: Cache | None = None
    """Dollars the client may spend (None: no limit)."""

    @classmethod
    def build(
        cls,
        *,
        base_url: object,
        api_key: str | None,
        model: object,
        batching: object,
        limits: object,
        retry: object,
        rate_limit: object,
        shared_in_flight: object,
        timeout: object,
        max_retries: object,
        default_headers: object,
        slo: object,
        transport: object,
        priority_scheduling: object,
        verify: object,
        on_close: object,
        drain_timeout: object,
        tenants: object = None,
        send_tenant_as_user: object = True,
        observers: object = (),
        prices: object = None,
        max_cost: object = None,
        cache: object = None,
    ) -> ClientConfig:
        """Check every argument; raises :class:`ConfigError` (or
        :class:`ConfigTypeError`) naming the first that is wrong."""
        key = check_api_key(api_key or env("LLMBATCH_API_KEY", "OPENAI_API_KEY"))
        replicas = resolve(None if base_url == "" else base_url, key)
        if model is not None and not isinstance(model, str):
            raise ConfigTypeError("model must be a str or None", field="model")
        if model == "":
            raise ConfigError("model must be a non-empty str or None", field="model")
        policies = _policies(batching)
        for name, value, kind in (("limits", limits, Limits), ("retry", retry, RetryPolicy)):
            if not isinstance(value, kind):
                raise ConfigTypeError(f"{name} must be a {kind.__name__}", field=name)
        assert isinstance(limits, Limits)
        assert isinstance(retry, RetryPolicy)
        # openai-python's options: a number is each call's timeout (queueing and
        # retries included); max_retries and default_headers apply to every request.
        call_timeout: object = None
        if not isinstance(timeout, Timeout):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise ConfigTypeError(
                    "timeout must be a Timeout or a number of seconds", field="timeout"
                )
            call_timeout, timeout = timeout, DEFAULT_TIMEOUT
        given = CallDefaults.checked(
            None,
            {
                "timeout": call_timeout,
                "max_retries": max_retries,
                "default_headers": default_headers,
            },
            config=True,
        )
        if given is not None and given.get("max_retries") is not None:
            retry = dataclasses.replace(retry, attempts=given.get("max_retries") + 1)
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise ConfigTypeError("rate_limit must be a RateLimit or None", field="rate_limit")
        if shared_in_flight is not None and not isinstance(shared_in_flight, SharedInFlight):
            raise ConfigTypeError(
                "shared_in_flight must be a SharedInFlight or None", field="shared_in_flight"
            )
        if slo is not None and slo != "auto" and not isinstance(slo, SLO):
            raise ConfigTypeError('slo must be an SLO, "auto" or None', field="slo")
        if not limits.adaptive and slo == "auto":
            slo = None  # a static setting: nothing for the default to move
        if isinstance(slo, SLO) and (slo.ttft or slo.tpot) and not limits.adaptive:
            raise ConfigError(
                "slo needs the closed loop, which Limits(adaptive=False) turns off: "
                "give one or the other",
                field="slo",
            )
        if priority_scheduling is not None and not isinstance(priority_scheduling, bool):
            raise ConfigTypeError(
                "priority_scheduling must be True, False or None", field="priority_scheduling"
            )
        if on_close not in ("drain", "cancel"):
            raise ConfigError("on_close must be 'drain' or 'cancel'", field="on_close")
        if isinstance(transport, str) and transport not in ("aiohttp", "httpx"):
            raise ConfigError(
                f"transport must be 'aiohttp', 'httpx' or a Transport, got {transport!r}",
                field="transport",
            )
        if transport is not None and not isinstance(transport, str | Transport):
            raise ConfigTypeError(
                "transport must be 'aiohttp', 'httpx' or a Transport", field="transport"
            )
        if (
            isinstance(drain_timeout, bool)
            or not isinstance(drain_timeout, (int, float))
            or math.isnan(drain_timeout)
            or drain_timeout < 0
        ):
            raise ConfigError(
                "drain_timeout must be a number of seconds >= 0", field="drain_timeout"
            )
        if not isinstance(send_tenant_as_user, bool):
            raise ConfigTypeError(
                "send_tenant_as_user must be True or False", field="send_tenant_as_user"
            )
        return cls(
            api_key=key,
            replicas=tuple(replicas),
            model=model,
            policies=policies,
            limits=limits,
            retry=retry,
            rate_limit=rate_limit,
            shared_in_flight=shared_in_flight,
            timeout=timeout,
            call_defaults=(
                CallDefaults({"timeout": given.get("timeout")})
                if given and given.get("timeout")
                else None
            ),
            default_headers=(given.headers if given else None) or {},
            slo=slo,
            transport=transport,  # type: ignore[arg-type]
            priority_scheduling=priority_scheduling,
            verify=bool(verify),
            on_close=on_close,
            drain_timeout=float(drain_timeout),
            tenants=_tenants(tenants),
            send_tenant_as_user=send_tenant_as_user,
            observers=check_observers(observers),
            prices=_prices(prices),
            max_cost=check_max_cost(max_cost),
            cache=Cache.of(cache),
        )

    def headers(self, api_key: str | None) -> dict[str, str]:
        """Every request's headers for a server with this API key."""
        headers = {"Content-Type": "application/json", "User-Agent": f"llmbatch/{__version__}"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        headers.update(self.default_headers)
        return headers

    def make_transport(self) -> Transport:
        """A connection pool as configured (one per server)."""
        choice = self.transport
        if choice is not None and not isinstance(choice, str):
            return choice
        if choice is None:
            choice = "aiohttp" if sniffio.current_async_library() == "asyncio" else "httpx"
        if choice == "aiohttp":
            if sniffio.current_async_library() != "asyncio":
                raise ConfigError(
                    "the aiohttp transport needs asyncio; use 'httpx'", field="transport"
                )
            from llmbatch._transports.aiohttp import AiohttpTransport

            return AiohttpTransport(limits=self.limits, timeout=self.timeout, verify=self.verify)
        from llmbatch._transports.httpx import HttpxTransport

        return HttpxTransport(limits=self.limits, timeout=self.timeout, verify=self.verify)

    def server_config(self) -> ServerConfig:
        """What every server is made with."""
        return ServerConfig(
            limits=self.limits,
            retry=self.retry,
            slo=self.slo,
            priority_scheduling=self.priority_scheduling,
            headers=self.headers,
            make_transport=self.make_transport,
            refill=max(
                self.policies[tier].max_batch_size for tier in (Priority.NORMAL, Priority.BATCH)
            ),
        )


def _prices(prices: object) -> dict[str, Price]:
    """``prices=``: model names (or ``"*"``) to :class:`Price`."""
    if prices is None:
        return {}
    if not isinstance(prices, Mapping):
        raise ConfigTypeError("prices must be a mapping of model name to Price", field="prices")
    for name, price in prices.items():
        if not isinstance(name, str) or not name:
            raise ConfigTypeError(f"prices: {name!r} is not a model name", field="prices")
        if not isinstance(price, Price):
            raise ConfigTypeError(
                f"prices[{name!r}] must be a Price, got {type(price).__name__}", field="prices"
            )
    return dict(prices)


def check_max_cost(max_cost: object) -> float | None:
    """``max_cost=`` (the client's, a map's or a job's): dollars > 0, or None."""
    if max_cost is None:
        return None
    if isinstance(max_cost, bool) or not isinstance(max_cost, (int, float)):
        raise ConfigTypeError(
            f"max_cost must be a number of dollars or None, got {type(max_cost).__name__}",
            field="max_cost",
        )
    if not math.isfinite(max_cost) or max_cost <= 0:
        raise ConfigError(
            f"max_cost must be a finite number > 0, got {max_cost!r}", field="max_cost"
        )
    return float(max_cost)


def _tenants(tenants: object) -> dict[str, TenantLimits]:
    """``tenants=``: tenant names (or ``"*"``) to :class:`TenantLimits`."""
    if tenants is None:
        return {}
    if not isinstance(tenants, Mapping):
        raise ConfigTypeError(
            "tenants must be a mapping of tenant name to TenantLimits", field="tenants"
        )
    checked: dict[str, TenantLimits] = {}
    for name, limits in tenants.items():
        if not isinstance(limits, TenantLimits):
            raise ConfigTypeError(
                f"tenants[{name!r}] must be a TenantLimits, got {type(limits).__name__}",
                field="tenants",
            )
        if name != "*":
            try:
                check_tenant(name)
            except InvalidRequestError as exc:
                raise ConfigError(f"tenants: {exc}", field="tenants") from None
        elif limits.redis_url is not None:
            raise ConfigError(
                'tenants["*"] cannot share its rates through Redis (one key would hold '
                "every tenant's budget); name each shared tenant",
                field="tenants",
            )
        checked[name] = limits
    return checked


def _policies(batching: object) -> dict[Priority, BatchPolicy]:
    policies = dict(DEFAULT_BATCH_POLICIES)
    if batching is None:
        return policies
    if not isinstance(batching, Mapping):
        raise ConfigTypeError("batching must be a mapping of tier to BatchPolicy", field="batching")
    for tier, policy in batching.items():
        if not isinstance(policy, BatchPolicy):
            raise ConfigTypeError("batching values must be BatchPolicy", field="batching")
        try:
            policies[parse_priority(tier)] = policy
        except InvalidRequestError as exc:
            raise ConfigError(f"batching: {exc}", field="batching") from None
    return policies


def check_observers(observers: object) -> tuple[Observer, ...]:
    """``observers=``: a list (or any sequence) of :class:`llmbatch.Observer`."""
    if isinstance(observers, Observer):
        raise ConfigTypeError(
            "observers must be a list of llmbatch.Observer: put the one in a list",
            field="observers",
        )
    if isinstance(observers, str | bytes) or not isinstance(observers, Sequence):
        raise ConfigTypeError(
            f"observers must be a list of llmbatch.Observer, got {type(observers).__name__}",
            field="observers",
        )
    for observer in observers:
        check_observer(observer)
    return tuple(observers)


def check_observer(observer: object) -> Observer:
    """One observer: an instance of a subclass of :class:`llmbatch.Observer`."""
    if not isinstance(observer, Observer):
        raise ConfigTypeError(
            "an observer must be an instance of a subclass of llmbatch.Observer, got "
            f"{type(observer).__name__}",
            field="observers",
        )
    return observer
