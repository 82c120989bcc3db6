"""The output file: append, resume scan, torn last line, lock, retry-failed rewrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmbatch._jobs.output import OutputError, OutputFile


def ok(custom_id: str) -> dict[str, object]:
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": "r", "body": {}},
        "error": None,
    }


def bad(custom_id: str) -> dict[str, object]:
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": "server_error", "message": "boom"},
    }


def test_a_new_file_is_created_and_each_record_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with OutputFile(path) as out:
        assert out.resumed.done == set()
        out.write(ok("a"))
        out.write(bad("b"))
        # Written through to the OS at once, not held in a buffer.
        assert path.read_bytes().count(b"\n") == 2
    lines = path.read_text().splitlines()
    assert [json.loads(x)["custom_id"] for x in lines] == ["a", "b"]


def test_reopening_reports_done_and_failed_ids(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with OutputFile(path) as out:
        for record in (ok("a"), bad("b"), ok("c")):
            out.write(record)
    with OutputFile(path) as out:
        assert out.resumed.done == {"a", "b", "c"}
        assert out.resumed.failed == 1
        assert out.resumed.torn_lines == 0
        out.write(ok("d"))
    assert path.read_text().count("\n") == 4


def test_a_torn_last_line_is_dropped_and_appends_start_on_a_clean_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    whole = json.dumps(ok("a")) + "\n"
    torn = json.dumps(ok("b"))[:25]  # a write cut short by kill -9 or a power cut
    path.write_text(whole + torn)
    with OutputFile(path) as out:
        assert out.resumed.done == {"a"}
        assert out.resumed.torn_lines == 1
        assert path.read_text() == whole
        out.write(ok("b"))
    assert [json.loads(x)["custom_id"] for x in path.read_text().splitlines()] == ["a", "b"]


def test_a_tail_of_zero_bytes_counts_as_torn(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(json.dumps(ok("a")).encode() + b"\n" + b"\0" * 64)
    with OutputFile(path) as out:
        assert out.resumed.done == {"a"}
        assert out.resumed.torn_lines == 1


def test_a_corrupt_complete_line_is_an_error_not_a_guess(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(ok("a")) + "\n" + "garbage\n" + json.dumps(ok("c")) + "\n")
    with pytest.raises(OutputError, match=r"out\.jsonl:2: not an output record"):
        with OutputFile(path):
            pass
    # Untouched.
    assert path.read_text().count("\n") == 3


def test_a_second_run_on_the_same_output_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with OutputFile(path):
        with pytest.raises(OutputError, match="in use by another llmbatch run"):
            with OutputFile(path):
                pass
    with OutputFile(path):  # released on close
        pass


def test_retry_failed_rewrites_the_file_without_failed_lines(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with OutputFile(path) as out:
        for record in (ok("a"), bad("b"), ok("c"), bad("d")):
            out.write(record)
    with OutputFile(path, retry_failed=True) as out:
        assert out.resumed.done == {"a", "c"}
        assert (out.resumed.failed, out.resumed.removed_failed) == (0, 2)
        out.write(ok("b"))
        # Still locked after the rewrite.
        with pytest.raises(OutputError):
            with OutputFile(path):
                pass
    assert [json.loads(x)["custom_id"] for x in path.read_text().splitlines()] == ["a", "c", "b"]
    assert not list(tmp_path.glob("*.retry-tmp"))


def test_unopenable_output_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="cannot open"):
        with OutputFile(tmp_path / "missing-dir" / "out.jsonl"):
            pass
