"""``llmbatch-server vllm``: start vLLM with a tuned profile.

Everything after ``--`` is passed to ``vllm serve`` and wins over the profile.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from llmbatch_server.launcher.profiles import (
    PROFILES,
    build_argv,
    display_command,
    format_client_settings,
    suggested_client_settings,
)
from llmbatch_server.launcher.server import (
    DEFAULT_STARTUP_TIMEOUT,
    LauncherError,
    VLLMServer,
    base_url_for,
    check_bound_host,
    check_host,
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``vllm`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "vllm",
        help="start a real vLLM server with a tuned profile",
        description="Start `vllm serve` with a tuned profile; args after `--` go to vLLM.",
    )
    p.add_argument(
        "--model", required=True, help="model name or local directory to serve (required)"
    )
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="balanced",
        help="engine flags tuned for throughput, latency or between (default: %(default)s)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address; a non-loopback one needs --api-key (default: %(default)s, loopback)",
    )
    p.add_argument("--port", type=int, default=8000, help="port to serve on (default: %(default)s)")
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this bearer token; passed to vLLM as VLLM_API_KEY, never on its "
        "command line (default: none)",
    )
    p.add_argument("--vllm-bin", default=None, help="the vLLM executable (default: `vllm` on PATH)")
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=DEFAULT_STARTUP_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for GET /health to answer 200 (default: %(default)g)",
    )
    p.add_argument(
        "--cpus",
        type=_cpu_list,
        metavar="LIST",
        help="pin vLLM to these CPUs, e.g. 0 or 2-3 or 0,2: its processes run there and its "
        "CPU backend binds its threads there (VLLM_CPU_OMP_THREADS_BIND), so replicas on one "
        "machine do not share cores (default: unpinned)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the vllm command and the client settings, start nothing (default: off)",
    )
    p.set_defaults(handler=run, passes_extra=True)
    return p


def _cpu_list(text: str) -> tuple[int, ...]:
    """``0``, ``2-3``, ``0,2-3`` as the sorted CPUs they name."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CPUs like 0 or 2-3 or 0,2, got {text!r}"
        ) from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"expected CPUs like 0 or 2-3 or 0,2, got {text!r}")
    return tuple(sorted(cpus))


def pin(cpus: tuple[int, ...]) -> None:
    """Run this process, and so the vLLM it starts, on ``cpus`` only."""
    os.sched_setaffinity(0, cpus)
    # vLLM's CPU backend binds its OpenMP threads itself (to every core by default).
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus)


def run(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    """Entry point for ``llmbatch-server vllm``."""
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        check_host(args.host, args.api_key)
        if args.dry_run:
            argv = build_argv(
                model=args.model,
                profile=args.profile,
                host=args.host,
                port=args.port,
                vllm_bin=args.vllm_bin or "vllm",
                extra=extra,
            )
            check_bound_host(argv, args.api_key)
            env = {"VLLM_API_KEY": args.api_key} if args.api_key else None
            print(display_command(argv, env))
            settings = suggested_client_settings(argv)
            print(format_client_settings(settings, base_url_for(args.host, args.port)))
            return 0
        if args.cpus:
            pin(args.cpus)  # before VLLMServer copies the environment
        server = VLLMServer(
            model=args.model,
            profile=args.profile,
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            vllm_bin=args.vllm_bin,
            extra_args=extra,
            startup_timeout=args.startup_timeout,
        )
    except (LauncherError, ValueError, OSError) as exc:
        print(f"llmbatch-server vllm: error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(server))
    except LauncherError as exc:
        print(f"llmbatch-server vllm: error: {exc}", file=sys.stderr)
        return 1


async def _serve(server: VLLMServer) -> int:
    """Start, announce, and run until vLLM exits or we are signalled."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    print(f"starting: {display_command(server.argv, server.env)}", file=sys.stderr)
    start = asyncio.create_task(server.start())
    stop_wait = asyncio.create_task(stopping.wait())
    await asyncio.wait({start, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if not start.done():  # signalled while loading: start() stops on cancel
        start.cancel()
        await asyncio.gather(start, return_exceptions=True)
        await server.stop()
        return 130
    stop_wait.cancel()
    start.result()
    print(f"vLLM ready at {server.base_url}", file=sys.stderr)
    print(format_client_settings(server.client_settings(), server.base_url), file=sys.stderr)
    exited = asyncio.create_task(server.wait())
    stop_wait = asyncio.create_task(stopping.wait())
    await asyncio.wait({exited, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    await server.stop()
    stop_wait.cancel()
    return 0 if stopping.is_set() else (await server.wait())
