"""One measurement per process: ``python -m llmbatch_bench.worker`` runs the
:class:`~llmbatch_bench.scenarios.Job` read as JSON on stdin and prints its
:class:`~llmbatch_bench.metrics.RunMetrics` as JSON on stdout.

A process of its own is what makes the numbers belong to one client: its CPU time
and peak RSS include nothing of the harness, the server or the other contenders.
The job (and so any API key) travels on stdin, never on the command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from llmbatch_bench import jobs
from llmbatch_bench.jobs import Job
from llmbatch_bench.metrics import RunMetrics
from llmbatch_bench.scenarios import run_job

__all__ = ["WorkerError", "run_in_process", "run_in_worker"]


class WorkerError(RuntimeError):
    """A worker process failed; the message carries its stderr tail."""


def run_in_worker(job: Job, timeout: float | None = None) -> RunMetrics:
    """Run ``job`` in a fresh Python process and return its metrics."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "llmbatch_bench.worker"],
            input=json.dumps(job.to_json()).encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkerError(f"{job.scenario}/{job.name}: no result after {timeout}s") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-15:]
        raise WorkerError(
            f"{job.scenario}/{job.name} exited with {done.returncode}:\n" + "\n".join(tail)
        )
    return RunMetrics.from_json(json.loads(done.stdout.decode().strip().splitlines()[-1]))


def run_in_process(job: Job) -> RunMetrics:
    """Run ``job`` here (tests, debugging): CPU and RSS then include the caller's."""
    return asyncio.run(run_job(job))


def _emit(metrics: RunMetrics) -> None:
    sys.stdout.write(json.dumps(metrics.to_json()) + "\n")
    sys.stdout.flush()


def _hard_stop(metrics: RunMetrics) -> None:
    # Called from the watchdog thread while the event loop is stuck: no clean exit.
    _emit(metrics)
    os._exit(0)


def main() -> int:
    job = Job.from_json(json.loads(sys.stdin.read()))
    jobs.hard_stop = _hard_stop
    _emit(run_in_process(job))
    return 0


if __name__ == "__main__":
    sys.exit(main())
