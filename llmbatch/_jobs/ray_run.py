"""``llmbatch run --ray``: one JSONL job spread over Ray actors, shard in, shards out.

The driver (this process) locks the output directory and reads what earlier runs
left there; Ray tasks check every input shard (the same checks as the
single-process run, one file per task); then ``ray.data.read_text`` streams the
lines to a pool of :class:`~llmbatch._jobs.ray_lines.JobLines` actors, each with
its own client and its own output shard. Only counts come back to the driver.

Ray is imported when a run starts, never by ``llmbatch`` itself.
"""

from __future__ import annotations

import contextlib
import importlib
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from llmbatch._config import Limits, RateLimit
from llmbatch._jobs.output import report_resumed
from llmbatch._jobs.ray_lines import COUNTS, FileCheck, JobLines, JobStopped, check_file
from llmbatch._jobs.runner import REPORT_LIMIT, JobConfig, JobRejected, JobSummary
from llmbatch._jobs.shards import OutputDir, input_files
from llmbatch._sync import SyncClient
from llmbatch.ray import DEFAULT_BATCH_SIZE, DEFAULT_NUM_CPUS, actor_options

__all__ = ["RAY_MISSING", "RayMissing", "RayOptions", "import_ray", "run_on_ray"]

RAY_MISSING = (
    "--ray needs Ray Data, which is not installed: pip install 'llmbatch[ray]' "
    "(in a checkout: pip install -e '.[ray]')"
)

# Ray, or what `ray[data]` adds to it: without any of them, the extra is missing.
_RAY_DATA_PARTS = frozenset({"ray", "pyarrow", "pandas", "numpy"})


class RayMissing(ImportError):
    """``--ray`` without Ray installed; the message says what to install."""


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How ``--ray`` spreads the job."""

    address: str | None = None
    """A running cluster (``ray.init(address=...)``); None: $RAY_ADDRESS, else a
    local Ray started for the run and stopped after it."""
    actors: int = 2
    batch_size: int = DEFAULT_BATCH_SIZE
    num_cpus: float = DEFAULT_NUM_CPUS
    show_progress: bool = False


def import_ray() -> ModuleType:
    """Ray, with Ray Data; :class:`RayMissing` if it is not installed."""
    try:
        importlib.import_module("ray.data")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] not in _RAY_DATA_PARTS:
            raise  # Ray is there but broken: show the real error
        raise RayMissing(RAY_MISSING) from None
    return importlib.import_module("ray")


def run_on_ray(
    config: JobConfig,
    options: RayOptions,
    *,
    report: Callable[[str], None],
    summary: JobSummary | None = None,
) -> JobSummary:
    """Run ``config``'s job on Ray; ``config.input`` may be a file, a directory or
    a glob, and ``config.output`` is a directory of shards."""
    started = time.monotonic()
    summary = JobSummary() if summary is None else summary
    ray = import_ray()
    files = input_files(str(config.input))
    # A bad --base-url fails here, as in the single-process run, not in an actor.
    SyncClient(config.base_url, api_key=config.api_key)
    with OutputDir(config.output, retry_failed=config.retry_failed) as out:
        resumed = out.resumed
        report_resumed(config.output, resumed.torn_lines, resumed.removed_failed, report)
        with _ray_session(ray, options):
            done = ray.put(frozenset(resumed.done))
            checks = _check_files(ray, files, config.model, done)
            model = _job_model(checks, config, report)
            summary.input_lines = sum(c.lines for c in checks)
            summary.malformed = sum(c.malformed for c in checks)
            pending = sum(c.pending for c in checks)
            summary.already_done = summary.input_lines - pending
            summary.earlier_failures = resumed.failed
            if pending:
                try:
                    _run(ray, files, config, options, model, resumed.done, summary)
                except Exception as exc:
                    stopped = _cause(exc, JobStopped)
                    if stopped is None:
                        raise
                    summary.stopped, summary.hint = stopped.why, stopped.hint
    summary.wall_time = time.monotonic() - started
    return summary


@contextlib.contextmanager
def _ray_session(ray: ModuleType, options: RayOptions) -> Iterator[None]:
    """Joins ``options.address`` (or $RAY_ADDRESS), else starts a local Ray for the
    run; shuts down only what it started."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    saved = context.enable_progress_bars, context.raise_original_map_exception
    context.enable_progress_bars = options.show_progress
    # JobStopped itself, not Ray Data's wrapper of it, which loses it on the way.
    context.raise_original_map_exception = True
    try:
        yield
    finally:
        context.enable_progress_bars, context.raise_original_map_exception = saved
        if started:
            ray.shutdown()


def _check_files(
    ray: ModuleType, files: list[Any], model: str | None, done: Any
) -> list[FileCheck]:
    check = ray.remote(num_cpus=DEFAULT_NUM_CPUS)(check_file)
    checks: list[FileCheck] = ray.get([check.remote(str(f), model, done) for f in files])
    return checks


def _job_model(
    checks: list[FileCheck], config: JobConfig, report: Callable[[str], None]
) -> str | None:
    """The job's model, after refusing the input as the single-process run would."""
    problems = [p for c in checks for p in c.problems]
    for message in problems[:REPORT_LIMIT]:
        report(message)
    total = sum(c.malformed + c.duplicates for c in checks)
    if total > REPORT_LIMIT:
        report(f"... and {total - min(len(problems), REPORT_LIMIT)} more problems")
    duplicates = sum(c.duplicates for c in checks)
    if duplicates:
        raise JobRejected(
            f"{duplicates} duplicate custom_id(s) in {config.input}; "
            "custom_ids must be unique. Nothing was sent."
        )
    malformed = sum(c.malformed for c in checks)
    if malformed and config.on_malformed == "fail":
        raise JobRejected(
            f"{malformed} malformed line(s) in {config.input}; nothing was sent "
            "(--on-malformed skip runs the valid lines)"
        )
    if config.model is not None:
        return config.model
    models = {c.model: c.path for c in checks if c.model is not None}
    if len(models) > 1:
        named = ", ".join(f"{m!r} ({path})" for m, path in sorted(models.items()))
        raise JobRejected(
            f"the input shards name different models: {named}; pass --model to run every "
            "line with one model. Nothing was sent."
        )
    return next(iter(models), None)


def _run(
    ray: ModuleType,
    files: list[Any],
    config: JobConfig,
    options: RayOptions,
    model: str | None,
    done: set[str],
    summary: JobSummary,
) -> None:
    # The job's limits are shared out: each actor has its own client, and the total
    # is what the user asked for when every actor is busy.
    share = options.actors
    rate: dict[str, Any] = {}
    if config.requests_per_minute or config.tokens_per_minute:
        rate["rate_limit"] = RateLimit(
            requests_per_minute=_split(config.requests_per_minute, share),
            tokens_per_minute=_split(config.tokens_per_minute, share),
        )
    lines = ray.data.read_text([str(f) for f in files])
    # A file is one read task, and a block goes whole to one actor: blocks of a few
    # batches let every actor work on a job of one big file.
    lines = lines.repartition(target_num_rows_per_block=options.batch_size * 4)
    with warnings.catch_warnings():
        # Ray 2.5x deprecates ray_remote_args without a named max_restarts to use
        # instead; until it has one, the warning would only confuse the user.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        counts = _answered(lines, config, options, model, done, share, rate)
    for batch in counts.iter_batches(batch_size=None, batch_format="numpy"):
        _add(summary, batch)


def _answered(
    lines: Any,
    config: JobConfig,
    options: RayOptions,
    model: str | None,
    done: set[str],
    share: int,
    rate: dict[str, Any],
) -> Any:
    """``lines`` through the pool of JobLines actors: one row of counts per batch."""
    return lines.map_batches(
        JobLines,
        fn_constructor_args=(str(config.output),),
        fn_constructor_kwargs={
            "input_name": str(config.input),
            "base_url": config.base_url,
            "api_key": config.api_key,
            "model": model,
            "check_model": config.model is None,
            "priority": config.priority,
            "tenant": config.tenant,
            # One job is one tier: slots reserved for realtime would only sit idle.
            "limits": Limits(
                max_in_flight=max(1, config.max_in_flight // share), reserved_realtime=0
            ),
            "client_options": {
                "retry": config.retry,
                "priority_scheduling": config.send_priority,
                "slo": config.slo,
                "on_close": "cancel",
                # Every actor on a machine shares the file (SQLite's locks).
                "cache": config.cache,
                **rate,
            },
            "done": frozenset(done),
        },
        batch_size=options.batch_size,
        # A restarted actor would send its batch again after writing part of it:
        # fail the run instead, and let the rerun resume from what was written.
        max_restarts=0,
        **actor_options(options.actors, num_cpus=options.num_cpus),
    )


def _add(summary: JobSummary, batch: dict[str, Any]) -> None:
    total = {name: int(batch[name].sum()) for name in COUNTS}
    summary.done += total["done"]
    summary.failed += total["failed"]
    summary.retried += total["retried"]
    summary.prompt_tokens += total["prompt_tokens"]
    summary.completion_tokens += total["completion_tokens"]


def _split(value: float | None, parts: int) -> float | None:
    return None if value is None else value / parts


def _cause(error: BaseException, kind: type[JobStopped]) -> JobStopped | None:
    """The ``kind`` error somewhere in Ray's wrapping of ``error``, if any."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        pending += [current.__cause__, current.__context__, getattr(current, "cause", None)]
    return None
