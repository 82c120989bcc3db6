"""Every error llmbatch raises, rooted at :class:`LLMBatchError`.

The tree::

    LLMBatchError
    ├── InvalidRequestError (ValueError)  bad input, raised at the call site; nothing was sent
    │   ├── InvalidTypeError (TypeError)  an argument of the wrong type
    │   └── ConfigError                   bad configuration (Client(...), Limits(...), ...)
    │       └── ConfigTypeError (TypeError) a configuration value of the wrong type
    ├── QueueFull                  the tier's queue is full and the caller asked not to wait
    │   └── TenantQuotaExceeded    the call's tenant is at its TenantLimits and may not wait
    ├── ClientClosedError          the client is not open (not entered yet, closed,
    │                              or open on another event loop)
    ├── ServerInfoError            the server's /v1/models could not be read at start-up,
    │   │                          or says no request can succeed (a base URL without /v1)
    │   └── UnknownModelError      the server does not list the ``model`` the client was given
    └── RequestError               a request that was accepted and then failed
        ├── DeadlineExceeded (TimeoutError)  its ``timeout`` ran out, queued or in flight
        ├── RequestCancelled       the caller went away, or the client closed before it ran
        ├── SpendingLimitReached   its ``max_cost`` is spent: it was not sent
        ├── StructuredOutputError  an answer still not valid for ``response_model`` after
        │   │                      its re-asks
        │   └── OutputTruncatedError  cut by ``max_tokens`` before it was complete
        ├── TransportError         no usable HTTP response
        │   ├── ConnectError       the server refused or could not be reached
        │   ├── TimeoutException   an HTTP phase took too long (``Timeout``)
        │   │   ├── ConnectTimeout (also a ConnectError)
        │   │   ├── ReadTimeout    the server accepted but did not answer in time
        │   │   ├── WriteTimeout   the request body could not be sent in time
        │   │   └── PoolTimeout    no free connection in the client's own pool in time
        │   ├── RemoteProtocolError the connection dropped mid-response or the body was garbage
        │   └── ServerOutageError  the server was unavailable for longer than outage_tolerance
        └── APIStatusError         the server answered with an error status
            ├── BadRequestError         400 (after bisection: this prompt alone is at fault)
            ├── AuthenticationError     401 (also raised at start-up: a missing or refused key)
            ├── PermissionDeniedError   403 (also raised at start-up)
            ├── NotFoundError           404 (unknown model or endpoint)
            ├── RateLimitError          429, with ``retry_after``
            └── ServerError             5xx
                └── ServiceUnavailableError 503 (overloaded), with ``retry_after``

New classes subclass what 0.1 raised in their place (a bad ``Limits`` value was an
``InvalidRequestError`` and still is one), so ``except`` clauses written against 0.1
keep working. One exception: write and pool timeouts were reported as
:class:`ReadTimeout`; catch :class:`TimeoutException` for every HTTP timeout.

Every :class:`RequestError` carries ``request_id`` (the llmbatch id of that one request)
and ``attempts`` (how many HTTP attempts were made for it).
"""

from __future__ import annotations

import copy

__all__ = [
    "APIStatusError",
    "AuthenticationError",
    "BadRequestError",
    "ClientClosedError",
    "ConfigError",
    "ConfigTypeError",
    "ConnectError",
    "ConnectTimeout",
    "DeadlineExceeded",
    "InvalidRequestError",
    "InvalidTypeError",
    "LLMBatchError",
    "NotFoundError",
    "OutputTruncatedError",
    "PermissionDeniedError",
    "PoolTimeout",
    "QueueFull",
    "RateLimitError",
    "ReadTimeout",
    "RemoteProtocolError",
    "RequestCancelled",
    "RequestError",
    "ServerError",
    "ServerInfoError",
    "ServerOutageError",
    "ServiceUnavailableError",
    "SpendingLimitReached",
    "StructuredOutputError",
    "TimeoutException",
    "TransportError",
    "UnknownModelError",
    "WriteTimeout",
    "status_error_type",
]


class LLMBatchError(Exception):
    """Root of every error raised by llmbatch."""


class InvalidRequestError(LLMBatchError, ValueError):
    """The arguments of a call are invalid; raised before anything is queued or sent.

    ``field`` names the offending argument (``"prompt"``, ``"max_tokens"``, ...).
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidTypeError(InvalidRequestError, TypeError):
    """An argument has the wrong type (``prompt=123``); also a :class:`TypeError`."""


class ConfigError(InvalidRequestError):
    """A configuration value is invalid (``Limits(max_in_flight=0)``, a bad ``base_url``)."""


class ConfigTypeError(ConfigError, InvalidTypeError):
    """A configuration value has the wrong type; also a :class:`TypeError`."""


class QueueFull(LLMBatchError):
    """The tier's queue is at ``Limits.max_queued`` and the call used ``nowait=True``."""


class TenantQuotaExceeded(QueueFull):
    """A call's tenant is at one of its :class:`TenantLimits` and the call would have
    to wait: its tenant's ``overflow`` is ``"raise"``, or the call used ``nowait=True``.

    ``tenant`` names the tenant, ``limit`` the limit it is at (``"max_in_flight"``,
    ``"max_in_flight_tokens"``, ``"requests_per_minute"``, ``"tokens_per_minute"``),
    ``allowed`` that limit's value and ``held`` what the tenant holds against it now:
    its requests or tokens queued and in flight (for the two rates, the cost of this
    request, which the budget has no room for now). Nothing was queued: the call can
    be retried later.
    """

    def __init__(self, *, tenant: str, limit: str, allowed: float, held: float) -> None:
        self.tenant = tenant
        self.limit = limit
        self.allowed = allowed
        self.held = held
        if limit.endswith("_per_minute"):
            detail = f"its {limit} ({allowed:g}) has no room now for this request's {held:g}"
        else:
            detail = f"it holds {held:g} of its {limit} {allowed:g}"
        super().__init__(f"tenant {tenant!r} is at its quota: {detail}")


class ClientClosedError(LLMBatchError, RuntimeError):
    """The client is used where it is not open: outside ``async with`` (before opening
    or after closing), or from an event loop other than the one that opened it."""


class ServerInfoError(LLMBatchError):
    """The server's model list could not be read when the client opened, or it showed
    that no request could succeed (``base_url`` lacks its ``/v1``)."""


class UnknownModelError(ServerInfoError):
    """The server's model list does not hold the ``model`` the client was given.

    ``model`` is the name asked for; ``available`` the names the server lists.
    """

    #: Names the message lists before "and N more" (OpenAI's own list runs to dozens).
    SHOWN = 20

    def __init__(self, *, model: str, available: tuple[str, ...], base_url: str) -> None:
        self.model = model
        self.available = available
        super().__init__(
            f"model {model!r} is not served at {base_url}, which serves {self.served}; "
            "pass one of them as model=..., or model=None for the first"
        )

    @property
    def served(self) -> str:
        """The server's model names as a short list: ``'a', 'b' and 3 more``."""
        names = ", ".join(repr(name) for name in self.available[: self.SHOWN])
        more = len(self.available) - self.SHOWN
        return f"{names} and {more} more" if more > 0 else names


class RequestError(LLMBatchError):
    """A queued request failed; carries its ``request_id`` and ``attempts``."""

    def __init__(self, message: str, *, request_id: str | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.attempts = attempts

    def for_request(self, request_id: str, attempts: int) -> RequestError:
        """A copy of this error naming one request (a batch's error is shared by many)."""
        clone = copy.copy(self)
        clone.request_id = request_id
        clone.attempts = attempts
        clone.__cause__ = self.__cause__
        return clone

    def __str__(self) -> str:
        if self.request_id is None:
            return self.message
        return f"{self.message} (request {self.request_id}, attempts={self.attempts})"


class DeadlineExceeded(RequestError, TimeoutError):
    """The request's ``timeout`` elapsed while it was queued or in flight."""


class RequestCancelled(RequestError):
    """The caller went away, or the client closed before the request finished."""


class SpendingLimitReached(RequestError):
    """A ``max_cost`` (the client's, or a map's or job's) has no room left for this
    request: what was spent, with what is in flight settled, leaves less than the
    request could cost. It was not sent; what was in flight settled as usual.

    ``scope`` says whose limit (``"client"``, ``"map"``), ``limit`` its dollars,
    ``spent`` the dollars spent under it so far, ``estimate`` the most this request
    could cost (its prompt's estimated tokens and ``max_tokens`` for every choice).
    In ``llmbatch run`` such items are not written: run the job again, with a higher
    limit, to send them.
    """

    def __init__(self, *, scope: str, limit: float, spent: float, estimate: float) -> None:
        self.scope = scope
        self.limit = limit
        self.spent = spent
        self.estimate = estimate
        super().__init__(
            f"the {scope}'s max_cost of {usd(limit)} is reached: {usd(spent)} spent, and "
            f"this request could cost up to {usd(estimate)}; it was not sent"
        )


def usd(dollars: float) -> str:
    """Dollars as a person reads them: cents from a cent up; below, to the millionth
    (one request of a small model costs millionths)."""
    if dollars >= 0.01 or dollars == 0:
        return f"${dollars:,.2f}"
    shown = f"{dollars:.6f}".rstrip("0")
    return "<$0.000001" if shown == "0." else f"${shown}"


class StructuredOutputError(RequestError):
    """An answer that did not validate into the call's ``response_model``, after
    ``max_reasks`` answers sent back to be corrected.

    ``text`` is the last answer's raw text, ``errors`` pydantic's errors for it
    (``ValidationError.errors()``: dicts with ``loc``, ``msg``, ``type``), and
    ``reasks`` how many times it was sent back. ``attempts`` counts the HTTP attempts
    of the whole call, its first ask and every re-ask (3 after two re-asks that each
    went once), and ``request_id`` is the last re-ask's.
    """

    def __init__(
        self,
        message: str,
        *,
        text: str,
        errors: list[dict[str, object]] | None = None,
        reasks: int = 0,
        request_id: str | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message, request_id=request_id, attempts=attempts)
        self.text = text
        self.errors = errors or []
        self.reasks = reasks


class OutputTruncatedError(StructuredOutputError):
    """The answer stopped at ``max_tokens`` (``finish_reason="length"``) before it
    was complete: not sent back with the same budget; give the call more tokens."""


class TransportError(RequestError):
    """No usable HTTP response was received."""


class ConnectError(TransportError):
    """The connection could not be established."""


class TimeoutException(TransportError):
    """An HTTP phase took longer than its :class:`llmbatch.Timeout`."""


class ConnectTimeout(TimeoutException, ConnectError):
    """Connecting took longer than ``Timeout.connect``."""


class ReadTimeout(TimeoutException):
    """The server did not send the next part of its answer within ``Timeout.read``."""


class WriteTimeout(TimeoutException):
    """The request could not be sent within ``Timeout.write``."""


class PoolTimeout(TimeoutException):
    """No connection of the client's pool came free within ``Timeout.pool``
    (raise ``Limits.max_connections`` or lower the load)."""


class RemoteProtocolError(TransportError):
    """The connection dropped mid-response, or the response could not be parsed."""


class ServerOutageError(TransportError):
    """The server stopped answering (connections refused or dropped, or 503 to
    everything) and did not come back within ``RetryPolicy.outage_tolerance``; the
    message says since when and the last error seen."""


class APIStatusError(RequestError):
    """The server answered with an error status; ``status_code`` and ``body`` are kept,
    and what it said of retrying: ``retry_after`` (seconds, from ``retry-after-ms`` or
    ``Retry-After``) and ``should_retry`` (its ``x-should-retry`` header: True, False,
    or None when it did not say)."""

    status_code: int = 0

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        body: object = None,
        retry_after: float | None = None,
        should_retry: bool | None = None,
        request_id: str | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message, request_id=request_id, attempts=attempts)
        if status_code is not None:
            self.status_code = status_code
        self.body = body
        self.retry_after = retry_after
        self.should_retry = should_retry


class BadRequestError(APIStatusError):
    """400: the server rejected this request (bisected down to the offending prompt)."""

    status_code = 400


class AuthenticationError(APIStatusError):
    """401: missing or wrong API key."""

    status_code = 401


class PermissionDeniedError(APIStatusError):
    """403."""

    status_code = 403


class NotFoundError(APIStatusError):
    """404: unknown model or endpoint."""

    status_code = 404


class RateLimitError(APIStatusError):
    """429: the server asked us to slow down; ``retry_after`` is in seconds if it said."""

    status_code = 429


class ServerError(APIStatusError):
    """5xx."""

    status_code = 500


class ServiceUnavailableError(ServerError):
    """503: the server is overloaded (e.g. vLLM past ``--max-num-queued-reqs``)."""

    status_code = 503


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def status_error_type(status_code: int) -> type[APIStatusError]:
    """The exception class for an HTTP error status."""
    if status_code in _STATUS_ERRORS:
        return _STATUS_ERRORS[status_code]
    if status_code >= 500:
        return ServerError
    return APIStatusError
