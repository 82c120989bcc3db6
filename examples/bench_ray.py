"""Ray Data through llmbatch.ray beside one process's ``SyncClient.map``, same prompts.

    pip install -e '.[ray]'
    python examples/bench_ray.py                           # 100,000 rows, 2 actors
    python examples/bench_ray.py --rows 20000 --json ray.json

It starts its own simulator (``--zero-latency``, so the client side is all there is
to measure, and ``--poison POISON``) on a free port and a local Ray with two CPUs,
then maps the same prompts twice: once with ``SyncClient.map`` in this process
(client start included), once with ``Dataset.map_batches(llmbatch.ray.Completions,
concurrency=2)`` (actor start-up included; ``ray.init`` not). One prompt carries the
poison string, so the server refuses it.

Each run is checked, and the script exits 1 if a check fails: every row comes back
exactly once, the poisoned row (and only it) has its error and no completion, every
other row has a completion. It prints one JSON object (rows/s of each, the ratio)
and writes it with ``--json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import llmbatch
import llmbatch.ray
from llmbatch_server.testing import run_simulator

POISON = "POISON"


def prompts(rows: int, poisoned: int) -> list[str]:
    return [
        f"Summarise ticket {i} {POISON}" if i == poisoned else f"Summarise ticket {i}"
        for i in range(rows)
    ]


def single_process(base_url: str, texts: list[str], max_tokens: int) -> dict[str, Any]:
    started = time.perf_counter()
    with llmbatch.SyncClient(base_url) as client:
        results = client.map(texts, max_tokens=max_tokens)
    elapsed = time.perf_counter() - started
    errors = {i: str(r.error) for i, r in enumerate(results) if r.error is not None}
    answered = sum(1 for r in results if r.value is not None and r.value.text)
    ids = Counter(range(len(results)))
    return _measured(len(texts), elapsed, ids, errors, answered)


def ray_data(
    base_url: str, texts: list[str], max_tokens: int, args: argparse.Namespace
) -> dict[str, Any]:
    # Imported by name: the type check runs where the ray extra may not be installed.
    ray = importlib.import_module("ray")
    pyarrow = importlib.import_module("pyarrow")  # comes with ray[data]; has no types

    table = pyarrow.table({"id": list(range(len(texts))), "prompt": texts})
    ids: Counter[int] = Counter()
    errors: dict[int, str] = {}
    answered = 0
    # Ray Data starts helper actors of its own (stats, autoscaling) on a session's
    # first dataset, ~3 s of CPU on two cores: a session cost, like ray.init, so a
    # tiny dataset pays it before the clock starts. The map's own actors are timed.
    ray.data.range(1).map_batches(lambda batch: batch).materialize()
    first: tuple[float, int] | None = None
    started = time.perf_counter()
    # Blocks of a few batches each, as a file-based read would give: one block is one
    # task on one actor, so a single block would leave the other actor idle.
    step = args.block_rows
    blocks = [table.slice(start, step) for start in range(0, len(texts), step)]
    dataset = ray.data.from_arrow(blocks).map_batches(
        llmbatch.ray.Completions,
        fn_constructor_kwargs={"base_url": base_url, "max_tokens": max_tokens},
        batch_size=args.batch_size,
        **llmbatch.ray.actor_options(
            args.actors, num_cpus=args.num_cpus, calls_per_actor=args.calls_per_actor
        ),
    )
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        if first is None:  # the actors are up and the first block is answered
            first = (time.perf_counter(), len(batch["id"]))
        ids.update(batch["id"].tolist())
        for row, completion, error in zip(
            batch["id"].tolist(), batch["completion"], batch["error"], strict=True
        ):
            if error is not None:
                errors[row] = str(error)
            elif completion:
                answered += 1
    ended = time.perf_counter()
    measured = _measured(len(texts), ended - started, ids, errors, answered)
    assert first is not None
    measured["first_output_s"] = round(first[0] - started, 3)
    measured["after_first_output_rows_per_s"] = round(
        (len(texts) - first[1]) / (ended - first[0]), 1
    )
    return measured


def _measured(
    rows: int, elapsed: float, ids: Counter[int], errors: dict[int, str], answered: int
) -> dict[str, Any]:
    return {
        "rows": rows,
        "seconds": round(elapsed, 3),
        "rows_per_s": round(rows / elapsed, 1),
        "ids_seen": len(ids),
        "ids_repeated": sum(1 for count in ids.values() if count != 1),
        "answered": answered,
        "errors": errors,
    }


def check(name: str, run: dict[str, Any], rows: int, poisoned: int) -> list[str]:
    """What is wrong with a run: rows missing or repeated, a wrong error column."""
    problems = []
    if run["ids_seen"] != rows or run["ids_repeated"]:
        problems.append(f"{name}: {run['ids_seen']} distinct rows, {run['ids_repeated']} repeated")
    if list(run["errors"]) != [poisoned] or POISON not in run["errors"][poisoned]:
        problems.append(f"{name}: errors {dict(list(run['errors'].items())[:3])}")
    if run["answered"] != rows - 1:
        problems.append(f"{name}: {run['answered']} answered of {rows - 1}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--num-cpus", type=float, default=llmbatch.ray.DEFAULT_NUM_CPUS)
    parser.add_argument("--batch-size", type=int, default=llmbatch.ray.DEFAULT_BATCH_SIZE)
    parser.add_argument("--calls-per-actor", type=int, default=2)
    parser.add_argument("--block-rows", type=int, default=5000)
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--json", metavar="PATH", help="also write the result here")
    args = parser.parse_args(argv)
    ray = importlib.import_module("ray")  # by name: see ray_data()

    poisoned = args.rows // 2
    texts = prompts(args.rows, poisoned)
    with run_simulator("--zero-latency", "--poison", POISON) as sim:
        single = single_process(sim.base_url, texts, args.max_tokens)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            distributed = ray_data(sim.base_url, texts, args.max_tokens, args)
        finally:
            ray.shutdown()
    problems = check("single process", single, args.rows, poisoned)
    problems += check("ray data", distributed, args.rows, poisoned)
    result = {
        "rows": args.rows,
        "actors": args.actors,
        "num_cpus": args.num_cpus,
        "batch_size": args.batch_size,
        "max_tokens": args.max_tokens,
        "single_process_rows_per_s": single["rows_per_s"],
        "ray_rows_per_s": distributed["rows_per_s"],
        "ratio": round(distributed["rows_per_s"] / single["rows_per_s"], 3),
        "ray_first_output_s": distributed["first_output_s"],
        "ray_after_first_output_rows_per_s": distributed["after_first_output_rows_per_s"],
        "ratio_after_first_output": round(
            distributed["after_first_output_rows_per_s"] / single["rows_per_s"], 3
        ),
        "poisoned_row_error": distributed["errors"].get(poisoned),
        "checks": problems or "ok",
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
