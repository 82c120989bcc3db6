"""The simulator's listening socket: bound before uvicorn starts, and closed and
re-opened on the same port for an outage of mode ``"refuse"``."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

BACKLOG = 2048


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``0`` picks a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Re-binding the port right after an outage must not wait for TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


class UvicornListener:
    """Stops and resumes a running ``uvicorn.Server``'s listening on one address.

    uvicorn has no API for this, so it uses the pieces its own ``startup`` and
    ``shutdown`` use: ``servers`` (asyncio servers), ``server_state.connections``
    (its protocol objects) and the ``http_protocol_class`` of its config.
    """

    def __init__(self, server: Any, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port

    def stop(self) -> None:
        for listening in self.server.servers:
            listening.close()
        for connection in list(self.server.server_state.connections):
            # close(), not abort(): a response already written (the admin
            # call that started the outage) still reaches its client.
            connection.transport.close()

    async def resume(self) -> None:
        server = self.server
        config = server.config

        def protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            made: asyncio.Protocol = config.http_protocol_class(
                config=config,
                server_state=server.server_state,
                app_state=server.lifespan.state,
                _loop=_loop,
            )
            return made

        sock = bind(self.host, self.port)
        loop = asyncio.get_running_loop()
        listening = await loop.create_server(protocol, sock=sock, backlog=BACKLOG)
        server.servers.append(listening)  # so uvicorn's shutdown closes it too
