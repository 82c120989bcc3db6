"""A chat map against the simulator playing a hosted provider's rate limiter.

    python -m llmbatch_bench.experiments.hosted --json out.json
    python -m llmbatch_bench.experiments.hosted --conversations 3000 --rpm 6000 --tpm 90000

No ``RateLimit`` is stated: whatever the client does about the limit it learns from
the answers. Each HTTP answer's status is recorded by the wire log's transport
around llmbatch's own, so the report counts the 429s per second as the server gave them,
and every conversation's outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import llmbatch
from llmbatch_bench.closedloop.wirelog import RecordingTransport, aiohttp_transport
from llmbatch_server.testing import run_simulator


async def _run(url: str, conversations: int, max_tokens: int) -> dict[str, Any]:
    transport = RecordingTransport(aiohttp_transport())
    origin = time.monotonic()
    async with llmbatch.Client(url, transport=transport) as client:
        inputs: list[Any] = [
            [{"role": "user", "content": f"question {i} please"}] for i in range(conversations)
        ]
        started = time.perf_counter()
        results = await client.map(inputs, max_tokens=max_tokens)
        wall = time.perf_counter() - started
        server = client.stats().servers[0]
    posts = [e for e in transport.log if e.method == "POST"]
    per_second: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for e in posts:
        per_second[int(e.done - origin)][0 if e.outcome == "200" else 1] += 1
    refused = sum(1 for e in posts if e.outcome == "429")
    return {
        "conversations": conversations,
        "wall_s": round(wall, 2),
        "answered": sum(r.error is None for r in results),
        "failed": sum(r.error is not None for r in results),
        "http_requests": len(posts),
        "http_429": refused,
        "share_429": round(refused / max(1, len(posts)), 4),
        "conversations_per_s": round(conversations / wall, 2),
        "per_second_ok_429": {str(k): v for k, v in sorted(per_second.items())},
        "provider_limits": None
        if server.provider_limits is None
        else server.provider_limits.model_dump(mode="json"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.hosted", description=__doc__
    )
    p.add_argument("--conversations", type=int, default=3000, help="default: 3000")
    p.add_argument("--max-tokens", type=int, default=16, help="default: 16")
    p.add_argument("--rpm", type=int, default=6000, help="requests a minute (default: 6000)")
    p.add_argument("--tpm", type=int, default=90000, help="tokens a minute (default: 90000)")
    p.add_argument(
        "--headers", choices=("openai", "anthropic"), default="openai", help="default: openai"
    )
    p.add_argument("--speed", default="50", help="the simulator's speed (default: 50)")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    sim_args = [
        "--speed", args.speed, "--no-chat-batch",
        "--rate-limit-rpm", str(args.rpm), "--rate-limit-tpm", str(args.tpm),
        "--rate-limit-headers", args.headers,
    ]  # fmt: skip
    with run_simulator(*sim_args) as sim:
        result = asyncio.run(_run(sim.base_url, args.conversations, args.max_tokens))
    result["command"] = " ".join(
        ["python -m llmbatch_bench.experiments.hosted", *(argv or sys.argv[1:])]
    )
    result["simulator"] = " ".join(sim_args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
