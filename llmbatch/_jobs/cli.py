"""``llmbatch run INPUT.jsonl -o OUTPUT.jsonl``: the command line of a JSONL job.

Exit codes:

- 0: every input line has a successful output line.
- 1: the job ran to the end, but some requests failed (their error lines are in
  the output) or malformed lines were skipped.
- 2: usage error: bad arguments, unreadable input.
- 3: the input was rejected before anything was sent: duplicate custom_ids, or
  malformed lines under ``--on-malformed fail`` (the default).
- 4: the job stopped early: server unreachable, authentication or unknown model,
  output file locked by another run or not an output file. The message says what to
  fix; a rerun then resumes.
- 130: interrupted (Ctrl-C, SIGINT); 143: stopped by SIGTERM (systemd, ``docker
  stop``, ``timeout``). Either way the message counts what was saved and what
  remains, and a rerun resumes. A job started in the background by a shell (``&``)
  inherits SIGINT ignored; it stops on SIGINT all the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

from llmbatch._calls.validate import check_tenant
from llmbatch._config import DEFAULT_LIMITS, Cache, Price, Priority
from llmbatch._exceptions import InvalidRequestError, usd
from llmbatch._jobs.output import OutputError
from llmbatch._jobs.runner import JobConfig, JobRejected, JobSummary, run_job
from llmbatch._jobs.shards import InputError
from llmbatch._progress import ProgressBar, ProgressLike
from llmbatch._replicas import DEFAULT_BASE_URL
from llmbatch.ray import DEFAULT_BATCH_SIZE

__all__ = ["EXIT_FAILURES", "EXIT_OK", "EXIT_REJECTED", "EXIT_STOPPED", "EXIT_USAGE", "add_parser"]

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_STOPPED = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
#: Seconds between progress lines when stderr is not a terminal.
LOG_PROGRESS_EVERY = 5.0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``run`` to the ``llmbatch`` subcommands."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run a JSONL batch file (OpenAI Batch API format), resumably",
        description=(
            "Send every request of INPUT (OpenAI Batch API lines: custom_id, method, url, "
            "body; /v1/completions or /v1/chat/completions) and append one result line per "
            "custom_id to OUTPUT as it finishes. Rerunning with the same OUTPUT skips the "
            "custom_ids already there, so an interrupted job resumes where it stopped."
        ),
        epilog=(
            "exit codes: 0 all succeeded; 1 finished with failed requests or skipped "
            "malformed lines; 2 usage error; 3 input rejected (duplicate custom_ids, "
            "malformed lines), nothing sent; 4 stopped early (server unreachable, auth, "
            "unknown model, output locked or invalid): fix what the message says, then "
            "rerun to resume; 130 interrupted (Ctrl-C), 143 stopped by SIGTERM: rerun to "
            "resume"
        ),
    )
    parser.add_argument(
        "input",
        type=Path,
        metavar="INPUT.jsonl",
        help="the requests: one OpenAI Batch API line each (a file; it is read twice); "
        "with --ray also a directory of *.jsonl shards or a quoted glob",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="OUTPUT.jsonl",
        help="where results are appended as they finish; a rerun resumes from it "
        "(required); with --ray a directory of part-*.jsonl shards",
    )
    server = parser.add_argument_group("server")
    server.add_argument(
        "--base-url",
        metavar="URL",
        help="the server's OpenAI base URL (default: $LLMBATCH_BASE_URL, then "
        f"$OPENAI_BASE_URL, then {DEFAULT_BASE_URL})",
    )
    server.add_argument(
        "--api-key",
        metavar="KEY",
        help="bearer token; prefer the environment, since arguments show in `ps` "
        "(default: $LLMBATCH_API_KEY, then $OPENAI_API_KEY, else none)",
    )
    server.add_argument(
        "--model",
        metavar="NAME",
        help="run every line with this model, whatever its body.model says (default: the "
        "lines' body.model, else the server's first model)",
    )
    sched = parser.add_argument_group("scheduling")
    sched.add_argument(
        "--priority",
        choices=[p.value for p in Priority],
        default=Priority.BATCH.value,
        help="the llmbatch tier every request of the job runs in (default: %(default)s)",
    )
    sched.add_argument(
        "--send-priority",
        action="store_true",
        help="also send the tier as vLLM's priority field, so the job yields to other "
        "clients' interactive work (server needs --scheduling-policy priority) "
        "(default: off)",
    )
    sched.add_argument(
        "--slo",
        choices=("auto", "none"),
        default="auto",
        help="the client's SLO, as Client(slo=...): 'auto' or 'none'; a job is one "
        "tier, so the default SLO never holds it back (docs/concepts.md, 'The default "
        "SLO') (default: %(default)s)",
    )
    sched.add_argument(
        "--tenant",
        type=_tenant,
        metavar="NAME",
        help="the tenant every request of the job runs as: sent as OpenAI's user field "
        "unless a line's body has one, and counted per tenant (default: none)",
    )
    sched.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=DEFAULT_LIMITS.max_in_flight,
        metavar="N",
        help="sequences on the server at once; match vLLM's --max-num-seqs (default: %(default)s)",
    )
    sched.add_argument(
        "--rpm",
        type=_positive_float,
        metavar="N",
        help="requests per minute at most (default: no limit)",
    )
    sched.add_argument(
        "--tpm",
        type=_positive_float,
        metavar="N",
        help="tokens per minute at most, estimated (default: no limit)",
    )
    job = parser.add_argument_group("job")
    job.add_argument(
        "--max-cost",
        type=_positive_float,
        metavar="DOLLARS",
        help="spend at most this much: once it is spent no new line is sent, what is in "
        "flight settles, and the rest stay undone for a rerun; needs the model's price "
        "(--price, or the genai-prices catalogue for a hosted provider) (default: no limit)",
    )
    job.add_argument(
        "--price",
        type=_price,
        metavar="IN,OUT[,CACHED]",
        help="dollars per million prompt and completion tokens (and cached prompt "
        "tokens), for the cost in the summary and --max-cost (default: the genai-prices "
        "catalogue's, for a hosted provider, where installed)",
    )
    job.add_argument(
        "--cache",
        type=Path,
        metavar="PATH",
        help="keep every answer in this file (created, readable by you only) and answer "
        "a line asked before from it, sending nothing: a new job with the same prompts, "
        "or this one with lines added, sends only what is new (docs/caching.md) "
        "(default: none)",
    )
    job.add_argument(
        "--cache-namespace",
        default="",
        metavar="NAME",
        help="part of every cache key: a new name starts afresh without deleting "
        "anything (default: none)",
    )
    job.add_argument(
        "--response-model",
        metavar="MODULE:CLASS",
        help="validate every answer into this pydantic model (or any type pydantic "
        "takes), imported from MODULE; each output line adds it as 'parsed', or the "
        "validation error in 'error' (docs/structured-outputs.md) (default: none)",
    )
    job.add_argument(
        "--max-reasks",
        type=int,
        default=None,
        metavar="N",
        help="answers that fail validation are sent back to be corrected up to N times "
        "(default: 2)",
    )
    job.add_argument(
        "--on-malformed",
        choices=["skip", "fail"],
        default="fail",
        help="malformed input lines: refuse the job before sending anything (fail), or "
        "run the valid lines (skip) (default: %(default)s)",
    )
    job.add_argument(
        "--retry-failed",
        action="store_true",
        help="remove failed lines from OUTPUT and run those requests again (default: off)",
    )
    job.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress on stderr: a line redrawn in place on a terminal, a line every "
        f"{LOG_PROGRESS_EVERY:.0f} s in a log (default: on; --no-progress: only the summary)",
    )
    job.add_argument(
        "--summary-json",
        metavar="PATH",
        help="also write the summary as JSON, '-' for stdout (default: none)",
    )
    ray = parser.add_argument_group(
        "ray", "spread a job too big for one process over Ray actors (docs/ray.md)"
    )
    ray.add_argument(
        "--ray",
        action="store_true",
        help="run the job on Ray Data: INPUT may be a file, a directory or a glob of "
        "shards, OUTPUT is a directory; needs `pip install 'llmbatch[ray]'` (default: off)",
    )
    ray.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join (default: $RAY_ADDRESS, else a local Ray for the run)",
    )
    ray.add_argument(
        "--concurrency",
        type=_positive_int,
        default=2,
        metavar="N",
        help="actors, each with its own client; --max-in-flight, --rpm and --tpm are "
        "shared out among them (default: %(default)s)",
    )
    ray.add_argument(
        "--batch-size",
        type=_positive_int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help="lines per batch an actor answers at once (default: %(default)s)",
    )
    parser.set_defaults(handler=handle)
    return parser


def handle(args: argparse.Namespace) -> int:
    """Run the job described by ``args``; returns the exit code."""
    if args.ray:
        return handle_ray(args)
    if args.ray_address:
        return _fail(EXIT_USAGE, "--ray-address needs --ray")
    if args.input.resolve() == args.output.resolve():
        return _fail(EXIT_USAGE, "INPUT and OUTPUT must be different files")
    if not args.input.is_file():
        return _fail(EXIT_USAGE, _not_a_file(args.input))
    progress = ProgressBar(description=args.input.name, line_interval=LOG_PROGRESS_EVERY)
    try:
        config = _config(args, progress if args.progress else None)
    except ValueError as exc:
        return _fail(EXIT_USAGE, str(exc))
    summary = JobSummary()  # filled in as the job runs: still readable after Ctrl-C
    stop = Stop()
    try:
        with stops_on_signals(stop):
            anyio.run(lambda: run_job(config, report=_say, summary=summary))
    except JobRejected as exc:
        return _fail(EXIT_REJECTED, str(exc))
    except InvalidRequestError as exc:  # e.g. a --base-url that is not a URL
        return _fail(EXIT_USAGE, str(exc))
    except OutputError as exc:
        return _fail(EXIT_STOPPED, str(exc))
    except KeyboardInterrupt:
        return _fail(stop.exit_code, format_interrupted(summary, args.output, stop.by))
    return _finish(summary, args)


class Stop:
    """Which signal stopped the job: SIGINT (Ctrl-C) unless SIGTERM came first."""

    def __init__(self) -> None:
        self.signal = signal.SIGINT

    @property
    def by(self) -> str | None:
        """How the message names it (None: Ctrl-C, the plain "interrupted")."""
        return None if self.signal == signal.SIGINT else self.signal.name

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.signal == signal.SIGINT else EXIT_TERMINATED


@contextlib.contextmanager
def stops_on_signals(stop: Stop) -> Iterator[None]:
    """While the job runs, SIGTERM stops it as Ctrl-C does (what systemd, ``docker
    stop`` and ``timeout`` send would otherwise end the process with no summary),
    and a SIGINT inherited as ignored (a shell's ``&``) is heeded again: a job that
    is asked to stop saves what it has and says how to resume.

    SIGTERM is handed to whatever handles SIGINT at that moment: asyncio's runner,
    which cancels the job's main task the first time and raises
    ``KeyboardInterrupt`` the second, as it does for a second Ctrl-C. ``stop`` notes
    which signal came."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers are the main thread's alone
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop.signal = signal.SIGTERM
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.signal(signal.SIGTERM, on_sigterm)
    if before_int == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before_term)
        signal.signal(signal.SIGINT, before_int)


def _not_a_file(path: Path) -> str:
    """Why INPUT cannot be read as a job, and what to do."""
    if not path.exists():
        return f"{path}: no such file"
    if path.is_dir():
        return f"{path}: a directory (a directory of *.jsonl shards runs with --ray)"
    # A pipe, /dev/stdin, a FIFO: read once, where a job reads its input twice.
    return (
        f"{path}: not a regular file (a pipe?); llmbatch run reads its input twice (all "
        "of it is checked before anything is sent) and a rerun reads it again to resume, "
        "which a pipe cannot give: save it to a file first (... > jobs.jsonl) and run that"
    )


def _config(args: argparse.Namespace, progress: ProgressLike) -> JobConfig:
    return JobConfig(
        input=args.input,
        output=args.output,
        base_url=args.base_url,
        api_key=args.api_key,
        model=args.model,
        priority=Priority(args.priority),
        send_priority=args.send_priority,
        slo=None if args.slo == "none" else "auto",
        tenant=args.tenant,
        max_in_flight=args.max_in_flight,
        requests_per_minute=args.rpm,
        tokens_per_minute=args.tpm,
        on_malformed=args.on_malformed,
        retry_failed=args.retry_failed,
        progress=progress,
        response_model=import_target(args.response_model) if args.response_model else None,
        max_reasks=args.max_reasks,
        max_cost=args.max_cost,
        price=args.price,
        cache=None if args.cache is None else Cache(args.cache, namespace=args.cache_namespace),
    )


def _price(text: str) -> Price:
    """``--price IN,OUT[,CACHED]``: dollars per million tokens."""
    parts = text.split(",")
    try:
        numbers = [float(part) for part in parts]
        if len(numbers) not in (2, 3):
            raise ValueError
        return Price(
            input=numbers[0],
            output=numbers[1],
            cached_input=numbers[2] if len(numbers) == 3 else None,
        )
    except (ValueError, InvalidRequestError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected IN,OUT or IN,OUT,CACHED, dollars per million tokens >= 0 "
            "(e.g. 0.15,0.60)"
        ) from None


def import_target(spec: str) -> object:
    """``package.module:Name`` (dots after the colon reach nested names): the object,
    or ValueError saying what is wrong."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"--response-model {spec!r}: expected MODULE:CLASS")
    import importlib

    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` has it
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--response-model {spec!r}: cannot import {module_name}: {exc}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(
                f"--response-model {spec!r}: {module_name} has no {attribute}"
            ) from None
    return target


def _finish(summary: JobSummary, args: argparse.Namespace) -> int:
    """Print the summary (and write it with --summary-json); returns the exit code."""
    code = exit_code(summary)
    _say(format_summary(summary))
    if summary.stopped:
        _say(f"stopped early: {summary.stopped}")
        _say(f"to go on: {summary.hint or 'rerun the same command to resume'}")
    elif summary.earlier_failures:
        _say(f"{summary.earlier_failures} earlier failure(s) kept; --retry-failed reruns them")
    if args.summary_json:
        data = {**summary.as_dict(), "exit_code": code, "output": str(args.output)}
        text = json.dumps(data, indent=2) + "\n"
        if args.summary_json == "-":
            sys.stdout.write(text)
        else:
            Path(args.summary_json).write_text(text)
    return code


def handle_ray(args: argparse.Namespace) -> int:
    """``--ray``: the job on Ray Data (imported only now); returns the exit code."""
    # Not at the top: the Ray path's modules are only needed with --ray.
    from llmbatch._jobs.ray_run import RayMissing, RayOptions, run_on_ray

    if args.input.resolve() == args.output.resolve():
        return _fail(EXIT_USAGE, "INPUT and OUTPUT must be different")
    if args.max_cost is not None:
        # Each actor has its own client: one limit would need a ledger they share.
        return _fail(EXIT_USAGE, "--max-cost is not supported with --ray yet")
    options = RayOptions(
        address=args.ray_address,
        actors=args.concurrency,
        batch_size=args.batch_size,
        # Ray Data's own bars: on a terminal only (in a log they are noise).
        show_progress=args.progress and sys.stderr.isatty(),
    )
    summary = JobSummary()
    stop = Stop()
    try:
        with stops_on_signals(stop):
            run_on_ray(_config(args, None), options, report=_say, summary=summary)
    except RayMissing as exc:
        return _fail(EXIT_USAGE, str(exc))
    except InputError as exc:
        return _fail(EXIT_USAGE, str(exc))
    except JobRejected as exc:
        return _fail(EXIT_REJECTED, str(exc))
    except InvalidRequestError as exc:
        return _fail(EXIT_USAGE, str(exc))
    except OutputError as exc:
        return _fail(EXIT_STOPPED, str(exc))
    except KeyboardInterrupt:
        return _fail(
            stop.exit_code,
            f"{_interrupted(stop.by)}: the results received so far are in {args.output}; "
            "rerun the same command to resume",
        )
    return _finish(summary, args)


def exit_code(summary: JobSummary) -> int:
    """The exit code for a finished (or stopped) job."""
    if summary.stopped:
        return EXIT_STOPPED
    if summary.failed or summary.earlier_failures or summary.malformed:
        return EXIT_FAILURES
    return EXIT_OK


def format_summary(s: JobSummary) -> str:
    """The one-paragraph summary printed on stderr at the end."""
    finished = s.done + s.failed
    rate = finished / s.wall_time if s.wall_time > 0 else 0.0
    return (
        f"llmbatch run: {s.done:,} done, {s.failed:,} failed, {s.retried:,} retried, "
        f"{s.already_done:,} already in the output, {s.malformed:,} malformed skipped; "
        f"{s.wall_time:.1f} s ({rate:,.0f}/s); tokens {s.prompt_tokens:,} prompt + "
        f"{s.completion_tokens:,} completion"
        + ("" if s.cost is None else f"; cost {usd(s.cost)}")
        + (f"; {s.from_cache:,} answered from the cache" if s.from_cache else "")
    )


def format_interrupted(s: JobSummary, output: Path, by: str | None = None) -> str:
    """What an interrupted run saved, what remains, and how to go on; ``by`` names
    the signal that stopped it (None: Ctrl-C)."""
    if not s.input_lines:  # stopped while the input was still being checked
        return f"{_interrupted(by)} before anything was sent; rerun the same command to start"
    failed = f", {s.failed:,} of them failed" if s.failed else ""
    return (
        f"{_interrupted(by)}: {s.saved:,} of {s.input_lines:,} results saved in {output} "
        f"({s.done + s.failed:,} in this run{failed}), {s.remaining:,} remain; "
        "rerun the same command to resume"
    )


def _interrupted(by: str | None) -> str:
    return "interrupted" if by is None else f"interrupted by {by}"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fail(code: int, message: str) -> int:
    _say(f"llmbatch run: {message}")
    return code


def _tenant(text: str) -> str:
    try:
        name = check_tenant(text)
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert name is not None
    return name


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number")
    return value
