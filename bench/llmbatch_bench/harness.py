"""Plans a bench run, runs each job in its own process, and assembles the report.

Order matters: the capacity sweep runs first (the bulk ratio needs it and the mixed
scenario sizes its bulk work from it), then bulk and mixed (with its idle twin) on
the main server; then the closed-loop scenarios (:mod:`.closedloop.plan`) on a slower
simulator (``outage`` and ``control`` start their own); then the replicas scenario
(:mod:`.replicas.plan`: each job starts a fleet of its own); then the hot-path scenarios
(:mod:`.hotpath.plan`) on a zero-latency server of their own. After every job the
harness waits until the server reports nothing running, so no job inherits
another's leftovers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from llmbatch import __version__
from llmbatch_bench import ceiling, hosted, provenance
from llmbatch_bench.closedloop import plan as closedplan
from llmbatch_bench.closedloop.targets import evaluate_closed
from llmbatch_bench.config import (
    CLOSED_SCENARIOS,
    HOT_SCENARIOS,
    HOT_SIM_ARGS,
    SERVER_SCENARIOS,
    BenchConfig,
)
from llmbatch_bench.contenders import available
from llmbatch_bench.hotpath import plan as hotplan
from llmbatch_bench.jobs import HARD_STOP_GRACE, Job, use_prompts
from llmbatch_bench.metrics import RunMetrics
from llmbatch_bench.replicas import plan as replicaplan
from llmbatch_bench.replicas.targets import evaluate_replicas
from llmbatch_bench.server import MetricsSampler, ServerInfo, discover, simulator, vllm, wait_idle
from llmbatch_bench.summary import summarize
from llmbatch_bench.targets import capacity, evaluate
from llmbatch_bench.worker import WorkerError, run_in_process, run_in_worker

__all__ = ["SCHEMA", "run_bench"]

SCHEMA = "llmbatch-bench/1"


def run_bench(
    config: BenchConfig, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Run every scenario of ``config``; return the JSON-ready report."""
    use_prompts(config.prompts)  # before any worker process starts: they inherit it
    # The workers inherit this process's directory and environment, so import the same.
    ran = provenance.code()
    progress(provenance.describe(ran))
    started = time.time()
    load_before = _loadavg()
    contenders = [c for c in config.contenders if available(c)]
    skipped = [c for c in config.contenders if c not in contenders]
    for name in skipped:
        progress(f"skipping {name}: its library is not installed")
    runs: list[RunMetrics] = []
    notes: list[str] = []
    servers: dict[str, dict[str, Any] | None] = {
        "server": None,
        "closed_loop_server": None,
        "hot_server": None,
        "replicas_server": None,
        "ceiling": None,
        "hosted": None,
    }
    main = [s for s in SERVER_SCENARIOS if s in config.scenarios]
    hot = [s for s in HOT_SCENARIOS if s in config.scenarios]
    closed = [s for s in CLOSED_SCENARIOS if s in config.scenarios]
    if "ceiling" in main:
        # Before the server starts: the engine alone on the machine (and the GPU).
        servers["ceiling"] = ceiling.measure(config, progress)
    on_one_server = bool(main) or any(s in closedplan.ON_THE_SERVER for s in closed)
    with _one_vllm(config, on_one_server) as engine:
        if main:
            with _reuse(engine) or _main_server(config) as server:
                progress(
                    f"server: {server.base_url} model={server.model} sim_args={server.sim_args}"
                )
                servers["server"] = _describe(server, config.url)
                runner = _Runner(config, server, runs, notes, progress)
                runner.ceiling_result = servers.get("ceiling")
                for scenario in main:
                    getattr(runner, scenario.replace("-", "_"))(contenders)
        if closed:
            _closed_loop(config, closed, contenders, runs, notes, progress, servers, engine)
    fleet = "replicas" in config.scenarios
    if fleet:
        own = None if config.url else config.replicas_sim_args
        servers["replicas_server"] = {
            "replicas": config.replicas,
            "simulator_args": list(own) if own is not None else None,
        }
        # A stand-in: every job carries its simulators' arguments and starts them.
        placeholder = ServerInfo("http://127.0.0.1:0/v1", "llmbatch-sim", sim_args=own)
        replicaplan.replicas(_Runner(config, placeholder, runs, notes, progress), own)
    if "hosted" in config.scenarios:
        servers["hosted"] = _hosted(config, progress)
    if hot:
        with _hot_server(config) as zero:
            progress(f"hot-path server: {zero.base_url} sim_args={zero.sim_args}")
            servers["hot_server"] = _describe(zero, config.overhead_url)
            runner = _Runner(config, zero, runs, notes, progress, hot=True)
            for scenario in hot:
                for job in hotplan.jobs_for(scenario, config, runner.job):
                    if job.contender not in skipped:
                        runner.run(job)
    # The closed-loop targets are listed when their scenarios were asked for.
    closed_targets = evaluate_closed([r.to_json() for r in runs], closed) if closed else []
    fleet_targets = evaluate_replicas([r.to_json() for r in runs]) if fleet else []
    return {
        "schema": SCHEMA,
        "llmbatch_version": __version__,
        "llmbatch_code": ran,
        "started_at": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(),
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": _loadavg(),
        },
        **servers,
        "config": config.to_json(),
        "skipped_contenders": skipped,
        "notes": notes,
        "runs": [r.to_json() for r in runs],
        "summaries": [s.to_json() for s in summarize(runs)],
        "targets": [
            t.to_json()
            for t in (*evaluate(runs, config.scenarios), *closed_targets, *fleet_targets)
        ],
    }


def _hosted(config: BenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    """Each contender's chat map against a simulator of its own playing the limiter."""
    args = hosted.defaults(
        conversations=config.hosted_conversations,
        rpm=config.hosted_rpm,
        tpm=config.hosted_tpm,
        headers=config.hosted_headers,
    )
    progress(
        f"hosted: {args.conversations:,} conversations a map, {args.rpm:,} requests and "
        f"{args.tpm:,} tokens a minute ({args.headers}'s headers)"
    )
    return hosted.compare(args, hosted.CONTENDERS, command="llmbatch-bench --scenario hosted")


def _describe(server: ServerInfo, url: str | None) -> dict[str, Any]:
    return {
        "url": server.base_url if url else None,
        "model": server.model,
        "simulator_args": list(server.sim_args) if server.sim_args is not None else None,
    }


def _loadavg() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


@contextlib.contextmanager
def _one_vllm(config: BenchConfig, wanted: bool) -> Iterator[ServerInfo | None]:
    """With ``--vllm``, one server for the main and the closed-loop scenarios: an
    engine takes a minute or more to start (minutes on a GPU). None otherwise."""
    if not (wanted and config.vllm_model and not config.url):
        yield None
        return
    with _main_server(config) as info:
        yield info


def _reuse(server: ServerInfo | None) -> contextlib.AbstractContextManager[ServerInfo] | None:
    """A server already started, as a context that leaves it running; None if none."""
    return contextlib.nullcontext(server) if server is not None else None


@contextlib.contextmanager
def _main_server(config: BenchConfig) -> Iterator[ServerInfo]:
    if config.url:
        yield discover(config.url, config.api_key, config.model)
        return
    if config.vllm_model:
        with vllm(
            config.vllm_model,
            config.vllm_args,
            profile=config.vllm_profile,
            vllm_bin=config.vllm_bin,
            api_key=config.api_key,
        ) as info:
            yield info
        return
    with simulator(config.sim_args) as info:
        yield info


def _closed_loop(
    config: BenchConfig,
    scenarios: Sequence[str],
    contenders: list[str],
    runs: list[RunMetrics],
    notes: list[str],
    progress: Callable[[str], None],
    servers: dict[str, dict[str, Any] | None],
    engine: ServerInfo | None = None,
) -> None:
    """slo, saturate and frontier on one simulator (or ``--url``, or the vLLM ``engine`` shared
    with the main scenarios); outage and control each start their own (``--url`` cannot be
    taken down, so they need the simulator)."""
    own = None if config.url else config.closed_sim_args
    shared = [s for s in scenarios if s in closedplan.ON_THE_SERVER]
    if shared:
        closed_config = dataclasses.replace(config, sim_args=config.closed_sim_args)
        with _reuse(engine) or _main_server(closed_config) as server:
            progress(f"closed-loop server: {server.base_url} sim_args={server.sim_args}")
            servers["closed_loop_server"] = _describe(server, config.url)
            runner = _Runner(config, server, runs, notes, progress)
            for scenario in shared:
                getattr(closedplan, scenario)(runner, contenders)
    rest = [s for s in scenarios if s in ("outage", "control")]
    if rest:
        # A stand-in: these jobs carry their simulator's arguments and start it.
        placeholder = ServerInfo("http://127.0.0.1:0/v1", "llmbatch-sim", sim_args=own)
        runner = _Runner(config, placeholder, runs, notes, progress)
        for scenario in rest:
            getattr(closedplan, scenario)(runner, own)


@contextlib.contextmanager
def _hot_server(config: BenchConfig) -> Iterator[ServerInfo]:
    """A zero-latency server: ``--overhead-url``, else ``llmbatch-server sim --zero-latency``."""
    if config.overhead_url:
        yield discover(config.overhead_url, config.api_key, config.model)
        return
    with simulator(HOT_SIM_ARGS) as info:
        yield info


class _Runner:
    """Runs one server's jobs, in order, each in its own process."""

    def __init__(
        self,
        config: BenchConfig,
        server: ServerInfo,
        runs: list[RunMetrics],
        notes: list[str],
        progress: Callable[[str], None],
        *,
        hot: bool = False,
    ) -> None:
        self.config = config
        self.server = server
        self.runs = runs
        self.notes = notes
        self.progress = progress
        self.hot = hot
        auto = server.priority or (server.sim_args is not None and "fcfs" not in server.sim_args)
        self.priority = (
            config.priority_scheduling if config.priority_scheduling is not None else auto
        )
        self._prompts_used = 0
        self.ceiling_result: dict[str, Any] | None = None
        """The offline run the ceiling scenario's jobs are judged against."""
        """Bulk prompts handed out so far: the next job's start (no prefix-cache
        hits on an earlier job's prompts)."""
        if hot:
            # The hot path compares llmbatch with raw requests of the same body: no
            # priority field on either side (a zero-latency server queues nothing).
            self.priority = False

    def job(self, **fields: Any) -> Job:
        c = self.config
        base: dict[str, Any] = {
            "base_url": self.server.base_url,
            "model": self.server.model,
            "api_key": c.api_key,
            "concurrency": c.concurrency,
            "max_in_flight": c.max_in_flight,
            "priority_scheduling": self.priority,
            "realtime_rate": c.realtime_rate,
            "realtime_duration": c.realtime_duration,
            "realtime_warmup": c.realtime_warmup,
            "realtime_max_tokens": c.realtime_max_tokens,
            "realtime_grace": c.realtime_grace,
            "seed": c.seed,
            # The hot path's server is the job's alone while it runs: its count of API
            # requests over the measurement is the client's.
            "count_requests": self.hot,
            "prompt_start": self._prompts_used,
        }
        job = Job(**{**base, **fields})
        self._prompts_used += job.n
        return job

    def run(self, job: Job, context: dict[str, Any] | None = None) -> RunMetrics | None:
        """Run ``job`` in its worker; ``context`` (what its numbers are judged in)
        joins its ``extra``."""
        if job.sim_args is not None or job.vllm is not None:
            return self._run_own_server(job, context)
        with MetricsSampler(self.server, self.config.api_key) as sampler:
            metrics = self._measure(job)
            if metrics is None:
                wait_idle(self.server, self.config.api_key)
                return None
        extra = {**metrics.extra, **sampler.summary(), **(context or {})}
        if "machine_busy_cores" in extra and metrics.wall_s > 0:
            ours = metrics.cpu_s + extra.get("server_cpu_s", 0.0)
            extra["other_load_cores"] = round(
                extra["machine_busy_cores"] - ours / metrics.wall_s, 2
            )
        metrics = dataclasses.replace(metrics, extra=extra)
        wait_idle(self.server, self.config.api_key)
        self.runs.append(metrics)
        self.progress(_line(metrics))
        return metrics

    def _measure(self, job: Job) -> RunMetrics | None:
        """``job``'s metrics from its worker (or this process); None, noted, if it
        failed: one contender's crash must not cost the other results."""
        try:
            if self.config.isolate:
                return run_in_worker(job, timeout=_worker_timeout(job))
            return run_in_process(job)
        except WorkerError as exc:
            self.notes.append(str(exc))
            self.progress(f"[{job.scenario}] {job.name}: FAILED: {exc}")
            return None

    def _run_own_server(self, job: Job, context: dict[str, Any] | None) -> RunMetrics | None:
        """A job that starts (and takes down) its own simulator: nothing to sample."""
        metrics = self._measure(job)
        if metrics is None:
            return None
        metrics = dataclasses.replace(metrics, extra={**metrics.extra, **(context or {})})
        self.runs.append(metrics)
        self.progress(_line(metrics))
        return metrics

    # -- scenarios -------------------------------------------------------------------

    def sweep(self, contenders: Sequence[str]) -> None:
        c = self.config
        for concurrency in c.sweep:
            self.run(
                self.job(
                    kind="probe",
                    scenario="sweep",
                    contender="probe",
                    label=f"probe c={concurrency}",
                    n=c.n,
                    max_tokens=c.max_tokens,
                    concurrency=concurrency,
                    batch=c.sweep_batch,
                )
            )

    def bulk(self, contenders: Sequence[str]) -> None:
        self._bulk_rounds("bulk", contenders, {})

    def _bulk_rounds(
        self, scenario: str, contenders: Sequence[str], context: dict[str, Any]
    ) -> None:
        """Each contender's bulk work, once a round, ``--bulk-rounds`` rounds."""
        c = self.config
        for round_ in range(c.bulk_rounds):
            for name in contenders:
                job = self.job(
                    kind="bulk",
                    scenario=scenario,
                    contender=name,
                    n=c.n,
                    max_tokens=c.max_tokens,
                    repeat=round_,
                )
                self.run(job, {**context, "round": round_ + 1})

    def ceiling(self, contenders: Sequence[str]) -> None:
        """The bulk work again, each client judged against vLLM's offline run of the
        same prompt shape and count (:mod:`.ceiling`, measured before the server
        started)."""
        c = self.config
        offline = self.ceiling_result or {}
        context = {
            "ceiling_prompts_per_s": offline.get("prompts_per_s"),
            "ceiling_output_tokens_per_s": offline.get("output_tokens_per_s"),
            "prompt_shape": c.prompts,
        }
        self._bulk_rounds("ceiling", contenders, context)

    def bulk_chat(self, contenders: Sequence[str]) -> None:
        """Conversations instead of prompts: llmbatch's ``map`` (the chat batch route
        where the server has it) against one ``chat.completions.create`` per chat."""
        c = self.config
        for name in [n for n in contenders if n in ("llmbatch", "openai")]:
            self.run(
                self.job(
                    kind="bulk",
                    scenario="bulk-chat",
                    contender=name,
                    n=c.n,
                    max_tokens=c.max_tokens,
                    inputs="chat",
                )
            )

    def mixed(self, contenders: Sequence[str]) -> None:
        c = self.config
        n = c.mixed_n or self._mixed_n()
        for name in contenders:
            self.run(self.job(kind="idle", scenario="idle", contender=name))
            self.run(
                self.job(
                    kind="mixed", scenario="mixed", contender=name, n=n, max_tokens=c.max_tokens
                )
            )

    def _mixed_n(self) -> int:
        """Enough bulk prompts to keep the server busy through warm-up and window."""
        c = self.config
        best = capacity(self.runs)
        rate = (
            best.prompts_per_s
            if best
            else max((r.prompts_per_s for r in self.runs if r.scenario == "bulk"), default=0.0)
        )
        if not rate or not math.isfinite(rate):
            return 50_000
        return max(1_000, math.ceil(rate * (c.realtime_warmup + c.realtime_duration) * 1.5))


def _worker_timeout(job: Job) -> float | None:
    """A job with a time limit gets its hard stop, then a minute for the process
    to start, warm up and exit, before it is killed; others run as long as they take."""
    if job.time_limit is None:
        return None
    # A job's own vLLM loads twice (start, restart) outside its time limit.
    starts = 2 * 300.0 if job.vllm is not None else 0.0
    return job.time_limit + HARD_STOP_GRACE + 60.0 + starts


def _line(m: RunMetrics) -> str:
    return (
        f"[{m.scenario}] {m.label}: {m.ok} ok, {m.failed} failed, "
        f"{m.prompts_per_s:.0f} prompts/s, {m.cpu_us_per_prompt:.0f} µs CPU/prompt, "
        f"peak RSS {m.peak_rss_mb or math.nan:.0f} MB, {m.wall_s:.1f} s"
    )
