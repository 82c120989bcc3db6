"""``llmbatch run`` as a real process that stops: on a model the server lacks it says
how to fix that in command-line terms; after Ctrl-C it says what was saved, what
remains and how to resume, and a rerun finishes the job."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfiles import completion_line, id_counts, read_output, write_jsonl

from llmbatch._jobs import cli
from llmbatch._jobs.runner import JobSummary
from llmbatch_server.testing import SimulatorProcess, run_simulator

MODEL = "sim-model"
TIMEOUT = 120


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    # Slow enough that a job of thousands of lines is still running when interrupted.
    with run_simulator("--speed", "20", "--model", MODEL) as server:
        yield server


def job(
    src: Path, out: Path, sim: SimulatorProcess, *extra: str, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "llmbatch", "run", str(src), "-o", str(out)]
    argv += ["--base-url", sim.base_url, *extra]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        preexec_fn=_sigint_ignored if sigint_ignored else _ctrl_c_as_in_a_terminal,
    )


def _ctrl_c_as_in_a_terminal() -> None:
    """In the job's process before it starts: SIGINT at its default, as in a terminal.
    (A test run started in the background by a shell without job control inherits
    SIGINT ignored, and Python then never turns it into KeyboardInterrupt.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigint_ignored() -> None:
    """As a job started with ``&`` from a script (a shell without job control) has it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def finish(process: subprocess.Popen[str]) -> tuple[int, list[str]]:
    _, stderr = process.communicate(timeout=TIMEOUT)
    return process.returncode, stderr.splitlines()


def input_file(tmp_path: Path, n: int, model: str = MODEL) -> Path:
    lines: list[dict[str, Any] | str] = [
        completion_line(f"id-{i}", f"prompt {i}", max_tokens=8, model=model) for i in range(n)
    ]
    return write_jsonl(tmp_path / "in.jsonl", lines)


def test_a_model_the_server_lacks_stops_with_a_command_line_hint(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    src, out = input_file(tmp_path, 5, model="gpt-4o"), tmp_path / "out.jsonl"
    code, err = finish(job(src, out, sim))
    assert code == cli.EXIT_STOPPED
    assert err[-2:] == [
        f"stopped early: the server does not serve model 'gpt-4o' (from body.model in {src}); "
        "it serves 'sim-model'",
        f"to go on: add --model NAME to run every line with one of them, or fix body.model "
        f"in {src}; nothing was sent",
    ]
    text = "\n".join(err)
    assert "model=" not in text  # no Python advice in a command line
    assert "rerun the same command" not in text  # it would stop the same way
    assert "Traceback" not in text
    assert out.read_text() == ""
    # The hint works.
    code, err = finish(job(src, out, sim, "--model", MODEL))
    assert code == cli.EXIT_OK, err
    assert id_counts(out) == {f"id-{i}": 1 for i in range(5)}


def test_a_wrong_model_option_names_the_option(sim: SimulatorProcess, tmp_path: Path) -> None:
    src, out = input_file(tmp_path, 2), tmp_path / "out.jsonl"
    code, err = finish(job(src, out, sim, "--model", "nope"))
    assert code == cli.EXIT_STOPPED
    assert err[-2:] == [
        "stopped early: the server does not serve model 'nope' (from --model); "
        "it serves 'sim-model'",
        "to go on: pass --model NAME with one of them; nothing was sent",
    ]


INTERRUPTED = re.compile(
    r"llmbatch run: interrupted(?P<by> by SIGTERM)?: (?P<saved>[\d,]+) of 3,000 results saved "
    r"in (?P<out>\S+) \((?P<this_run>[\d,]+) in this run\), (?P<remain>[\d,]+) remain; "
    r"rerun the same command to resume"
)


@pytest.mark.parametrize(
    ("signum", "sigint_ignored", "code"),
    [
        pytest.param(signal.SIGINT, False, cli.EXIT_INTERRUPTED, id="ctrl-c"),
        # What systemd, docker stop and timeout send.
        pytest.param(signal.SIGTERM, False, cli.EXIT_TERMINATED, id="sigterm"),
        # Started with `&` from a script: SIGINT inherited as ignored, heeded anyway.
        pytest.param(signal.SIGINT, True, cli.EXIT_INTERRUPTED, id="sigint-inherited-ignored"),
    ],
)
def test_a_stopped_job_reports_what_was_saved_and_what_remains(
    sim: SimulatorProcess, tmp_path: Path, signum: int, sigint_ignored: bool, code: int
) -> None:
    # 3,000 lines at 32 in flight: seconds of work left after the first 100 are
    # saved, so a loaded machine's late signal still finds the job running.
    total = 3000
    src, out = input_file(tmp_path, total), tmp_path / "out.jsonl"
    running = job(src, out, sim, "--max-in-flight", "32", sigint_ignored=sigint_ignored)
    deadline = time.monotonic() + TIMEOUT
    while not out.exists() or out.read_bytes().count(b"\n") < 100:
        assert running.poll() is None, f"the job ended early: {running.communicate()[1]}"
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.005)
    running.send_signal(signum)
    returned, err = finish(running)
    assert returned == code, err
    assert "Traceback" not in "\n".join(err)
    match = INTERRUPTED.fullmatch(err[-1])
    assert match, err
    assert bool(match["by"]) == (signum == signal.SIGTERM)
    saved = int(match["saved"].replace(",", ""))
    assert match["out"] == str(out)
    assert saved == int(match["this_run"].replace(",", "")) == len(id_counts(out))
    assert 100 <= saved < total, "interrupted too late to tell: make the job slower"
    # The last progress line counts what was saved, and says the run stopped:
    # requests cancelled in flight are neither done nor failed.
    assert f": {saved:,}/{total:,} stopped · 0 failed · 0 in flight · " in err[-2], err[-2:]
    assert int(match["remain"].replace(",", "")) == total - saved
    # As it says: the same command resumes, and sends only what remained.
    code, err = finish(job(src, out, sim, "--max-in-flight", "256"))
    assert code == cli.EXIT_OK, err
    assert f"{total - saved:,} done, 0 failed" in err[-1]
    assert id_counts(out) == {f"id-{i}": 1 for i in range(total)}


def test_interrupted_before_the_input_was_checked() -> None:
    message = cli.format_interrupted(JobSummary(), Path("out.jsonl"))
    assert message == "interrupted before anything was sent; rerun the same command to start"


def test_a_spent_max_cost_stops_the_job_and_a_higher_one_resumes_it(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    """$1 a million tokens either way: a line reserves (7-8 prompt bytes + 16 + 8
    max_tokens) millionths of a dollar and costs what the simulator counts, fewer."""
    src, out = input_file(tmp_path, 60), tmp_path / "out.jsonl"
    code, err = finish(job(src, out, sim, "--price", "1,1", "--max-cost", "0.0005"))
    assert code == cli.EXIT_STOPPED, err
    saved = sum(id_counts(out).values())
    assert 0 < saved < 60
    summary = next(line for line in err if line.startswith("llmbatch run:"))
    spent = float(re.search(r"cost \$([\d.]+)", summary).group(1))  # type: ignore[union-attr]
    assert spent <= 0.0005
    assert err[-2:] == [
        f"stopped early: --max-cost $0.0005 was reached (${spent:g} spent)",
        f"to go on: {60 - saved} line(s) were not sent; rerun with a higher --max-cost to resume",
    ]
    assert "failed" not in "".join(line for line in err if "error" in line)
    # What was left unsent was not written as failed: a rerun sends exactly those.
    code, err = finish(job(src, out, sim, "--price", "1,1", "--max-cost", "1"))
    assert code == cli.EXIT_OK, err
    assert id_counts(out) == {f"id-{i}": 1 for i in range(60)}
    assert all("error" not in record or record["error"] is None for record in read_output(out))


def test_a_max_cost_without_a_price_is_a_usage_error(sim: SimulatorProcess, tmp_path: Path) -> None:
    src, out = input_file(tmp_path, 2), tmp_path / "out.jsonl"
    code, err = finish(job(src, out, sim, "--max-cost", "1"))
    assert code == cli.EXIT_USAGE
    assert "max_cost needs the price of model 'sim-model'" in err[-1]
    assert out.read_text() == ""
