"""The conformance matrix: the ``slo`` measurement on servers that behave
differently, so the admission controller is judged where it was not tuned.

    python -m llmbatch_bench.experiments.matrix --json docs/benchmarks/matrix.json
    python -m llmbatch_bench.experiments.matrix --smoke          # each row in its short form (CI)
    python -m llmbatch_bench.experiments.matrix --llama-server BIN --llama-model GGUF  # llama.cpp
    python -m llmbatch_bench.experiments.matrix --pace           # SLO(pace=True): bulk paced
    python -m llmbatch_bench.experiments.matrix --pace --prefill-cost  # paced in steps

Each row is the bench's own ``slo`` scenario (realtime 16-token streams at 2/s beside
saturating bulk; SLO = ``factor`` x the idle per-token time) on one simulator mode:

============================  =====================================================
``vllm-full``                 vLLM's gauges, load header and inter-token histogram
``gauges-only``               ``/metrics`` gauges without histograms (older vLLM, proxy)
``nothing``                   no ``/metrics``, no load header (most other servers)
``load-header-only``          the load header alone
``transient-queue``           ``--speed 1 --queue-gauge live``: a real engine's
                              step, whose arrivals a scraper sees waiting although
                              seats are free
                              (realtime at 2/s: the same load on a step ten times
                              as long as the other rows' 20/s)
``step-model``                256 seats, step 10 ms + 1 ms a running sequence, SLO
                              3.2x the one-sequence step
``persistent-queue``          64 seats: bulk beyond them queues on the server
``refusals-503``              64 seats and a queue cap of 8 (vLLM 0.29+'s
                              ``--max-num-queued-reqs``): 503s as backpressure
``loose-slo``                 the SLO 10x the step: bulk should hardly notice it
``jitter``                    every step's time spread uniformly by +-30 %
``preemption``                KV blocks allocated as sequences grow, a cache of
                              3,072 tokens: running sequences are preempted
``long-prompts``              prompts of about 1,000 tokens (``--prompts long``):
                              each admitted prompt's prefill lengthens a step
``llama.cpp``                 llama.cpp's own server, 16 slots, no priority (when
                              ``--llama-server`` and ``--llama-model`` are given)
============================  =====================================================

For each: realtime p99 per-token time over the SLO, bulk over the step model's bound
at that SLO (simulated rows), bulk over its own no-SLO rate, and what the controller
believed (``stats().servers[0].inferences``: seen and dismissed queues, seats).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbatch_bench import provenance
from llmbatch_bench.cli import build_parser, config_from_args
from llmbatch_bench.harness import run_bench
from llmbatch_bench.tables import table

__all__ = ["ROWS", "Row", "main", "summarize_row"]


@dataclass(frozen=True, slots=True)
class Row:
    """One server behaviour: the simulator's arguments and the SLO's factor."""

    name: str
    sim_args: str
    slo_factor: float = 3.0
    what: str = ""
    bench_args: str = ""
    """More arguments for the bench (the realtime load, the prompts)."""


ROWS: tuple[Row, ...] = (
    Row("vllm-full", "--speed 10", what="vLLM's full signals"),
    Row("gauges-only", "--speed 10 --metrics gauges", what="gauges, no histogram"),
    Row("nothing", "--speed 10 --metrics none --no-load-header", what="no load signal"),
    Row("load-header-only", "--speed 10 --metrics none", what="the load header alone"),
    Row(
        "transient-queue",
        "--speed 1 --queue-gauge live",
        what="a real engine's step: arrivals seen waiting",
        bench_args="--realtime-rate 2",
    ),
    Row(
        "step-model",
        "--speed 10 --step-base-ms 10 --step-per-sequence-ms 1",
        slo_factor=3.2,
        what="256 seats, 10 ms + 1 ms a sequence",
    ),
    Row("persistent-queue", "--speed 10 --max-num-seqs 64", what="64 seats"),
    Row(
        "refusals-503",
        "--speed 10 --max-num-seqs 64 --max-num-queued-reqs 8",
        what="64 seats, queue cap 8",
    ),
    Row("loose-slo", "--speed 10", slo_factor=10.0, what="SLO 10x the step"),
    Row("jitter", "--speed 10 --step-jitter 0.3", what="steps spread +-30 %"),
    Row(
        "preemption",
        "--speed 10 --preemption --max-model-len 2048 --kv-cache-tokens 3072",
        what="KV grown and preempted, 3,072 tokens",
    ),
    Row(
        "long-prompts",
        "--speed 10 --max-model-len 4096",
        what="prompts of ~1,000 tokens",
        bench_args="--prompts long",
    ),
)
#: The slo scenario's labels for the runs the matrix reads.
WITH_SLO, WITHOUT_SLO = "llmbatch, SLO", "llmbatch, no SLO"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rows = [r for r in ROWS if not args.rows or r.name in args.rows]
    ran = provenance.code()  # one for every row: this process imports one llmbatch
    print(provenance.describe(ran), file=sys.stderr)
    results = []
    for row in rows:
        print(f"== {row.name}: sim {row.sim_args}, SLO {row.slo_factor:g}x", file=sys.stderr)
        report = run_bench(config_from_args(build_parser().parse_args(_bench_args(row, args))))
        results.append(summarize_row(row.name, row.what, report))
    if args.llama_server and args.llama_model:
        results.append(_llama_cpp(args))
    print(render(results))
    if args.json:
        written = {"smoke": args.smoke, "llmbatch_code": ran, "rows": results}
        Path(args.json).write_text(json.dumps(written, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.matrix", description=__doc__
    )
    p.add_argument("--smoke", action="store_true", help="each row's slo run in its short form")
    p.add_argument("--rows", type=lambda s: s.split(","), help="comma list of rows (default: all)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument(
        "--pace", action="store_true", help="the SLOs pace bulk for its prefill (SLO(pace=True))"
    )
    p.add_argument(
        "--prefill-cost",
        action="store_true",
        help="state each simulated row's prefill cost to the client "
        "(Replica(prefill_seconds_per_token=), as llmbatch-server fit measures it)",
    )
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary, for its row")
    p.add_argument("--llama-model", help="the GGUF it serves")
    return p


def _bench_args(row: Row, args: argparse.Namespace, url: str | None = None) -> list[str]:
    argv = ["--scenario", "slo", "--slo-baselines", "", "--slo-factor", str(row.slo_factor)]
    argv += ["--url", url] if url else ["--closed-sim", row.sim_args]
    argv += row.bench_args.split()
    argv += ["--slo-pace"] if args.pace else []
    if args.prefill_cost and not url:
        argv += ["--slo-prefill-cost", repr(row_prefill_cost(row))]
    return argv + (["--smoke"] if args.smoke else [])


def row_prefill_cost(row: Row) -> float:
    """Seconds a step of ``row``'s simulator grows per prompt token it prefills: the
    step model's cost over the row's ``--speed``."""
    from llmbatch_server.sim.config import StepModel

    words = row.sim_args.split()
    speed = float(words[words.index("--speed") + 1]) if "--speed" in words else 1.0
    return StepModel().per_prefill_token / speed


def _llama_cpp(args: argparse.Namespace) -> dict[str, Any]:
    from llmbatch_server.llama_process import LlamaServerProcess

    row = Row("llama.cpp", "", what="llama.cpp's server, 16 slots, no priority")
    with LlamaServerProcess(args.llama_server, args.llama_model, parallel=16) as server:
        print(f"== {row.name}: {server.base_url}", file=sys.stderr)
        argv = _bench_args(row, args, url=server.base_url)
        argv += ["--realtime-rate", "2", "--realtime-max-tokens", "16"]
        report = run_bench(config_from_args(build_parser().parse_args(argv)))
    return summarize_row(row.name, row.what, report)


def summarize_row(name: str, what: str, report: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers one row is judged by, from the bench's report."""
    runs = {r["label"]: r for r in report["runs"] if r["scenario"] == "slo"}
    ours, free = runs.get(WITH_SLO), runs.get(WITHOUT_SLO)
    extra = ours["extra"] if ours else {}
    slo = extra.get("slo_tpot_s")
    tpot = (ours or {}).get("tpot", {}).get("realtime") or {}
    p99 = tpot.get("p99")
    bound = (extra.get("bound") or {}).get("tokens_per_s")
    rate = ours["output_tokens_per_s"] if ours else math.nan
    free_rate = free["output_tokens_per_s"] if free else math.nan
    return {
        "row": name,
        "what": what,
        "slo_ms": slo * 1e3 if slo else None,
        "p99_ms": p99 * 1e3 if p99 is not None else None,
        "p99_over_slo": p99 / slo if p99 is not None and slo else None,
        "bulk_over_bound": rate / bound if bound else None,
        "bulk_over_no_slo": rate / free_rate if free_rate else None,
        "inferences": extra.get("inferences"),
    }


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    def ratio(value: object) -> str:
        return "-" if value is None else f"{value:.2f}x"

    def ms(value: object) -> str:
        return "-" if value is None else f"{value:.2f}"

    body = [
        [
            r["row"],
            r["what"],
            ms(r["slo_ms"]),
            ms(r["p99_ms"]),
            ratio(r["p99_over_slo"]),
            ratio(r["bulk_over_bound"]),
            ratio(r["bulk_over_no_slo"]),
        ]
        for r in rows
    ]
    headers = ["row", "server", "SLO ms", "rt p99 ms", "p99 / SLO", "bulk / bound", "bulk / no SLO"]
    return table(headers, body)


if __name__ == "__main__":
    raise SystemExit(main())
