"""Keyword-only configuration value objects, each with production defaults.

The defaults fit a vLLM server started with ``--max-num-seqs 256`` (vLLM's own
default): llmbatch keeps about that many sequences in flight so the server is just
full, and holds the rest client-side where tier priorities still apply.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from llmbatch._exceptions import InvalidRequestError

__all__ = [
    "DEFAULT_BATCH_POLICIES",
    "DEFAULT_LIMITS",
    "DEFAULT_RETRY_POLICY",
    "DEFAULT_TIMEOUT",
    "BatchPolicy",
    "Limits",
    "Priority",
    "PriorityLike",
    "RateLimit",
    "RetryPolicy",
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
    if isinstance(value, str):
        try:
            return Priority(value)
        except ValueError:
            pass
    raise InvalidRequestError(
        f"unknown priority {value!r}; expected one of 'realtime', 'normal', 'batch'",
        field="priority",
    )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidRequestError(message)


def _positive_finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchPolicy:
    """When a tier's batch closes: whichever trigger fires first.

    - ``max_batch_size``: prompts per HTTP request.
    - ``max_wait``: seconds since the batch's first item arrived.
    - ``max_batch_tokens``: estimated prompt tokens + ``max_tokens`` summed over the batch.

    ``max_wait=0`` dispatches at once, coalescing only what already waits.
    """

    max_batch_size: int = 16
    max_wait: float = 0.005
    max_batch_tokens: int = 65_536

    def __post_init__(self) -> None:
        _require(
            isinstance(self.max_batch_size, int) and 1 <= self.max_batch_size <= 1024,
            "BatchPolicy.max_batch_size must be an int in 1..1024 (vLLM's list-prompt limit)",
        )
        _require(
            isinstance(self.max_wait, (int, float))
            and math.isfinite(self.max_wait)
            and self.max_wait >= 0,
            "BatchPolicy.max_wait must be a finite number of seconds >= 0",
        )
        _require(
            isinstance(self.max_batch_tokens, int) and self.max_batch_tokens >= 1,
            "BatchPolicy.max_batch_tokens must be a positive int",
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

    def __post_init__(self) -> None:
        for name in ("max_queued", "max_in_flight", "max_in_flight_tokens", "max_connections"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"Limits.{name} must be an int >= 1")
        _require(
            isinstance(self.reserved_realtime, int)
            and 0 <= self.reserved_realtime < self.max_in_flight,
            "Limits.reserved_realtime must be an int in 0..max_in_flight-1",
        )
        _require(_positive_finite(self.keepalive_expiry), "Limits.keepalive_expiry must be > 0")
        shares = {parse_priority(k): float(v) for k, v in self.min_share.items()}
        _require(
            all(0.0 <= v < 1.0 for v in shares.values()) and sum(shares.values()) < 1.0,
            "Limits.min_share values must be in [0, 1) and sum to less than 1",
        )
        object.__setattr__(self, "min_share", MappingProxyType(shares))


DEFAULT_LIMITS = Limits()
"""``Limits()``: sized for vLLM's default ``--max-num-seqs 256``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Retries for 429, 5xx, 503, connection errors and read timeouts.

    Exponential backoff with full jitter: attempt *k* waits a random time in
    ``[0, min(max_backoff, initial_backoff * 2**k)]``, or the server's ``Retry-After``
    if that is longer (capped at ``max_backoff``). ``attempts`` counts the first try.
    """

    attempts: int = 5
    initial_backoff: float = 0.25
    max_backoff: float = 30.0
    retry_on_timeout: bool = True

    def __post_init__(self) -> None:
        _require(
            isinstance(self.attempts, int) and self.attempts >= 1,
            "RetryPolicy.attempts must be an int >= 1",
        )
        for name in ("initial_backoff", "max_backoff"):
            value = getattr(self, name)
            _require(
                isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
                f"RetryPolicy.{name} must be a finite number >= 0",
            )


DEFAULT_RETRY_POLICY = RetryPolicy()
"""``RetryPolicy()``: 5 attempts, backoff from 0.25 s up to 30 s."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RateLimit:
    """Optional client-side rate limits (asyncio only; see docs/concepts.md).

    ``tokens_per_minute`` is weighted by each request's estimated prompt tokens +
    ``max_tokens``.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            _require(
                value is None or _positive_finite(value),
                f"RateLimit.{name} must be None or a positive number",
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeout:
    """HTTP timeouts in seconds (``None`` = no limit for that phase).

    ``read`` bounds the wait for each chunk of a response, so it must cover a whole
    non-streamed generation of ``max_tokens``.
    """

    connect: float | None = 10.0
    read: float | None = 600.0
    write: float | None = 60.0
    pool: float | None = 600.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "write", "pool"):
            value = getattr(self, name)
            _require(
                value is None or _positive_finite(value),
                f"Timeout.{name} must be None or a positive number of seconds",
            )


DEFAULT_TIMEOUT = Timeout()
"""``Timeout()``: connect 10 s, read 600 s, write 60 s, pool 600 s."""
