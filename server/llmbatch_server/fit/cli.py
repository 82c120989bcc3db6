"""``llmbatch-server fit --url URL -o FIT.json``: fit the simulator to a running server."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from typing import Any

import httpx

from llmbatch_server.fit.measure import Probe, measure
from llmbatch_server.fit.model import Fit, FittedLimits, fit_step


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected integers >= 1")
    return values


_DEFAULT = Probe()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``fit`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "fit",
        help="measure a running vLLM (or any OpenAI-compatible server) for `sim --fitted`",
        description=(
            "Measure a running server from outside (step time against running sequences, "
            "prefill cost per token, TTFT, its limits) and write the simulator's step model "
            "as JSON; `llmbatch-server sim --fitted FILE` then serves like it. Run it on an "
            "otherwise idle server: about a minute on a small CPU model."
        ),
    )
    p.add_argument("--url", required=True, help="the server's base URL, …/v1 (required)")
    p.add_argument("-o", "--output", required=True, metavar="FIT.json", help="write the fit here")
    p.add_argument("--model", help="model to probe (default: the server's first)")
    p.add_argument("--api-key", help="bearer token (default: none)")
    p.add_argument(
        "--sequences",
        type=_ints,
        default=_DEFAULT.sequences,
        help="sequences decoding at once, one probe each; stops at the server's limit "
        "(default: 1,2,4,8,16,32,64)",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=_DEFAULT.tokens,
        help="output tokens per decode probe (default: 32)",
    )
    p.add_argument(
        "--prompt-lengths",
        type=_ints,
        default=_DEFAULT.prompt_lengths,
        help="prompt tokens of the prefill probes, below half the context (default: 16,256,1024)",
    )
    p.add_argument(
        "--repeat", type=int, default=_DEFAULT.repeat, help="prefill probes per length (default: 3)"
    )
    p.set_defaults(handler=run, passes_extra=False)
    return p


def run(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    """Entry point for ``llmbatch-server fit``."""
    if args.tokens < 3 or args.repeat < 1:
        parser.error("--tokens must be >= 3 and --repeat >= 1")
    probe = Probe(
        sequences=args.sequences,
        tokens=args.tokens,
        prompt_lengths=args.prompt_lengths,
        repeat=args.repeat,
    )
    try:
        fit = fit_server(args.url, probe, api_key=args.api_key, model=args.model)
    except (httpx.HTTPError, ValueError, RuntimeError) as exc:
        print(f"llmbatch-server fit: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    fit.save(args.output)
    print(describe(fit))
    print(f"written to {args.output}; serve like it: llmbatch-server sim --fitted {args.output}")
    return 0


def fit_server(
    url: str, probe: Probe, *, api_key: str | None = None, model: str | None = None
) -> Fit:
    """Measure the server at ``url`` and fit the step model to it."""
    name, measured = asyncio.run(measure(url, probe, api_key=api_key, model=model))
    step, worst = fit_step(
        measured.decode,
        measured.prefill,
        batch_prompts=measured.batch_prompts,
        batch_latency_s=measured.batch_latency_s,
        batch_prompt_tokens=measured.batch_prompt_tokens,
        burst=measured.burst,
        gaps=measured.gaps,
    )
    return Fit(
        model=name,
        step=step,
        limits=measured.limits,
        idle_ttft_s=measured.idle_ttft_s,
        idle_tpot_s=measured.decode[0].tpot_s,
        decode=measured.decode,
        prefill=measured.prefill,
        burst=measured.burst,
        worst_residual=worst,
        url=url,
        measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def describe(fit: Fit) -> str:
    """The fit in a few lines, milliseconds and microseconds as people read them."""
    s = fit.step
    lines = [
        f"model {fit.model}: idle TTFT {fit.idle_ttft_s * 1e3:.1f} ms, "
        f"idle TPOT {fit.idle_tpot_s * 1e3:.2f} ms",
        f"step = {s.base * 1e3:.2f} ms + {s.per_sequence * 1e6:.1f} µs per running sequence "
        f"+ {s.per_prefill_token * 1e6:.2f} µs per prefill token; steps spread "
        f"+-{s.jitter:.0%}",
        f"API server: {s.per_request * 1e3:.2f} ms per request + {s.per_prompt * 1e6:.0f} µs "
        f"per prompt; worst residual {fit.worst_residual:.0%}",
        "decode points: "
        + ", ".join(f"{p.sequences}: {p.tpot_s * 1e3:.2f} ms" for p in fit.decode),
        "prefill points: "
        + ", ".join(f"{p.prompt_tokens} tok: {p.latency_s * 1e3:.1f} ms" for p in fit.prefill),
    ]
    if fit.burst:
        lines.append(
            "bursts of requests: "
            + ", ".join(f"{p.requests}: {p.seconds * 1e3:.1f} ms" for p in fit.burst)
        )
    lines.append(describe_limits(fit.limits))
    return "\n".join(lines)


def describe_limits(limits: FittedLimits) -> str:
    """The limits seen, in words; what the server did not show is named as such."""
    seen = []
    if limits.max_num_seqs is not None:
        seen.append(f"runs at most {limits.max_num_seqs} sequences at once")
    if limits.max_model_len is not None:
        seen.append(f"context {limits.max_model_len:,} tokens")
    if limits.kv_cache_tokens is not None:
        blocks = f" in blocks of {limits.block_size}" if limits.block_size else ""
        seen.append(f"KV cache {limits.kv_cache_tokens:,} tokens{blocks}")
    unseen = []
    if limits.max_num_seqs is None:
        unseen.append("no sequence limit up to the largest probe")
    if limits.kv_cache_tokens is None:
        unseen.append("no KV-cache size (no vLLM cache_config_info in /metrics)")
    text = "limits: " + ("; ".join(seen) if seen else "none shown")
    if unseen:
        text += " (" + "; ".join(unseen) + ")"
    return text
