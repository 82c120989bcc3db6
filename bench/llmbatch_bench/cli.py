"""``llmbatch-bench`` (also ``llmbatch bench``): the benchmark harness's command line.

llmbatch-bench                                  # starts the simulators itself
llmbatch-bench --url http://127.0.0.1:8000/v1   # any OpenAI-compatible server
llmbatch-bench --scenario bulk --n 200 --json out.json
llmbatch-bench --scenario overhead,single,chat  # the hot-path scenarios only
llmbatch-bench --scenario dropin,embed          # openai's client vs the drop-in; embeddings
llmbatch-bench --scenario slo,saturate,outage,control --smoke   # closed loop, short
llmbatch-bench --scenario replicas              # four simulators: routing and failover
llmbatch-bench --scenario frontier --url URL    # static settings swept, the controller judged
llmbatch-bench --scenario hosted                # a provider's limiter: llmbatch vs AsyncOpenAI
llmbatch-bench --scale                          # all, plus 1M prompts through map_unordered
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmbatch_bench import __version__
from llmbatch_bench.config import (
    CLOSED_SIM_ARGS,
    DEFAULT_SIM_ARGS,
    EXTRA_SCENARIOS,
    REPLICAS_SIM_ARGS,
    SCENARIOS,
    SMOKE,
    BenchConfig,
)
from llmbatch_bench.contenders import CONTENDERS

__all__ = ["build_parser", "config_from_args", "main", "run"]

_DEFAULTS = BenchConfig()


def _prefill_cost(text: str) -> float | str:
    """``--slo-prefill-cost``: seconds a prompt token (> 0), or "fit"."""
    if text == "fit":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'fit', got {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def _csv(kind: type, choices: Sequence[str] | None = None, *, allow_empty: bool = False) -> Any:
    def parse(text: str) -> tuple[Any, ...]:
        items = tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        bad = [x for x in items if choices is not None and x not in choices]
        if bad or not (items or allow_empty):
            raise argparse.ArgumentTypeError(f"expected a comma list of {choices or kind}")
        return items

    return parse


def build_parser(prog: str = "llmbatch-bench") -> argparse.ArgumentParser:
    """The bench's own argument parser (``llmbatch bench`` forwards its arguments here)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Run benchmark scenarios against an OpenAI-compatible server (or the bundled "
            "simulator) with llmbatch and the common baselines side by side. Each "
            "measurement runs in its own process; see docs/benchmarks.md."
        ),
    )
    p.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="show the version"
    )
    _configure(p)
    # Error messages name the command the user typed.
    p.set_defaults(prog=prog)
    return p


def _configure(p: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    server = p.add_argument_group("server")
    server.add_argument("--url", help="base URL of an OpenAI-compatible server (…/v1)")
    server.add_argument(
        "--sim",
        nargs="?",
        const=" ".join(DEFAULT_SIM_ARGS),
        metavar="ARGS",
        help="start `llmbatch-server sim ARGS` (the default without --url; "
        f"default ARGS: {' '.join(DEFAULT_SIM_ARGS)!r}; write --sim='--speed 50')",
    )
    server.add_argument(
        "--vllm",
        metavar="MODEL",
        help="start a real vLLM serving MODEL (a name or a local directory) through "
        "`llmbatch-server vllm` for the server and closed-loop scenarios, and count its "
        "API server's and engine's CPU apart; arguments after `--` go to `vllm serve` "
        "(default: off)",
    )
    server.add_argument(
        "--vllm-profile",
        default=d.vllm_profile,
        choices=("latency", "balanced", "throughput"),
        help="the launcher profile for --vllm (default: %(default)s)",
    )
    server.add_argument(
        "--vllm-bin", help="the vLLM executable for --vllm (default: `vllm` on PATH)"
    )
    server.add_argument(
        "--prompts",
        default=d.prompts,
        choices=("standard", "short", "long", "mixed"),
        help="standard prompts (about 40 tokens on a Llama tokenizer), short ones, where "
        "the API server rather than the engine limits, long ones (about 1,000 tokens: "
        "serve with --max-model-len 4096), or a long-tailed mix of the three lengths "
        "(default: %(default)s); the realtime streams of the slo and mixed scenarios "
        "keep standard prompts",
    )
    server.add_argument(
        "--api-key", help="bearer token (default: $LLMBATCH_API_KEY, then $OPENAI_API_KEY)"
    )
    server.add_argument("--model", help="model name (default: the server's first)")
    what = p.add_argument_group("what to run")
    what.add_argument(
        "--scenario",
        action="append",
        type=_csv(str, (*SCENARIOS, "all")),
        help=f"comma list of {', '.join(SCENARIOS)} or all (default: all, which leaves "
        f"out {', '.join(EXTRA_SCENARIOS)}; repeatable)",
    )
    what.add_argument(
        "--clients",
        type=_csv(str, CONTENDERS),
        default=d.contenders,
        help="comma list of clients to compare (default: all installed)",
    )
    what.add_argument("--seed", type=int, default=d.seed)
    bulk = p.add_argument_group("bulk and sweep")
    bulk.add_argument("--n", type=int, default=d.n, help="prompts per bulk run and sweep point")
    bulk.add_argument("--max-tokens", type=int, default=d.max_tokens)
    bulk.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="the baselines' semaphore"
    )
    bulk.add_argument("--sweep", type=_csv(int), default=d.sweep, help="probe concurrencies")
    bulk.add_argument(
        "--sweep-batch", type=int, default=d.sweep_batch, help="prompts per probe request"
    )
    bulk.add_argument(
        "--bulk-rounds",
        type=int,
        default=d.bulk_rounds,
        help="interleaved rounds of the bulk and ceiling scenarios, each client once a "
        "round on prompts of its own; the report adds each client's median and the "
        "targets judge the medians (default: %(default)s)",
    )
    mixed = p.add_argument_group("mixed")
    mixed.add_argument(
        "--realtime-rate", type=float, default=d.realtime_rate, help="Poisson arrivals per second"
    )
    mixed.add_argument("--realtime-duration", type=float, default=d.realtime_duration)
    mixed.add_argument("--realtime-warmup", type=float, default=d.realtime_warmup)
    mixed.add_argument("--realtime-max-tokens", type=int, default=d.realtime_max_tokens)
    mixed.add_argument("--realtime-grace", type=float, default=d.realtime_grace)
    mixed.add_argument("--mixed-n", type=int, help="bulk prompts (default: from capacity)")
    closed = p.add_argument_group(
        "closed loop (slo, saturate, frontier, outage, control)",
        "Judge the admission controller and the breaker on a simulator whose step model "
        "gives the bound; defaults are the full form, --smoke the short one.",
    )
    closed.add_argument(
        "--closed-sim",
        metavar="ARGS",
        help=f"simulator arguments for these scenarios (default: {' '.join(CLOSED_SIM_ARGS)!r})",
    )
    closed.add_argument(
        "--smoke",
        action="store_true",
        help="the short form: each closed-loop and replicas job a few seconds (CI)",
    )
    closed.add_argument(
        "--slo-factor", type=float, help="SLO = this x the idle per-token time (default 3)"
    )
    closed.add_argument("--slo-warmup", type=float, help="seconds of bulk before realtime")
    closed.add_argument(
        "--slo-pace",
        action="store_true",
        default=None,
        help="the SLOs of the slo scenario and the frontier's controller pace bulk for its "
        "prefill: SLO(pace=True) (default: unpaced)",
    )
    closed.add_argument(
        "--slo-prefill-cost",
        type=_prefill_cost,
        metavar="SECONDS|fit",
        help="tell the slo scenario's SLO clients how much a server step grows per prompt "
        "token it prefills (Replica(prefill_seconds_per_token=); llmbatch-server fit "
        "prints it; 'fit': measure it on the server first, with fit's prefill probe); "
        "with --slo-pace, each step's prefill is kept within the SLO's room",
    )
    closed.add_argument("--slo-duration", type=float, help="seconds of realtime arrivals")
    closed.add_argument(
        "--slo-baselines",
        type=_csv(str, CONTENDERS[1:], allow_empty=True),
        help="baselines in the slo scenario (default: aiohttp; '' for none)",
    )
    closed.add_argument("--saturate-n", type=int, help="prompts per saturate run")
    closed.add_argument("--saturate-sweep", type=_csv(int), help="probe concurrencies")
    closed.add_argument("--saturate-rounds", type=int, help="interleaved rounds (median)")
    closed.add_argument(
        "--frontier-caps",
        type=_csv(int),
        help="the frontier's static bulk caps, in sequences (default 1,2,4,...,256)",
    )
    closed.add_argument(
        "--frontier-batches",
        type=_csv(int),
        help="the frontier's bulk batch sizes, in prompts (default 8,64)",
    )
    closed.add_argument(
        "--frontier-rounds", type=int, help="alternated rounds of the frontier (medians)"
    )
    closed.add_argument(
        "--frontier-confirm",
        type=int,
        help="more alternated rounds of the controller and the static settings near "
        "the bound, after the grid's (default 2; 0 in --smoke)",
    )
    closed.add_argument(
        "--frontier-warmup", type=float, help="seconds of bulk before each frontier window"
    )
    closed.add_argument(
        "--frontier-duration", type=float, help="seconds of each frontier run's window"
    )
    closed.add_argument(
        "--frontier-rate", type=float, help="the frontier's realtime calls a second (default 2)"
    )
    closed.add_argument(
        "--frontier-slo",
        choices=("both", "tpot"),
        help="the controller's SLO: TTFT and per-token (both, the default) or per-token "
        "alone (tpot: the bound takes the TTFT the client derives from it)",
    )
    closed.add_argument("--outage-n", type=int, help="prompts in each outage map")
    closed.add_argument("--outage-503", type=float, help="seconds of 503 (default 15)")
    closed.add_argument(
        "--outage-restart", type=float, help="seconds from kill to restart (default 20)"
    )
    closed.add_argument(
        "--control-phases",
        type=_csv(float),
        help="seconds of bulk alone, with realtime, of outage, of recovery (default 8,12,6,12)",
    )
    fleet = p.add_argument_group(
        "replicas",
        "One client over several simulators (each job starts its own): throughput "
        "against one, prefix-heavy work against round-robin, a replica killed mid-map, "
        "the SLO across them. Defaults are the full form, --smoke the short one.",
    )
    fleet.add_argument(
        "--replicas-sim",
        metavar="ARGS",
        help=f"each replica's simulator arguments (default: {' '.join(REPLICAS_SIM_ARGS)!r})",
    )
    fleet.add_argument("--replicas", type=int, help="replicas of the fleet (default 4)")
    fleet.add_argument(
        "--replicas-bulk-n", type=int, help="throughput prompts per replica (default 3,000)"
    )
    fleet.add_argument("--replicas-prefix-n", type=int, help="prompts per prefix-heavy run")
    fleet.add_argument("--replicas-prefixes", type=int, help="shared system prompts (default 32)")
    fleet.add_argument(
        "--replicas-prefix-chars", type=int, help="characters of each (default 4,000)"
    )
    fleet.add_argument(
        "--replicas-kv-tokens",
        type=int,
        help="each replica's KV cache in the prefix runs (default: sized from the prompts)",
    )
    fleet.add_argument(
        "--replicas-stream-rate",
        type=float,
        help="streamed requests a second beside the prefix runs (TTFT sample, default 4)",
    )
    fleet.add_argument("--replicas-failover-n", type=int, help="prompts of the failover map")
    fleet.add_argument(
        "--replicas-slo-warmup", type=float, help="seconds of bulk before realtime arrivals"
    )
    fleet.add_argument(
        "--replicas-slo-duration",
        type=float,
        help="seconds of realtime arrivals in the SLO run (0 leaves it out)",
    )
    hosted = p.add_argument_group(
        "hosted",
        "a hosted provider's rate limiter, played by the simulator: llmbatch "
        "beside AsyncOpenAI with openai's retries under a semaphore of 64",
    )
    hosted.add_argument(
        "--hosted-conversations",
        type=int,
        help="chat conversations of each map (default 3,000; --smoke 300)",
    )
    hosted.add_argument("--hosted-rpm", type=int, help="the limiter's requests a minute (6,000)")
    hosted.add_argument("--hosted-tpm", type=int, help="the limiter's tokens a minute (90,000)")
    hosted.add_argument(
        "--hosted-headers",
        choices=("openai", "anthropic", "together"),
        help="whose rate-limit headers the limiter sends (default openai)",
    )
    hot = p.add_argument_group(
        "hot path (overhead, chat, embed, single, burst, dropin, transport, scale)",
        "These run against a zero-latency server and measure llmbatch's own cost.",
    )
    hot.add_argument(
        "--overhead-url",
        help="a zero-latency server (default: start `llmbatch-server sim --zero-latency`)",
    )
    hot.add_argument(
        "--repeat",
        type=int,
        default=d.repeat,
        help="interleaved rounds of each overhead/chat/single/transport measurement; "
        "the report shows the median",
    )
    hot.add_argument(
        "--overhead-n", type=int, default=d.overhead_n, help="prompts per batched measurement"
    )
    hot.add_argument("--overhead-max-tokens", type=int, default=d.overhead_max_tokens)
    hot.add_argument(
        "--overhead-batch",
        type=int,
        default=d.overhead_batch,
        help="prompts per HTTP request, llmbatch and probe alike",
    )
    hot.add_argument(
        "--overhead-in-flight",
        type=int,
        default=d.overhead_in_flight,
        help="prompts in flight, llmbatch and probe alike",
    )
    hot.add_argument("--chat-n", type=int, default=d.chat_n, help="prompts per chat measurement")
    hot.add_argument(
        "--embed-n",
        type=int,
        default=d.embed_n,
        help="texts per embed measurement (embeddings and completions alike)",
    )
    hot.add_argument(
        "--single-n", type=int, default=d.single_n, help="sequential calls per single measurement"
    )
    hot.add_argument("--burst-n", type=int, default=d.burst_n)
    hot.add_argument("--burst-max-tokens", type=int, default=d.burst_max_tokens)
    hot.add_argument(
        "--burst-modes",
        type=_csv(str, ("map", "gather")),
        default=d.burst_modes,
        help="llmbatch's ways in: map, gather (of complete calls, with its bare baseline)",
    )
    hot.add_argument(
        "--burst-baselines",
        type=_csv(str, CONTENDERS[1:], allow_empty=True),
        default=d.burst_baselines,
        help="unbounded gather baselines ('' for none)",
    )
    hot.add_argument("--burst-time-limit", type=float, default=d.burst_time_limit)
    hot.add_argument(
        "--dropin-n",
        type=int,
        default=d.dropin_n,
        help="concurrent completions.create calls of the drop-in scenario's program",
    )
    hot.add_argument(
        "--scale",
        type=int,
        nargs="?",
        const=d.scale_n,
        metavar="N",
        help=f"also run the scale scenario: N prompts (default {d.scale_n:,}) through "
        "map_unordered (takes minutes)",
    )
    hot.add_argument("--scale-time-limit", type=float, default=d.scale_time_limit)
    client = p.add_argument_group("llmbatch settings")
    client.add_argument("--max-in-flight", type=int, help="llmbatch Limits.max_in_flight")
    client.add_argument(
        "--priority-scheduling",
        action=argparse.BooleanOptionalAction,
        help="send vLLM priorities (default: on for the simulator's priority profiles and "
        "a --vllm started with --scheduling-policy priority, as the launcher's profiles are)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, help="write the report as JSON here")
    out.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    out.add_argument("--quiet", action="store_true", help="no progress lines")
    out.add_argument(
        "--in-process",
        action="store_true",
        help="run jobs in this process (debugging: CPU and RSS are then shared)",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` that ``args`` describe."""
    if sum(x is not None for x in (args.url, args.sim, args.vllm)) > 1:
        raise ValueError("--url, --sim and --vllm exclude each other")
    if getattr(args, "vllm_args", ()) and not args.vllm:
        raise ValueError("arguments after `--` go to vLLM: they need --vllm MODEL")
    chosen = {s for group in (args.scenario or [("all",)]) for s in group}
    if "all" in chosen:
        chosen |= {s for s in SCENARIOS if s not in EXTRA_SCENARIOS}
    if args.scale is not None:
        chosen.add("scale")
    scenarios = tuple(s for s in SCENARIOS if s in chosen)
    if "ceiling" in scenarios and not args.vllm:
        raise ValueError(
            "the ceiling scenario runs vLLM's offline LLM.generate with the server's own "
            "engine flags: it needs --vllm MODEL"
        )
    for name in (
        "n",
        "max_tokens",
        "concurrency",
        "sweep_batch",
        "bulk_rounds",
        "repeat",
        "overhead_n",
        "overhead_max_tokens",
        "overhead_batch",
        "overhead_in_flight",
        "chat_n",
        "embed_n",
        "single_n",
        "burst_n",
        "dropin_n",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.overhead_batch > 1024:
        raise ValueError("--overhead-batch must be <= 1024 (vLLM's list-prompt limit)")
    if args.scale is not None and args.scale < 1:
        raise ValueError("--scale must be >= 1")
    closed = _closed(args)
    fleet = _fleet(args)
    if args.vllm:
        from llmbatch_bench.server import check_prompts_fit

        check_prompts_fit(
            args.vllm,
            args.vllm_profile,
            getattr(args, "vllm_args", ()),
            args.prompts,
            args.max_tokens,
        )
    return BenchConfig(
        url=args.url,
        sim_args=tuple(shlex.split(args.sim)) if args.sim is not None else DEFAULT_SIM_ARGS,
        vllm_model=args.vllm,
        vllm_args=tuple(getattr(args, "vllm_args", ())),
        vllm_profile=args.vllm_profile,
        vllm_bin=args.vllm_bin,
        prompts=args.prompts,
        api_key=args.api_key
        or os.environ.get("LLMBATCH_API_KEY")
        or os.environ.get("OPENAI_API_KEY"),
        model=args.model,
        scenarios=scenarios,
        contenders=tuple(args.clients),
        n=args.n,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        sweep=tuple(args.sweep),
        sweep_batch=args.sweep_batch,
        bulk_rounds=args.bulk_rounds,
        realtime_rate=args.realtime_rate,
        realtime_duration=args.realtime_duration,
        realtime_warmup=args.realtime_warmup,
        realtime_max_tokens=args.realtime_max_tokens,
        realtime_grace=args.realtime_grace,
        mixed_n=args.mixed_n,
        repeat=args.repeat,
        overhead_batch=args.overhead_batch,
        overhead_in_flight=args.overhead_in_flight,
        chat_n=args.chat_n,
        embed_n=args.embed_n,
        single_n=args.single_n,
        scale_n=args.scale if args.scale is not None else _DEFAULTS.scale_n,
        scale_time_limit=args.scale_time_limit,
        burst_n=args.burst_n,
        burst_max_tokens=args.burst_max_tokens,
        burst_modes=tuple(args.burst_modes),
        burst_baselines=tuple(args.burst_baselines),
        burst_time_limit=args.burst_time_limit,
        dropin_n=args.dropin_n,
        overhead_n=args.overhead_n,
        overhead_max_tokens=args.overhead_max_tokens,
        overhead_url=args.overhead_url,
        **closed,
        **fleet,
        **_hosted(args),
        max_in_flight=args.max_in_flight,
        priority_scheduling=args.priority_scheduling,
        isolate=not args.in_process,
        seed=args.seed,
    )


def _closed(args: argparse.Namespace) -> dict[str, Any]:
    """The closed-loop fields: given options, else ``--smoke``'s, else the defaults."""
    names = (
        "slo_factor",
        "slo_warmup",
        "slo_duration",
        "slo_baselines",
        "slo_pace",
        "slo_prefill_cost",
        "saturate_n",
        "saturate_sweep",
        "saturate_rounds",
        "outage_n",
        "outage_503",
        "outage_restart",
        "control_phases",
        "frontier_caps",
        "frontier_batches",
        "frontier_rounds",
        "frontier_confirm",
        "frontier_warmup",
        "frontier_duration",
        "frontier_rate",
        "frontier_slo",
    )
    out = {name: _given(args, name) for name in names}
    for name in ("saturate_n", "saturate_rounds", "outage_n", "frontier_rounds"):
        if out[name] < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("frontier_caps", "frontier_batches"):
        if not out[name] or min(out[name]) < 1:
            raise ValueError(f"--{name.replace('_', '-')} takes positive whole numbers")
    for name in (
        "slo_factor",
        "slo_duration",
        "outage_503",
        "outage_restart",
        "frontier_duration",
        "frontier_rate",
    ):
        if not out[name] > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    for name in ("slo_warmup", "frontier_warmup", "frontier_confirm"):
        if out[name] < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    phases = out["control_phases"]
    if len(phases) != 4 or any(x <= 0 for x in phases):
        raise ValueError("--control-phases takes four positive numbers of seconds")
    if args.closed_sim is not None:
        out["closed_sim_args"] = tuple(shlex.split(args.closed_sim))
    return out


def _given(args: argparse.Namespace, name: str) -> Any:
    """An option as given, else ``--smoke``'s value, else the default."""
    value = getattr(args, name)
    if value is None:
        value = SMOKE[name] if args.smoke and name in SMOKE else getattr(_DEFAULTS, name)
    return tuple(value) if isinstance(value, list | tuple) else value


def _hosted(args: argparse.Namespace) -> dict[str, Any]:
    """The hosted fields: given options, else ``--smoke``'s, else the defaults."""
    names = ("hosted_conversations", "hosted_rpm", "hosted_tpm", "hosted_headers")
    out = {name: _given(args, name) for name in names}
    for name in names[:3]:
        if out[name] < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    return out


def _fleet(args: argparse.Namespace) -> dict[str, Any]:
    """The replicas fields: given options, else ``--smoke``'s, else the defaults."""
    names = (
        "replicas",
        "replicas_bulk_n",
        "replicas_prefix_n",
        "replicas_prefixes",
        "replicas_prefix_chars",
        "replicas_kv_tokens",
        "replicas_stream_rate",
        "replicas_failover_n",
        "replicas_slo_warmup",
        "replicas_slo_duration",
    )
    out = {name: _given(args, name) for name in names}
    for name in names[:6]:
        if out[name] is not None and out[name] < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if out["replicas"] < 2:
        raise ValueError("--replicas must be >= 2")
    if not out["replicas_stream_rate"] > 0:
        raise ValueError("--replicas-stream-rate must be > 0")
    if out["replicas_failover_n"] < 2:
        raise ValueError("--replicas-failover-n must be >= 2")
    if out["replicas_slo_warmup"] < 0 or out["replicas_slo_duration"] < 0:
        raise ValueError("--replicas-slo-warmup and --replicas-slo-duration must be >= 0")
    if args.replicas_sim is not None:
        out["replicas_sim_args"] = tuple(shlex.split(args.replicas_sim))
    return out


def run(args: argparse.Namespace) -> int:
    """The ``bench`` handler: run, print the tables, write JSON and plots."""
    from llmbatch_bench.harness import run_bench
    from llmbatch_bench.plots import write_plots
    from llmbatch_bench.report import render, write_json
    from llmbatch_bench.worker import WorkerError

    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"{args.prog}: {exc}", file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        report = run_bench(config, progress)
    except (WorkerError, RuntimeError, OSError) as exc:
        print(f"{args.prog}: {exc}", file=sys.stderr)
        return 1
    print(render(report))
    if args.json:
        write_json(report, args.json)
        progress(f"wrote {args.json}")
    if args.plots:
        written = write_plots(report, args.plots)
        progress(
            f"wrote {len(written)} plot(s) into {args.plots}"
            if written
            else "no plots: install matplotlib (pip install matplotlib)"
        )
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "llmbatch-bench") -> int:
    """``llmbatch-bench``, ``python -m llmbatch_bench`` and ``llmbatch bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` is vLLM's (with --vllm), never the bench's.
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser(prog).parse_args(argv[:split])
    args.vllm_args = argv[split + 1 :]
    return run(args)
