"""llmbatch in one minute: bulk work and interactive calls sharing one client.

Starts the bundled vLLM simulator on 127.0.0.1 (no GPU needed), then:
  1. runs 2,000 bulk prompts through ``client.map`` at priority "batch";
  2. meanwhile answers realtime requests, which go ahead of the bulk work;
  3. prints throughput, realtime latency and the client's stats.

Run:  python examples/demo.py            (or --url http://host:8000/v1 for your server)
      python examples/demo.py --slo 8     (realtime held near 8 ms a token: less bulk)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import llmbatch

SIM_SPEED = "10"  # modelled 70B-on-4xA100 engine, 10x faster than real time


async def main(base_url: str, bulk: int, slo_ms: float | None) -> None:
    slo = None if slo_ms is None else llmbatch.SLO(tpot=slo_ms / 1000)
    async with llmbatch.Client(base_url, slo=slo) as client:
        print(f"server model: {client.model} (max_model_len {client.max_model_len})")
        first = await client.complete("Say hello", priority="realtime", max_tokens=12)
        print(f"realtime answer: {first.text.strip()!r} in {first.timings.latency * 1000:.0f} ms")

        prompts = [f"Summarise ticket #{i}" for i in range(bulk)]
        realtime_latencies: list[float] = []

        async def interactive_user() -> None:
            # A user asking something every 100 ms while the bulk job runs.
            for i in range(20):
                c = await client.complete(f"Question {i}?", priority="realtime", max_tokens=16)
                realtime_latencies.append(c.timings.latency)
                await asyncio.sleep(0.1)

        started = time.perf_counter()
        user = asyncio.create_task(interactive_user())
        results = await client.map(prompts, priority="batch", max_tokens=32)
        wall = time.perf_counter() - started
        await user

        ok = sum(r.ok for r in results)
        print(f"bulk: {ok}/{len(results)} ok in {wall:.1f} s ({len(results) / wall:.0f} prompts/s)")
        print(f"example result: {results[0].unwrap().text.strip()!r}")
        p50 = statistics.median(realtime_latencies) * 1000
        worst = max(realtime_latencies) * 1000
        print(f"realtime during bulk: p50 {p50:.0f} ms, worst {worst:.0f} ms")
        if slo is None:
            # Realtime goes first in the client, but on the server it shares each engine
            # step with every bulk sequence running there, and a step grows with them.
            print(
                "  (slower than alone: the server runs realtime beside the bulk sequences "
                "and each step grows with them; --slo 8 sets Client(slo=SLO(tpot=0.008)), "
                "which keeps less bulk in flight to hold realtime near 8 ms a token)"
            )
        else:
            target = f"Client(slo=SLO(tpot={slo.tpot:g}))"
            print(f"  ({target}: the client keeps less bulk in flight to hold it)")
        stats = client.stats()
        print(f"HTTP batches: {stats.batches_sent} sent, mean size {stats.mean_batch_size:.1f}")
        print(stats)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", help="an OpenAI-compatible base URL (default: start the simulator)"
    )
    parser.add_argument("--bulk", type=int, default=2000, help="bulk prompts to run")
    parser.add_argument(
        "--slo",
        type=float,
        metavar="MS",
        help="a per-token latency target for realtime, in ms (default: none)",
    )
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.bulk, args.slo))
        return
    from llmbatch_server.testing import run_simulator

    with run_simulator("--speed", SIM_SPEED, "--scheduling-policy", "priority") as sim:
        print(f"started the simulator at {sim.base_url} (pid {sim.pid})")
        asyncio.run(main(sim.base_url, args.bulk, args.slo))


if __name__ == "__main__":
    cli()
