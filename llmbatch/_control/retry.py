"""What a failed exchange means and what to do about it: retry it (and after how
long), hold it for a server that is down, or let it fail. Pure: the error in, a
decision out, the random draw passed in, so every rule is tested without a server
or a clock (tests/unit/test_retry.py). The loop that acts on it (tenacity's, after
a first failure) is the dispatcher's; the breaker decides how long an outage is
waited for.

The kinds of failure, by what they say:

- the request is wrong (400, 401, 403, 404): never retried, it fails alone;
- the server is busy (429; a 503 whose words say its queue is full): retried with
  backoff, honouring ``Retry-After`` (capped at ``max_backoff``);
- the server is down or restarting (no connection, a connection dropped mid-answer,
  another 503): *unavailable*, held while the breaker allows, else retried;
- anything else of the server's (500, 502, 504...) or the network's: retried;
- a read timeout (the server may be working on it): as ``retry_on_timeout`` says.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from llmbatch._config import RetryPolicy
from llmbatch._exceptions import (
    APIStatusError,
    BadRequestError,
    ConnectError,
    NotFoundError,
    RateLimitError,
    RemoteProtocolError,
    RequestError,
    ServerError,
    ServiceUnavailableError,
    TimeoutException,
    TransportError,
)

__all__ = ["Retries", "is_backpressure", "is_unavailable"]

#: Words of a 503 that says the server's queue is full (vLLM's ``--max-num-queued-reqs``,
#: its QueueOverflowError; the simulator's queue cap), rather than that it is down or
#: overloaded in general, which the breaker and the retries handle.
_BACKPRESSURE_WORDS = ("queue",)


class Retries:
    """One client's retry rules, from its :class:`RetryPolicy`. ``uniform(a, b)``
    draws the jitter (default: :func:`random.uniform`; a test passes its own)."""

    __slots__ = ("_uniform", "policy")

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.policy = policy
        self._uniform = uniform

    def attempts(self, asked: int | None) -> int:
        """How many attempts a call has: its own (``max_retries`` + 1), else the
        policy's."""
        return asked or self.policy.attempts

    def retryable(self, error: RequestError) -> bool:
        """Whether another attempt could succeed where this one failed. The server's
        ``x-should-retry`` decides where it said (a refused batch is still bisected,
        not resent whole)."""
        if isinstance(error, APIStatusError) and error.should_retry is not None:
            return error.should_retry and not isinstance(error, BadRequestError)
        if isinstance(error, NotFoundError):
            return False  # a wrong model or route stays wrong
        if isinstance(error, TimeoutException) and not isinstance(error, ConnectError):
            # The server may be working on it: RetryPolicy.retry_on_timeout decides.
            # (A connect timeout reached no server, like any connection failure.)
            return self.policy.retry_on_timeout
        return isinstance(error, RateLimitError | ServerError | TransportError)

    def backoff(self, attempt: int, error: RequestError) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first):
        full jitter over ``initial_backoff * 2**(attempt - 1)`` (at most
        ``max_backoff``), or the server's ``Retry-After`` if that asks for longer
        (also at most ``max_backoff``)."""
        policy = self.policy
        ceiling = min(policy.max_backoff, policy.initial_backoff * 2 ** (attempt - 1))
        delay = self._uniform(0, ceiling)
        if isinstance(error, APIStatusError) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, policy.max_backoff))
        return delay

    def after_cooldown(self, left: float) -> float:
        """Seconds to wait for a cooldown with ``left`` seconds to go: never less, and
        up to :data:`COOLDOWN_SPREAD` of it more (positive jitter)."""
        return left + self._uniform(0, COOLDOWN_SPREAD * left)


#: Retries after a cooldown are spread over this share of it past its end, so that
#: they do not all arrive at once.
COOLDOWN_SPREAD = 0.1


def is_unavailable(error: RequestError) -> bool:
    """A failure that says the server is down or restarting, not that the request is
    wrong: no connection, a connection dropped mid-answer, or a 503 that is not
    backpressure."""
    if isinstance(error, ServiceUnavailableError):
        return not is_backpressure(error)
    return isinstance(error, ConnectError | RemoteProtocolError)


def is_backpressure(error: ServiceUnavailableError) -> bool:
    """A 503 that says the server's queue is full: retried with backoff like a 429 (the
    controller halves the limit when they are many), never held as an outage."""
    message = str(error.message).lower()
    return any(word in message for word in _BACKPRESSURE_WORDS)
