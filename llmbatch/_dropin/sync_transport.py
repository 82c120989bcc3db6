"""The sync twin of :class:`BatchingTransport`: an httpx transport for sync programs
(openai's ``OpenAI``, ``httpx.Client``) whose OpenAI completions, chat and embeddings
requests go through a :class:`SyncClient`, so calls made from many threads batch
together. Everything else goes to the server unchanged, from the caller's thread.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from llmbatch._config import parse_priority
from llmbatch._dropin.transport import (
    NO_STATS_YET,
    answer,
    batchable_body,
    client_options,
    route,
)
from llmbatch._exceptions import ClientClosedError
from llmbatch._stats import Stats
from llmbatch._sync import SyncClient

__all__ = ["SyncBatchingTransport"]


class SyncBatchingTransport(httpx.BaseTransport):
    """Batches OpenAI API calls made through a sync ``httpx.Client``; passes
    everything else through.

    ``client``: an opened :class:`llmbatch.SyncClient` to send through, or None to
    have one made on the first request (from its URL and ``Authorization`` header,
    with ``client_options`` as :class:`SyncClient` keywords) and closed with the
    transport. ``default_priority`` is the tier of a request without the
    ``x-llmbatch-priority`` header.

    >>> import httpx, llmbatch
    >>> http = httpx.Client(transport=llmbatch.transports.SyncBatchingTransport())
    """

    def __init__(
        self,
        client: SyncClient | None = None,
        *,
        default_priority: str = "normal",
        passthrough: httpx.BaseTransport | None = None,
        **client_options: Any,
    ) -> None:
        self._default_priority = parse_priority(default_priority).value
        self._client = client
        self._owns_client = client is None
        self._options = client_options
        self._passthrough = passthrough or httpx.HTTPTransport()
        self._opening = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Batch a completions, chat or embeddings request through the client (on its
        loop); send anything else through the pass-through transport unchanged."""
        kind = route(request)
        if kind is None:
            return self._passthrough.handle_request(request)
        body = batchable_body(kind, request.read())
        if body is None:
            return self._passthrough.handle_request(request)
        client = self._open(request, kind)
        response: httpx.Response = client._call(
            answer, client._client, request, kind, body, self._default_priority
        )
        return response

    def close(self) -> None:
        """Close the llmbatch client if this transport made it, and the passthrough."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            client.close()
        self._passthrough.close()

    def stats(self) -> Stats:
        """The llmbatch client's :meth:`SyncClient.stats` (once a call has opened it)."""
        if self._client is None:
            raise ClientClosedError(NO_STATS_YET)
        return self._client.stats()

    def _open(self, request: httpx.Request, kind: str) -> SyncClient:
        client = self._client
        if client is not None:
            return client
        with self._opening:  # the first requests of several threads: open once
            if self._client is None:
                self._client = SyncClient(**client_options(self._options, request, kind)).open()
            return self._client
