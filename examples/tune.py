"""Realtime latency and bulk throughput on one simulated server, per client setting.

    python examples/tune.py                                  # the library's defaults
    python examples/tune.py --slo-tpot-ms 4                  # with a per-token SLO
    python examples/tune.py --scheduling-policy fcfs         # vLLM's default policy

An endless bulk job (``map_unordered``, ``max_tokens=32``) runs while a user asks a
realtime question (``max_tokens=16``, streamed) every 100 ms. It starts its own
simulator (``--profile``, ``--speed``: modelled durations divided by the speed) on a
free port and prints one line: bulk prompts/s, the realtime per-token time and
time to first token, and the bulk limit the client settled on.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import llmbatch
from llmbatch_server.testing import run_simulator


async def trial(base_url: str, args: argparse.Namespace) -> str:
    options: dict[str, object] = {"on_close": "cancel"}
    if args.max_in_flight is not None:
        options["limits"] = llmbatch.Limits(max_in_flight=args.max_in_flight)
    if args.slo_tpot_ms is not None:
        options["slo"] = llmbatch.SLO(tpot=args.slo_tpot_ms / 1000)
    async with llmbatch.Client(base_url, **options) as client:  # type: ignore[arg-type]
        done = 0

        async def bulk() -> None:  # an endless bulk job at priority "batch"
            nonlocal done
            prompts = (f"Summarise ticket {i}" for i in range(10**9))
            async for _, result in client.map_unordered(prompts, max_tokens=32, ignore_eos=True):
                done += result.ok

        job = asyncio.create_task(bulk())
        await asyncio.sleep(args.warmup)  # let the bulk job fill the server
        started, done_before = time.perf_counter(), done
        per_token, first_token, limits = [], [], []
        for i in range(args.questions):  # a user asking something every 100 ms
            asked = time.perf_counter()
            first = None
            tokens = 0
            async for _ in client.stream(f"Question {i}?", max_tokens=16, ignore_eos=True):
                tokens += 1
                if first is None:
                    first = time.perf_counter()
            assert first is not None
            first_token.append((first - asked) * 1000)
            per_token.append((time.perf_counter() - first) / max(1, tokens - 1) * 1000)
            server = client.stats().server
            if server is not None:
                limits.append(server.bulk_limit)
            await asyncio.sleep(0.1)
        rate = (done - done_before) / (time.perf_counter() - started)
        job.cancel()
    per_token.sort()
    return (
        f"bulk {rate:5.0f} prompts/s   realtime per token p50 "
        f"{statistics.median(per_token):5.2f} ms  max {per_token[-1]:5.2f} ms   "
        f"first token p50 {statistics.median(first_token):5.1f} ms   "
        f"bulk limit p50 {statistics.median(limits):.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="latency", help="simulator profile (default: latency)")
    parser.add_argument(
        "--scheduling-policy",
        default="priority",
        choices=["fcfs", "priority"],
        help="the simulated vLLM's policy (default: priority, as the launcher's profiles)",
    )
    parser.add_argument("--speed", default="20", help="simulator speed factor (default: 20)")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="Limits.max_in_flight, the ceiling (default: the library's, 256)",
    )
    parser.add_argument(
        "--slo-tpot-ms",
        type=float,
        default=None,
        help="SLO(tpot=...) in wall-clock ms (default: no SLO)",
    )
    parser.add_argument(
        "--questions", type=int, default=40, help="realtime questions asked (default: 40)"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of bulk alone first (default: 2)"
    )
    args = parser.parse_args()
    sim_args = ["--profile", args.profile, "--scheduling-policy", args.scheduling_policy]
    with run_simulator(*sim_args, "--speed", args.speed) as sim:
        print(asyncio.run(trial(sim.base_url, args)))


if __name__ == "__main__":
    main()
