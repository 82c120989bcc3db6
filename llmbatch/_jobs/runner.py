"""Run one JSONL job: check the input, resume the output, stream results into it.

A request's result is appended as soon as it finishes. A failure that would hit
every remaining request alike (the server unreachable, a wrong API key, an unknown
model) stops the job instead of writing a failed line per request; those requests
stay undone and a rerun picks them up. The summary then says why it stopped and
what to do, in the command line's terms (``--model``, ``--base-url``), not Python's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from llmbatch._client import Client
from llmbatch._config import (
    DEFAULT_LIMITS,
    DEFAULT_RETRY_POLICY,
    Cache,
    Limits,
    Price,
    Priority,
    RateLimit,
    RetryPolicy,
)
from llmbatch._exceptions import (
    AuthenticationError,
    ConnectError,
    LLMBatchError,
    NotFoundError,
    PermissionDeniedError,
    RequestError,
    ServerInfoError,
    SpendingLimitReached,
    UnknownModelError,
    usd,
)
from llmbatch._jobs.format import SchemaLine, answer_of, result_record
from llmbatch._jobs.input import PendingInputs, scan_input
from llmbatch._jobs.output import OutputFile, report_resumed
from llmbatch._models import Result
from llmbatch._progress import ProgressLike
from llmbatch._transports.base import Transport

__all__ = ["JobConfig", "JobRejected", "JobSummary", "run_job"]

#: Errors that every remaining request would get too: stop rather than record them.
JOB_FATAL = (ConnectError, AuthenticationError, PermissionDeniedError, NotFoundError)
#: Malformed lines and duplicates reported one by one before a summary count.
REPORT_LIMIT = 20


class JobRejected(LLMBatchError):
    """The input was refused before anything was sent (duplicates, malformed lines)."""


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """Everything ``llmbatch run`` was asked to do."""

    input: Path
    output: Path
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None
    priority: Priority = Priority.BATCH
    send_priority: bool = False
    slo: Literal["auto"] | None = "auto"
    """``--slo``: the default SLO, or none."""
    tenant: str | None = None
    max_in_flight: int = DEFAULT_LIMITS.max_in_flight
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    on_malformed: Literal["skip", "fail"] = "fail"
    retry_failed: bool = False
    progress: ProgressLike = None
    retry: RetryPolicy = DEFAULT_RETRY_POLICY
    transport: Transport | None = None
    response_model: object = None
    """Validate each answer into this type (``--response-model``)."""
    max_reasks: int | None = None
    max_cost: float | None = None
    """Dollars the run may spend (``--max-cost``); the lines it leaves stay undone."""
    price: Price | None = None
    """What the job's tokens cost (``--price``; else the catalogue's, if installed)."""
    cache: Cache | None = None
    """Where answers are kept across runs and jobs (``--cache``)."""


@dataclass(slots=True)
class JobSummary:
    """Counts for one run (``already_done`` and ``earlier_failures`` are from before it)."""

    input_lines: int = 0
    malformed: int = 0
    already_done: int = 0
    earlier_failures: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    """Dollars this run's answers cost (None: no price known for the model)."""
    from_cache: int = 0
    """Lines this run answered from ``--cache`` (nothing sent for them)."""
    over_budget: int = 0
    """Lines left unsent because ``--max-cost`` was spent (a rerun sends them)."""
    wall_time: float = 0.0
    stopped: str | None = None
    """Why the job stopped before the end (then a rerun resumes it)."""
    hint: str | None = None
    """What to do about ``stopped`` before that rerun."""

    @property
    def saved(self) -> int:
        """Input lines with an output line, from this run and earlier ones."""
        return self.already_done + self.done + self.failed

    @property
    def remaining(self) -> int:
        """Valid input lines still without an output line."""
        return self.input_lines - self.saved

    @property
    def complete(self) -> bool:
        """Every valid input line has an output line."""
        return self.stopped is None and self.remaining == 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["wall_time"] = round(self.wall_time, 3)
        rate = (self.done + self.failed) / self.wall_time if self.wall_time > 0 else 0.0
        data["prompts_per_s"] = round(rate, 1)
        data["complete"] = self.complete
        return data


async def run_job(
    config: JobConfig, *, report: Callable[[str], None], summary: JobSummary | None = None
) -> JobSummary:
    """Run ``config``'s job; ``report`` receives human-readable notices.

    ``summary``, when given, is filled in as the job runs, so a caller whose run was
    interrupted (Ctrl-C) can still tell how far it got.
    """
    started = time.monotonic()
    summary = JobSummary() if summary is None else summary
    scan = scan_input(config.input, model=config.model)
    problems = [
        f"{config.input}:{m.line_no}: {m.reason}"
        for m in sorted([*scan.malformed, *scan.duplicates], key=lambda m: m.line_no)
    ]
    for message in problems[:REPORT_LIMIT]:
        report(message)
    if len(problems) > REPORT_LIMIT:
        report(f"... and {len(problems) - REPORT_LIMIT} more problems")
    if scan.duplicates:
        raise JobRejected(
            f"{len(scan.duplicates)} duplicate custom_id(s) in {config.input}; "
            "custom_ids must be unique. Nothing was sent."
        )
    if scan.malformed and config.on_malformed == "fail":
        raise JobRejected(
            f"{len(scan.malformed)} malformed line(s) in {config.input}; nothing was sent "
            "(--on-malformed skip runs the valid lines)"
        )
    summary.input_lines, summary.malformed = len(scan.ids), len(scan.malformed)
    with OutputFile(config.output, retry_failed=config.retry_failed) as out:
        resumed = out.resumed
        report_resumed(config.output, resumed.torn_lines, resumed.removed_failed, report)
        pending = sum(1 for custom_id in scan.ids if custom_id not in resumed.done)
        summary.already_done = summary.input_lines - pending
        summary.earlier_failures = resumed.failed
        inputs = PendingInputs(
            config.input, skip_lines=scan.bad_lines, done=resumed.done, count=pending
        )
        scan.ids.clear()  # only the output's custom_ids are needed from here on
        if pending:
            try:
                await _run(config, scan.model, inputs, out, summary)
            except (ServerInfoError, *JOB_FATAL) as exc:  # raised as the client opened
                summary.stopped, summary.hint = stop_reason(exc, config)
    summary.wall_time = time.monotonic() - started
    return summary


def stop_reason(error: LLMBatchError, config: JobConfig) -> tuple[str, str]:
    """Why a job stopped and what to do about it, in the command line's terms."""
    rerun = "then rerun the same command to resume"
    if isinstance(error, UnknownModelError):
        if config.model:
            where, fix = "from --model", "pass --model NAME with one of them"
        else:
            where = f"from body.model in {config.input}"
            fix = (
                "add --model NAME to run every line with one of them, or fix body.model "
                f"in {config.input}"
            )
        why = f"the server does not serve model {error.model!r} ({where}); it serves {error.served}"
        return why, f"{fix}; nothing was sent"
    if isinstance(error, ServerInfoError):
        if error.__cause__ is not None:  # the model list could not be read at all
            why = f"could not read the server's model list ({error.__cause__})"
            return why, f"check that the server is up and --base-url points at it; {rerun}"
        return str(error), f"check --base-url (and --model, if the server lists none); {rerun}"
    why = f"{type(error).__name__}: {error.message if isinstance(error, RequestError) else error}"
    if isinstance(error, AuthenticationError | PermissionDeniedError):
        return why, f"check the API key ($LLMBATCH_API_KEY, $OPENAI_API_KEY or --api-key); {rerun}"
    if isinstance(error, ConnectError):
        return why, f"start the server or fix --base-url; {rerun}"
    return why, f"check --base-url and the model; {rerun}"


async def _run(
    config: JobConfig,
    model: str | None,
    inputs: PendingInputs,
    out: OutputFile,
    summary: JobSummary,
) -> None:
    rate_limit = None
    if config.requests_per_minute or config.tokens_per_minute:
        rate_limit = RateLimit(
            requests_per_minute=config.requests_per_minute,
            tokens_per_minute=config.tokens_per_minute,
        )
    client = Client(
        config.base_url,
        api_key=config.api_key,
        model=model,
        # One job is one tier: slots reserved for realtime would only sit idle.
        limits=Limits(max_in_flight=config.max_in_flight, reserved_realtime=0),
        retry=config.retry,
        rate_limit=rate_limit,
        transport=config.transport,
        priority_scheduling=config.send_priority,
        slo=config.slo,
        on_close="cancel",
        prices=None if config.price is None else {"*": config.price},
        max_cost=config.max_cost,
        cache=config.cache,
    )
    async with client:
        async for _index, result in client.map_unordered(
            inputs,
            priority=config.priority,
            tenant=config.tenant,
            progress=config.progress,
            response_model=config.response_model,
            max_reasks=config.max_reasks,
        ):
            if isinstance(result.error, JOB_FATAL):
                summary.stopped, summary.hint = stop_reason(result.error, config)
                break
            if isinstance(result.error, SpendingLimitReached):
                summary.over_budget += 1  # not written: a rerun sends it, as after Ctrl-C
                continue
            _record(result, out, summary)
        stats = client.stats()
        # The client's count leaves out the extra requests of a 400 bisection.
        summary.retried = stats.tiers[config.priority].retried
        if stats.cost.answers > stats.cost.unpriced:
            summary.cost = stats.cost.dollars
    if summary.over_budget and summary.stopped is None:
        spent = "" if summary.cost is None else f" ({usd(summary.cost)} spent)"
        summary.stopped = f"--max-cost {usd(config.max_cost or 0)} was reached{spent}"
        summary.hint = (
            f"{summary.over_budget:,} line(s) were not sent; rerun with a higher --max-cost "
            "to resume"
        )


def _record(result: Result[Any], out: OutputFile, summary: JobSummary) -> None:
    custom_id = result.metadata
    out.write(result_record(str(custom_id), result, json_answer=isinstance(custom_id, SchemaLine)))
    if result.error is None:
        answer = answer_of(result)
        summary.done += 1
        summary.from_cache += result.from_cache
        summary.prompt_tokens += answer.usage.prompt_tokens
        summary.completion_tokens += answer.usage.completion_tokens
    else:
        summary.failed += 1
