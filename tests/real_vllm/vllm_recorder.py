"""A transport for the real-vLLM tests that notes what was sent where."""

from __future__ import annotations

from collections import Counter

import llmbatch
from llmbatch._transports.aiohttp import AiohttpTransport
from llmbatch.transports import HTTPRequest, HTTPResponse


class Recorder:
    """The real aiohttp transport, noting the method and URL of every request."""

    def __init__(self) -> None:
        self.inner = AiohttpTransport(
            limits=llmbatch.DEFAULT_LIMITS, timeout=llmbatch.DEFAULT_TIMEOUT
        )
        self.sent: list[tuple[str, str]] = []

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        self.sent.append((request.method, request.url))
        return await self.inner.send(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def paths(self) -> list[str]:
        """Each request's path after ``/v1``, in order."""
        return [url.split("/v1", 1)[-1] for _, url in self.sent]

    def posts(self) -> Counter[str]:
        """POSTs per server (the URL before ``/v1``)."""
        return Counter(url.split("/v1", 1)[0] for method, url in self.sent if method == "POST")
