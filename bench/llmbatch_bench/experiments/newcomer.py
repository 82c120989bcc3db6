"""The default SLO as a new user meets it (issue #46, item 3), measured.

    python -m llmbatch_bench.experiments.newcomer --json docs/benchmarks/newcomer.json
    python -m llmbatch_bench.experiments.newcomer --smoke     # ~2.5 min, a shorter form

Against ``llmbatch-server sim`` at its default speed (1, the modelled GPU) on
127.0.0.1, one client per run, as a new user would write it:

- ``idle``: a realtime ``complete(max_tokens=16)`` every 0.3 s for ``--seconds``, alone.
- ``mixed``: the same calls beside a saturating ``map_unordered`` (``max_tokens=32``,
  batch tier) started with them: the default client (``slo="auto"``), ``slo=None``,
  and static settings (``Limits(max_in_flight=cap + 8, reserved_realtime=8,
  adaptive=False)``, caps 1 to 256 by doubling). Realtime p50 and p99 against the
  idle p50; bulk prompts a second over the window.
- ``bulk``: a 2,000-prompt ``map`` (``max_tokens=8``) with the default and with
  ``slo=None``, alternated ``--rounds`` times: the default must cost bulk-only work
  nothing.

Targets: realtime p50 <= 3x idle with bulk >= 0.8x the best static setting whose
realtime p50 is within 3x idle; bulk only, the default >= 0.98x ``slo=None``
(medians).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llmbatch
from llmbatch_bench.closedloop.frontier import CAPS, RESERVE

__all__ = ["main"]

#: The issue's server: the simulator at its default speed.
SIM_ARGS = ("--speed", "1")
INTERVAL = 0.3
REALTIME_TOKENS = 16
BULK_TOKENS = 32
#: The targets.
P50_MULTIPLE = 3.0
BULK_SHARE = 0.8
BULK_ONLY_SHARE = 0.98


def static(cap: int) -> dict[str, Any]:
    limits = llmbatch.Limits(max_in_flight=cap + RESERVE, reserved_realtime=RESERVE, adaptive=False)
    return {"slo": None, "limits": limits}


async def _realtime(client: llmbatch.Client, seconds: float) -> list[float]:
    """A realtime call every ``INTERVAL`` seconds for ``seconds``; each one's latency."""
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = time.perf_counter()
        await client.complete(
            f"Realtime {i}: one line, please.",
            priority="realtime",
            max_tokens=REALTIME_TOKENS,
            ignore_eos=True,
        )
        latencies.append(time.perf_counter() - start)

    begin = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for i in itertools.count():
            at = begin + i * INTERVAL
            if at - begin >= seconds:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tg.create_task(one(i))
    return latencies


def _summary(latencies: Sequence[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


async def mixed(url: str, seconds: float, options: dict[str, Any]) -> dict[str, Any]:
    """Realtime calls beside a saturating map, both from one client."""
    answered = 0
    async with llmbatch.Client(url, on_close="cancel", **options) as client:

        async def bulk() -> None:
            nonlocal answered
            prompts = (f"Bulk {i}: summarise the note." for i in itertools.count())
            results = client.map_unordered(
                prompts, max_tokens=BULK_TOKENS, ignore_eos=True, priority="batch"
            )
            async with contextlib.aclosing(results):
                async for _, result in results:
                    answered += result.ok

        task = asyncio.create_task(bulk())
        start = time.perf_counter()
        latencies = await _realtime(client, seconds)
        window = time.perf_counter() - start
        done = answered
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server = client.stats().servers[0]
    return {
        "realtime": _summary(latencies),
        "bulk_prompts_per_s": done / window,
        "slo_auto": server.slo_auto,
        "bulk_limit": server.bulk_limit,
    }


async def idle(url: str, seconds: float) -> dict[str, Any]:
    async with llmbatch.Client(url) as client:
        return {"realtime": _summary(await _realtime(client, seconds))}


async def bulk_only(url: str, n: int, options: dict[str, Any]) -> float:
    """Prompts a second of one ``map`` of ``n`` prompts."""
    async with llmbatch.Client(url, **options) as client:
        start = time.perf_counter()
        results = await client.map(
            [f"Only bulk {i}: a word." for i in range(n)], max_tokens=8, ignore_eos=True
        )
        seconds = time.perf_counter() - start
    assert all(r.ok for r in results)
    return n / seconds


def judge(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The two targets from a report's numbers."""
    bound = P50_MULTIPLE * report["idle"]["realtime"]["p50"]
    runs = report["mixed"]
    ours = runs["default"]
    within = {
        name: run["bulk_prompts_per_s"]
        for name, run in runs.items()
        if name.startswith("static") and run["realtime"]["p50"] <= bound
    }
    best = max(within.items(), key=lambda kv: kv[1], default=None)
    share = ours["bulk_prompts_per_s"] / best[1] if best else None
    p50_ok = ours["realtime"]["p50"] <= bound
    out = [
        {
            "id": "default_realtime_vs_idle",
            "met": p50_ok and (share is None or share >= BULK_SHARE),
            "detail": (
                f"realtime p50 {ours['realtime']['p50'] * 1e3:.0f} ms vs 3x idle "
                f"{bound * 1e3:.0f} ms; bulk {ours['bulk_prompts_per_s']:.1f} prompts/s"
                + (f", {share:.2f}x {best[0]}'s {best[1]:.1f}" if best and share else "")
            ),
        }
    ]
    rates = report["bulk_only"]
    ratio = statistics.median(rates["default"]) / statistics.median(rates["off"])
    out.append(
        {
            "id": "default_bulk_only",
            "met": ratio >= BULK_ONLY_SHARE,
            "detail": f"the default's bulk-only map {ratio:.3f}x slo=None's (medians)",
        }
    )
    return out


async def run(seconds: float, caps: Sequence[int], rounds: int, bulk_n: int) -> dict[str, Any]:
    from llmbatch_server.testing import run_simulator

    report: dict[str, Any] = {"sim_args": list(SIM_ARGS), "seconds": seconds}
    with run_simulator(*SIM_ARGS) as sim:
        url = sim.base_url
        report["idle"] = await idle(url, seconds)
        print(f"idle: {report['idle']}", flush=True)
        settings: dict[str, dict[str, Any]] = {"default": {}, "slo=None": {"slo": None}}
        settings.update({f"static cap {cap}": static(cap) for cap in caps})
        report["mixed"] = {}
        for name, options in settings.items():
            result = await mixed(url, seconds, options)
            report["mixed"][name] = result
            rt = result["realtime"]
            print(
                f"{name}: realtime p50 {rt['p50'] * 1e3:.0f} ms p99 {rt['p99'] * 1e3:.0f} ms; "
                f"bulk {result['bulk_prompts_per_s']:.1f} prompts/s; {result['slo_auto']}",
                flush=True,
            )
        rates: dict[str, list[float]] = {"default": [], "off": []}
        for _ in range(rounds):
            rates["default"].append(await bulk_only(url, bulk_n, {}))
            rates["off"].append(await bulk_only(url, bulk_n, {"slo": None}))
        report["bulk_only"] = rates
        print(f"bulk only: {rates}", flush=True)
    report["targets"] = judge(report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmbatch_bench.experiments.newcomer")
    p.add_argument("--seconds", type=float, default=30.0, help="each run's realtime window")
    p.add_argument("--rounds", type=int, default=2, help="bulk-only rounds, alternated")
    p.add_argument("--bulk-n", type=int, default=2000, help="prompts of the bulk-only map")
    p.add_argument("--caps", default=",".join(map(str, CAPS)), help="static caps to sweep")
    p.add_argument("--smoke", action="store_true", help="20 s windows, caps 16 and 32, 500 prompts")
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)
    caps = tuple(int(x) for x in args.caps.split(","))
    seconds, bulk_n = args.seconds, args.bulk_n
    if args.smoke:
        # The window must outlast the first drain (about 10 s at speed 1) to show
        # what the default does after it.
        seconds, bulk_n, caps = 20.0, 500, (16, 32)
    report = asyncio.run(run(seconds, caps, args.rounds, bulk_n))
    for target in report["targets"]:
        print(f"{target['id']}: {'met' if target['met'] else 'MISSED'}: {target['detail']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
