"""A one-line drop-in for openai-python: ``from llmbatch.openai import AsyncOpenAI``
(or ``OpenAI`` for sync code).

It is openai's own ``AsyncOpenAI`` (``OpenAI``), whose HTTP client sends
completions, chat and embeddings calls through llmbatch (batching, tiers, fault
isolation, retries, the closed-loop admission) and everything else to the server
unchanged; calls return openai's own types. ``client.stats()`` is the llmbatch
client's :class:`llmbatch.Stats`. Needs the ``openai`` extra (``pip install
'llmbatch[openai]'``).

    from llmbatch.openai import AsyncOpenAI

    client = AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="...")
    answer = await client.chat.completions.create(
        model="m", messages=[...], extra_headers={"x-llmbatch-priority": "realtime"}
    )
    # Every call of one agent as its tenant (fair shares, TenantLimits):
    agent = AsyncOpenAI(..., default_headers={"x-llmbatch-tenant": "agent-7"})
    print(client.stats().batches_sent)
    await client.close()

See docs/openai.md ("Coming from openai-python").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "llmbatch.openai needs the openai package: pip install 'llmbatch[openai]'"
    ) from exc

import httpx

from llmbatch._dropin.sync_transport import SyncBatchingTransport
from llmbatch._dropin.transport import PRIORITY_HEADER, TENANT_HEADER, BatchingTransport
from llmbatch._exceptions import ClientClosedError
from llmbatch._stats import Stats

__all__ = ["PRIORITY_HEADER", "TENANT_HEADER", "AsyncOpenAI", "OpenAI"]

_OWN_HTTP_CLIENT = (
    "stats() needs llmbatch's transport: this client was given its own http_client, "
    "so its calls do not go through llmbatch"
)


class _ThroughLLMBatch:
    """What both drop-ins add to openai's client: an HTTP client whose transport is
    llmbatch's (unless one is passed), and ``stats()`` of the llmbatch client behind
    it. Each names its transport and httpx client class."""

    _transport: type[BatchingTransport] | type[SyncBatchingTransport]
    _http: type[httpx.AsyncClient] | type[httpx.Client]
    _llmbatch: BatchingTransport | SyncBatchingTransport | None

    def __init__(
        self,
        *,
        default_priority: str = "normal",
        llmbatch_options: Mapping[str, Any] | None = None,
        max_retries: int = 0,
        http_client: Any = None,
        **kwargs: Any,
    ) -> None:
        transport = None
        if http_client is None:
            transport = self._transport(
                default_priority=default_priority, **dict(llmbatch_options or {})
            )
            # llmbatch bounds each request itself (Client timeouts and deadlines).
            http_client = self._http(transport=transport, timeout=None)  # type: ignore[arg-type]
        self._llmbatch = transport
        openai_init: Any = super().__init__  # openai's client, next in the MRO
        openai_init(max_retries=max_retries, http_client=http_client, **kwargs)

    def stats(self) -> Stats:
        """The llmbatch client's :class:`llmbatch.Stats`: queues, batches, latencies,
        what the controller believes of the server. Available once a completions,
        chat or embeddings call has opened it (else :class:`ClientClosedError`)."""
        if self._llmbatch is None:
            raise ClientClosedError(_OWN_HTTP_CLIENT)
        return self._llmbatch.stats()


class AsyncOpenAI(_ThroughLLMBatch, openai.AsyncOpenAI):
    """openai's ``AsyncOpenAI``, batching through llmbatch.

    Takes openai's arguments, plus ``default_priority`` (the tier of calls without an
    ``x-llmbatch-priority`` header; ``"normal"``) and ``llmbatch_options`` (keywords
    for the :class:`llmbatch.Client` it makes: ``limits=``, ``slo=``, ``tenants=``,
    ...). An ``x-llmbatch-tenant`` header (``extra_headers`` or ``default_headers``)
    names the call's tenant; a tenant at its limits with ``overflow="raise"`` gets a
    429 (openai's ``RateLimitError``).
    ``max_retries`` defaults to 0 because llmbatch retries already (and waits out
    outages); a passed ``http_client`` is used as it is, without batching.
    """

    _transport = BatchingTransport
    _http = httpx.AsyncClient


class OpenAI(_ThroughLLMBatch, openai.OpenAI):
    """openai's sync ``OpenAI``, batching through llmbatch: calls made from any number
    of threads are batched together by one :class:`llmbatch.SyncClient`, which runs
    its event loop in a thread of its own.

    Arguments as for :class:`AsyncOpenAI` (``default_priority``,
    ``llmbatch_options`` for the :class:`llmbatch.SyncClient` it makes,
    ``max_retries=0``); ``client.close()`` (or ``with OpenAI(...)``) closes it.
    """

    _transport = SyncBatchingTransport
    _http = httpx.Client
