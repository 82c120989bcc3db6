"""One process of the shared-cache tests: maps its prompts through a client with a
cache file at temperature 0 and prints what it got as JSON (the texts by prompt,
the cache's counts). ``--hold SECONDS`` keeps going after the map (to be killed)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import anyio

import llmbatch


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("cache")
    parser.add_argument("prompts", help="a JSON file of prompts")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--namespace", default="")
    args = parser.parse_args()
    prompts = json.loads(await anyio.Path(args.prompts).read_text(encoding="utf-8"))
    # The processes start their maps together.
    await asyncio.sleep(max(0.0, args.start_at - time.time()))
    cache = llmbatch.Cache(args.cache, namespace=args.namespace)
    async with llmbatch.Client(args.url, cache=cache) as client:
        results = await client.map(prompts, temperature=0, max_tokens=8)
        stats = client.stats()
    cache = stats.cache
    assert cache is not None
    print(
        json.dumps(
            {
                "texts": {p: r.text for p, r in zip(prompts, results, strict=True)},
                "errors": [str(r.error) for r in results if r.error is not None],
                "hits": cache.hits,
                "shared": cache.shared,
                "stored": cache.stored,
                "write_errors": cache.write_errors,
                "unreadable": cache.unreadable,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
