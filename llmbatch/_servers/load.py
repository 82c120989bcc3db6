"""What a vLLM (or llama.cpp) server says about its load, parsed sans I/O: the
``endpoint-load-metrics`` response header and the ``/metrics`` text (each kind of
server's series are in its module of ``_servers``).

Both are optional (other OpenAI-compatible servers send neither); every parser
returns None for what it cannot read rather than raising, since a malformed load
report must never fail a request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from llmbatch._servers.kinds import METRICS

__all__ = [
    "LOAD_FORMAT_HEADER",
    "LOAD_HEADER",
    "Load",
    "MetricsSample",
    "parse_load_header",
    "parse_metrics",
]

#: Request header asking vLLM for a load report on each non-streaming response.
LOAD_FORMAT_HEADER = ("endpoint-load-metrics-format", "json")
#: The response header that carries it.
LOAD_HEADER = "endpoint-load-metrics"


@dataclass(frozen=True, slots=True)
class Load:
    """A server's queue and cache at one moment (None: not reported)."""

    waiting: int | None = None
    running: int | None = None
    kv_cache_usage: float | None = None
    """KV-cache use, 0 to 1."""


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """One read of ``/metrics``: gauges now, and the running totals of the latency
    histograms (the controller uses the change between two reads)."""

    load: Load
    tpot_sum: float | None = None
    tpot_count: float | None = None
    ttft_sum: float | None = None
    ttft_count: float | None = None
    finished: float | None = None
    """Requests the engine has finished, in all (vLLM's ``request_success_total``)."""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _load_from(values: Mapping[str, object]) -> Load | None:
    waiting = _number(values.get("num_requests_waiting"))
    running = _number(values.get("num_requests_running"))
    kv = _number(values.get("kv_cache_usage_perc", values.get("gpu_cache_usage_perc")))
    if waiting is None and running is None and kv is None:
        return None
    return Load(
        waiting=None if waiting is None else int(waiting),
        running=None if running is None else int(running),
        kv_cache_usage=kv,
    )


def parse_load_header(value: str | None) -> Load | None:
    """The load report in an ``endpoint-load-metrics`` header, in its JSON form.

    Accepts the plain JSON object and ORCA's ``JSON {...}`` prefix, with the metrics
    at the top level or under ``named_metrics``."""
    if not value:
        return None
    text = value.strip()
    if text[:4].upper() == "JSON":
        text = text[4:].strip()
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, Mapping):
        return None
    named = data.get("named_metrics")
    if isinstance(named, Mapping):
        found = _load_from(named)
        if found is not None:
            return found
    return _load_from(data)


#: The series' namespaces, which rule out most lines of a /metrics body at once.
_PREFIXES = tuple({name[: name.index(":") + 1] for name in METRICS})


def parse_metrics(text: str) -> MetricsSample | None:
    """vLLM's (or llama.cpp's) gauges and latency totals from a ``/metrics`` body
    (Prometheus text), summed over label sets (several models or engines); None if
    it has none of them."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        brace = line.find("{")
        if brace > 0:
            name, rest = line[:brace], line[line.find("}", brace) + 1 :].split()
        else:
            name, *rest = line.split()
        key = METRICS.get(name)
        if key is None or not rest:
            continue
        try:
            value = float(rest[0])  # (a timestamp may follow the value)
        except ValueError:
            continue
        if math.isfinite(value):
            found[key] = found.get(key, 0.0) + value
    if not found:
        return None
    if "itl_count" in found:
        found["tpot_sum"], found["tpot_count"] = found.get("itl_sum", 0.0), found["itl_count"]
    waiting, running = found.get("waiting"), found.get("running")
    return MetricsSample(
        load=Load(
            waiting=None if waiting is None else int(waiting),
            running=None if running is None else int(running),
            kv_cache_usage=found.get("kv"),
        ),
        tpot_sum=found.get("tpot_sum"),
        tpot_count=found.get("tpot_count"),
        ttft_sum=found.get("ttft_sum"),
        ttft_count=found.get("ttft_count"),
        finished=found.get("finished"),
    )
