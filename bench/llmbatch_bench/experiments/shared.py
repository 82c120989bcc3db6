"""Budgets shared through Redis, measured with real processes.

    python -m llmbatch_bench.experiments.shared --json docs/benchmarks/shared.json
    python -m llmbatch_bench.experiments.shared --smoke          # ~40 s, for CI

Starts a real redis-server and simulators on 127.0.0.1, then worker processes that
each open one llmbatch Client and map far more prompts than they may send:

- ``rpm``: N processes share ``RateLimit(requests_per_minute=R)``; after a warm-up
  the simulator's own POST count over the window, per minute, against R.
- ``tpm``: the same with ``tokens_per_minute=T``; the simulator's prompt and
  generation token counters over the window, per minute, against T.
- ``tenant``: N processes map for one tenant whose ``TenantLimits(tokens_per_minute=
  T)`` they share, measured as ``tpm`` is;
- ``inflight``: N processes share ``SharedInFlight(max_in_flight=M)`` in front of
  a slow simulator; its high-water mark of sequences held against M, then one
  process is killed with SIGKILL and Redis is watched until the survivors hold
  the whole budget again (against the lease time).

Each worker reports its Redis round trips (count and p99, as the process saw them)
and the HTTP requests it sent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _worker(args: argparse.Namespace) -> None:
    import anyio

    from llmbatch import Client, RateLimit, SharedInFlight, TenantLimits

    async def run() -> None:
        kwargs: dict[str, Any] = {}
        tenant = None
        if args.worker == "tenant":
            tenant = "shared-tenant"
            kwargs["tenants"] = {
                tenant: TenantLimits(
                    tokens_per_minute=args.budget, redis_url=args.redis_url, key=args.key
                )
            }
        elif args.worker == "rpm":
            kwargs["rate_limit"] = RateLimit(
                requests_per_minute=args.budget, redis_url=args.redis_url, key=args.key
            )
        elif args.worker == "tpm":
            kwargs["rate_limit"] = RateLimit(
                tokens_per_minute=args.budget, redis_url=args.redis_url, key=args.key
            )
        else:
            kwargs["shared_in_flight"] = SharedInFlight(
                max_in_flight=int(args.budget),
                redis_url=args.redis_url,
                key=args.key,
                lease=args.lease,
            )
        async with Client(args.base_url, **kwargs) as client:
            prompts = (f"Item {i}: say something about it." for i in range(10**9))
            with anyio.move_on_after(args.seconds):
                async for _ in client.map_unordered(
                    prompts, max_tokens=args.max_tokens, tenant=tenant
                ):
                    pass
            stats = client.stats()
        shared = stats.shared
        assert shared is not None
        print(
            json.dumps(
                {
                    "tenant_tokens": (
                        0
                        if tenant is None
                        else stats.tenants[tenant].prompt_tokens
                        + stats.tenants[tenant].completion_tokens
                    ),
                    "http_requests": stats.batches_sent,
                    "round_trips": shared.round_trips,
                    "refusals": shared.rate_refusals,
                    "round_trip_p50_ms": (shared.round_trip_p50 or 0) * 1e3,
                    "round_trip_p99_ms": (shared.round_trip_p99 or 0) * 1e3,
                    "failures": shared.failures,
                }
            ),
            flush=True,
        )

    anyio.run(run)


def _spawn(kind: str, base_url: str, redis_url: str, key: str, budget: float, seconds: float,
           max_tokens: int, lease: float = 10.0) -> subprocess.Popen[str]:  # fmt: skip
    argv = [
        sys.executable, "-m", "llmbatch_bench.experiments.shared", "--worker", kind,
        "--base-url", base_url, "--redis-url", redis_url, "--key", key,
        "--budget", str(budget), "--seconds", str(seconds),
        "--max-tokens", str(max_tokens), "--lease", str(lease),
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def _reports(workers: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for worker in workers:
        stdout, _ = worker.communicate(timeout=120)
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if lines:
            out.append(json.loads(lines[-1]))
    return out


def _tokens(sim: Any) -> int:
    from llmbatch_server.testing import _counter

    text = sim.metrics()
    return _counter(text, "vllm:prompt_tokens_total") + _counter(
        text, "vllm:generation_tokens_total"
    )


class _Probe:
    """Times one round trip to Redis (a ``PING``) every 10 ms from a quiet thread of
    this (otherwise idle) process: Redis's own latency while the workers lease from
    it, without a busy event loop's wait around it. (Each lease call pays this round
    trip plus its Lua script's few microseconds of work on the server.)"""

    def __init__(self, redis_url: str) -> None:
        import threading

        import redis

        self._db = redis.Redis.from_url(redis_url, decode_responses=True)
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self._db.ping()  # connects
        while not self._stop.wait(0.01):
            started = time.perf_counter()
            self._db.ping()
            self.samples.append(time.perf_counter() - started)

    def __enter__(self) -> _Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._db.close()

    def p(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def _rate_part(kind: str, budget: float, n: int, warmup: float, window: float,
               redis_url: str) -> dict[str, Any]:  # fmt: skip
    from llmbatch_server.testing import run_simulator

    count = (lambda s: s.post_count()) if kind == "rpm" else _tokens
    with _Probe(redis_url) as idle:  # the same round trip with nothing else running
        time.sleep(2.0)
    with run_simulator("--zero-latency") as sim:
        key = f"bench-{kind}-{os.getpid()}-{time.time_ns()}"
        workers = [
            _spawn(kind, sim.base_url, redis_url, key, budget, warmup + window + 2, 16)
            for _ in range(n)
        ]
        time.sleep(warmup)
        start, t0 = count(sim), time.monotonic()
        with _Probe(redis_url) as probe:
            time.sleep(window)
        seen, elapsed = count(sim) - start, time.monotonic() - t0
        reports = _reports(workers)
    per_minute = seen / elapsed * 60
    trips = sum(r["round_trips"] for r in reports)
    requests = sum(r["http_requests"] for r in reports)
    return {
        "processes": n,
        "budget_per_minute": budget,
        "window_s": round(elapsed, 2),
        "server_saw_per_minute": round(per_minute, 1),
        "ratio": round(per_minute / budget, 4),
        "round_trips": trips,
        "http_requests": requests,
        "round_trips_per_request": round(trips / max(1, requests), 3),
        "leases_refused": sum(r["refusals"] or 0 for r in reports),
        "round_trip_p50_ms": round(probe.p(0.5), 3),
        "round_trip_p99_ms": round(probe.p(0.99), 3),
        "round_trip_samples": len(probe.samples),
        "round_trip_idle_p50_ms": round(idle.p(0.5), 3),
        "round_trip_idle_p99_ms": round(idle.p(0.99), 3),
        "lease_wait_in_worker_p50_ms_worst": round(max(r["round_trip_p50_ms"] for r in reports), 3),
        "lease_wait_in_worker_p99_ms_worst": round(max(r["round_trip_p99_ms"] for r in reports), 3),
    }


def _inflight_part(budget: int, n: int, seconds: float, lease: float,
                   redis_url: str) -> dict[str, Any]:  # fmt: skip
    import redis

    from llmbatch_server.testing import run_simulator

    db = redis.Redis.from_url(redis_url, decode_responses=True)
    key = f"bench-inflight-{os.getpid()}-{time.time_ns()}"
    # The documented key of what each process holds (docs/shared-limits.md).
    held_key = f"llmbatch:{{{key}}}:seats-held"

    def holds() -> dict[str, int]:
        return {str(m): int(v.split()[0]) for m, v in db.hgetall(held_key).items()}

    with run_simulator("--speed", "10") as sim:
        workers = [
            _spawn("inflight", sim.base_url, redis_url, key, budget, seconds, 64, lease)
            for _ in range(n)
        ]
        deadline = time.monotonic() + 20
        while len(holds()) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(seconds / 3)
        before = holds()
        victim = workers[0]
        members = set(before)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        returned: float | None = None
        while time.monotonic() - killed < lease + 10:
            now_holds = holds()
            if len(now_holds) < len(members) and sum(now_holds.values()) >= budget:
                returned = time.monotonic() - killed
                break
            time.sleep(0.02)
        reports = _reports(workers[1:])
        victim.wait()
        peak = sim.peak_sequences()
    db.close()
    return {
        "processes": n,
        "max_in_flight": budget,
        "lease_s": lease,
        "server_peak_sequences": peak,
        "holds_before_kill": sorted(before.values()),
        "share_returned_after_s": None if returned is None else round(returned, 2),
        "round_trips": sum(r["round_trips"] for r in reports),
        "lease_wait_in_worker_p99_ms_worst": round(max(r["round_trip_p99_ms"] for r in reports), 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.shared", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window (default: 60)")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rpm", type=float, default=1200.0)
    parser.add_argument("--tpm", type=float, default=600_000.0)
    parser.add_argument(
        "--tenant-tpm", type=float, default=300_000.0, help="the shared tenant's tokens a minute"
    )
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--smoke", action="store_true", help="short windows (~40 s in all)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--parts",
        default="rpm,tpm,tenant,inflight",
        help="comma-separated parts to run (default: rpm,tpm,tenant,inflight)",
    )
    # A worker process (started by the bench itself).
    parser.add_argument(
        "--worker", choices=("rpm", "tpm", "tenant", "inflight"), help=argparse.SUPPRESS
    )
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--max-tokens", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    from llmbatch_server.redis_process import run_redis

    if args.smoke:
        args.seconds, args.warmup, args.lease = 8.0, 3.0, 3.0
    results: dict[str, Any] = {
        "command": " ".join(
            ["python -m llmbatch_bench.experiments.shared", *(argv or sys.argv[1:])]
        )
    }
    with run_redis() as server:
        parts = set(args.parts.split(","))
        if unknown := parts - {"rpm", "tpm", "tenant", "inflight"}:
            parser.error(
                f"unknown --parts {sorted(unknown)}: choose from rpm, tpm, tenant, inflight"
            )
        for kind, budget in (("rpm", args.rpm), ("tpm", args.tpm), ("tenant", args.tenant_tpm)):
            if kind not in parts:
                continue
            part = _rate_part(kind, budget, args.processes, args.warmup, args.seconds, server.url)
            results[kind] = part
            print(kind, json.dumps(part), flush=True)
        if "inflight" in parts:
            part = _inflight_part(args.max_in_flight, args.processes, max(12.0, args.seconds / 2),
                                  args.lease, server.url)  # fmt: skip
            results["inflight"] = part
            print("inflight", json.dumps(part), flush=True)
    failed = _verdicts(results, args.max_in_flight, args.lease)
    results["missed"] = failed
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    for line in failed:
        print("missed:", line)


def _verdicts(results: dict[str, Any], budget: int, lease: float) -> list[str]:
    """The issue's targets that were missed (empty: all met)."""
    missed = []
    for kind in ("rpm", "tpm", "tenant"):
        if kind not in results:
            continue
        part = results[kind]
        if abs(part["ratio"] - 1) > 0.05:
            missed.append(
                f"{kind}: the server saw {part['ratio']:.3f}x the budget (target 1 +- 5 %)"
            )
        if kind != "tenant" and part["round_trip_p99_ms"] >= 2.0:
            missed.append(
                f"{kind}: Redis round trip p99 {part['round_trip_p99_ms']} ms (target < 2)"
            )
    inflight = results.get("inflight")
    if inflight is None:
        return missed
    if inflight["server_peak_sequences"] > budget + 64:
        missed.append(
            f"inflight: server peak {inflight['server_peak_sequences']} > {budget} + one batch"
        )
    returned = inflight["share_returned_after_s"]
    if returned is None or returned > lease:
        missed.append(f"inflight: share returned after {returned} s (lease {lease} s)")
    return missed


if __name__ == "__main__":
    main()
