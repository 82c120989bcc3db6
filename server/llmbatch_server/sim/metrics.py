"""Prometheus metrics under vLLM's names, rendered in the text exposition format,
and the per-response load report vLLM attaches on request."""

from __future__ import annotations

import bisect
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class Histogram:
    """A cumulative Prometheus histogram."""

    buckets: Sequence[float] = _LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value``, ``times`` times."""
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.total += value * times
        self.count += times

    def render(self, name: str, labels: str) -> list[str]:
        lines = []
        cumulative = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


@dataclass
class EngineMetrics:
    """Counters and histograms the engine updates as it steps."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    aborted: int = 0
    preemptions: int = 0
    """Running sequences preempted for KV blocks (vLLM's ``num_preemptions``)."""
    peak_sequences: int = 0
    """The most sequences the server has held at once (running and waiting)."""
    peak_running: int = 0
    """The most sequences it has run in one step (at most ``max_num_seqs``)."""
    peak_running_by_user: dict[str, int] = field(default_factory=dict)
    """The same for each ``user`` the requests named."""
    success: Counter[str] = field(default_factory=Counter)
    e2e: Histogram = field(default_factory=Histogram)
    ttft: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)
    inter_token: Histogram = field(default_factory=Histogram)
    """The time between two output tokens of a sequence (vLLM observes it per token)."""

    def finish(self, reason: str, e2e_seconds: float) -> None:
        self.success[reason] += 1
        self.e2e.observe(e2e_seconds)


def render(
    metrics: EngineMetrics,
    *,
    model: str,
    running: int,
    waiting: int,
    kv_usage: float,
    prefix_queries: int = 0,
    prefix_hits: int = 0,
    http_requests: Mapping[tuple[str, str, str], int] | None = None,
    histograms: bool = True,
) -> str:
    """The ``/metrics`` body; ``http_requests`` counts requests by (handler, method,
    status class), rendered as vLLM's ``http_requests_total``. ``histograms=False``
    leaves out the latency histograms (``--metrics gauges``)."""
    labels = f'model_name="{model}"'
    out = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}",
        # The simulator's own: a high-water mark, which no scrape interval can miss.
        "# TYPE llmbatch_sim:peak_sequences gauge",
        f"llmbatch_sim:peak_sequences{{{labels}}} {metrics.peak_sequences}",
        "# TYPE llmbatch_sim:peak_running gauge",
        f"llmbatch_sim:peak_running{{{labels}}} {metrics.peak_running}",
        "# TYPE llmbatch_sim:peak_running_by_user gauge",
        *(
            f'llmbatch_sim:peak_running_by_user{{{labels},user="{_label(user)}"}} {peak}'
            for user, peak in sorted(metrics.peak_running_by_user.items())
        ),
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv_usage}",
        # vLLM's V1 names, in tokens (prometheus_client adds the _total).
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} {prefix_queries}",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {prefix_hits}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {metrics.prompt_tokens}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {metrics.generation_tokens}",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {metrics.preemptions}",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason in ("stop", "length", "abort"):
        count = metrics.aborted if reason == "abort" else metrics.success[reason]
        out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {count}')
    for name, hist in (
        ()
        if not histograms
        else (
            ("vllm:e2e_request_latency_seconds", metrics.e2e),
            ("vllm:time_to_first_token_seconds", metrics.ttft),
            # vLLM exports the same inter-token latencies under both names (the older
            # time_per_output_token is kept for dashboards).
            ("vllm:inter_token_latency_seconds", metrics.inter_token),
            ("vllm:time_per_output_token_seconds", metrics.inter_token),
            ("vllm:request_queue_time_seconds", metrics.queue_time),
        )
    ):
        out.append(f"# TYPE {name} histogram")
        out.extend(hist.render(name, labels))
    if http_requests:
        # prometheus-fastapi-instrumentator's counter, which vLLM's API server exports
        # (no model_name: it counts the HTTP front end, not the engine).
        out.append("# TYPE http_requests_total counter")
        for (handler, method, status), count in sorted(http_requests.items()):
            out.append(
                f'http_requests_total{{handler="{handler}",method="{method}",'
                f'status="{status}"}} {count}'
            )
    # prometheus_client's process collector, which vLLM's API server exports too: the
    # CPU seconds of the serving process (a bench at --url reads it per prompt).
    cpu = time.process_time()
    out += ["# TYPE process_cpu_seconds_total counter", f"process_cpu_seconds_total {cpu}"]
    return "\n".join(out) + "\n"


#: Request header asking for a load report; its value is ``json`` or ``text``.
LOAD_FORMAT_HEADER = "endpoint-load-metrics-format"
#: Response header carrying the load report.
LOAD_HEADER = "endpoint-load-metrics"


def load_report(fmt: str, *, waiting: int, kv_usage: float) -> dict[str, str]:
    """The ``endpoint-load-metrics`` header for a request that asked in format ``fmt``.

    vLLM (``vllm/entrypoints/openai/orca_metrics.py``) writes an ORCA load report
    from two of its Prometheus gauges, as floats, in registry order:
    ``JSON {"named_metrics": {...}}`` (``json.dumps``' default separators) or
    ``TEXT named_metrics.NAME=VALUE, ...``. Any other format gets no header.
    """
    named = {"num_requests_waiting": float(waiting), "kv_cache_usage_perc": float(kv_usage)}
    kind = fmt.strip().lower()
    if kind == "json":
        return {LOAD_HEADER: "JSON " + json.dumps({"named_metrics": named})}
    if kind == "text":
        text = ", ".join(f"named_metrics.{name}={value}" for name, value in named.items())
        return {LOAD_HEADER: "TEXT " + text}
    return {}


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
