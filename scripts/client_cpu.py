"""Client CPU per prompt, one prompt per HTTP request vs batched, per transport.

Runs against a zero-latency simulator subprocess, so the client's own CPU is what
``time.process_time()`` measures (the server is another process).

    python scripts/client_cpu.py [--n 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import llmbatch
from llmbatch_server.testing import run_simulator


async def measure(url: str, n: int, batch_size: int, transport: str) -> tuple[float, float]:
    """(µs of client CPU per prompt, prompts/s) for ``n`` prompts through ``map``."""
    batching = {"batch": llmbatch.BatchPolicy(max_batch_size=batch_size, max_wait=0.05)}
    async with llmbatch.Client(url, batching=batching, transport=transport) as client:  # type: ignore[arg-type]
        await client.map(["warm-up"] * 200, max_tokens=1)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        results = await client.map([f"prompt {i}" for i in range(n)], max_tokens=1)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert all(r.ok for r in results)
    return cpu / n * 1e6, n / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="prompts per batched run")
    args = parser.parse_args()
    with run_simulator("--zero-latency") as sim:
        print("transport  prompts/request  client CPU/prompt  prompts/s")
        for transport in ("aiohttp", "httpx"):
            for size, n in ((1, max(1, args.n // 10)), (64, args.n)):
                cpu, rate = asyncio.run(measure(sim.base_url, n, size, transport))
                print(f"{transport:9s}  {size:15d}  {cpu:14.1f} µs  {rate:9.0f}")


if __name__ == "__main__":
    main()
