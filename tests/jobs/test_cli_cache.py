"""``llmbatch run --cache`` against a real simulator (a new job with lines added sends
only the new ones, as counted by the server), and ``llmbatch cache show / prune /
clear`` on the file it left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobfiles import chat_line, completion_line, id_counts, llmbatch_run, write_jsonl

from llmbatch._cache.commands import parse_age
from llmbatch._cli import main
from llmbatch._jobs import cli
from llmbatch_server.testing import SimulatorProcess, run_simulator

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL) as server:
        yield server


def lines(ids: range) -> list[dict[str, object] | str]:
    return [
        completion_line(f"c{i}", f"prompt {i}", max_tokens=4, model=MODEL, temperature=0)
        if i % 2
        else chat_line(f"c{i}", f"hello {i}", max_tokens=4, model=MODEL, temperature=0)
        for i in ids
    ]


def test_a_job_with_lines_added_sends_only_the_new_ones(
    sim: SimulatorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "answers.db"
    first = write_jsonl(tmp_path / "first.jsonl", lines(range(100)))
    grown = write_jsonl(tmp_path / "grown.jsonl", lines(range(110)))
    common = ["--base-url", sim.base_url, "--cache", str(cache)]
    assert llmbatch_run(str(first), "-o", str(tmp_path / "out1.jsonl"), *common) == cli.EXIT_OK
    before = sim.finished()
    out = tmp_path / "out2.jsonl"
    summary = tmp_path / "summary.json"
    code = llmbatch_run(str(grown), "-o", str(out), *common, "--summary-json", str(summary))
    assert code == cli.EXIT_OK
    assert sim.finished() - before == 10
    assert id_counts(out) == {f"c{i}": 1 for i in range(110)}
    assert json.loads(summary.read_text())["from_cache"] == 100
    assert "100 answered from the cache" in capsys.readouterr().err
    # The answers read from the cache are the ones written the first time.
    written = {
        json.loads(line)["custom_id"]: json.loads(line)["response"]["body"]["choices"]
        for line in (tmp_path / "out1.jsonl").read_text().splitlines()
    }
    again = {
        json.loads(line)["custom_id"]: json.loads(line)["response"]["body"]["choices"]
        for line in out.read_text().splitlines()
    }
    assert all(again[k] == v for k, v in written.items())
    # Another namespace starts afresh.
    out3 = tmp_path / "out3.jsonl"
    before = sim.finished()
    code = llmbatch_run(str(first), "-o", str(out3), *common, "--cache-namespace", "v2")
    assert code == cli.EXIT_OK
    assert sim.finished() - before == 100

    # llmbatch cache show / prune / clear
    assert main(["cache", "show", str(cache)]) == 0
    shown = capsys.readouterr().out
    assert "210 entries" in shown
    assert "(no namespace): 110 entries" in shown
    assert "'v2': 100 entries" in shown
    assert main(["cache", "show", str(cache), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entries"] == 210
    assert {n["namespace"]: n["hits"] for n in data["namespaces"]} == {"": 100, "v2": 0}
    assert main(["cache", "prune", str(cache), "--namespace", "v2"]) == 0
    assert "100 entries dropped" in capsys.readouterr().out
    assert main(["cache", "prune", str(cache), "--older-than", "1h"]) == 0
    assert "0 entries dropped" in capsys.readouterr().out
    assert main(["cache", "clear", str(cache)]) == 0
    assert "110 entries dropped" in capsys.readouterr().out
    assert main(["cache", "show", str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0


def test_the_cache_commands_refuse_what_they_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.db"
    assert main(["cache", "show", str(missing)]) == 2
    assert "no cache file at" in capsys.readouterr().err
    assert not missing.exists()  # not created by looking
    (tmp_path / "c.db").write_bytes(b"")
    assert main(["cache", "prune", str(tmp_path / "c.db")]) == 2
    assert "--older-than and/or --namespace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cache", "prune", str(tmp_path / "c.db"), "--older-than", "soon"])
    assert "is not an age" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600)],
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


def test_the_cache_commands_say_what_to_do_for_redis(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "show", "redis://localhost:6379/0"]) == 2
    assert "redis-cli --scan" in capsys.readouterr().err
