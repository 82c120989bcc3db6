"""Drop llmbatch into an existing asyncio app in a few lines.

Before: the app fired one HTTP request per item with asyncio.gather, which
floods the server and puts a user's request behind every queued item.
After: one shared ``llmbatch.Client``; the same gather now goes through the
batcher, which keeps the server just full, and the user's request jumps the queue.

Run against a server:  LLMBATCH_BASE_URL=http://127.0.0.1:8000/v1 python examples/asyncio_dropin.py
(start one with:  llmbatch-server sim)
"""

from __future__ import annotations

import asyncio

import llmbatch


async def summarise(client: llmbatch.Client, document: str) -> str:
    # Was: await http.post(".../v1/completions", json={...}) and JSON plumbing.
    completion = await client.complete(f"Summarise: {document}", priority="batch", max_tokens=32)
    return completion.text


async def answer_user(client: llmbatch.Client, question: str) -> str:
    completion = await client.complete(question, priority="realtime", max_tokens=32)
    return completion.text


async def main() -> None:
    documents = [f"document number {i}" for i in range(500)]
    # The only new line: one client for the whole app (base URL from LLMBATCH_BASE_URL).
    async with llmbatch.Client() as client:
        bulk = asyncio.gather(*(summarise(client, d) for d in documents))
        reply = await answer_user(client, "What is the status of my order?")
        print(f"user got an answer while {len(documents)} summaries were queued: {reply!r}")
        summaries = await bulk
        print(f"{len(summaries)} summaries done; first: {summaries[0]!r}")
        print(f"they went out as {client.stats().batches_sent} HTTP requests")


if __name__ == "__main__":
    asyncio.run(main())
