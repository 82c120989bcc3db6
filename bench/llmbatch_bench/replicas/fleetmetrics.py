"""What every replica of a fleet did while a job ran, read from its ``/metrics``.

:class:`FleetSampler` reads each replica's ``/metrics`` every ``interval`` seconds:
the gauges (running, waiting, KV-cache usage) as a time series, and the counters and
histograms (prefix-cache queries and hits, inter-token latency, time to first token,
requests finished) at the first and the latest reading, so each replica's share of
the job is a difference. A replica that stops answering (killed) keeps its last
reading. :func:`replica_summary` turns one replica's readings into the report's
numbers, :func:`absorbed` times how long the others took to take over a killed
one's share, and :func:`histogram_quantile` reads a percentile off merged
histogram buckets as Prometheus does.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch_bench.closedloop.stepmodel import SimModel
from llmbatch_bench.server import parse_metrics

__all__ = [
    "FleetSampler",
    "absorbed",
    "histogram_quantile",
    "parse_buckets",
    "replica_summary",
]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
_GAUGES = (RUNNING, WAITING, KV_USAGE)
_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_success_total",
    "vllm:generation_tokens_total",
)
TTFT = "vllm:time_to_first_token_seconds"
_LE = re.compile(r'le="([^"]+)"')


class FleetSampler:
    """Gauges over time and counters at both ends, for each replica of a fleet.

    ``rows`` holds one row per reading: ``[t, running_0, ..., running_n-1]`` (None
    where a replica did not answer), ``t`` in seconds from ``origin``.
    """

    def __init__(self, metrics_urls: Sequence[str], interval: float = 0.2) -> None:
        self.urls = list(metrics_urls)
        self.interval = interval
        self.origin = time.monotonic()
        self.rows: list[list[float | None]] = []
        self.waiting: list[list[float]] = [[] for _ in self.urls]
        self.kv_usage: list[list[float]] = [[] for _ in self.urls]
        self.first: list[dict[str, Any] | None] = [None] * len(self.urls)
        self.last: list[dict[str, Any] | None] = [None] * len(self.urls)

    async def read(self) -> None:
        """One reading of every replica at once."""
        import httpx

        async with httpx.AsyncClient(timeout=2.0) as http:
            await self._read(http)

    async def run(self) -> None:
        """Read every ``interval`` seconds until cancelled."""
        import httpx

        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                await self._read(http)
                await asyncio.sleep(self.interval)

    async def _read(self, http: Any) -> None:
        import httpx

        async def one(url: str) -> str | None:
            with contextlib.suppress(httpx.HTTPError):
                response = await http.get(url)
                if response.status_code == 200:
                    return str(response.text)
            return None

        texts = await asyncio.gather(*(one(url) for url in self.urls))
        row: list[float | None] = [round(time.monotonic() - self.origin, 3)]
        for i, text in enumerate(texts):
            if text is None:
                row.append(None)
                continue
            gauges = parse_metrics(text, _GAUGES)
            row.append(gauges.get(RUNNING))
            self.waiting[i].append(gauges.get(WAITING, 0.0))
            self.kv_usage[i].append(gauges.get(KV_USAGE, 0.0))
            reading = {**parse_metrics(text, _COUNTERS), "ttft_buckets": parse_buckets(text, TTFT)}
            if self.first[i] is None:
                self.first[i] = reading
            self.last[i] = reading
        self.rows.append(row)

    def running(self, replica: int) -> list[tuple[float, float]]:
        """``(t, running)`` of one replica, where it answered."""
        col = replica + 1
        return [(float(r[0] or 0.0), float(v)) for r in self.rows if (v := r[col]) is not None]

    def summaries(self, model: SimModel | None) -> list[dict[str, Any]]:
        """:func:`replica_summary` of every replica."""
        return [
            replica_summary(
                self.running(i), self.waiting[i], self.kv_usage[i], self.first[i], self.last[i],
                model,
            )
            for i in range(len(self.urls))
        ]  # fmt: skip

    def ttft_buckets(self) -> list[tuple[float, float]]:
        """The fleet's time-to-first-token histogram over the job: every replica's
        buckets, last reading minus first, summed."""
        merged: dict[float, float] = {}
        for first, last in zip(self.first, self.last, strict=True):
            if first is None or last is None:
                continue
            before = dict(first["ttft_buckets"])
            for le, count in last["ttft_buckets"]:
                merged[le] = merged.get(le, 0.0) + count - before.get(le, 0.0)
        return sorted(merged.items())

    def to_json(self) -> dict[str, Any]:
        return {"interval": self.interval, "rows": self.rows}


def parse_buckets(text: str, name: str) -> list[tuple[float, float]]:
    """A Prometheus histogram's cumulative buckets ``(le, count)``, summed over its
    other labels, ``+Inf`` included."""
    prefix = name + "_bucket{"
    out: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line.rpartition(" ")
        found = _LE.search(labels)
        if found is None:
            continue
        with contextlib.suppress(ValueError):
            le = float(found.group(1))  # "+Inf" parses to inf
            out[le] = out.get(le, 0.0) + float(value)
    return sorted(out.items())


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile (0..1) of cumulative ``buckets``, interpolating linearly
    within the bucket it falls in (Prometheus' ``histogram_quantile``); the highest
    finite bound if it falls in ``+Inf``, None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            width = count - below
            return lower + (le - lower) * ((rank - below) / width if width else 1.0)
        lower, below = le, count
    return lower


def replica_summary(
    running: Sequence[tuple[float, float]],
    waiting: Sequence[float],
    kv_usage: Sequence[float],
    first: Mapping[str, Any] | None,
    last: Mapping[str, Any] | None,
    model: SimModel | None,
) -> dict[str, Any]:
    """One replica over the job: mean running, waiting and KV usage; its prefix-cache
    hit rate (hits / queries, in tokens, over the job); requests finished; its real
    mean step (inter-token latency) and, when the simulator's step model is known,
    that over the model's for the running counts sampled (about 1 when this machine
    keeps the simulator on its model)."""

    def mean(xs: Sequence[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    def delta(name: str) -> float:
        if first is None or last is None:
            return 0.0
        return float(last.get(name, 0.0)) - float(first.get(name, 0.0))

    counts = [n for _, n in running]
    queries, hits = delta(_COUNTERS[0]), delta(_COUNTERS[1])
    itl_sum, itl_count = delta(_COUNTERS[2]), delta(_COUNTERS[3])
    ttft_sum, ttft_count = delta(_COUNTERS[4]), delta(_COUNTERS[5])
    finished = delta(_COUNTERS[6])
    step = itl_sum / itl_count if itl_count else None
    modelled = None
    if model is not None and finished > 0:
        # Prompt tokens each finished request really prefilled (what the cache missed).
        prefilled = max(0.0, queries - hits) / finished
        tuned = SimModel(**{**model.to_json(), "prompt_tokens": round(prefilled)})
        modelled = _token_weighted_step(tuned, counts)
    return {
        "samples": len(counts),
        "running_mean": mean(counts),
        "running_max": max(counts, default=None),
        "waiting_mean": mean(waiting),
        "kv_usage_mean": mean(kv_usage),
        "finished": finished,
        "prefix_queries": queries,
        "prefix_hits": hits,
        "hit_rate": hits / queries if queries else None,
        "ttft_mean_s": ttft_sum / ttft_count if ttft_count else None,
        "step_s": step,
        "step_model_s": modelled,
        "step_vs_model": step / modelled if step and modelled else None,
    }


def _token_weighted_step(model: SimModel, running: Sequence[float]) -> float | None:
    """The mean step a token saw under the model, given the running count at each
    sample: a step of ``n`` makes ``n`` tokens, so it weighs ``n / step(n)`` per
    second (the server's inter-token histogram weighs every token alike)."""
    busy = [n for n in running if n > 0]
    rate = sum(n / model.step_seconds(n) for n in busy)
    return sum(busy) / rate if rate else None


def absorbed(
    rows: Sequence[Sequence[float | None]],
    killed: int,
    killed_at: float,
    max_num_seqs: int,
    before_s: float = 3.0,
) -> dict[str, Any]:
    """How long the replicas left took over a killed one's share.

    The level: the whole fleet's mean running count in the ``before_s`` seconds before
    the kill, or what the survivors can run at most (``max_num_seqs`` each) if that is
    less. ``absorb_s`` is the time from the kill to the first reading in which the
    survivors together run 90 % of that level (None: never).
    """
    survivors = [i for i in range(len(rows[0]) - 1) if i != killed] if rows else []
    before = [
        sum(v for v in row[1:] if v is not None)
        for row in rows
        if row[0] is not None and killed_at - before_s <= row[0] < killed_at
    ]
    if not before:
        return {"level": None, "absorb_s": None, "before_total": None}
    total = sum(before) / len(before)
    level = 0.9 * min(total, len(survivors) * max_num_seqs)
    absorb = None
    for row in rows:
        t = row[0]
        if t is None or t < killed_at:
            continue
        together = sum(row[1 + i] or 0.0 for i in survivors)
        if together >= level:
            absorb = round(t - killed_at, 3)
            break
    return {"level": level, "absorb_s": absorb, "before_total": total}
