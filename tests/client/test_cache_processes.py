"""Processes sharing one cache file, against a real simulator: four racing maps with
half their prompts in common (no lock error, no lost or wrong entry, each common
prompt sent at most once per process), and a writer killed with SIGKILL mid-run
(the rerun reads no wrong or corrupt answer and sends only what was not kept)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_worker_paths import WORKER

import llmbatch
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--max-model-len", "512") as server:
        yield server


def truth(sim: SimulatorProcess, prompts: list[str]) -> dict[str, str]:
    """Each prompt's answer, asked without a cache."""
    with llmbatch.SyncClient(sim.base_url) as client:
        results = client.map(prompts, temperature=0, max_tokens=8)
    return {p: r.unwrap().text for p, r in zip(prompts, results, strict=True)}


def run_worker(sim: SimulatorProcess, cache: Path, prompts_file: Path, start_at: float) -> Any:
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            sim.base_url,
            str(cache),
            str(prompts_file),
            "--start-at",
            str(start_at),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_four_processes_racing_on_one_file(sim: SimulatorProcess, tmp_path: Path) -> None:
    common = [f"common prompt {i}" for i in range(1_000)]
    files = []
    for n in range(4):
        own = [f"process {n} prompt {i}" for i in range(1_000)]
        mixed = [p for pair in zip(common, own, strict=True) for p in pair]
        path = tmp_path / f"prompts-{n}.json"
        path.write_text(json.dumps(mixed))
        files.append((path, mixed))
    cache = tmp_path / "shared.db"
    before = sim.finished()
    start_at = time.time() + 3.0
    workers = [run_worker(sim, cache, path, start_at) for path, _ in files]
    outputs = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert "Warning" not in err, err  # no "database is locked", nothing set aside
        outputs.append(json.loads(out))
    sent = sim.finished() - before
    every = sorted({p for _, prompts in files for p in prompts})
    right = truth(sim, every)
    for output in outputs:
        assert output["errors"] == []
        assert output["write_errors"] == output["unreadable"] == 0
        assert all(right[p] == text for p, text in output["texts"].items())
    # Each process sends each of its prompts at most once: the common ones at most
    # four times in all, fewer where one process found another's answer first.
    assert sent <= 4 * 2_000
    hits = sum(o["hits"] for o in outputs)
    assert sent == 4 * 2_000 - hits
    # No entry lost or wrong: every prompt is in the file with its own answer.
    with sqlite3.connect(cache) as connection:
        (entries,) = connection.execute("SELECT COUNT(*) FROM answers").fetchone()
    assert entries == len(every) == 5_000
    check = sim.finished()
    with llmbatch.SyncClient(sim.base_url, cache=cache) as client:
        again = client.map(every, temperature=0, max_tokens=8)
    assert sim.finished() == check  # all from the file
    assert all(r.from_cache and r.text == right[p] for p, r in zip(every, again, strict=True))


def test_a_writer_killed_mid_run_leaves_no_wrong_answer(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    prompts = [f"kill test prompt {i}" for i in range(20_000)]
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    cache = tmp_path / "killed.db"
    worker = run_worker(sim, cache, path, 0.0)
    # Kill it once some answers are committed (the writer is mid-stream then).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if cache.exists():
            try:
                with sqlite3.connect(cache, timeout=1) as connection:
                    (kept,) = connection.execute("SELECT COUNT(*) FROM answers").fetchone()
            except sqlite3.OperationalError:
                continue
            if kept >= 2_000:
                break
    os.kill(worker.pid, signal.SIGKILL)
    worker.communicate(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    with sqlite3.connect(cache) as connection:
        (kept,) = connection.execute("SELECT COUNT(*) FROM answers").fetchone()
    assert 2_000 <= kept < len(prompts)
    right = truth(sim, prompts)
    before = sim.finished()
    with llmbatch.SyncClient(sim.base_url, cache=cache) as client:
        again = client.map(prompts, temperature=0, max_tokens=8)
        stats = client.stats()
    assert all(r.text == right[p] for p, r in zip(prompts, again, strict=True))
    assert stats.cache is not None
    assert stats.cache.unreadable == 0
    assert stats.cache.hits == kept
    assert sim.finished() - before == len(prompts) - kept
