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

#: Seconds after which the steady rate is measured (the issue's first 10 s).
STEADY_AFTER = 10.0


async def _run(url: str, conversations: int, max_tokens: int, rpm: int, tpm: int) -> dict[str, Any]:
    transport = RecordingTransport(aiohttp_transport())
    origin = time.monotonic()
    async with llmbatch.Client(url, transport=transport) as client:
        inputs: list[Any] = [
            [{"role": "user", "content": f"question {i} please"}] for i in range(conversations)
        ]
        started = time.perf_counter()
        results = await client.map(inputs, max_tokens=max_tokens)
        wall = time.perf_counter() - started
        stats = client.stats()
        server = stats.servers[0]
    posts = [e for e in transport.log if e.method == "POST"]
    per_second: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for e in posts:
        per_second[int(e.done - origin)][0 if e.outcome == "200" else 1] += 1
    refused = sum(1 for e in posts if e.outcome == "429")
    answered = sum(r.error is None for r in results)
    # The binding limit in conversations a second: requests, or tokens as the
    # provider counts them (the prompt's, from the usage, and max_tokens).
    per_conversation = stats.prompt_tokens / max(1, answered) + max_tokens
    binding = min(rpm / 60, tpm / 60 / per_conversation)
    ok_times = sorted(e.done - origin for e in posts if e.outcome == "200")
    steady = [t for t in ok_times if t >= STEADY_AFTER]
    steady_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else None
    return {
        "conversations": conversations,
        "wall_s": round(wall, 2),
        "answered": answered,
        "failed": sum(r.error is not None for r in results),
        "http_requests": len(posts),
        "http_429": refused,
        "share_429": round(refused / max(1, len(posts)), 4),
        "conversations_per_s": round(conversations / wall, 2),
        "binding_per_s": round(binding, 2),
        "steady_per_s": None if steady_rate is None else round(steady_rate, 2),
        "steady_share": None if steady_rate is None else round(steady_rate / binding, 3),
        "http_429_first_second": sum(
            1 for e in posts if e.outcome == "429" and e.done - origin < 1
        ),
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
        "--headers",
        choices=("openai", "anthropic", "together"),
        default="openai",
        help="whose rate-limit headers the simulator sends (default: openai)",
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
        result = asyncio.run(
            _run(sim.base_url, args.conversations, args.max_tokens, args.rpm, args.tpm)
        )
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
