"""An httpx transport that sends OpenAI completions, chat and embeddings requests
through an llmbatch :class:`Client`, so any httpx-based program gets batching,
tiers, fault isolation and retries without changing a call.

A program's ``POST .../completions`` (or ``/chat/completions``, ``/embeddings``) is
taken apart into calls of the llmbatch client, which batches them with every other
call; the answer is put back together as the JSON the server would have sent for
that one request. Everything else (other endpoints, streams) goes to the server
unchanged. The priority tier comes from the ``x-llmbatch-priority`` request header,
the tenant (``tenant=``) from ``x-llmbatch-tenant``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import sniffio

from llmbatch._calls.params import ALLOWED
from llmbatch._client import Client
from llmbatch._config import parse_priority
from llmbatch._exceptions import (
    APIStatusError,
    ClientClosedError,
    ConnectError,
    InvalidRequestError,
    LLMBatchError,
    QueueFull,
    RemoteProtocolError,
    RequestCancelled,
    RequestError,
    ServerOutageError,
    SpendingLimitReached,
    TimeoutException,
)
from llmbatch._models import ChatCompletion, Completion, Embedding
from llmbatch._stats import Stats

__all__ = ["PRIORITY_HEADER", "TENANT_HEADER", "BatchingTransport"]

PRIORITY_HEADER = "x-llmbatch-priority"
"""The request header that names a call's tier (``realtime``, ``normal``, ``batch``);
llmbatch reads it and does not send it on."""
TENANT_HEADER = "x-llmbatch-tenant"
"""The request header that names a call's tenant (``tenant=``: its fair share and
its ``TenantLimits``); llmbatch reads it and does not send it on."""
_ROUTES = {"/chat/completions": "chat", "/completions": "completion", "/embeddings": "embedding"}
_JSON_HEADERS = {"content-type": "application/json"}
#: Request fields that are not parameters.
_CALL_FIELDS = frozenset({"model", "prompt", "messages", "input", "stream", "stream_options"})


class BatchingTransport(httpx.AsyncBaseTransport):
    """Batches OpenAI API calls made through httpx; passes everything else through.

    ``client``: an opened :class:`llmbatch.Client` to send through, or None to have
    one made on the first request (from the request's URL and ``Authorization``
    header, with ``client_options`` as :class:`Client` keywords) and closed with
    the transport. (On trio, pass an opened client: trio cannot host the client's
    background work outside the task that opens it.) ``default_priority`` is the
    tier of a request without the ``x-llmbatch-priority`` header.

    >>> import httpx, llmbatch
    >>> http = httpx.AsyncClient(transport=llmbatch.transports.BatchingTransport())
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        default_priority: str = "normal",
        passthrough: httpx.AsyncBaseTransport | None = None,
        **client_options: Any,
    ) -> None:
        self._default_priority = parse_priority(default_priority).value
        self._client = client
        self._owns_client = client is None
        self._options = client_options
        self._passthrough = passthrough or httpx.AsyncHTTPTransport()
        self._opening: anyio.Lock | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Batch a completions, chat or embeddings request through the client; send
        anything else through the pass-through transport unchanged."""
        kind = route(request)
        if kind is None:
            return await self._passthrough.handle_async_request(request)
        try:
            content = request.content  # a JSON body is already in memory
        except httpx.RequestNotRead:
            content = await request.aread()
        body = batchable_body(kind, content)
        if body is None:
            return await self._passthrough.handle_async_request(request)
        client = await self._open(request, kind)
        return await answer(client, request, kind, body, self._default_priority)

    async def aclose(self) -> None:
        """Close the llmbatch client if this transport made it, and the passthrough."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.__aexit__(None, None, None)
        await self._passthrough.aclose()

    def stats(self) -> Stats:
        """The llmbatch client's :meth:`Client.stats` (once a call has opened it)."""
        if self._client is None:
            raise ClientClosedError(NO_STATS_YET)
        return self._client.stats()

    async def _open(self, request: httpx.Request, kind: str) -> Client:
        if self._client is not None:
            return self._client
        if sniffio.current_async_library() != "asyncio":
            raise RuntimeError(
                "on trio, give BatchingTransport an opened llmbatch.Client "
                "(async with llmbatch.Client(...) as client: BatchingTransport(client))"
            )
        if self._opening is None:
            self._opening = anyio.Lock()
        async with self._opening:  # the first requests arrive together: open once
            if self._client is None:
                client = Client(**client_options(self._options, request, kind))
                await client.__aenter__()
                self._client = client
        return self._client


#: What ``stats()`` says before the first batched call.
NO_STATS_YET = (
    "stats() is available once a completions, chat or embeddings call has opened llmbatch's client"
)


def batchable_body(kind: str, content: bytes) -> dict[str, Any] | None:
    """The request's JSON body if llmbatch batches it; None for what goes as it is
    (streams, token-id prompts)."""
    body = json.loads(content or b"{}")
    if not isinstance(body, dict) or body.get("stream") or not _batchable(kind, body):
        return None
    return body


async def answer(
    client: Client, request: httpx.Request, kind: str, body: dict[str, Any], priority: str
) -> httpx.Response:
    """One batched request's response, as the server would have sent it; llmbatch's
    errors become the server's error responses or httpx's transport errors.
    ``priority``: the tier of a request without the priority header."""
    priority = request.headers.get(PRIORITY_HEADER, priority)
    tenant = request.headers.get(TENANT_HEADER)
    try:
        payload = await _call(client, kind, body, priority, tenant)
    except APIStatusError as exc:
        return _error_response(request, exc.status_code, exc.body, str(exc.message))
    except QueueFull as exc:
        # A tenant at its TenantLimits with overflow="raise": openai's clients
        # read 429 as "too many requests, later".
        return _error_response(request, 429, None, str(exc))
    except InvalidRequestError as exc:
        return _error_response(request, 400, None, str(exc))
    except SpendingLimitReached as exc:
        # As OpenAI answers a spent quota: a 429 whose code says so (openai raises
        # RateLimitError), and not to be retried (x-should-retry, which it honours).
        body = {
            "error": {
                "message": str(exc),
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        }
        return httpx.Response(429, json=body, headers={"x-should-retry": "false"}, request=request)
    except (ConnectError, ServerOutageError) as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except TimeoutException as exc:
        raise httpx.ReadTimeout(str(exc), request=request) from exc
    except (RemoteProtocolError, RequestCancelled, RequestError) as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    return httpx.Response(
        200, headers=_JSON_HEADERS, content=json.dumps(payload).encode(), request=request
    )


def client_options(options: Mapping[str, Any], request: httpx.Request, kind: str) -> dict[str, Any]:
    """The client's keywords: ``options``, with the base URL and API key of the
    first request where they are not given."""
    made = dict(options)
    made.setdefault("base_url", _base_url(request, kind))
    authorization = request.headers.get("authorization", "")
    if authorization.lower().startswith("bearer ") and "api_key" not in made:
        made["api_key"] = authorization[7:].strip() or None
    return made


def route(request: httpx.Request) -> str | None:
    """The kind of call a request is, if llmbatch batches its endpoint."""
    if request.method != "POST":
        return None
    path = request.url.path
    for suffix, kind in _ROUTES.items():
        if path.endswith(suffix):
            return kind
    return None


def _base_url(request: httpx.Request, kind: str) -> str:
    suffix = next(s for s, k in _ROUTES.items() if k == kind)
    url = str(request.url.copy_with(query=None))
    return url[: -len(suffix)]


def _batchable(kind: str, body: Mapping[str, Any]) -> bool:
    """Text prompts and inputs are; token-id prompts and image inputs go as they are."""
    if kind == "chat":
        return isinstance(body.get("messages"), list)
    value = body.get("prompt" if kind == "completion" else "input")
    return isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    )


def _arguments(kind: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request's fields as the client's keywords, and the rest as ``extra_body``
    (openai-python has already validated its own keywords and merged extra_body)."""
    allowed = ALLOWED[kind]
    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in body.items():
        if key in _CALL_FIELDS:
            continue
        (params if key in allowed else extra)[key] = value
    return params, extra


async def _call(
    client: Client, kind: str, body: Mapping[str, Any], priority: str, tenant: str | None
) -> dict[str, Any]:
    params, extra = _arguments(kind, body)
    options: dict[str, Any] = {
        "priority": priority,
        "tenant": tenant,
        "model": body.get("model"),
        "extra_body": extra or None,
        **params,
    }
    if kind == "chat":
        chat = await client.chat(body["messages"], **options)
        return _answer_json(chat, "chat.completion")
    if kind == "embedding":
        texts = body["input"]
        embeddings = await client.embed(texts if isinstance(texts, list) else [texts], **options)
        data = [
            {**item._raw_choices()[0], "object": "embedding", "index": i}
            for i, item in enumerate(embeddings)
        ]
        prompt = sum(e.usage.prompt_tokens for e in embeddings)
        return {
            "object": "list",
            "model": embeddings[0].model if embeddings else body.get("model"),
            "data": data,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }
    prompts = body["prompt"]
    if isinstance(prompts, str):
        return _answer_json(await client.complete(prompts, **options), "text_completion")
    answers: list[Completion | BaseException] = [None] * len(prompts)  # type: ignore[list-item]

    async def one(i: int) -> None:
        try:
            answers[i] = await client.complete(prompts[i], **options)
        except LLMBatchError as exc:
            answers[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return _combined_json([a for a in answers if isinstance(a, Completion)])


def _usage_json(answer: Completion | ChatCompletion | Embedding) -> dict[str, int]:
    usage = answer.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _answer_json(answer: Completion | ChatCompletion, obj: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": answer.id,
        "object": obj,
        "created": answer.created,
        "model": answer.model,
        "choices": answer._raw_choices(),
        "usage": _usage_json(answer),
    }
    if answer.system_fingerprint is not None:
        data["system_fingerprint"] = answer.system_fingerprint
    return data


def _combined_json(answers: list[Completion]) -> dict[str, Any]:
    """One completions response for a list prompt: choice ``i * n + j``, usage summed."""
    choices: list[dict[str, Any]] = []
    for answer in answers:
        for choice in answer._raw_choices():
            choices.append({**choice, "index": len(choices)})
    prompt = sum(a.usage.prompt_tokens for a in answers)
    completion = sum(a.usage.completion_tokens for a in answers)
    first = answers[0]
    return {
        "id": first.id,
        "object": "text_completion",
        "created": first.created,
        "model": first.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _error_response(
    request: httpx.Request, status: int, body: object, message: str
) -> httpx.Response:
    """The server's error, as it sent it (or OpenAI's error shape around the message)."""
    if not isinstance(body, Mapping):
        body = {
            "error": {"message": message, "type": "BadRequestError", "param": None, "code": status}
        }
    return httpx.Response(status, json=body, request=request)
