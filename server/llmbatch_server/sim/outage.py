"""Make the simulated server unavailable for a while.

Two kinds of outage, both ending by themselves:

- ``"503"``: every route answers 503 except ``/metrics`` and ``/admin/faults`` (so
  a test can watch and end it); ``/health`` answers 503 too, as vLLM's does once
  its engine is dead, and as a gateway in front of a server that is down.
  Requests already running finish.
- ``"refuse"``: the server stops listening and closes every open connection, as
  a restarting server does: new connections are refused (a client sees a
  connect error), requests in flight are cut off and their sequences aborted,
  and the prefix cache is lost. Then it listens on the same port again.

Refusing needs a :class:`Listener` (the CLI attaches one for its uvicorn server);
an app embedded without one can only do ``"503"``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from llmbatch_server.sim.errors import ApiError

MODES = ("503", "refuse")
#: Routes a 503 outage leaves up.
_ALWAYS_UP = ("/metrics", "/admin/faults")


@dataclass(frozen=True, kw_only=True)
class OutagePlan:
    """An outage set on the command line: ``seconds`` long, ``after`` seconds in."""

    mode: str = "503"
    seconds: float = 0.0
    after: float = 0.0

    def __post_init__(self) -> None:
        _check(self.mode, self.seconds)
        if self.after < 0:
            raise ValueError("outage start must be >= 0 seconds")


class Listener(Protocol):
    """The part of an HTTP server an outage of mode ``"refuse"`` needs."""

    def stop(self) -> None:
        """Stop listening and close every open connection."""

    async def resume(self) -> None:
        """Listen again on the same address."""


class Outage:
    """The current outage, if any; started by a plan, the admin API or a test."""

    def __init__(self, *, on_restart: Callable[[], None] | None = None) -> None:
        self.mode: str | None = None
        self._until = 0.0
        self._listener: Listener | None = None
        self._pending: tuple[str, float] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._resuming: asyncio.Future[None] | None = None
        self._on_restart = on_restart
        self.count = 0

    @property
    def refusing_possible(self) -> bool:
        return self._listener is not None

    def remaining(self) -> float:
        """Seconds left of the current outage (0 when there is none)."""
        if self.mode is None:
            return 0.0
        return max(0.0, self._until - time.monotonic())

    def unavailable(self) -> bool:
        """Whether routes should answer 503 now."""
        return self.mode == "503" and self.remaining() > 0

    def state(self) -> dict[str, Any] | None:
        if self.mode is None:
            return None
        return {"mode": self.mode, "remaining": round(self.remaining(), 3)}

    def attach(self, listener: Listener) -> None:
        """Give the outage the server's listener; starts an outage that waited for it."""
        self._listener = listener
        if self._pending is not None:
            mode, seconds = self._pending
            self._pending = None
            self.start(mode, seconds)

    def schedule(self, plan: OutagePlan) -> None:
        """Start ``plan`` ``plan.after`` seconds from now (call with a running loop)."""
        if plan.seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        loop.call_later(plan.after, self._start_planned, plan)

    def _start_planned(self, plan: OutagePlan) -> None:
        if plan.mode == "refuse" and self._listener is None:
            self._pending = (plan.mode, plan.seconds)  # the server is not listening yet
            return
        self.start(plan.mode, plan.seconds)

    def start(self, mode: str, seconds: float) -> None:
        """Begin an outage of ``mode`` for ``seconds`` (0 ends the current one)."""
        _check(mode, seconds)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if seconds == 0:
            self._end()
            return
        if mode == "refuse" and self._listener is None:
            raise ValueError("outage mode 'refuse' needs the llmbatch-server sim command")
        loop = asyncio.get_running_loop()
        was_refusing = self.mode == "refuse"
        self.mode = mode
        self._until = time.monotonic() + seconds
        self._timer = loop.call_later(seconds, self._end)
        self.count += 1
        if mode == "refuse" and not was_refusing:
            assert self._listener is not None
            self._listener.stop()
            if self._on_restart is not None:
                self._on_restart()
        elif was_refusing and mode != "refuse":
            self._resume_soon()

    def _end(self) -> None:
        refusing = self.mode == "refuse"
        self.mode = None
        self._timer = None
        if refusing:
            self._resume_soon()

    def _resume_soon(self) -> None:
        if self._listener is not None:
            self._resuming = asyncio.ensure_future(self._resume(self._listener))

    async def _resume(self, listener: Listener) -> None:
        # The port is normally free at once; if another process took it, keep
        # trying rather than leave the server deaf for good.
        delay = 0.05
        while self.mode != "refuse":
            try:
                await listener.resume()
                return
            except OSError as exc:
                print(f"llmbatch-server sim: cannot listen again: {exc}", file=sys.stderr)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


class OutageMiddleware:
    """Answers 503 to everything but the watch-and-control routes during an outage."""

    def __init__(self, app: ASGIApp, outage: Outage) -> None:
        self.app = app
        self.outage = outage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.outage.unavailable() or scope["path"] in _ALWAYS_UP:
            await self.app(scope, receive, send)
            return
        error = ApiError(503, "The server is unavailable (simulated outage)")
        body = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _check(mode: str, seconds: float) -> None:
    if mode not in MODES:
        raise ValueError(f"outage mode must be one of {list(MODES)}, got {mode!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"outage seconds must be a number >= 0, got {seconds!r}")
