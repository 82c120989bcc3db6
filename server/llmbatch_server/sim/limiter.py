"""A hosted provider's rate limiter, as the simulator can play one.

Requests and tokens a minute, enforced per second as OpenAI documents: each limit is
a bucket holding one second's worth (a minute's limit / 60), refilled continuously;
a request takes one from the first and its tokens (its prompts' tokens plus what it
may generate) from the second, or is refused with 429 and the wait until it would
fit. Every answer carries the provider's headers: OpenAI's family
(``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as durations,
``retry-after-ms`` and ``retry-after`` on a 429) or Anthropic's
(``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``, resets as RFC 3339
times, ``retry-after`` in whole seconds) or Together's (``x-ratelimit-{limit,remaining,
reset}`` for requests and ``x-tokenlimit-{limit,remaining}`` for tokens, per second;
``retry-after`` in whole seconds). Pure but for the clock, which is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

__all__ = ["FAMILIES", "Family", "RateLimiter", "Refused"]

Family = Literal["openai", "anthropic", "together"]
FAMILIES: tuple[Family, ...] = ("openai", "anthropic", "together")


@dataclass(frozen=True, slots=True)
class Refused:
    """A request over the limit: which limit, and the seconds until it would fit."""

    limit: Literal["requests", "tokens"]
    wait: float


class _Bucket:
    """One limit: ``per_minute`` spread over the minute, at most a second's worth held."""

    __slots__ = ("at", "level", "per_minute", "per_second")

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.per_second = per_minute / 60
        self.level = self.per_second
        self.at = now

    def refill(self, now: float) -> None:
        self.level = min(self.per_second, self.level + (now - self.at) * self.per_second)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` fits (0: now). More than a second's worth waits
        for a full bucket."""
        short = min(amount, self.per_second) - self.level
        return max(0.0, short / self.per_second)

    def until_full(self) -> float:
        return (self.per_second - self.level) / self.per_second

    def remaining(self) -> int:
        """What is left, in the minute's terms the provider states (a second's worth
        held is the whole limit)."""
        return max(0, math.floor(self.level * 60))


class RateLimiter:
    """Requests and tokens a minute (None: that one is not limited)."""

    def __init__(
        self,
        *,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        family: Family = "openai",
        clock: Callable[[], float],
    ) -> None:
        if requests_per_minute is None and tokens_per_minute is None:
            raise ValueError("a rate limiter needs requests or tokens a minute")
        for name, value in (("requests", requests_per_minute), ("tokens", tokens_per_minute)):
            if value is not None and value < 1:
                raise ValueError(f"{name} a minute must be >= 1")
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}")
        self.family = family
        self._clock = clock
        now = clock()
        self._requests = None if requests_per_minute is None else _Bucket(requests_per_minute, now)
        self._tokens = None if tokens_per_minute is None else _Bucket(tokens_per_minute, now)
        self.refused = 0

    def take(self, tokens: int) -> Refused | None:
        """Admit one request of ``tokens`` (None), or say which limit refuses it and
        for how long (nothing is taken then)."""
        now = self._clock()
        waits: list[tuple[float, Literal["requests", "tokens"]]] = []
        for name, bucket, amount in (
            ("requests", self._requests, 1.0),
            ("tokens", self._tokens, float(tokens)),
        ):
            if bucket is not None:
                bucket.refill(now)
                wait = bucket.wait_for(amount)
                if wait > 0:
                    waits.append((wait, name))  # type: ignore[arg-type]
        if waits:
            self.refused += 1
            wait, name = max(waits)
            return Refused(name, wait)
        if self._requests is not None:
            self._requests.level -= 1.0
        if self._tokens is not None:
            # A batch larger than a second's worth goes once the bucket is full, and
            # the overdraft delays what follows.
            self._tokens.level -= float(tokens)
        return None

    def headers(self, refused: Refused | None = None) -> dict[str, str]:
        """The provider's headers for an answer now (with the wait on a 429)."""
        now = self._clock()
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.refill(now)
        if self.family == "openai":
            headers = self._openai()
            if refused is not None:
                headers["retry-after-ms"] = str(math.ceil(refused.wait * 1000))
                headers["retry-after"] = str(math.ceil(refused.wait))
            return headers
        headers = self._anthropic() if self.family == "anthropic" else self._together()
        if refused is not None:
            headers["retry-after"] = str(max(1, math.ceil(refused.wait)))
        return headers

    def _openai(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, bucket in (("requests", self._requests), ("tokens", self._tokens)):
            if bucket is None:
                continue
            headers[f"x-ratelimit-limit-{name}"] = str(bucket.per_minute)
            headers[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining())
            headers[f"x-ratelimit-reset-{name}"] = f"{bucket.until_full() * 1000:.0f}ms"
        return headers

    def _anthropic(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        wall = datetime.now(UTC)
        for name, bucket in (("requests", self._requests), ("tokens", self._tokens)):
            if bucket is None:
                continue
            reset = wall + timedelta(seconds=bucket.until_full())
            headers[f"anthropic-ratelimit-{name}-limit"] = str(bucket.per_minute)
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(bucket.remaining())
            headers[f"anthropic-ratelimit-{name}-reset"] = reset.isoformat(timespec="seconds")
        return headers

    def _together(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        requests, tokens = self._requests, self._tokens
        if requests is not None:
            headers["x-ratelimit-limit"] = f"{requests.per_second:g}"
            headers["x-ratelimit-remaining"] = str(max(0, math.floor(requests.level)))
            headers["x-ratelimit-reset"] = f"{requests.until_full():.3f}"
        if tokens is not None:
            headers["x-tokenlimit-limit"] = f"{tokens.per_second:g}"
            headers["x-tokenlimit-remaining"] = str(max(0, math.floor(tokens.level)))
        return headers
