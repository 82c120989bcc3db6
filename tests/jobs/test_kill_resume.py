"""A real ``llmbatch run`` process killed with SIGKILL mid-job, twice, then resumed:
every custom_id ends up in the output exactly once and nothing is sent twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobfiles import chat_line, completion_line, id_counts, read_output, write_jsonl

from llmbatch_server.testing import SimulatorProcess, run_simulator

MODEL = "sim-model"
LINES = 1500
TIMEOUT = 120


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    # Slow enough that the job takes a couple of seconds: time to kill it twice.
    with run_simulator("--speed", "20", "--model", MODEL) as server:
        yield server


def start_job(src: Path, out: Path, sim: SimulatorProcess, summary: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "llmbatch", "run", str(src), "-o", str(out)]
    argv += ["--base-url", sim.base_url, "--summary-json", str(summary)]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )


def kill_after(job: subprocess.Popen[str], out: Path, lines: int) -> int:
    """SIGKILL the job once the output holds ``lines`` lines; returns the count seen."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        count = out.read_bytes().count(b"\n") if out.exists() else 0
        if count >= lines:
            break
        if job.poll() is not None:
            pytest.fail(f"the job ended before it was killed: {job.communicate()[1]}")
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.005)
    assert job.poll() is None, "the job finished before the kill: make it slower"
    job.send_signal(signal.SIGKILL)
    job.wait(TIMEOUT)
    assert job.returncode == -signal.SIGKILL
    return count


def test_sigkill_twice_then_resume_loses_and_duplicates_nothing(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            completion_line(f"id-{i}", f"prompt {i}", max_tokens=8, model=MODEL)
            if i % 3
            else chat_line(f"id-{i}", f"chat {i}", max_tokens=8, model=MODEL)
            for i in range(LINES)
        ],
    )
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"

    seen_first = kill_after(start_job(src, out, sim, summary), out, LINES // 5)
    ids_first = id_counts(out)
    seen_second = kill_after(start_job(src, out, sim, summary), out, 2 * LINES // 5)
    ids_second = id_counts(out)
    assert max(ids_second.values()) == 1
    assert ids_first.keys() <= ids_second.keys()

    final = start_job(src, out, sim, summary)
    _, stderr = final.communicate(timeout=TIMEOUT)
    assert final.returncode == 0, stderr

    counts = id_counts(out)
    assert counts == {f"id-{i}": 1 for i in range(LINES)}  # none lost, none twice
    assert all(r["error"] is None for r in read_output(out))
    result = json.loads(summary.read_text())
    # The last run sent only what the killed runs had not finished.
    assert result["already_done"] == len(ids_second)
    assert result["done"] == LINES - len(ids_second)
    assert LINES // 5 <= seen_first <= len(ids_first)
    assert 2 * LINES // 5 <= seen_second <= len(ids_second)
