"""``llmbatch run --ray`` without Ray: its input shards and output directory, the
JobLines class called directly on a dict batch against a real simulator, and the
command line's error when Ray is missing. The run on a real local Ray is in
tests/integrations/test_ray_run.py (marked ``ray``)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobfiles import chat_line, completion_line, llmbatch_run, read_output, write_jsonl

from llmbatch._config import Limits
from llmbatch._jobs import cli
from llmbatch._jobs.output import OutputError
from llmbatch._jobs.ray_lines import JobLines, JobStopped, check_file
from llmbatch._jobs.shards import InputError, OutputDir, input_files
from llmbatch_server.testing import SimulatorProcess, run_simulator

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL, "--poison", "POISON") as server:
        yield server


def job_lines(sim: SimulatorProcess, out: Path, **options: object) -> JobLines:
    kwargs: dict[str, object] = {
        "input_name": "in.jsonl",
        "base_url": sim.base_url,
        "api_key": None,
        "model": MODEL,
        "check_model": True,
        "priority": "batch",
        "limits": Limits(reserved_realtime=0),
        "client_options": {"on_close": "cancel"},
        **options,
    }
    return JobLines(str(out), **kwargs)  # type: ignore[arg-type]


def text(line: dict[str, object] | str) -> str:
    return line if isinstance(line, str) else json.dumps(line)


def test_input_files_from_a_file_a_directory_or_a_glob(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.jsonl", "notes.txt"):
        (tmp_path / name).write_text("\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.jsonl").write_text("\n")
    assert input_files(str(tmp_path / "b.jsonl")) == [tmp_path / "b.jsonl"]
    # A directory: its own *.jsonl files, sorted, not its subdirectories'.
    assert input_files(str(tmp_path)) == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    assert input_files(str(tmp_path / "**" / "*.jsonl")) == [tmp_path / "sub" / "c.jsonl"]
    with pytest.raises(InputError, match="no such file"):
        input_files(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="matches no file"):
        input_files(str(tmp_path / "*.csv"))


def test_empty_directory_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"has no \*\.jsonl files"):
        input_files(str(tmp_path))


def test_output_dir_locks_repairs_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ok = '{"custom_id":"a","response":{"status_code":200},"error":null}\n'
    bad = '{"custom_id":"b","response":null,"error":{"code":"x","message":"y"}}\n'
    (out / "part-1.jsonl").write_text(ok + bad + '{"custom_id":"c","resp')  # torn tail
    (out / "part-2.jsonl").write_text(
        '{"custom_id":"d","response":{"status_code":200},"error":null}\n'
    )
    with OutputDir(out) as first:
        assert first.resumed.done == {"a", "b", "d"}
        assert (first.resumed.failed, first.resumed.shards, first.resumed.torn_lines) == (1, 2, 1)
        with pytest.raises(OutputError, match="in use by another llmbatch run"):
            OutputDir(out).__enter__()
    assert (out / "part-1.jsonl").read_text() == ok + bad  # the partial line is gone
    with OutputDir(out, retry_failed=True) as retry:
        assert retry.resumed.done == {"a", "d"}
        assert retry.resumed.removed_failed == 1
    # The same custom_id in two shards cannot be resumed from: say so.
    (out / "part-3.jsonl").write_text(ok)
    with pytest.raises(OutputError, match="'a' is also in another shard"):
        OutputDir(out).__enter__()
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is a file"):
        OutputDir(tmp_path / "file").__enter__()


def test_check_file_finds_what_the_single_process_run_would(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            completion_line("a", "x", model=MODEL),
            "not json",
            completion_line("a", "again", model=MODEL),
            completion_line("b", "y", model="other"),
            completion_line("c", "z", model=MODEL),
        ],
    )
    check = check_file(str(src), None, frozenset({"c"}))
    assert (check.model, check.lines, check.pending) == (MODEL, 2, 1)
    assert (check.malformed, check.duplicates) == (2, 1)
    assert check.problems[0].startswith(f"{src}:2: not valid JSON")
    assert "duplicate custom_id 'a' (first on line 1)" in check.problems[1]
    assert "body.model 'other' differs" in check.problems[2]


def test_job_lines_write_records_like_the_single_process_run(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    lines = [
        completion_line("c1", "hello", max_tokens=3, model=MODEL),
        chat_line("c2", "hi", max_tokens=3, model=MODEL),
        completion_line("bad", "a POISON b", max_tokens=3, model=MODEL),
        "not json",  # the checking pass let it through (--on-malformed skip)
        completion_line("other", "x", model="another-model"),
        completion_line("old", "already answered", model=MODEL),
    ]
    rows = job_lines(sim, out, done=frozenset({"old"}))
    try:
        counts = rows({"text": [text(line) for line in lines]})
    finally:
        rows.close()
    assert counts["done"] == [2]
    assert counts["failed"] == [1]
    assert counts["malformed"] == [2]
    assert counts["already_done"] == [1]
    assert counts["completion_tokens"] == [6]
    [shard] = list(out.glob("part-*.jsonl"))
    records = {r["custom_id"]: r for r in read_output(shard)}
    assert set(records) == {"c1", "c2", "bad"}

    # The single-process run on the same lines writes the same shape of record.
    single = tmp_path / "single.jsonl"
    src = write_jsonl(tmp_path / "in.jsonl", lines[:3])
    code = llmbatch_run(str(src), "-o", str(single), "--base-url", sim.base_url)
    assert code == cli.EXIT_FAILURES
    expected = {r["custom_id"]: r for r in read_output(single)}
    for custom_id, record in records.items():
        assert shape(record) == shape(expected[custom_id])
    assert records["bad"]["error"] == expected["bad"]["error"]
    assert records["bad"]["response"]["status_code"] == 400
    assert records["c2"]["response"]["body"]["object"] == "chat.completion"


def test_an_unknown_model_stops_the_run_with_the_cli_hint(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    rows = job_lines(sim, tmp_path, model="gpt-4o", check_model=False)
    try:
        with pytest.raises(JobStopped) as caught:
            rows({"text": [text(completion_line("a", "x"))]})
    finally:
        rows.close()
    assert "does not serve model 'gpt-4o'" in caught.value.why
    assert "--model" in caught.value.hint
    assert not list(tmp_path.glob("part-*.jsonl"))  # nothing written: a rerun sends it
    # It survives the trip back to Ray's driver.
    again = pickle.loads(pickle.dumps(caught.value))
    assert (again.why, again.hint) == (caught.value.why, caught.value.hint)


def test_ray_missing_is_a_usage_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line("a", "x")])
    # None in sys.modules makes `import ray` fail as it does when Ray is not installed.
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    assert llmbatch_run(str(src), "-o", str(tmp_path / "out"), "--ray") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "pip install 'llmbatch[ray]'" in err
    assert not (tmp_path / "out").exists()


def test_ray_options_need_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line("a", "x")])
    out = str(tmp_path / "out.jsonl")
    assert llmbatch_run(str(src), "-o", out, "--ray-address", "auto") == cli.EXIT_USAGE
    assert "--ray-address needs --ray" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        llmbatch_run(str(src), "-o", out, "--ray", "--concurrency", "0")


def shape(value: object) -> object:
    """Keys and value types, recursively: what must match between the two runs."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def test_the_command_line_does_not_import_ray() -> None:
    code = (
        "import sys; from llmbatch._cli import build_parser; build_parser(); "
        "sys.exit(bool({'ray', 'pandas', 'pyarrow'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert result.returncode == 0
