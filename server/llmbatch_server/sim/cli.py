"""``llmbatch-server sim``: run the vLLM-compatible simulator (one or more replicas)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from llmbatch_server.launcher.server import LauncherError, check_host
from llmbatch_server.sim import options
from llmbatch_server.sim.app import build_app
from llmbatch_server.sim.listener import bind
from llmbatch_server.sim.serve import Replica, serve


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sim`` subcommand."""
    p = options.add_parser(subparsers)
    p.set_defaults(handler=run, passes_extra=False)
    return p


def run(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    """Serve until interrupted."""
    try:
        check_host(args.host, args.api_key)
        if args.replicas < 1:
            raise ValueError("--replicas must be >= 1")
        config = options.config_from_args(args)
        configs = [dataclasses.replace(config, replica=i) for i in range(args.replicas)]
        apps = [build_app(c) for c in configs]
    except (LauncherError, ValueError) as exc:
        print(f"llmbatch-server sim: {exc}", file=sys.stderr)
        return 2
    replicas: list[Replica] = []
    try:
        for i, (c, app) in enumerate(zip(configs, apps, strict=True)):
            # --port P gives consecutive ports P, P+1, ...; --port 0 a free port each.
            sock = bind(args.host, args.port + i if args.port else 0)
            host, port = sock.getsockname()[:2]
            replicas.append(Replica(config=c, app=app, sock=sock, host=host, port=port))
    except OSError as exc:
        for replica in replicas:
            replica.sock.close()
        print(f"llmbatch-server sim: cannot listen on {args.host}: {exc}", file=sys.stderr)
        return 2
    serve(replicas, log_level=args.log_level, ready_file=args.ready_file)
    return 0
