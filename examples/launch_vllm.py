"""Launch vLLM with a tuned profile and connect with the matching client settings.

    python examples/launch_vllm.py --model /path/to/model --profile latency

The launcher builds the ``vllm serve`` command (no shell), waits for /health,
and suggests client limits that keep the server just full: the in-flight
limit equals the profile's --max-num-seqs, and priority scheduling is on.
Needs vLLM installed (see docs/vllm-cpu.md for a CPU-only machine).
"""

from __future__ import annotations

import argparse
import asyncio

import llmbatch
from llmbatch_server.launcher import VLLMServer


async def main(model: str, profile: str, port: int, vllm_bin: str | None) -> None:
    async with VLLMServer(model=model, profile=profile, port=port, vllm_bin=vllm_bin) as server:
        settings = server.client_settings()
        print(f"vLLM ready at {server.base_url}; client settings: {settings}")
        async with llmbatch.Client(
            server.base_url,
            limits=llmbatch.Limits(**settings["limits"]),
            priority_scheduling=settings["priority_scheduling"],
        ) as client:
            results = await client.map([f"Item {i}" for i in range(64)], max_tokens=8)
            print(f"{sum(r.ok for r in results)}/{len(results)} ok")
            answer = await client.complete("Hello", priority="realtime", max_tokens=8)
            print(f"realtime: {answer.text!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Launch vLLM and connect llmbatch to it.")
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--profile", default="latency", choices=["throughput", "balanced", "latency"]
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--vllm-bin", help="the vllm executable (default: vllm on PATH)")
    args = parser.parse_args()
    asyncio.run(main(args.model, args.profile, args.port, args.vllm_bin))
