"""``llmbatch-server sim``: run the vLLM-compatible simulator."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

from llmbatch_server.launcher.profiles import PROFILES
from llmbatch_server.launcher.server import LauncherError, check_host
from llmbatch_server.sim.app import build_app
from llmbatch_server.sim.config import (
    DEFAULT_MODEL,
    ZERO_LATENCY,
    EngineLimits,
    FaultRates,
    SimConfig,
    StepModel,
    profile_limits,
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sim`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help="run the vLLM-compatible simulator (no GPU needed)",
        description=(
            "Serve vLLM's OpenAI-compatible API from a model of its continuous-batching "
            "engine (defaults fit a 70B model on 4xA100)."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--ready-file", type=Path, help="write the base URL here once listening")
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="balanced",
        help="engine limits of a launcher profile (flags below override)",
    )
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-cache-tokens", type=int, default=400_000)
    p.add_argument("--max-num-queued-reqs", type=int, help="answer 503 past this many waiting")
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"])
    p.add_argument("--speed", type=float, default=1.0, help="divide every modelled time by this")
    p.add_argument("--zero-latency", action="store_true", help="no modelled time at all")
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="require this bearer token (default: $VLLM_API_KEY)",
    )
    p.add_argument("--seed", type=int, default=0)
    faults = p.add_argument_group("fault injection (per HTTP request)")
    faults.add_argument("--error-rate-500", type=float, default=0.0)
    faults.add_argument("--error-rate-429", type=float, default=0.0)
    faults.add_argument("--error-rate-503", type=float, default=0.0)
    faults.add_argument(
        "--drop-rate", type=float, default=0.0, help="close the connection mid-response"
    )
    faults.add_argument(
        "--stream-error-rate",
        type=float,
        default=0.0,
        help="send an error event inside a 200 stream",
    )
    faults.add_argument("--spike-rate", type=float, default=0.0)
    faults.add_argument("--spike-ms", type=float, default=1000.0)
    faults.add_argument("--retry-after", type=float, default=1.0, help="Retry-After on 429")
    faults.add_argument(
        "--poison",
        action="append",
        default=[],
        help="prompts containing this string get a 400 (repeatable)",
    )
    faults.add_argument(
        "--enable-admin",
        action="store_true",
        help="serve /admin/faults to change fault rates at runtime",
    )
    p.add_argument("--log-level", default="warning")
    p.set_defaults(handler=run)
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build a validated SimConfig; raises ValueError with a readable message."""
    limits: dict[str, Any] = profile_limits(args.profile)
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "scheduling_policy"):
        value = getattr(args, name)
        if value is not None:
            limits[name] = value
    if args.speed <= 0:
        raise ValueError("--speed must be > 0")
    step = ZERO_LATENCY if args.zero_latency else StepModel(speed=args.speed)
    return SimConfig(
        model=args.model,
        limits=EngineLimits(
            **limits,
            kv_cache_tokens=max(args.kv_cache_tokens, limits["max_model_len"]),
            max_num_queued_reqs=args.max_num_queued_reqs,
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
    )


def run(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    """Serve until interrupted."""
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        check_host(args.host, args.api_key)
        config = config_from_args(args)
    except (LauncherError, ValueError) as exc:
        print(f"llmbatch-server sim: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    sock = _bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(config),
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    _announce(server, url, args.ready_file, config)
    server.run(sockets=[sock])
    return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _announce(server: Any, url: str, ready_file: Path | None, config: SimConfig) -> None:
    """Print the URL (and write the ready file) once uvicorn has started."""
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets=sockets)
        limits = config.limits
        print(
            f"llmbatch-server sim: serving {config.model!r} at {url} "
            f"(max_num_seqs={limits.max_num_seqs}, policy={limits.scheduling_policy}, "
            f"speed={config.step.speed:g})",
            file=sys.stderr,
            flush=True,
        )
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(url)
            tmp.replace(ready_file)

    server.startup = startup
