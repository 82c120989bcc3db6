"""A transport that calls a function instead of the network, for tests and examples."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llmbatch._transports.base import HTTPRequest, HTTPResponse

__all__ = ["MockResponse", "MockTransport"]


@dataclass(slots=True)
class MockResponse:
    """A canned response. ``json`` wins over ``content``; ``lines`` makes an SSE body."""

    status: int = 200
    json: object = None
    content: bytes = b""
    lines: Sequence[bytes] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.json is not None:
            self.content = json.dumps(self.json).encode()
        if self.lines is not None:
            self.content = b"\n".join(self.lines) + b"\n"
        self.headers = {k.lower(): v for k, v in self.headers.items()}

    async def read(self) -> bytes:
        """The body (``content``)."""
        return self.content

    async def iter_lines(self) -> AsyncIterator[bytes]:
        """The body split on newlines."""
        for line in self.content.split(b"\n"):
            yield line

    async def aclose(self) -> None:
        """Nothing to release."""
        return None


Handler = Callable[[HTTPRequest], "MockResponse | Awaitable[MockResponse]"]


class MockTransport:
    """Answers every request with ``handler(request)`` (sync or async).

    A handler may raise any llmbatch ``TransportError`` to simulate network failure.
    Every request sent is appended to ``requests``, for assertions.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.requests: list[HTTPRequest] = []

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        """Record ``request`` in ``requests`` and answer it with the handler."""
        self.requests.append(request)
        response = self._handler(request)
        if inspect.isawaitable(response):
            response = await response
        assert isinstance(response, MockResponse)
        return response

    async def aclose(self) -> None:
        """Nothing to close."""
        return None
