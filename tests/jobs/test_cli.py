"""``llmbatch run`` arguments, summary and exit codes, against a real simulator."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobfiles import chat_line, completion_line, id_counts, llmbatch_run, read_output, write_jsonl

from llmbatch._jobs import cli
from llmbatch._jobs.output import OutputFile
from llmbatch_server.testing import SimulatorProcess, run_simulator

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL, "--poison", "POISON") as server:
        yield server


def lines(n: int, model: str = MODEL) -> list[dict[str, object] | str]:
    return [
        completion_line(f"c{i}", f"prompt {i}", max_tokens=4, model=model)
        if i % 2
        else chat_line(f"c{i}", f"hello {i}", max_tokens=4, model=model)
        for i in range(n)
    ]


def test_a_clean_run_exits_0_and_prints_a_summary(
    sim: SimulatorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", lines(200))
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    code = llmbatch_run(
        str(src), "-o", str(out), "--base-url", sim.base_url, "--summary-json", str(summary)
    )
    assert code == cli.EXIT_OK
    assert id_counts(out) == {f"c{i}": 1 for i in range(200)}
    err = capsys.readouterr().err
    assert "llmbatch run: 200 done, 0 failed, 0 retried" in err
    data = json.loads(summary.read_text())
    assert data["done"] == 200
    assert data["exit_code"] == 0
    assert data["completion_tokens"] == 800
    assert data["complete"]
    # A rerun finds everything done.
    assert llmbatch_run(str(src), "-o", str(out), "--base-url", sim.base_url) == 0
    assert "0 done, 0 failed, 0 retried, 200 already in the output" in capsys.readouterr().err


def test_failures_and_skipped_lines_exit_1(
    sim: SimulatorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = lines(10)
    rows[3] = completion_line("bad", "a POISON b", model=MODEL)
    rows[5] = "not json"
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    argv = (str(src), "-o", str(out), "--base-url", sim.base_url, "--summary-json", "-")
    assert llmbatch_run(*argv) == cli.EXIT_REJECTED
    assert not out.exists()
    assert llmbatch_run(*argv, "--on-malformed", "skip") == cli.EXIT_FAILURES
    captured = capsys.readouterr()
    assert f"{src}:6: not valid JSON" in captured.err
    assert json.loads(captured.out[captured.out.index("{") :])["failed"] == 1
    assert len(id_counts(out)) == 9


def test_duplicates_exit_3_naming_lines(
    sim: SimulatorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [*lines(3), chat_line("c1", "again", model=MODEL)])
    code = llmbatch_run(str(src), "-o", str(tmp_path / "o.jsonl"), "--base-url", sim.base_url)
    assert code == cli.EXIT_REJECTED
    err = capsys.readouterr().err
    assert f"{src}:4: duplicate custom_id 'c1' (first on line 2)" in err
    assert "Nothing was sent" in err


def test_an_output_in_use_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", lines(2))
    out = tmp_path / "out.jsonl"
    with OutputFile(out):
        assert llmbatch_run(str(src), "-o", str(out)) == cli.EXIT_STOPPED
    assert "in use by another llmbatch run" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", lines(1))
    assert llmbatch_run(str(tmp_path / "nope.jsonl"), "-o", str(src)) == cli.EXIT_USAGE
    assert llmbatch_run(str(src), "-o", str(src)) == cli.EXIT_USAGE
    out = str(tmp_path / "out.jsonl")
    assert llmbatch_run(str(src), "-o", out, "--base-url", "localhost:8000") == cli.EXIT_USAGE
    with pytest.raises(SystemExit) as info:
        llmbatch_run(str(src), "-o", "x", "--max-in-flight", "0")
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        llmbatch_run(str(src), "-o", "x", "--tenant", "")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "must be different files" in err
    assert "base_url must be an http(s) URL" in err
    assert "tenant must be 1 to 256 printable characters" in err


def test_a_pipe_is_refused_saying_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # /dev/stdin in a pipeline is one; a FIFO is the same to the runner, and opening
    # neither may read from it (that would block the test with no writer).
    fifo = tmp_path / "jobs.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.jsonl"
    assert llmbatch_run(str(fifo), "-o", str(out)) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"llmbatch run: {fifo}: not a regular file (a pipe?); ")
    assert "reads its input twice" in err
    assert "save it to a file first" in err
    assert "no such file" not in err
    assert not out.exists()


def test_progress_in_a_log_prints_plain_lines(
    sim: SimulatorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", lines(20))
    out = tmp_path / "out.jsonl"
    # Progress is on by default; off a terminal it is a line every few seconds and
    # one at the end, then the summary. --no-progress leaves only the summary.
    assert llmbatch_run(str(src), "-o", str(out), "--base-url", sim.base_url) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("in.jsonl: 0/20 running")
    assert err[-2].startswith("in.jsonl: 20/20 done")
    assert err[-1].startswith("llmbatch run: 20 done")
    out.unlink()
    assert llmbatch_run(str(src), "-o", str(out), "--base-url", sim.base_url, "--no-progress") == 0
    assert [line.split(":")[0] for line in capsys.readouterr().err.splitlines()] == ["llmbatch run"]


def test_options_reach_the_server(sim: SimulatorProcess, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", lines(30, model="whatever"))
    out = tmp_path / "out.jsonl"
    code = llmbatch_run(
        str(src),
        "-o",
        str(out),
        "--base-url",
        sim.base_url,
        "--model",
        MODEL,
        "--priority",
        "normal",
        "--max-in-flight",
        "4",
        "--rpm",
        "600000",
        "--tpm",
        "60000000",
        "--tenant",
        "nightly-job",
    )
    assert code == 0
    assert len(id_counts(out)) == 30
    assert sim.peak_running(user="nightly-job") >= 1  # the tenant went as OpenAI's user


def test_embeddings_lines_run_beside_completions(sim: SimulatorProcess, tmp_path: Path) -> None:
    embeddings = [
        {"custom_id": f"e{i}", "url": "/v1/embeddings", "body": {"input": f"text {i}"}}
        for i in range(30)
    ]
    src = write_jsonl(tmp_path / "in.jsonl", [*lines(10), *embeddings])
    out = tmp_path / "out.jsonl"
    assert llmbatch_run(str(src), "-o", str(out), "--base-url", sim.base_url) == cli.EXIT_OK
    records = {r["custom_id"]: r for r in read_output(out)}
    assert len(records) == 40
    body = records["e7"]["response"]["body"]
    assert body["object"] == "list"
    assert body["data"][0]["object"] == "embedding"
    assert len(body["data"][0]["embedding"]) > 0
    assert body["usage"]["prompt_tokens"] > 0


def test_a_misspelt_field_is_refused_before_anything_is_sent(
    sim: SimulatorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = completion_line("bad", "x", max_tokns=16, model=MODEL)
    src = write_jsonl(tmp_path / "requests.jsonl", [*lines(6), bad])
    out = tmp_path / "out.jsonl"
    assert llmbatch_run(str(src), "-o", str(out), "--base-url", sim.base_url) == cli.EXIT_REJECTED
    err = capsys.readouterr().err
    assert (
        f"{src}:7: body.max_tokns is not a parameter of /v1/completions; did you mean max_tokens?"
    ) in err
    assert not out.exists() or out.read_text() == ""
