"""The ``llmbatch-server sim`` command line: its options and the config they make."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from llmbatch_server.fit.model import Fit, load_fit
from llmbatch_server.launcher.profiles import PROFILES
from llmbatch_server.sim.config import (
    DEFAULT_MODEL,
    METRICS_LEVELS,
    QUEUE_GAUGES,
    ZERO_LATENCY,
    EngineLimits,
    FaultRates,
    SimConfig,
    StepModel,
    profile_limits,
)
from llmbatch_server.sim.limiter import FAMILIES
from llmbatch_server.sim.outage import MODES, OutagePlan


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sim`` subcommand's options; the caller sets its handler."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help="run the vLLM-compatible simulator (no GPU needed)",
        description=(
            "Serve vLLM's OpenAI-compatible API from a model of its continuous-batching "
            "engine (defaults fit a 70B model on 4xA100)."
        ),
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="bind address (default: 127.0.0.1, loopback)"
    )
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (default: 8000)")
    p.add_argument(
        "--ready-file",
        type=Path,
        help="write the base URL here once listening, one line per replica (default: none)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="run N independent simulators in this process, on ports P, P+1, ... "
        "(or a free port each with --port 0) (default: 1)",
    )
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"served model name (default: {DEFAULT_MODEL})"
    )
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="balanced",
        help="engine limits of a launcher profile; the flags below override (default: balanced)",
    )
    p.add_argument(
        "--fitted",
        metavar="FIT.json",
        help="serve like a measured engine: the step model and limits `llmbatch-server fit` "
        "wrote; the flags below and --speed still apply (default: the 70B/4xA100 model)",
    )
    p.add_argument(
        "--max-num-seqs", type=int, help="sequences running at once (default: from the profile)"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens per engine step, the chunked-prefill budget (default: from the profile)",
    )
    p.add_argument(
        "--max-model-len", type=int, help="context length in tokens (default: from the profile)"
    )
    p.add_argument(
        "--kv-cache-tokens",
        type=int,
        help="KV-cache capacity in tokens, shared by running sequences and cached prefixes "
        "(default: the fit's, else 400000)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV blocks of prompt prefixes already computed, as vLLM V1 does "
        "(default: on)",
    )
    p.add_argument(
        "--block-size", type=int, help="tokens per KV-cache block (default: the fit's, else 16)"
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report the prompt tokens found in the prefix cache as "
        "usage.prompt_tokens_details.cached_tokens, like vLLM's flag (default: off)",
    )
    p.add_argument(
        "--max-num-queued-reqs",
        type=int,
        help="answer 503 past this many waiting sequences (default: unbounded)",
    )
    p.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        help="order of the waiting queue (default: from the profile)",
    )
    p.add_argument(
        "--speed", type=float, default=1.0, help="divide every modelled time by this (default: 1)"
    )
    p.add_argument(
        "--step-base-ms",
        type=float,
        metavar="MS",
        help="a step's fixed cost, modelled ms before --speed (default: the 70B model's "
        "22.25, or the fit's)",
    )
    p.add_argument(
        "--step-per-sequence-ms",
        type=float,
        metavar="MS",
        help="a step's cost per running sequence, modelled ms before --speed (default: "
        "the 70B model's 1.065, or the fit's); with --step-base-ms, a step-model server",
    )
    p.add_argument(
        "--step-jitter",
        type=float,
        metavar="SHARE",
        help="spread each step's time uniformly by this share either way, e.g. 0.3 for "
        "+-30%% (default: the fit's, else 0: every step as modelled)",
    )
    p.add_argument(
        "--preemption",
        action="store_true",
        help="allocate KV blocks as sequences grow and preempt running ones when the "
        "cache is full, as vLLM's scheduler does (default: off: each sequence reserves "
        "its prompt and max_tokens when admitted)",
    )
    p.add_argument(
        "--zero-latency", action="store_true", help="model no time at all (default: off)"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="require this bearer token (default: $VLLM_API_KEY)",
    )
    p.add_argument(
        "--embedding-dim",
        type=int,
        default=384,
        help="length of the vectors /v1/embeddings returns (default: 384)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="count prompt tokens with this Hugging Face tokenizer.json (or a directory "
        "holding one); needs the 'tokenizer' extra (default: a built-in estimate)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seeds output text and fault draws (default: 0)"
    )
    p.add_argument(
        "--queue-gauge",
        choices=QUEUE_GAUGES,
        default="step",
        help="when the running and waiting gauges are read: 'step', as vLLM v1 "
        "publishes them, after each step's scheduling (a step's arrivals never show as "
        "waiting while seats are free); 'live', every request not yet running, a "
        "step's arrivals included (default: %(default)s)",
    )
    p.add_argument(
        "--invalid-json",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="answer this share of structured requests (a JSON schema asked for) with "
        "invalid JSON, each drawn on its own, to exercise a client's re-asks (default: 0)",
    )
    p.add_argument(
        "--max-completion-prompts",
        type=int,
        default=1024,
        metavar="N",
        help="refuse a /v1/completions list of more prompts with a 400, as vLLM's "
        "VLLM_MAX_COMPLETION_PROMPTS does (default: %(default)s, vLLM's)",
    )
    p.add_argument(
        "--no-chat-batch",
        dest="chat_batch",
        action="store_false",
        help="answer 404 on /v1/chat/completions/batch, like vLLM before 0.19 and most "
        "other servers (default: served)",
    )
    p.add_argument(
        "--metrics",
        choices=METRICS_LEVELS,
        default="full",
        help="what /metrics exposes: vLLM's gauges and latency histograms (full), the "
        "gauges alone, as an older vLLM or a filtering proxy (gauges), or nothing: 404, "
        "as most other servers (none) (default: %(default)s)",
    )
    p.add_argument(
        "--no-load-header",
        dest="load_header",
        action="store_false",
        help="send no endpoint-load-metrics header, even when a request asks for one, as "
        "servers other than vLLM (default: sent on request)",
    )
    p.add_argument(
        "--enable-server-load-tracking",
        action="store_true",
        help="count requests in flight for GET /load, like vLLM's flag (default: off)",
    )
    outage = p.add_argument_group("outage (the server unavailable for a while)")
    outage.add_argument(
        "--outage-seconds",
        type=float,
        default=0.0,
        help="length of an outage that starts by itself; 0 for none (default: 0)",
    )
    outage.add_argument(
        "--outage-after",
        type=float,
        default=0.0,
        help="seconds after startup that the outage begins (default: 0)",
    )
    outage.add_argument(
        "--outage-mode",
        choices=list(MODES),
        default="503",
        help="503: every route but /metrics and /admin/faults answers 503; refuse: stop "
        "listening and close all connections, as a restart does (default: 503)",
    )
    faults = p.add_argument_group("fault injection (per HTTP request)")
    for code in ("500", "429", "503"):
        faults.add_argument(
            f"--error-rate-{code}",
            type=float,
            default=0.0,
            help=f"probability of answering {code} (default: 0)",
        )
    faults.add_argument(
        "--drop-rate",
        type=float,
        default=0.0,
        help="probability of closing the connection mid-response (default: 0)",
    )
    faults.add_argument(
        "--stream-error-rate",
        type=float,
        default=0.0,
        help="probability of an error event inside a 200 stream (default: 0)",
    )
    faults.add_argument(
        "--spike-rate", type=float, default=0.0, help="probability of a latency spike (default: 0)"
    )
    faults.add_argument(
        "--spike-ms", type=float, default=1000.0, help="length of a spike in ms (default: 1000)"
    )
    hosted = p.add_argument_group("a hosted provider's rate limiter")
    hosted.add_argument(
        "--rate-limit-rpm",
        type=int,
        help="requests a minute, enforced per second, then 429 (default: no limit)",
    )
    hosted.add_argument(
        "--rate-limit-tpm",
        type=int,
        help="tokens a minute (prompt tokens plus max_tokens), enforced per second "
        "(default: no limit)",
    )
    hosted.add_argument(
        "--rate-limit-headers",
        choices=FAMILIES,
        default="openai",
        help="whose rate-limit headers every answer carries (default: openai)",
    )
    faults.add_argument(
        "--retry-after",
        type=float,
        default=1.0,
        help="Retry-After seconds of injected 429s (default: 1)",
    )
    faults.add_argument(
        "--poison",
        action="append",
        default=[],
        help="prompts containing this string get a 400; repeatable (default: none)",
    )
    faults.add_argument(
        "--enable-admin",
        action="store_true",
        help="serve /admin/faults to change faults at runtime (default: off)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build a validated SimConfig; raises ValueError with a readable message."""
    limits: dict[str, Any] = profile_limits(args.profile)
    limits |= {"kv_cache_tokens": 400_000, "block_size": 16}
    step = StepModel(speed=args.speed)
    if args.speed <= 0:
        raise ValueError("--speed must be > 0")
    fitted: str | None = None
    if args.fitted:
        fit = load_fit(args.fitted)
        step = StepModel(**dataclasses.asdict(fit.step), speed=args.speed)
        limits |= {k: v for k, v in dataclasses.asdict(fit.limits).items() if v is not None}
        fitted = describe_fitted(args.fitted, fit)
    for flag, field_name in (("step_base_ms", "base"), ("step_per_sequence_ms", "per_sequence")):
        value = getattr(args, flag)
        if value is not None:
            if value < 0:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 0")
            step = dataclasses.replace(step, **{field_name: value / 1000})
    if args.step_jitter is not None:
        if not 0 <= args.step_jitter < 1:
            raise ValueError(f"--step-jitter must be in [0, 1), got {args.step_jitter}")
        step = dataclasses.replace(step, jitter=args.step_jitter)
    for name in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "scheduling_policy",
        "kv_cache_tokens",
        "block_size",
    ):
        value = getattr(args, name)
        if value is not None:
            limits[name] = value
    if args.zero_latency:
        step = ZERO_LATENCY
    return SimConfig(
        fitted=fitted,
        model=args.model,
        limits=EngineLimits(
            **(
                limits
                | {"kv_cache_tokens": max(limits["kv_cache_tokens"], limits["max_model_len"])}
            ),
            enable_prefix_caching=args.enable_prefix_caching,
            max_num_queued_reqs=args.max_num_queued_reqs,
            preemption=args.preemption,
        ),
        step=step,
        faults=FaultRates(
            error_500=args.error_rate_500,
            error_429=args.error_rate_429,
            error_503=args.error_rate_503,
            drop=args.drop_rate,
            stream_error=args.stream_error_rate,
            spike=args.spike_rate,
            spike_seconds=args.spike_ms / 1000,
            retry_after=args.retry_after,
            poison=tuple(args.poison),
        ),
        api_key=args.api_key or None,
        enable_admin=args.enable_admin,
        seed=args.seed,
        chat_batch=args.chat_batch,
        rate_limit_rpm=args.rate_limit_rpm,
        rate_limit_tpm=args.rate_limit_tpm,
        rate_limit_headers=args.rate_limit_headers,
        metrics=args.metrics,
        load_header=args.load_header,
        server_load_tracking=args.enable_server_load_tracking,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        tokenizer=args.tokenizer,
        embedding_dim=args.embedding_dim,
        invalid_json=args.invalid_json,
        queue_gauge=args.queue_gauge,
        max_completion_prompts=args.max_completion_prompts,
        outage=OutagePlan(
            mode=args.outage_mode, seconds=args.outage_seconds, after=args.outage_after
        ),
    )


def describe_fitted(path: str, fit: Fit) -> str:
    """``fitted to FILE``: what it was measured on and the step model it gives."""
    where = f" at {fit.url}" if fit.url else ""
    when = f" on {fit.measured_at}" if fit.measured_at else ""
    s = fit.step
    return (
        f"fitted to {path} (model {fit.model!r}{where}{when}): step {s.base * 1e3:.2f} ms "
        f"+ {s.per_sequence * 1e6:.0f} µs a running sequence"
        + (f" (spread +-{s.jitter:.0%})" if s.jitter else "")
        + f", API server {s.per_request * 1e3:.2f} ms a request"
    )
