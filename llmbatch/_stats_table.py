"""``str(client.stats())``: the snapshot as a table a person can read at a glance."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmbatch._stats import Percentiles, ServerStats, Stats

__all__ = ["render"]

_COLUMNS = ("tier", "queued", "in flight", "done", "failed", "cancelled", "retried")


def render(stats: Stats) -> str:
    """Every figure of ``stats``, one tier per row, then batches, tokens and server."""
    lines = [
        f"llmbatch: up {_duration(stats.uptime)}; last {_duration(stats.rate_window)}: "
        f"{stats.requests_per_second:,.1f} answers/s, "
        f"{stats.tokens_per_second:,.1f} completion tokens/s"
    ]
    rows = [
        [
            tier.value,
            *(f"{n:,}" for n in (t.queued, t.in_flight, t.done, t.failed, t.cancelled, t.retried)),
            _percentiles(t.latency) if t.done else "-",
            _percentiles(t.queue_wait) if t.queue_wait_histogram.count else "-",
        ]
        for tier, t in stats.tiers.items()
    ]
    header = [*_COLUMNS, "latency p50/p95/p99", "queue wait p50/p95/p99"]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    mean = f"{stats.mean_batch_size:,.1f}"
    lines.append(
        f"HTTP requests {stats.batches_sent:,} (prompts each: mean {mean}, "
        f"max {stats.max_batch_size:,}); retries {stats.retries:,}; "
        f"bisections {stats.bisections:,}"
    )
    lines.append(f"tokens: {stats.prompt_tokens:,} prompt, {stats.completion_tokens:,} completion")
    lines.extend(_server(server) for server in stats.servers)
    lines.extend(_tenants(stats))
    return "\n".join(lines)


#: Tenants listed by name in the table (the busiest; the rest are summed).
SHOWN_TENANTS = 8


def _tenants(stats: Stats) -> list[str]:
    """One line per busy tenant (queued and in flight first, then answers)."""
    if not stats.tenants:
        return []
    busiest = sorted(
        stats.tenants.items(), key=lambda kv: (-(kv[1].queued + kv[1].in_flight), -kv[1].done)
    )
    lines = [
        f"tenant {name}: queued {t.queued:,}, in flight {t.in_flight:,}, done {t.done:,}, "
        f"failed {t.failed:,}, cancelled {t.cancelled:,}; latency p50/p99 "
        f"{_duration(t.latency.p50)} / {_duration(t.latency.p99)}"
        for name, t in busiest[:SHOWN_TENANTS]
    ]
    if len(busiest) > SHOWN_TENANTS:
        lines.append(f"... and {len(busiest) - SHOWN_TENANTS:,} more tenants")
    return lines


def _server(server: ServerStats) -> str:
    parts = [
        f"in flight {server.in_flight:,}",
        f"bulk limit {server.bulk_limit:,} of {server.ceiling:,}",
        f"realtime reserve {server.realtime_reserve}",
        f"step {_duration(server.step_time)}",
        f"TTFT {_duration(server.ttft)}",
        f"waiting {'-' if server.waiting is None else server.waiting}",
        "KV cache -" if server.kv_cache_usage is None else f"KV cache {server.kv_cache_usage:.0%}",
        f"breaker {server.breaker}",
    ]
    if server.slo_aim is not None:
        parts.append(
            f"SLO met {server.slo_met:,}, missed {server.slo_missed:,}, "
            f"aiming at {server.slo_aim:.0%} of it"
        )
    if server.outages:
        parts.append(f"outages {server.outages}")
    if server.ejected:
        parts.append("ejected (slow)")
    return f"server {server.base_url}: " + "; ".join(parts)


def _percentiles(p: Percentiles) -> str:
    return f"{_duration(p.p50)} / {_duration(p.p95)} / {_duration(p.p99)}"


def _duration(seconds: float | None) -> str:
    """Seconds in the unit a person reads best: ``0.4 ms``, ``123 ms``, ``2.50 s``."""
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 600:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"
