"""The server's own gauges over time under a saturating map: how its queue and its
running batch behave, sampled the way a scraper sees them.

    python -m llmbatch_bench.experiments.gauges --url http://127.0.0.1:8000/v1 --json gauges.json

Runs an llmbatch ``map`` of the bench's prompts with no SLO (the client keeps the
server full), and reads ``/metrics`` every ``--interval`` (50 ms) for ``--seconds``
(30) after a warm-up: ``vllm:num_requests_waiting`` and ``vllm:num_requests_running``
(llama.cpp's ``llamacpp:requests_deferred`` and ``requests_processing`` where those
are what it has). Prints and writes their mean and p90, and writes every read
(``series``: seconds into the sampling, then each gauge), so the simulator fitted
to an engine can be held against the engine itself (docs/simulator.md). A run's
queue comes and goes in waves and runs differ: ``--rounds 3`` pools three runs'
reads into one summary, each run's own kept beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

import llmbatch
from llmbatch_bench.jobs import prompts

__all__ = ["gauge_values", "main", "pool", "summarize"]

#: Each gauge and the names servers give it, most common first.
GAUGES: Mapping[str, tuple[str, ...]] = {
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
    "running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
}
#: A read in ``series``: seconds into the sampling, then each gauge.
FIELDS = ("t", *GAUGES)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def gauge_values(text: str) -> dict[str, float]:
    """``waiting`` and ``running`` from a ``/metrics`` body (summed over label sets:
    one per model); a gauge the body lacks is left out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, value = match.group(1), match.group(3)
        for gauge, names in GAUGES.items():
            if name in names:
                with contextlib.suppress(ValueError):
                    found[gauge] = found.get(gauge, 0.0) + float(value)
    return found


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Mean and p90 (nearest rank) of one gauge's samples."""
    if not samples:
        return {"mean": math.nan, "p90": math.nan}
    ordered = sorted(samples)
    rank = max(0, math.ceil(0.9 * len(ordered)) - 1)
    return {"mean": statistics.fmean(ordered), "p90": ordered[rank]}


async def measure(
    url: str, *, seconds: float, interval: float, warmup: float, max_tokens: int
) -> dict[str, Any]:
    parts = urlsplit(url)
    metrics_url = f"{parts.scheme}://{parts.netloc}/metrics"
    reads: list[list[float]] = []
    async with llmbatch.Client(url) as client, httpx.AsyncClient(timeout=5) as http:

        async def saturate() -> None:
            async for _ in client.map_unordered(prompts(None), max_tokens=max_tokens):
                pass

        load = asyncio.ensure_future(saturate())
        try:
            await asyncio.sleep(warmup)
            start = time.monotonic()
            tick = start
            while tick - start < seconds:
                values = gauge_values((await http.get(metrics_url)).text)
                reads.append(
                    [
                        round(time.monotonic() - start, 3),
                        *(values.get(gauge, math.nan) for gauge in GAUGES),
                    ]
                )
                tick += interval
                await asyncio.sleep(max(0.0, tick - time.monotonic()))
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    return {
        "url": url,
        "seconds": seconds,
        "interval": interval,
        "max_tokens": max_tokens,
        **_summaries(FIELDS, reads),
        "series": {"fields": list(FIELDS), "reads": reads},
    }


def _summaries(fields: Sequence[str], reads: Sequence[Sequence[float]]) -> dict[str, Any]:
    """``samples`` (reads with a ``running`` gauge) and each gauge's mean and p90
    over the reads that have it (a gauge a read lacked is NaN there)."""
    columns: dict[str, list[float]] = {}
    for gauge in GAUGES:
        at = list(fields).index(gauge)
        columns[gauge] = [read[at] for read in reads if not math.isnan(read[at])]
    return {"samples": len(columns["running"]), **{g: summarize(v) for g, v in columns.items()}}


def pool(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several runs' reads as one series: each gauge's mean and p90 over all of them
    (one run's queue comes and goes in waves, and runs differ), and every run's own
    summary under ``rounds``."""
    if not rounds:
        raise ValueError("pool needs at least one run")
    fields = rounds[0]["series"]["fields"]
    reads = [read for run in rounds for read in run["series"]["reads"]]
    pooled: dict[str, Any] = {
        key: rounds[0][key] for key in ("url", "seconds", "interval", "max_tokens")
    }
    pooled.update(_summaries(fields, reads))
    pooled["rounds"] = [dict(run) for run in rounds]
    return pooled


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.gauges", description=__doc__
    )
    p.add_argument("--url", required=True, help="the server's OpenAI base URL (…/v1)")
    p.add_argument("--seconds", type=float, default=30.0, help="sampling time (default: 30)")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between reads")
    p.add_argument("--warmup", type=float, default=5.0, help="load before sampling (s)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens a bulk prompt makes")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs in a row, each with its own map and warm-up; the summary pools their "
        "reads (default: 1)",
    )
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    runs = []
    for number in range(1, args.rounds + 1):
        run = asyncio.run(
            measure(
                args.url,
                seconds=args.seconds,
                interval=args.interval,
                warmup=args.warmup,
                max_tokens=args.max_tokens,
            )
        )
        runs.append(run)
        if args.rounds > 1:
            print(f"round {number}: " + _line(run))
    result = runs[0] if args.rounds == 1 else pool(runs)
    for gauge in GAUGES:
        s = result[gauge]
        label = "pooled " if args.rounds > 1 else ""
        summary = f"mean {s['mean']:.2f}, p90 {s['p90']:.2f} ({result['samples']} samples)"
        print(f"{label}{gauge}: {summary}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _line(run: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{gauge} mean {run[gauge]['mean']:.2f} p90 {run[gauge]['p90']:.2f}" for gauge in GAUGES
    )


if __name__ == "__main__":
    raise SystemExit(main())
