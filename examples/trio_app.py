"""llmbatch under trio: the same API, with the httpx transport.

Everything works on trio, ``RateLimit`` included; only ``transport="aiohttp"``
needs asyncio (asking for it here raises a clear ``ConfigError`` at entry).

Run:  LLMBATCH_BASE_URL=http://127.0.0.1:8000/v1 python examples/trio_app.py
"""

from __future__ import annotations

import trio

import llmbatch


async def main() -> None:
    async with llmbatch.Client() as client:  # picks the httpx transport on trio
        results = await client.map([f"Translate sentence {i}" for i in range(100)], max_tokens=16)
        print(f"{sum(r.ok for r in results)}/{len(results)} translated")
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(ask, client, i)
        print(
            "streamed:", "".join([d async for d in client.stream("Tell me a story", max_tokens=12)])
        )


async def ask(client: llmbatch.Client, i: int) -> None:
    answer = await client.complete(f"Question {i}", priority="realtime", max_tokens=8)
    print(f"answer {i}: {answer.text!r}")


if __name__ == "__main__":
    trio.run(main)
