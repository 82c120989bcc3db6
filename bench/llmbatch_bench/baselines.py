"""The baselines: one request per prompt, ``asyncio.gather`` + a semaphore.

This is how people batch LLM calls today, written the common way for each client
library: one shared client object, ``async with semaphore`` around each call (none
for the unbounded burst), ``asyncio.gather`` over every prompt, generous timeouts as
LLM calls need. Nothing here is tuned beyond what such code usually does, and
realtime calls share the bulk semaphore, as they do when one helper wraps every call.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any

from llmbatch_bench.metrics import Recorder, record_stream

__all__ = ["BASELINES", "AiohttpBaseline", "GatherBaseline", "HttpxBaseline", "OpenAIBaseline"]

#: What users typically give LLM calls: long enough for a full generation.
TIMEOUT = 600.0


class GatherBaseline:
    """gather + semaphore around :meth:`complete` and :meth:`stream` of a subclass."""

    name = "gather"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        concurrency: int | None = 64,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.params = dict(params or {})
        # None: unbounded, every prompt in flight at once (the burst baseline).
        self._semaphore = asyncio.Semaphore(concurrency) if concurrency else None

    async def __aenter__(self) -> GatherBaseline:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the library's client object (inside the running loop)."""

    async def close(self) -> None:
        """Close it."""

    async def complete(self, prompt: str, max_tokens: int) -> int:
        """POST one prompt; return its completion tokens."""
        raise NotImplementedError

    def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        """POST one prompt with ``stream: true``; yield its text deltas."""
        raise NotImplementedError

    def _body(self, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens}
        return {**body, **self.params, **extra}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # -- the workloads, as a user would write them -------------------------------------

    async def bulk(self, prompts: Iterable[str], max_tokens: int, rec: Recorder) -> None:
        """Every prompt at once through ``asyncio.gather``, bounded by the semaphore."""

        async def one(prompt: str) -> None:
            async with self._limit():
                start = time.perf_counter()
                try:
                    tokens = await self.complete(prompt, max_tokens)
                except Exception as exc:
                    rec.failure(exc)
                    return
                rec.success("batch", time.perf_counter() - start, tokens)

        await asyncio.gather(*(one(p) for p in prompts))

    async def realtime(self, prompt: str, max_tokens: int, rec: Recorder) -> None:
        """One streamed call through the same semaphore; latency from the call."""
        start = time.perf_counter()
        async with self._limit():
            await record_stream(rec, self.stream(prompt, max_tokens), start)

    def _limit(self) -> Any:
        return self._semaphore if self._semaphore is not None else _NoLimit()


class _NoLimit:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def _sse_text(line: str) -> str | None:
    """The text of one ``data:`` line of a completions stream, else None."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    event = json.loads(data)
    if "error" in event:
        raise RuntimeError(f"error in stream: {event['error']}")
    choices = event.get("choices") or ()
    return "".join(c.get("text") or "" for c in choices)


class HttpxBaseline(GatherBaseline):
    """``httpx.AsyncClient`` (the client the ``openai`` SDK is built on)."""

    name = "httpx"

    async def open(self) -> None:
        import httpx

        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers(), timeout=TIMEOUT
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def complete(self, prompt: str, max_tokens: int) -> int:
        response = await self._http.post("/completions", json=self._body(prompt, max_tokens))
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"])

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        body = self._body(prompt, max_tokens, stream=True)
        async with self._http.stream("POST", "/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                text = _sse_text(line)
                if text is not None:
                    yield text


class AiohttpBaseline(GatherBaseline):
    """``aiohttp.ClientSession`` with its default connector (100 connections)."""

    name = "aiohttp"

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            headers=self._headers(), timeout=aiohttp.ClientTimeout(total=TIMEOUT)
        )

    async def close(self) -> None:
        await self._session.close()

    async def complete(self, prompt: str, max_tokens: int) -> int:
        url = self.base_url + "/completions"
        async with self._session.post(url, json=self._body(prompt, max_tokens)) as response:
            response.raise_for_status()
            return int((await response.json())["usage"]["completion_tokens"])

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        url = self.base_url + "/completions"
        body = self._body(prompt, max_tokens, stream=True)
        async with self._session.post(url, json=body) as response:
            response.raise_for_status()
            async for raw in response.content:
                text = _sse_text(raw.decode())
                if text is not None:
                    yield text


class OpenAIBaseline(GatherBaseline):
    """The ``openai`` SDK's ``AsyncOpenAI`` (its defaults: 2 retries, pooled httpx)."""

    name = "openai"

    async def open(self) -> None:
        import openai

        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=TIMEOUT
        )

    async def close(self) -> None:
        await self._client.close()

    async def complete(self, prompt: str, max_tokens: int) -> int:
        answer = await self._client.completions.create(
            model=self.model, prompt=prompt, max_tokens=max_tokens, extra_body=self.params
        )
        return answer.usage.completion_tokens if answer.usage else 0

    async def bulk_chat(
        self, chats: Iterable[list[dict[str, str]]], max_tokens: int, rec: Recorder
    ) -> None:
        """One ``chat.completions.create`` per conversation, gathered under the
        semaphore, as the SDK's own examples write it."""

        async def one(messages: list[dict[str, str]]) -> None:
            async with self._limit():
                start = time.perf_counter()
                try:
                    answer = await self._client.chat.completions.create(
                        model=self.model,
                        messages=messages,  # type: ignore[arg-type]
                        max_tokens=max_tokens,
                        extra_body=self.params,
                    )
                except Exception as exc:
                    rec.failure(exc)
                    return
                tokens = answer.usage.completion_tokens if answer.usage else 0
                rec.success("batch", time.perf_counter() - start, tokens)

        await asyncio.gather(*(one(m) for m in chats))

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        chunks = await self._client.completions.create(
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens,
            stream=True,
            extra_body=self.params,
        )
        async for chunk in chunks:
            if chunk.choices:
                yield chunk.choices[0].text


BASELINES: dict[str, type[GatherBaseline]] = {
    b.name: b for b in (HttpxBaseline, AiohttpBaseline, OpenAIBaseline)
}
