"""Structured outputs at bulk scale: a ``map`` into a 5-field ``response_model``
against a simulator that answers a share of them with invalid JSON.

    python -m llmbatch_bench.experiments.structured --prompts 10000 --invalid 0.1 --json out.json

Starts a zero-latency simulator (``--invalid-json SHARE``) unless ``--url`` names
a server, then runs, side by side, the same prompts as a plain ``map`` and as a
``map`` with the model, twice each, alternating. Reports the share validated (the
rest must each end in ``StructuredOutputError``: a map never raises for them),
the re-asks, and the client CPU a prompt of each (this process's CPU time: the
server is another process), so the cost of validating and re-asking is the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

import llmbatch
from llmbatch_bench.jobs import prompts

__all__ = ["Profile", "main", "measure"]


class Profile(BaseModel):
    """The 5-field model every prompt is extracted into."""

    name: Annotated[str, Field(min_length=1, max_length=40)]
    age: Annotated[int, Field(ge=0, le=120)]
    city: str
    tags: Annotated[list[str], Field(max_length=3)]
    score: Annotated[float, Field(ge=0.0, le=1.0)]


#: Tokens a plain answer gets: about what a Profile's JSON takes on the simulator.
PLAIN_TOKENS = 24


async def _run(url: str, n: int, structured: bool) -> dict[str, Any]:
    async with llmbatch.Client(url) as client:
        started, cpu = time.perf_counter(), time.process_time()
        if structured:
            results: list[llmbatch.Result[Any]] = await client.map(
                prompts(n), response_model=Profile, max_tokens=200
            )
        else:
            results = await client.map(prompts(n), max_tokens=PLAIN_TOKENS)
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - started
        stats = client.stats()
    ok = sum(r.ok for r in results)
    typed = sum(isinstance(r.error, llmbatch.StructuredOutputError) for r in results)
    return {
        "structured": structured,
        "prompts": n,
        "validated": ok,
        "structured_errors": typed,
        "other_errors": n - ok - typed,
        "reasked": stats.structured.reasked,
        "client_cpu_us_per_prompt": cpu / n * 1e6,
        "wall_s": wall,
    }


async def measure(url: str, n: int, rounds: int = 2) -> dict[str, Any]:
    """Plain and structured maps of ``n`` prompts, alternating, ``rounds`` each."""
    runs = []
    for _ in range(rounds):
        runs.append(await _run(url, n, structured=False))
        runs.append(await _run(url, n, structured=True))
    plain = min(r["client_cpu_us_per_prompt"] for r in runs if not r["structured"])
    schema = min(r["client_cpu_us_per_prompt"] for r in runs if r["structured"])
    return {
        "runs": runs,
        "plain_cpu_us_per_prompt": plain,
        "structured_cpu_us_per_prompt": schema,
        "cpu_ratio": schema / plain,
        "validated_share": min(r["validated"] / n for r in runs if r["structured"]),
    }


@contextlib.contextmanager
def _server(url: str | None, invalid: float) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from llmbatch_server.testing import run_simulator

    with run_simulator("--zero-latency", "--invalid-json", str(invalid)) as sim:
        yield sim.base_url


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.structured", description=__doc__
    )
    p.add_argument("--url", help="a running server (default: start a simulator)")
    p.add_argument("--prompts", type=int, default=10_000, help="prompts a map (default: 10000)")
    p.add_argument(
        "--invalid", type=float, default=0.1, help="the simulator's invalid share (default: 0.1)"
    )
    p.add_argument("--rounds", type=int, default=2, help="maps of each kind (default: 2)")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    with _server(args.url, args.invalid) as url:
        result = asyncio.run(measure(url, args.prompts, args.rounds))
    result["invalid_share"] = args.invalid
    for run in result["runs"]:
        kind = "structured" if run["structured"] else "plain     "
        print(
            f"{kind} {run['prompts']} prompts: {run['validated']} ok, "
            f"{run['structured_errors']} StructuredOutputError, {run['other_errors']} other, "
            f"{run['reasked']} re-asked, {run['client_cpu_us_per_prompt']:.1f} us CPU a prompt, "
            f"{run['wall_s']:.1f} s"
        )
    structured, plain = result["structured_cpu_us_per_prompt"], result["plain_cpu_us_per_prompt"]
    print(
        f"validated {result['validated_share']:.2%}; client CPU a prompt {structured:.1f} us "
        f"vs {plain:.1f} us plain ({result['cpu_ratio']:.2f}x)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
