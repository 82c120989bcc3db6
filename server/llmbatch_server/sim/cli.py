"""``llmbatch-server sim``: run the vLLM-compatible simulator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llmbatch_server.launcher.server import LauncherError, check_host
from llmbatch_server.sim import options
from llmbatch_server.sim.app import build_app
from llmbatch_server.sim.config import (
    SimConfig,
)
from llmbatch_server.sim.listener import UvicornListener, bind
from llmbatch_server.sim.simulator import Simulator


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sim`` subcommand."""
    p = options.add_parser(subparsers)
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    """Serve until interrupted."""
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        check_host(args.host, args.api_key)
        config = options.config_from_args(args)
        app = build_app(config)
    except (LauncherError, ValueError) as exc:
        print(f"llmbatch-server sim: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    _attach_listener(server, app.state.simulator, host, port)
    _announce(server, url, args.ready_file, config)
    server.run(sockets=[sock])
    return 0


def _attach_listener(server: Any, sim: Simulator, host: str, port: int) -> None:
    """Let outages of mode "refuse" close and re-open this server's socket."""
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets=sockets)
        sim.outage.attach(UvicornListener(server, host, port))

    server.startup = startup


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
