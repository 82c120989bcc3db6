"""``/admin/faults``: read and change fault injection and outages at runtime."""

from __future__ import annotations

import dataclasses

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmbatch_server.sim.errors import ApiError
from llmbatch_server.sim.requests import read_json
from llmbatch_server.sim.simulator import Simulator

#: Admin fields that start an outage rather than set a fault rate.
OUTAGE_FIELDS = ("outage_mode", "outage_seconds")


async def admin_faults(sim: Simulator, request: Request) -> Response:
    """GET the state; POST changes (any fault rate, and/or an outage to start now)."""
    if not sim.config.enable_admin:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    background = None
    outage_state = sim.outage.state()
    if request.method == "POST":
        changes = await read_json(request)
        outage = {name: changes.pop(name) for name in OUTAGE_FIELDS if name in changes}
        try:
            rates = sim.faults.rates.update(**changes)
            planned = _outage(sim, outage)
        except (TypeError, ValueError) as exc:
            raise ApiError(400, str(exc)) from None
        sim.faults.rates = rates
        if planned is not None:
            mode, seconds = planned
            if mode == "refuse" and seconds > 0:
                # Refusing closes every connection, this one included, so it
                # starts once this answer is out.
                background = BackgroundTask(_start_outage, sim, mode, seconds)
                outage_state = {"mode": mode, "remaining": seconds}
            else:
                sim.outage.start(mode, seconds)
                outage_state = sim.outage.state()
    return JSONResponse(
        {
            "rates": dataclasses.asdict(sim.faults.rates),
            "injected": sim.faults.injected,
            "outage": outage_state,
        },
        background=background,
    )


async def _start_outage(sim: Simulator, mode: str, seconds: float) -> None:
    # async, so Starlette runs it on the event loop rather than in a thread.
    sim.outage.start(mode, seconds)


def _outage(sim: Simulator, fields: dict[str, object]) -> tuple[str, float] | None:
    """The validated ``(mode, seconds)`` of an outage request, if there is one."""
    if not fields:
        return None
    mode = fields.get("outage_mode", "503")
    seconds = fields.get("outage_seconds", 0.0)
    if not isinstance(mode, str):
        raise ValueError(f"outage_mode must be a string, got {mode!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"outage_seconds must be a number >= 0, got {seconds!r}")
    if mode == "refuse" and not sim.outage.refusing_possible:
        raise ValueError("outage mode 'refuse' needs the llmbatch-server sim command")
    if mode not in ("503", "refuse"):
        raise ValueError(f"outage_mode must be '503' or 'refuse', got {mode!r}")
    return mode, float(seconds)
