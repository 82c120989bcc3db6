"""Run one or more simulators (replicas) under uvicorn in this process.

Each replica is a whole simulated server with its own engine, cache, faults and
admin route, on its own port. One replica runs the way ``uvicorn.Server.run``
does; several share one event loop, and a SIGINT or SIGTERM stops them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from llmbatch_server.sim.config import SimConfig
from llmbatch_server.sim.listener import UvicornListener


@dataclass
class Replica:
    """One simulator: its app, listening socket and address."""

    config: SimConfig
    app: Starlette
    sock: Any  # socket.socket, bound and listening
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


def serve(replicas: list[Replica], *, log_level: str, ready_file: Path | None) -> None:
    """Serve ``replicas`` until SIGINT/SIGTERM; write ``ready_file`` once all listen."""
    shared_loop = len(replicas) > 1
    servers = [_server(r, log_level, shared_loop=shared_loop) for r in replicas]
    started = 0

    def on_started(index: int) -> None:
        nonlocal started
        replica = replicas[index]
        limits = replica.config.limits
        which = f", replica {index + 1}/{len(replicas)}" if len(replicas) > 1 else ""
        fitted = replica.config.fitted
        print(
            f"llmbatch-server sim: serving {replica.config.model!r} at {replica.url} "
            f"(max_num_seqs={limits.max_num_seqs}, policy={limits.scheduling_policy}, "
            f"speed={replica.config.step.speed:g}{which})"
            + (f", {fitted}" if fitted else ", the default model (a 70B on 4xA100)"),
            file=sys.stderr,
            flush=True,
        )
        started += 1
        if started == len(replicas) and ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text("\n".join(r.url for r in replicas))
            tmp.replace(ready_file)

    for index, (replica, server) in enumerate(zip(replicas, servers, strict=True)):
        _after_startup(server, replica, lambda index=index: on_started(index))
    if len(servers) == 1:
        servers[0].run(sockets=[replicas[0].sock])
        return
    loop_factory = getattr(servers[0].config, "get_loop_factory", lambda: None)()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve_all(servers, replicas))


def _server(replica: Replica, log_level: str, *, shared_loop: bool) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        # Several servers in one loop must not each take the signal handlers
        # (the last would win and stop only itself); _serve_all installs one
        # handler for all of them instead.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def install_signal_handlers(self) -> None:  # uvicorn before 0.29
            pass

    server_cls = Server if shared_loop else uvicorn.Server
    return server_cls(
        uvicorn.Config(
            replica.app, log_level=log_level, access_log=False, timeout_graceful_shutdown=2
        )
    )


async def _serve_all(servers: list[Any], replicas: list[Replica]) -> None:
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_all)
    await asyncio.gather(
        *(server.serve(sockets=[r.sock]) for server, r in zip(servers, replicas, strict=True))
    )


def _after_startup(server: Any, replica: Replica, announce: Any) -> None:
    """Once uvicorn listens: let "refuse" outages control the socket, then announce."""
    original = server.startup
    sim = replica.app.state.simulator

    async def startup(sockets: Any = None) -> None:
        await original(sockets=sockets)
        sim.outage.attach(UvicornListener(server, replica.host, replica.port))
        announce()

    server.startup = startup
