"""The transport seam, public for tests and custom networking.

``MockTransport(handler)`` answers requests with a function, so an application's
tests can run llmbatch without a server::

    def handler(request: HTTPRequest) -> MockResponse:
        return MockResponse(json={...})

    async with llmbatch.Client(transport=MockTransport(handler), model="m") as client: ...

``BatchingTransport`` (and ``SyncBatchingTransport`` for sync code) goes the other
way: an httpx transport that sends any httpx-based program's OpenAI calls through an
llmbatch client (see ``llmbatch.openai`` and docs/openai.md).
"""

from typing import TYPE_CHECKING, Any

from llmbatch._transports import HTTPRequest, HTTPResponse, MockResponse, MockTransport, Transport

if TYPE_CHECKING:
    from llmbatch._dropin.sync_transport import SyncBatchingTransport
    from llmbatch._dropin.transport import PRIORITY_HEADER, TENANT_HEADER, BatchingTransport

__all__ = [
    "PRIORITY_HEADER",
    "TENANT_HEADER",
    "BatchingTransport",
    "HTTPRequest",
    "HTTPResponse",
    "MockResponse",
    "MockTransport",
    "SyncBatchingTransport",
    "Transport",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: it pulls in httpx, which plain llmbatch use does not need.
    if name in ("BatchingTransport", "PRIORITY_HEADER", "TENANT_HEADER"):
        from llmbatch._dropin import transport

        return getattr(transport, name)
    if name == "SyncBatchingTransport":
        from llmbatch._dropin import sync_transport

        return sync_transport.SyncBatchingTransport
    raise AttributeError(f"module 'llmbatch.transports' has no attribute {name!r}")
