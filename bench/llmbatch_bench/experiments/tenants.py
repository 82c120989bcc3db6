"""Tenants: one caller's backlog beside another's work, measured.

    python -m llmbatch_bench.experiments.tenants --json docs/benchmarks/tenants.json
    python -m llmbatch_bench.experiments.tenants --smoke         # ~1 min, for CI (A 4,000, B 200)

Against ``llmbatch-server sim --speed 10 --max-num-seqs 64`` on 127.0.0.1, one client
with default settings, as a new user would have it:

- ``alone``: B's map of ``--b-n`` prompts (``max_tokens=17``) alone, and A's map of
  ``--a-n`` prompts (``max_tokens=16``) alone (A's steady throughput).
- ``no-tenants``, ``tenants``, ``tenants-gathered``: A's map (or, for the last, A as
  ``--a-n`` gathered ``complete()`` calls) and, 1 s later, B's map, in the same tier:
  without tenants, as tenants ``A`` and ``B``. B's time against B alone; every result
  of both exactly once; A's throughput after B is done against A alone.
- ``cap``: a tenant with ``TenantLimits(max_in_flight=4)`` beside one without
  limits, both mapping; the most of its prompts the server ran at once (the
  simulator counts by OpenAI ``user``).
- ``cpu``: the client's CPU per prompt of a map with a tenant (named in
  ``tenants=``, with limits) and without, in alternating turns (a zero-latency
  simulator, so the client's work is what is timed); the least of each side's
  turns (noise only ever adds CPU time), the medians beside them.

The fourth target (a tenant's ``tokens_per_minute`` shared by four processes through
Redis) is ``python -m llmbatch_bench.experiments.shared --parts tenant``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

import llmbatch

__all__ = ["main"]

#: The issue's server: 64 seats, ten times the modelled GPU's speed.
SIM_ARGS = ("--speed", "10", "--max-num-seqs", "64")
#: B starts this long after A.
B_DELAY = 1.0


async def _map_a(
    client: llmbatch.Client, n: int, tenant: str | None, done: list[float]
) -> list[int]:
    """A's map, unordered: each answer's time in ``done``; returns the indexes seen."""
    seen: list[int] = []
    prompts = (f"A {i}: tell me about it." for i in range(n))
    async for index, result in client.map_unordered(prompts, max_tokens=16, tenant=tenant):
        assert result.ok, result.error
        seen.append(index)
        done.append(time.monotonic())
    return seen


async def _gather_a(
    client: llmbatch.Client, n: int, tenant: str | None, done: list[float]
) -> list[int]:
    """A as ``n`` gathered ``complete()`` calls, in B's tier (a map's: batch)."""
    seen: list[int] = []

    async def one(i: int) -> None:
        await client.complete(
            f"A {i}: tell me about it.", max_tokens=16, tenant=tenant, priority="batch"
        )
        seen.append(i)
        done.append(time.monotonic())

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return seen


async def _map_b(client: llmbatch.Client, n: int, tenant: str | None) -> tuple[float, list[int]]:
    started = time.monotonic()
    results = await client.map(
        [f"B {i}: a short one." for i in range(n)], max_tokens=17, tenant=tenant
    )
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    return time.monotonic() - started, [r.index for r in results]


def _rate(done: list[float], start: float, end: float) -> float:
    """Answers per second between ``start`` and ``end``."""
    if end <= start:
        return 0.0
    return sum(start <= t < end for t in done) / (end - start)


async def _alone(base_url: str, a_n: int, b_n: int) -> dict[str, Any]:
    async with llmbatch.Client(base_url) as client:
        b_time, _ = await _map_b(client, b_n, None)
        done: list[float] = []
        started = time.monotonic()
        await _map_a(client, a_n, None, done)
        ended = time.monotonic()
    # Steady throughput: past the first second (the controller opening up), before
    # the last (the tail of the map).
    return {
        "b_seconds": round(b_time, 3),
        "a_seconds": round(ended - started, 3),
        "a_steady_per_s": round(_rate(done, started + B_DELAY, ended - 1.0), 1),
    }


async def _beside(base_url: str, a_n: int, b_n: int, mode: str) -> dict[str, Any]:
    tenant_a, tenant_b = (None, None) if mode == "no-tenants" else ("A", "B")
    a_run = _gather_a if mode == "tenants-gathered" else _map_a
    done: list[float] = []
    out: dict[str, Any] = {}
    async with llmbatch.Client(base_url) as client:
        started = time.monotonic()

        async def run_a() -> None:
            out["a_seen"] = await a_run(client, a_n, tenant_a, done)
            out["a_end"] = time.monotonic()

        async def run_b() -> None:
            await anyio.sleep(B_DELAY)
            out["b_seconds"], out["b_seen"] = await _map_b(client, b_n, tenant_b)
            out["b_end"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_a)
            tg.start_soon(run_b)
    a_seen, b_seen = out.pop("a_seen"), out.pop("b_seen")
    a_end, b_end = out.pop("a_end"), out.pop("b_end")
    return {
        "b_seconds": round(out["b_seconds"], 3),
        "a_seconds": round(a_end - started, 3),
        "a_after_b_per_s": round(_rate(done, b_end + 0.5, a_end - 1.0), 1),
        "every_result_once": sorted(a_seen) == list(range(a_n))
        and sorted(b_seen) == list(range(b_n)),
    }


async def _cap(base_url: str, n: int, user: str) -> dict[str, Any]:
    tenants = {user: llmbatch.TenantLimits(max_in_flight=4)}
    async with (
        llmbatch.Client(base_url, tenants=tenants) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: client.map([f"c {i}" for i in range(n // 4)], tenant=user))
        tg.start_soon(lambda: client.map([f"f {i}" for i in range(n)], tenant=f"{user}-free"))
    return {"capped_prompts": n // 4, "free_prompts": n}


async def _cpu_once(base_url: str, n: int, tenant: str | None) -> float:
    tenants = None if tenant is None else {tenant: llmbatch.TenantLimits(max_in_flight=10**6)}
    async with llmbatch.Client(base_url, tenants=tenants) as client:
        await client.map([f"warm {i}" for i in range(200)], max_tokens=4, tenant=tenant)
        started = time.process_time()
        results = await client.map([f"p {i}" for i in range(n)], max_tokens=4, tenant=tenant)
        spent = time.process_time() - started
    assert all(r.ok for r in results)
    return spent / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.tenants", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--a-n", type=int, default=20_000, help="A's prompts (default 20,000)")
    parser.add_argument("--b-n", type=int, default=200, help="B's prompts (default 200)")
    parser.add_argument("--cpu-n", type=int, default=20_000, help="prompts per CPU turn")
    parser.add_argument("--cpu-turns", type=int, default=9, help="turns of each (default 9)")
    parser.add_argument("--smoke", action="store_true", help="a short run (~1 min, CI)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.smoke:
        args.a_n, args.b_n, args.cpu_n, args.cpu_turns = 4000, 200, 5000, 3
    from llmbatch_server.testing import run_simulator

    results: dict[str, Any] = {
        "command": " ".join(
            ["python -m llmbatch_bench.experiments.tenants", *(argv or sys.argv[1:])]
        ),
        "simulator": " ".join(SIM_ARGS),
    }
    with run_simulator(*SIM_ARGS) as sim:
        results["alone"] = anyio.run(_alone, sim.base_url, args.a_n, args.b_n)
        print("alone", json.dumps(results["alone"]), flush=True)
        for mode in ("no-tenants", "tenants", "tenants-gathered"):
            results[mode] = anyio.run(_beside, sim.base_url, args.a_n, args.b_n, mode)
            print(mode, json.dumps(results[mode]), flush=True)
        user = f"capped-{time.time_ns()}"
        cap = anyio.run(_cap, sim.base_url, 2000, user)
        cap["server_peak_running"] = sim.peak_running(user=user)
        cap["free_server_peak_running"] = sim.peak_running(user=f"{user}-free")
        results["cap"] = cap
        print("cap", json.dumps(cap), flush=True)
    with run_simulator("--zero-latency") as quick:
        none: list[float] = []
        named: list[float] = []
        for _ in range(args.cpu_turns):
            none.append(anyio.run(_cpu_once, quick.base_url, args.cpu_n, None))
            named.append(anyio.run(_cpu_once, quick.base_url, args.cpu_n, "A"))
    results["cpu"] = {
        "prompts": args.cpu_n,
        "no_tenant_us_per_prompt": [round(v, 1) for v in none],
        "tenant_us_per_prompt": [round(v, 1) for v in named],
        "ratio_of_medians": round(statistics.median(named) / statistics.median(none), 3),
        # What a turn costs at least: the client and the simulator share two cores,
        # and whatever else runs only ever adds to a turn's CPU time.
        "ratio_of_minima": round(min(named) / min(none), 3),
    }
    print("cpu", json.dumps(results["cpu"]), flush=True)
    results["table"] = _table(results)
    results["missed"] = _verdicts(results)
    print("\n".join(results["table"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    for line in results["missed"]:
        print("missed:", line)


def _table(results: dict[str, Any]) -> list[str]:
    alone = results["alone"]
    rows = ["| run | B's map (s) | B vs alone | A after B (prompts/s) | vs A alone | each once |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    rows.append(
        f"| alone | {alone['b_seconds']:.2f} | 1.00x | {alone['a_steady_per_s']:,.0f} | "
        "1.00x | yes |"
    )
    for mode in ("no-tenants", "tenants", "tenants-gathered"):
        run = results[mode]
        rows.append(
            f"| {mode} | {run['b_seconds']:.2f} | {run['b_seconds'] / alone['b_seconds']:.2f}x | "
            f"{run['a_after_b_per_s']:,.0f} | "
            f"{run['a_after_b_per_s'] / alone['a_steady_per_s']:.2f}x | "
            f"{'yes' if run['every_result_once'] else 'NO'} |"
        )
    return rows


def _verdicts(results: dict[str, Any]) -> list[str]:
    """The issue's targets that were missed (empty: all met)."""
    missed = []
    alone = results["alone"]
    for mode in ("no-tenants", "tenants", "tenants-gathered"):
        run = results[mode]
        ratio = run["b_seconds"] / alone["b_seconds"]
        if ratio > 3.0:
            missed.append(f"{mode}: B took {ratio:.2f}x its time alone (target <= 3x)")
        if not run["every_result_once"]:
            missed.append(f"{mode}: a result was lost or seen twice")
        after = run["a_after_b_per_s"] / alone["a_steady_per_s"]
        if mode != "no-tenants" and after < 0.95:
            missed.append(f"{mode}: A after B at {after:.1%} of A alone (target >= 95 %)")
    if results["cap"]["server_peak_running"] > 4:
        missed.append(
            f"cap: the server ran {results['cap']['server_peak_running']} of the capped "
            "tenant's prompts at once (target <= 4)"
        )
    ratio = results["cpu"]["ratio_of_minima"]
    if abs(ratio - 1) > 0.10:
        missed.append(f"cpu: a map with a tenant costs {ratio:.2f}x one without (target +-10 %)")
    return missed


if __name__ == "__main__":
    main()
