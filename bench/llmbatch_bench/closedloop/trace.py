"""A time series of the closed loop while a job runs: what the client decided and
what the server did.

Every ``interval`` seconds :class:`Trace` takes one row: from ``client.stats()``
the admission controller's bulk limit, realtime reserve, step-time estimate and
breaker state, and each tier's requests in flight and queued; from the server's
``/metrics`` its running and waiting sequences and, from the change of vLLM's
inter-token-latency histogram since the previous row, the step time the server
really had (and tokens generated meanwhile), and this client's requests it held in
its API process (in flight less running and waiting). Rows are plain lists in the JSON
report, so a plot or a later analysis needs nothing but the file.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from llmbatch_bench.metrics import percentile
from llmbatch_bench.server import parse_metrics

__all__ = ["FIELDS", "PlacedCall", "Trace", "column", "place_calls", "window_summary"]

#: One row's columns, in order.
FIELDS = (
    "t",
    "bulk_limit",
    "reserve",
    "step_est",
    "breaker",
    "rt_in_flight",
    "rt_queued",
    "bulk_in_flight",
    "bulk_queued",
    "slo_met",
    "slo_missed",
    "running",
    "waiting",
    "step_real",
    "tokens",
    "api_queue",
)

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_ITL_SUM = "vllm:inter_token_latency_seconds_sum"
_ITL_COUNT = "vllm:inter_token_latency_seconds_count"
_TOKENS = "vllm:generation_tokens_total"
_METRICS = (_RUNNING, _WAITING, _ITL_SUM, _ITL_COUNT, _TOKENS)


class Trace:
    """Rows of :data:`FIELDS`, times in seconds from ``origin`` (``time.monotonic``)."""

    def __init__(self, origin: float, interval: float = 0.2) -> None:
        self.origin = origin
        self.interval = interval
        self.rows: list[list[Any]] = []
        self._last: dict[str, float] | None = None

    def add(self, now: float, stats: Any, server: Mapping[str, float] | None) -> None:
        """One row from a ``client.stats()`` snapshot and a ``/metrics`` reading."""
        s = stats.server
        tiers = {getattr(k, "value", k): v for k, v in stats.tiers.items()}
        rt = tiers.get("realtime")
        bulk = [tiers[k] for k in ("normal", "batch") if k in tiers]
        step_real = tokens = None
        running = waiting = None
        if server:
            running, waiting = server.get(_RUNNING), server.get(_WAITING)
            last = self._last
            if last is not None and _ITL_COUNT in server and _ITL_COUNT in last:
                counted = server[_ITL_COUNT] - last[_ITL_COUNT]
                if counted > 0:
                    step_real = (server[_ITL_SUM] - last[_ITL_SUM]) / counted
                # A restarted server starts its counters again from zero.
                tokens = max(0.0, server.get(_TOKENS, 0.0) - last.get(_TOKENS, 0.0))
            self._last = dict(server)
        rt_in_flight = rt.in_flight if rt else 0
        bulk_in_flight = sum(t.in_flight for t in bulk)
        # This client's requests the server holds in its API process, not yet in its
        # engine (vLLM's gauges count the engine's only; other clients' work lowers it).
        api_queue = (
            max(0.0, rt_in_flight + bulk_in_flight - running - waiting)
            if running is not None and waiting is not None
            else None
        )
        self.rows.append(
            [
                round(now - self.origin, 3),
                s.bulk_limit if s else None,
                s.realtime_reserve if s else None,
                _round(s.step_time) if s else None,
                s.breaker if s else None,
                rt_in_flight,
                rt.queued if rt else 0,
                bulk_in_flight,
                sum(t.queued for t in bulk),
                s.slo_met if s else 0,
                s.slo_missed if s else 0,
                running,
                waiting,
                _round(step_real),
                tokens,
                api_queue,
            ]
        )

    async def run(self, stats: Callable[[], Any], metrics_url: str | None) -> None:
        """Sample until cancelled; ``/metrics`` is read with a client of its own."""
        import httpx

        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                server = None
                if metrics_url is not None:
                    try:
                        server = parse_metrics((await http.get(metrics_url)).text, _METRICS)
                    except httpx.HTTPError:
                        server = None
                self.add(time.monotonic(), stats(), server)
                await asyncio.sleep(self.interval)

    def to_json(self) -> dict[str, Any]:
        return {"fields": list(FIELDS), "interval": self.interval, "rows": self.rows}


def _round(seconds: float | None) -> float | None:
    """Seconds to 0.1 µs: plenty for a step time, and a report a fifth the size."""
    return None if seconds is None else round(seconds, 7)


def column(trace: Mapping[str, Any], name: str) -> list[Any]:
    """One column of a trace's JSON form."""
    k = list(trace["fields"]).index(name)
    return [row[k] for row in trace["rows"]]


def window_summary(trace: Mapping[str, Any], start: float, end: float) -> dict[str, Any]:
    """What the controller did in ``[start, end)`` (seconds from the trace's origin):
    the bulk limit's p10/p50/p90 and range, mean server running, the server's real
    step time and the client's estimate."""
    t = column(trace, "t")
    inside = [i for i, x in enumerate(t) if start <= x < end]

    def values(name: str) -> list[float]:
        col = column(trace, name)
        return [float(col[i]) for i in inside if col[i] is not None and math.isfinite(col[i])]

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    limits = values("bulk_limit")
    return {
        "samples": len(inside),
        "limit_p10": percentile(limits, 10) if limits else None,
        "limit_p50": percentile(limits, 50) if limits else None,
        "limit_p90": percentile(limits, 90) if limits else None,
        "limit_min": min(limits, default=None),
        "limit_max": max(limits, default=None),
        "running_mean": mean(values("running")),
        "waiting_mean": mean(values("waiting")),
        "step_real_mean_s": mean(values("step_real")),
        "step_est_mean_s": mean(values("step_est")),
        "api_queue_mean": mean(values("api_queue")) if "api_queue" in trace["fields"] else None,
    }


class PlacedCall(NamedTuple):
    """A realtime single call and the bulk limit the trace read when it was sent."""

    sent: float
    """Seconds from the trace's origin."""
    latency: float
    limit: int | None
    """The latest row's bulk limit at or before ``sent`` (None: no row yet)."""


def place_calls(trace: Mapping[str, Any], calls: Mapping[str, Any]) -> list[PlacedCall]:
    """A run's realtime single calls (its JSON's ``calls``: sent, in the trace's time,
    and latency), in the order sent, each with the bulk limit in force when it went:
    where a slow call's time came from (the window's first call meets what bulk alone
    left; later ones what the controller made of realtime's answers)."""
    t = column(trace, "t")
    limits = column(trace, "bulk_limit")
    placed = []
    for sent, latency in sorted(calls["rows"]):
        i = bisect.bisect_right(t, sent) - 1
        limit = limits[i] if i >= 0 else None
        placed.append(PlacedCall(sent, latency, None if limit is None else int(limit)))
    return placed
