"""A Grafana-style picture of llmbatch's Prometheus metrics, from a real run.

    python -m llmbatch_bench.dashboard --out docs/metrics/dashboard.png

Starts a simulator (vLLM's engine model at real speed, priority scheduling), runs a
client exporting ``llmbatch.prometheus`` metrics over HTTP, and scrapes them once a
second from another thread, as Prometheus would. The workload: realtime calls
throughout, a bulk ``map`` from the 5th second, a 5 s server outage (503s) in the
middle and a burst of 500s after it. The panels are the queries a dashboard would
run (rates, histogram quantiles) computed from the scrapes.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

import llmbatch
import llmbatch.prometheus
from llmbatch_server.testing import SimulatorProcess, run_simulator

TIERS = ("realtime", "normal", "batch")
COLOURS = {"realtime": "#73bf69", "normal": "#5794f2", "batch": "#ff9830"}

Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrapes:
    """Every scrape: its time and ``{(name, labels): value}``."""

    times: list[float] = field(default_factory=list)
    samples: list[dict[tuple[str, Labels], float]] = field(default_factory=list)

    def series(self, name: str, **labels: str) -> list[float]:
        """One sample's value at every scrape (NaN where absent)."""
        return [_pick(s, name, labels) for s in self.samples]


def _pick(samples: dict[tuple[str, Labels], float], name: str, labels: dict[str, str]) -> float:
    total, found = 0.0, False
    for (got, got_labels), value in samples.items():
        if got != name:
            continue
        have = dict(got_labels)
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
            found = True
    return total if found else math.nan


def scrape_loop(url: str, scrapes: Scrapes, stop: threading.Event, started: float) -> None:
    while not stop.is_set():
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        sample: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                sample[(s.name, tuple(sorted(s.labels.items())))] = s.value
        scrapes.times.append(time.monotonic() - started)
        scrapes.samples.append(sample)
        stop.wait(1.0)


async def workload(sim: SimulatorProcess, metrics_url_box: list[str], duration: float) -> None:
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    metrics_url_box.append(f"http://127.0.0.1:{server.server_port}/metrics")
    scrapes = Scrapes()
    stop = threading.Event()
    started = time.monotonic()
    slo = llmbatch.SLO(ttft=0.2)
    try:
        async with llmbatch.Client(sim.base_url, slo=slo) as client:
            llmbatch.prometheus.register(client, registry)
            scraper = threading.Thread(
                target=scrape_loop, args=(metrics_url_box[0], scrapes, stop, started)
            )
            scraper.start()
            async with anyio.create_task_group() as tg:

                async def realtime() -> None:
                    while time.monotonic() - started < duration:
                        tg.start_soon(_one, client)
                        await anyio.sleep(0.25)

                async def bulk() -> None:
                    await anyio.sleep(duration * 0.08)
                    prompts = [f"summarise document {i}: " + "text " * 200 for i in range(20_000)]
                    with anyio.move_on_after(duration * 0.88):
                        await client.map(prompts, max_tokens=128)

                async def faults() -> None:
                    await anyio.sleep(duration * 0.45)
                    await anyio.to_thread.run_sync(lambda: sim.outage(duration * 0.08))
                    await anyio.sleep(duration * 0.2)
                    await anyio.to_thread.run_sync(lambda: sim.set_faults(error_500=0.3))
                    await anyio.sleep(duration * 0.06)
                    await anyio.to_thread.run_sync(lambda: sim.set_faults(error_500=0.0))

                tg.start_soon(realtime)
                tg.start_soon(bulk)
                tg.start_soon(faults)
            await anyio.sleep(1.5)  # one more scrape after the work
    finally:
        stop.set()
        server.shutdown()
        thread.join(timeout=10)
    _SCRAPES.append(scrapes)


_SCRAPES: list[Scrapes] = []


async def _one(client: llmbatch.Client) -> None:
    with contextlib.suppress(llmbatch.LLMBatchError):  # failures show in the metrics
        await client.complete("a quick question", priority="realtime", max_tokens=32)


def rate(times: Sequence[float], values: Sequence[float], span: int = 3) -> list[float]:
    """Prometheus ``rate()`` over ``span`` scrapes."""
    out = []
    for i in range(len(values)):
        j = max(0, i - span)
        dt = times[i] - times[j]
        dv = values[i] - values[j]
        out.append(dv / dt if dt > 0 and not math.isnan(dv) else math.nan)
    return out


def quantile(scrapes: Scrapes, name: str, tier: str, q: float, span: int = 3) -> list[float]:
    """``histogram_quantile(q, rate(name_bucket[span]))``, per scrape."""
    bounds = sorted(
        {
            float(dict(labels)["le"])
            for (n, labels) in scrapes.samples[-1]
            if n == f"{name}_bucket" and dict(labels).get("tier") == tier
        }
    )
    series = {b: scrapes.series(f"{name}_bucket", tier=tier, le=_le(b)) for b in bounds}
    out = []
    for i in range(len(scrapes.times)):
        j = max(0, i - span)
        deltas = [(b, series[b][i] - series[b][j]) for b in bounds]
        total = deltas[-1][1] if deltas else 0.0
        if not total or math.isnan(total):
            out.append(math.nan)
            continue
        target = q * total
        lower_bound, lower_count = 0.0, 0.0
        value = math.nan
        for bound, count in deltas:
            if count >= target:
                if math.isinf(bound):
                    value = lower_bound
                else:
                    share = (target - lower_count) / max(count - lower_count, 1e-9)
                    value = lower_bound + (bound - lower_bound) * share
                break
            lower_bound, lower_count = bound, count
        out.append(value)
    return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def plot(scrapes: Scrapes, out: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = scrapes.times
    plt.rcParams.update(
        {
            "figure.facecolor": "#111217",
            "axes.facecolor": "#181b1f",
            "axes.edgecolor": "#2c3235",
            "axes.labelcolor": "#ccccdc",
            "text.color": "#ccccdc",
            "xtick.color": "#8e8e9e",
            "ytick.color": "#8e8e9e",
            "grid.color": "#2c3235",
            "font.size": 9,
        }
    )
    fig, axes = plt.subplots(3, 2, figsize=(13, 9.5), sharex=True)
    panels = axes.flatten()

    ax = panels[0]
    for tier in TIERS:
        done = scrapes.series("llmbatch_requests_total", tier=tier, outcome="done")
        ax.plot(t, rate(t, done), color=COLOURS[tier], label=tier)
    failed = scrapes.series("llmbatch_requests_total", outcome="failed")
    ax.plot(t, rate(t, failed), color="#f2495c", label="failed (all tiers)")
    ax.set_title("answers / s  ·  rate(llmbatch_requests_total[3s])", loc="left")

    ax = panels[1]
    for tier in ("realtime", "batch"):
        for q, style in ((0.5, "--"), (0.99, "-")):
            ax.plot(
                t,
                quantile(scrapes, "llmbatch_request_duration_seconds", tier, q),
                style,
                color=COLOURS[tier],
                label=f"{tier} p{int(q * 100)}",
            )
    ax.set_yscale("log")
    ax.set_title("latency, s  ·  histogram_quantile(llmbatch_request_duration_seconds)", loc="left")

    ax = panels[2]
    for tier in TIERS:
        ax.plot(
            t,
            scrapes.series("llmbatch_in_flight_requests", tier=tier),
            color=COLOURS[tier],
            label=f"{tier} in flight",
        )
    ax.plot(t, scrapes.series("llmbatch_admission_limit"), color="#b877d9", label="admission limit")
    ax.set_title("in flight and the admission limit", loc="left")

    ax = panels[3]
    for tier in ("realtime", "batch"):
        ax.plot(
            t,
            scrapes.series("llmbatch_queued_requests", tier=tier),
            color=COLOURS[tier],
            label=f"{tier} queued",
        )
    ax.set_title("queued in the client  ·  llmbatch_queued_requests", loc="left")

    ax = panels[4]
    http = rate(t, scrapes.series("llmbatch_http_requests_total"))
    retries = rate(t, scrapes.series("llmbatch_http_retries_total"))
    ax.plot(t, http, color="#5794f2", label="HTTP requests / s")
    ax.plot(t, retries, color="#f2495c", label="retries / s")
    open_state = scrapes.series("llmbatch_breaker_state", state="open")
    ax.fill_between(
        t,
        0,
        [
            max(h for h in http if not math.isnan(h)) * v if not math.isnan(v) else 0
            for v in open_state
        ],
        color="#f2495c",
        alpha=0.15,
        step="mid",
        label="breaker open (outage)",
    )
    ax.set_title("HTTP requests and retries", loc="left")

    ax = panels[5]
    tokens = rate(t, scrapes.series("llmbatch_completion_tokens_total"))
    ax.plot(t, tokens, color="#fade2a", label="completion tokens / s")
    sizes = rate(t, scrapes.series("llmbatch_batch_size_sum"))
    mean = [
        s / h if h and not math.isnan(h) and not math.isnan(s) else math.nan
        for s, h in zip(sizes, http, strict=True)
    ]
    twin = ax.twinx()
    twin.plot(t, mean, color="#8ab8ff", linestyle="--", label="prompts per HTTP request")
    twin.tick_params(colors="#8e8e9e")
    ax.set_title("tokens / s and batch size", loc="left")
    twin.legend(loc="upper right", fontsize=8, facecolor="#181b1f", edgecolor="#2c3235")

    for ax in panels:
        ax.grid(True, linewidth=0.5)
        ax.legend(loc="upper left", fontsize=8, facecolor="#181b1f", edgecolor="#2c3235")
    for ax in panels[4:]:
        ax.set_xlabel("seconds")
    fig.suptitle(
        "llmbatch metrics from one run (simulated vLLM; outage and 500s injected)\n" + command,
        color="#ccccdc",
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.dashboard",
        description="Run a mixed workload and draw its Prometheus metrics, Grafana-style.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/metrics/dashboard.png"),
        help="where to write the PNG (default: docs/metrics/dashboard.png)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds of workload (default: 60)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulator speed factor, 1 = the modelled GPU's real time (default: 1)",
    )
    args = parser.parse_args(argv)
    with run_simulator(
        "--speed", str(args.speed), "--enable-admin", "--scheduling-policy", "priority"
    ) as sim:
        anyio.run(workload, sim, [], args.duration)
    command = f"python -m llmbatch_bench.dashboard --duration {args.duration:g}"
    plot(_SCRAPES[-1], args.out, command)
    print(f"wrote {args.out} ({len(_SCRAPES[-1].times)} scrapes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
