"""The transport seam, public for tests and custom networking.

``MockTransport(handler)`` answers requests with a function, so an application's
tests can run llmbatch without a server::

    def handler(request: HTTPRequest) -> MockResponse:
        return MockResponse(json={...})

    async with llmbatch.Client(transport=MockTransport(handler), model="m") as client: ...
"""

from llmbatch._transports import HTTPRequest, HTTPResponse, MockResponse, MockTransport, Transport

__all__ = ["HTTPRequest", "HTTPResponse", "MockResponse", "MockTransport", "Transport"]
