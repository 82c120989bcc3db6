"""The response cache's targets (#48), measured against the simulator at its fastest
(``--zero-latency``), each as a ratio or count from one run:

    python -m llmbatch_bench.experiments.cache --json out.json

- **cpu**: the client process's CPU (every thread's: the cache's writer included)
  per prompt for a map with no cache, with a fresh cache (every prompt a miss,
  written), and again on the filled one (every prompt a hit), in ``--rounds``
  alternated rounds of ``--cpu-n`` prompts; medians. A hit's cost is the filled run's
  CPU per prompt; a miss adds the fresh run's less the uncached one's.
- **rerun**: a ``--rerun-n`` map run again with a tenth of its prompts new, beside a
  map of only those new prompts (no cache), alternated over ``--rounds``: the prompts
  the server answered (its own counter) and the wall-time ratio; on the simulator at
  its default speed (a server that takes time to answer), and at its fastest, where
  the hits' client CPU is all there is to wait for.
- **twice**: a map at ``temperature=0`` with every prompt twice: prompts answered.
- **processes**: ``--processes`` processes sharing one cache file, ``--per-process``
  prompts each, half of them common to all, started together: warnings (a "database
  is locked" or a file set aside), entries in the file against the distinct prompts,
  wrong answers (against an uncached map), and what the server answered against
  what the processes asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import llmbatch
from llmbatch_server.testing import SimulatorProcess, free_port, run_simulator

__all__ = ["main"]

MAX_TOKENS = 8


async def timed_map(
    url: str, prompts: Sequence[str], cache: Path | None, **params: Any
) -> tuple[float, float, list[llmbatch.Result[Any]]]:
    """(wall seconds, process CPU seconds, results) of one client's map, its opening
    and closing (the cache's last writes) included."""
    wall, cpu = time.perf_counter(), time.process_time()
    async with llmbatch.Client(url, cache=cache) as client:
        results = await client.map(prompts, temperature=0, max_tokens=MAX_TOKENS, **params)
    return time.perf_counter() - wall, time.process_time() - cpu, results


def cpu(sim: SimulatorProcess, n: int, rounds: int, workdir: Path) -> dict[str, Any]:
    per: dict[str, list[float]] = {"none": [], "miss": [], "hit": []}
    # A first client in a process pays for imports and first connections: not measured.
    asyncio.run(timed_map(sim.base_url, [f"cpu warm-up {i}" for i in range(2_000)], None))
    for r in range(rounds):
        fresh = [f"cpu round {r} prompt {i} " + "word " * 20 for i in range(n)]
        other = [f"cpu round {r} other {i} " + "word " * 20 for i in range(n)]
        cache = workdir / f"cpu-{r}.db"
        _, none_cpu, _ = asyncio.run(timed_map(sim.base_url, other, None))
        _, miss_cpu, _ = asyncio.run(timed_map(sim.base_url, fresh, cache))
        _, hit_cpu, results = asyncio.run(timed_map(sim.base_url, fresh, cache))
        assert all(res.from_cache for res in results)
        per["none"].append(none_cpu / n * 1e6)
        per["miss"].append(miss_cpu / n * 1e6)
        per["hit"].append(hit_cpu / n * 1e6)
    medians = {k: statistics.median(v) for k, v in per.items()}
    return {
        "n": n,
        "rounds": rounds,
        "us_per_prompt": per,
        "median_us_per_prompt": medians,
        "hit_us": medians["hit"],
        # Paired by round (the rounds are alternated), then the median.
        "miss_added_us": statistics.median(
            miss - none for miss, none in zip(per["miss"], per["none"], strict=True)
        ),
    }


def rerun(
    url: str,
    fill: Callable[[], AbstractContextManager[SimulatorProcess]],
    serve: Callable[[], AbstractContextManager[SimulatorProcess]],
    n: int,
    rounds: int,
    workdir: Path,
) -> dict[str, Any]:
    """Each round: a map of nine tenths of ``n`` fills a cache on ``fill()``'s server;
    then, on ``serve()``'s (the same port and model: the same cache keys), a map of a
    tenth of ``n`` new prompts alone (no cache) and the whole ``n`` again with another
    tenth new, side by side."""
    old_n = n - n // 10
    rows = []
    for r in range(rounds):
        cache = workdir / f"rerun-{r}-{time.monotonic_ns()}.db"
        old = [f"rerun {r} prompt {i}" for i in range(old_n)]
        with fill():
            asyncio.run(timed_map(url, old, cache))  # the first run
        new = [f"rerun {r} new prompt {i}" for i in range(n // 10)]
        # The same new prompts again would all be hits: the rerun gets its own new ones.
        new_again = [f"rerun {r} newer prompt {i}" for i in range(n // 10)]
        grown = old + new_again
        with serve() as sim:
            order = [("alone", new, None), ("rerun", grown, cache)]
            if r % 2:
                order.reverse()
            measured: dict[str, tuple[float, int, int]] = {}
            for name, prompts, store in order:
                before = sim.finished()
                wall, _, results = asyncio.run(timed_map(url, prompts, store))
                hits = sum(res.from_cache for res in results)
                measured[name] = (wall, sim.finished() - before, hits)
        rows.append(
            {
                "round": r,
                "rerun_prompts": len(grown),
                "new_prompts": len(new_again),
                "server_answered": measured["rerun"][1],
                "hits": measured["rerun"][2],
                "rerun_wall_s": measured["rerun"][0],
                "new_only_wall_s": measured["alone"][0],
                "new_only_server_answered": measured["alone"][1],
                "ratio": measured["rerun"][0] / measured["alone"][0],
            }
        )
    return {
        "n": n,
        "rounds": rows,
        "median_ratio": statistics.median(row["ratio"] for row in rows),
    }


def twice(sim: SimulatorProcess, n: int, workdir: Path) -> dict[str, Any]:
    prompts = [f"twice prompt {i}" for i in range(n)] * 2
    before = sim.finished()
    _, _, results = asyncio.run(timed_map(sim.base_url, prompts, workdir / "twice.db"))
    return {
        "prompts": len(prompts),
        "distinct": n,
        "server_answered": sim.finished() - before,
        "shared": sum(res.from_cache for res in results),
    }


def processes(sim: SimulatorProcess, count: int, per_process: int, workdir: Path) -> dict[str, Any]:
    half = per_process // 2
    common = [f"shared prompt {i}" for i in range(half)]
    files = []
    for p in range(count):
        own = [f"process {p} prompt {i}" for i in range(per_process - half)]
        mixed = [x for pair in zip(common, own, strict=True) for x in pair]
        path = workdir / f"prompts-{p}.json"
        path.write_text(json.dumps(mixed))
        files.append(path)
    cache = workdir / "shared.db"
    before = sim.finished()
    start_at = time.time() + 3.0
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                __spec__.name if __spec__ else __name__,
                "--worker",
                sim.base_url,
                str(cache),
                str(path),
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in files
    ]
    outputs, warnings = [], []
    for worker in workers:
        out, err = worker.communicate(timeout=1800)
        if worker.returncode != 0:
            raise RuntimeError(f"a worker failed: {err[-2000:]}")
        warnings += [line for line in err.splitlines() if "Warning" in line]
        outputs.append(json.loads(out))
    sent = sim.finished() - before
    every = sorted(set(common) | {p for path in files for p in json.loads(path.read_text())})
    _, _, truth = asyncio.run(timed_map(sim.base_url, every, None))
    right = {p: r.text for p, r in zip(every, truth, strict=True)}
    wrong = sum(1 for output in outputs for p, text in output["texts"].items() if right[p] != text)
    check = sim.finished()
    _, _, again = asyncio.run(timed_map(sim.base_url, every, cache))
    missing = sum(1 for r in again if not r.from_cache)
    wrong_in_file = sum(1 for p, r in zip(every, again, strict=True) if r.text != right[p])
    return {
        "processes": count,
        "per_process": per_process,
        "common": half,
        "distinct": len(every),
        "asked": count * per_process,
        "server_answered": sent,
        "hits": sum(o["hits"] for o in outputs),
        "shared_in_flight": sum(o["shared"] for o in outputs),
        "warnings": warnings,
        "write_errors": sum(o["write_errors"] for o in outputs),
        "errors": sum(len(o["errors"]) for o in outputs),
        "wrong_answers": wrong,
        "entries_missing_after": missing,
        "wrong_in_file": wrong_in_file,
        "server_answered_by_check": sim.finished() - check,
        "wall_s": max(o["wall_s"] for o in outputs),
    }


async def worker(url: str, cache: str, prompts: list[str], start_at: str) -> None:
    await asyncio.sleep(max(0.0, float(start_at) - time.time()))
    wall = time.perf_counter()
    async with llmbatch.Client(url, cache=cache) as client:
        results = await client.map(prompts, temperature=0, max_tokens=MAX_TOKENS)
        stats = client.stats()
    wall = time.perf_counter() - wall
    assert stats.cache is not None
    print(
        json.dumps(
            {
                "texts": {p: r.text for p, r in zip(prompts, results, strict=True)},
                "errors": [str(r.error) for r in results if r.error is not None],
                "hits": stats.cache.hits,
                "shared": stats.cache.shared,
                "write_errors": stats.cache.write_errors,
                "wall_s": wall,
            }
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--worker"]:
        url, cache, prompts_file, start_at = args_in[1:5]
        prompts = json.loads(Path(prompts_file).read_text())
        asyncio.run(worker(url, cache, prompts, start_at))
        return 0
    parser = argparse.ArgumentParser(prog="python -m llmbatch_bench.experiments.cache")
    parser.add_argument("--parts", default="cpu,rerun,twice,processes")
    parser.add_argument("--cpu-n", type=int, default=20_000)
    parser.add_argument("--rerun-n", type=int, default=100_000)
    parser.add_argument(
        "--rerun-speed", type=float, default=5.0, help="the timed simulator's --speed"
    )
    parser.add_argument("--twice-n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--per-process", type=int, default=50_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(args_in)
    parts = args.parts.split(",")
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_simulator("--zero-latency", "--max-model-len", "4096") as sim,
    ):
        workdir = Path(tmp)
        if "cpu" in parts:
            report["cpu"] = cpu(sim, args.cpu_n, args.rounds, workdir)
            print(json.dumps(report["cpu"]["median_us_per_prompt"]), file=sys.stderr)
        if "rerun" in parts:
            port = free_port()
            url = f"http://127.0.0.1:{port}/v1"

            def server(*flags: str) -> Callable[[], AbstractContextManager[SimulatorProcess]]:
                return lambda: run_simulator(*flags, "--max-model-len", "4096", port=port)

            fastest = server("--zero-latency")
            timed = server("--speed", str(args.rerun_speed))
            report["rerun"] = rerun(url, fastest, timed, args.rerun_n, args.rounds, workdir)
            report["rerun"]["speed"] = args.rerun_speed
            print(json.dumps(report["rerun"]), file=sys.stderr)
            report["rerun_fastest"] = rerun(
                url, fastest, fastest, args.rerun_n, args.rounds, workdir
            )
            print(json.dumps(report["rerun_fastest"]), file=sys.stderr)
        if "twice" in parts:
            report["twice"] = twice(sim, args.twice_n, workdir)
            print(json.dumps(report["twice"]), file=sys.stderr)
        if "processes" in parts:
            report["processes"] = processes(sim, args.processes, args.per_process, workdir)
            shown = {k: v for k, v in report["processes"].items() if k != "warnings"}
            print(json.dumps(shown), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
