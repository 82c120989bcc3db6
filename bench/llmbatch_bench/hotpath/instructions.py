"""Client instructions a call or a prompt, counted by valgrind: a measure that a
noisy machine does not move.

``python -m llmbatch_bench.hotpath.instructions`` runs each client program twice under
``valgrind --tool=cachegrind --cache-sim=no``, once with ``--n1`` and once with
``--n2`` calls (or prompts), against a zero-latency simulator, and divides the
difference of the two instruction counts by the difference of the two sizes: what
the process does once (start, imports, connecting, a warm-up) cancels out, and what
is left is the client's own instructions a call. Only the client process is counted;
the server runs outside valgrind.

Two pairs, each llmbatch beside its reference from the hot-path scenarios
(docs/benchmarks.md, "Overhead" and "Single"):

- ``single``: one ``complete(priority="realtime", max_tokens=1)`` at a time, against
  ``raw``: one aiohttp request at a time with the same body.
- ``map``: ``map`` of prompts, 64 a request, 256 in flight, every result's usage read,
  against ``probe``: raw aiohttp, 64 prompts a request, four requests in flight.

CPU time on a shared two-core machine moves by 10-30 % from run to run; these counts
move by about 0.1 %, so a change of a few percent in the client's own work shows,
where a timed A/B needs many rounds to tell it from noise. They count instructions,
not time: a cache miss or a system call's wait is not in them (the timed scenarios
remain the measure of record).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

import llmbatch
from llmbatch_bench.jobs import prompts
from llmbatch_bench.server import discover, simulator
from llmbatch_bench.tables import num, table

__all__ = ["Count", "client_timeout", "instructions_of", "main", "measure", "per_unit"]

#: Calls (or prompts) each program makes before the counted ones, in both runs.
WARMUP = {"single": 50, "raw": 50, "map": 1000, "probe": 1000}
#: The pairs, each llmbatch's program and the reference it is compared with.
PAIRS = {"single": "raw", "map": "probe"}
#: The bench's own settings for the overhead scenario: 64 prompts a request, 256 in
#: flight (four requests of the probe).
BATCH = 64
IN_FLIGHT = 256
_TIMEOUT = aiohttp.ClientTimeout(total=600)
_JSON = {"Content-Type": "application/json"}
_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


# -- the client programs (run in the measured process) -------------------------------


async def _single(url: str, model: str, n: int, timeout: llmbatch.Timeout) -> None:
    async with llmbatch.Client(url, model=model, timeout=timeout) as client:
        for text in prompts(WARMUP["single"] + n):
            await client.complete(text, priority="realtime", max_tokens=1)


async def _raw(url: str, model: str, n: int, timeout: llmbatch.Timeout) -> None:
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for text in prompts(WARMUP["raw"] + n):
            body = json.dumps({"model": model, "prompt": text, "max_tokens": 1})
            async with session.post(url + "/completions", data=body, headers=_JSON) as response:
                json.loads(await response.read())


async def _map(url: str, model: str, n: int, timeout: llmbatch.Timeout) -> None:
    policy = llmbatch.BatchPolicy(max_batch_size=BATCH, max_wait=0.05)
    limits = llmbatch.Limits(max_in_flight=IN_FLIGHT, reserved_realtime=0)
    async with llmbatch.Client(
        url, model=model, batching={"batch": policy}, limits=limits, timeout=timeout
    ) as client:
        for size in (WARMUP["map"], n):
            results = await client.map(prompts(size), priority="batch", max_tokens=1)
            _ = sum(r.unwrap().usage.completion_tokens for r in results)  # as a caller would


async def _probe(url: str, model: str, n: int, timeout: llmbatch.Timeout) -> None:
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:

        async def worker(inputs: Iterator[str]) -> None:
            while chunk := list(itertools.islice(inputs, BATCH)):
                body = json.dumps({"model": model, "prompt": chunk, "max_tokens": 1})
                async with session.post(url + "/completions", data=body, headers=_JSON) as r:
                    _ = json.loads(await r.read())["usage"]["completion_tokens"]

        for size in (WARMUP["probe"], n):
            inputs = prompts(size)
            await asyncio.gather(*(worker(inputs) for _ in range(IN_FLIGHT // BATCH)))


PROGRAMS: dict[str, Callable[[str, str, int, llmbatch.Timeout], Coroutine[Any, Any, None]]] = {
    "single": _single,
    "raw": _raw,
    "map": _map,
    "probe": _probe,
}


# -- counting ------------------------------------------------------------------------


def instructions_of(valgrind_output: str) -> int:
    """The ``I refs`` total cachegrind prints at the end of a run."""
    found = _IREFS.search(valgrind_output)
    if found is None:
        raise ValueError("no 'I refs' line in valgrind's output:\n" + valgrind_output[-2000:])
    return int(found.group(1).replace(",", ""))


def per_unit(small: int, large: int, n1: int, n2: int) -> float:
    """Instructions a call: the difference of two runs over the difference of sizes."""
    if n2 <= n1:
        raise ValueError(f"--n2 ({n2}) must be larger than --n1 ({n1})")
    return (large - small) / (n2 - n1)


def _count(valgrind: str, program: str, url: str, model: str, n: int, read_timeout: str) -> int:
    argv = [
        valgrind,
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "llmbatch_bench.hotpath.instructions",
        "--run",
        program,
        "--url",
        url,
        "--model",
        model,
        "--n",
        str(n),
        "--read-timeout",
        read_timeout,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{program} under valgrind failed ({done.returncode}):\n{done.stderr}")
    return instructions_of(done.stderr)


@dataclass(frozen=True, slots=True)
class Count:
    """One program's instructions a call (or prompt), and the two runs behind it."""

    program: str
    n1: int
    n2: int
    instructions_n1: int
    instructions_n2: int
    per_unit: float


def measure(
    programs: Sequence[str],
    *,
    url: str,
    model: str,
    sizes: dict[str, tuple[int, int]],
    read_timeout: str = "default",
    progress: Callable[[str], None] = print,
) -> list[Count]:
    """Count each program at its two sizes (``sizes[program]``); llmbatch's with
    ``Timeout(read=...)`` as ``read_timeout`` says (see :func:`client_timeout`)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("counting instructions needs valgrind (apt-get install valgrind)")
    counts = []
    for program in programs:
        n1, n2 = sizes[program]
        small = _count(valgrind, program, url, model, n1, read_timeout)
        large = _count(valgrind, program, url, model, n2, read_timeout)
        count = Count(program, n1, n2, small, large, per_unit(small, large, n1, n2))
        progress(f"{program}: {count.per_unit:,.0f} instructions a unit ({n1} and {n2})")
        counts.append(count)
    return counts


def client_timeout(read: str) -> llmbatch.Timeout:
    """``Timeout(read=...)`` from ``--read-timeout``: ``default``, ``none`` or seconds."""
    if read == "default":
        return llmbatch.DEFAULT_TIMEOUT
    if read == "none":
        return llmbatch.Timeout(read=None)
    try:
        seconds = float(read)
    except ValueError:
        raise ValueError(f"'default', 'none' or seconds, not {read!r}") from None
    return llmbatch.Timeout(read=seconds)


def render(counts: Sequence[Count]) -> str:
    """One row a pair with either side counted: llmbatch, its reference, the ratio
    and what llmbatch adds (``-`` for a side not counted)."""
    by_name = {c.program: c.per_unit for c in counts}
    rows = []
    for ours, reference in PAIRS.items():
        if ours not in by_name and reference not in by_name:
            continue
        a, b = by_name.get(ours, math.nan), by_name.get(reference, math.nan)
        unit = "call" if ours == "single" else "prompt"
        ratio = num(a / b, 2, suffix="x") if math.isfinite(a + b) else "-"
        rows.append([f"{ours} vs {reference}", unit, num(a), num(b), ratio, num(a - b)])
    return table(["pair", "unit", "llmbatch", "reference", "ratio", "added"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.hotpath.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--programs",
        default="single,raw,map,probe",
        help="which to count, comma-separated (single, raw, map, probe)",
    )
    parser.add_argument("--url", help="a zero-latency server (default: start the simulator)")
    parser.add_argument("--model", help="the model to ask for (default: the server's first)")
    parser.add_argument("--single-n", default="200,1200", help="calls of single and raw: N1,N2")
    parser.add_argument("--map-n", default="2000,12000", help="prompts of map and probe: N1,N2")
    parser.add_argument(
        "--read-timeout",
        default="default",
        help="llmbatch's Timeout.read: 'default', seconds, or 'none' (no read timer: what "
        "aiohttp's timer, reset at every chunk, costs a call)",
    )
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument("--run", choices=sorted(PROGRAMS), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        timeout = client_timeout(args.read_timeout)
    except ValueError as exc:
        parser.error(f"--read-timeout: {exc}")
    if args.run is not None:  # the measured process itself
        asyncio.run(PROGRAMS[args.run](args.url.rstrip("/"), args.model, args.n, timeout))
        return 0
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        parser.error(f"--programs: unknown {unknown}; choose from {sorted(PROGRAMS)}")
    sizes = {}
    for name, flag in (("single", "single_n"), ("map", "map_n")):
        try:
            n1, n2 = (int(v) for v in getattr(args, flag).split(","))
        except ValueError:
            parser.error(f"--{flag.replace('_', '-')} takes two counts, N1,N2")
        if not 0 < n1 < n2:
            parser.error(f"--{flag.replace('_', '-')}: N1 must be positive and below N2")
        sizes[name] = sizes[PAIRS[name]] = (n1, n2)
    with contextlib.ExitStack() as stack:
        if args.url is None:
            info = stack.enter_context(simulator(["--zero-latency"]))
            url, model = info.base_url, args.model or info.model
        else:
            url, model = args.url.rstrip("/"), args.model
            if model is None:
                model = discover(url, None, None).model
        counts = measure(
            programs, url=url, model=model, sizes=sizes, read_timeout=args.read_timeout
        )
    print()
    print(render(counts))
    if args.json is not None:
        report = {
            "url": url,
            "model": model,
            "read_timeout": args.read_timeout,
            "counts": [asdict(c) for c in counts],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
