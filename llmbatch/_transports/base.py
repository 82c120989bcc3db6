"""The transport interface: one method to send, one to close."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["HTTPRequest", "HTTPResponse", "Transport"]


@dataclass(frozen=True, slots=True)
class HTTPRequest:
    """What llmbatch asks a transport to send."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None

    def __repr__(self) -> str:
        # Headers carry the API key: never show them.
        return f"HTTPRequest({self.method} {self.url}, {len(self.body or b'')} bytes)"


class HTTPResponse(Protocol):
    """A response whose body is read once, whole or line by line, then closed."""

    @property
    def status(self) -> int:
        """The HTTP status code."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Header names in lower case."""
        ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def iter_lines(self) -> AsyncIterator[bytes]:
        """The body split on newlines, without them (for server-sent events)."""
        ...

    async def aclose(self) -> None:
        """Release the connection (back to the pool if the body was read)."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Sends requests; raises only llmbatch :class:`TransportError` subclasses."""

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        """Send ``request`` and return once the status and headers have arrived.

        Network failures raise :class:`ConnectError`, :class:`ReadTimeout` or
        :class:`RemoteProtocolError`; an HTTP error status is a normal response.
        """
        ...

    async def aclose(self) -> None:
        """Close every connection; called once when the client closes."""
        ...
