"""The transport seam, public for tests and custom networking.

``MockTransport(handler)`` answers requests with a function, so an application's
tests can run llmbatch without a server::

    def handler(request: HTTPRequest) -> MockResponse:
        return MockResponse(json={...})

    async with llmbatch.Client(transport=MockTransport(handler), model="m") as client: ...

``AiohttpTransport`` (the default on asyncio) and ``HttpxTransport`` (the default on
trio) are the real ones, to be wrapped by a transport of your own: anything with
``async send(request) -> HTTPResponse`` and ``async aclose()``.

``BatchingTransport`` (and ``SyncBatchingTransport`` for sync code) goes the other
way: an httpx transport that sends any httpx-based program's OpenAI calls through an
llmbatch client (see ``llmbatch.openai`` and docs/openai.md).

Every name but the seam's own is loaded on first use: aiohttp and httpx are
imported only by a program that asks for them.
"""

import typing

from llmbatch._lazy import lazy_exports as _lazy_exports
from llmbatch._transports import HTTPRequest, HTTPResponse, MockResponse, MockTransport, Transport

if typing.TYPE_CHECKING:
    from llmbatch._dropin.sync_transport import SyncBatchingTransport
    from llmbatch._dropin.transport import PRIORITY_HEADER, TENANT_HEADER, BatchingTransport
    from llmbatch._transports.aiohttp import AiohttpTransport
    from llmbatch._transports.httpx import HttpxTransport

#: Where each name loaded on first use is defined (read by ``__getattr__``).
_EXPORTS = {
    "AiohttpTransport": "llmbatch._transports.aiohttp",
    "HttpxTransport": "llmbatch._transports.httpx",
    "BatchingTransport": "llmbatch._dropin.transport",
    "PRIORITY_HEADER": "llmbatch._dropin.transport",
    "TENANT_HEADER": "llmbatch._dropin.transport",
    "SyncBatchingTransport": "llmbatch._dropin.sync_transport",
}

if not typing.TYPE_CHECKING:  # type checkers read the imports above, and flag typos
    __getattr__, __dir__ = _lazy_exports("llmbatch.transports", _EXPORTS, globals())


__all__ = [
    "PRIORITY_HEADER",
    "TENANT_HEADER",
    "AiohttpTransport",
    "BatchingTransport",
    "HTTPRequest",
    "HTTPResponse",
    "HttpxTransport",
    "MockResponse",
    "MockTransport",
    "SyncBatchingTransport",
    "Transport",
]
