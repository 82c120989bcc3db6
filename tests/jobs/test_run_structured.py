"""``llmbatch run --response-model module:Class``: each line keeps the server's
answer and adds the validated object as ``parsed``, or the validation error."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobfiles import chat_line, completion_line, llmbatch_run, read_output, write_jsonl

from llmbatch._jobs import cli
from llmbatch_server.testing import SimulatorProcess, run_simulator

MODEL_SOURCE = """
import enum
from pydantic import BaseModel, Field

class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"

class Label(BaseModel):
    mood: Mood
    urgent: bool
    score: int = Field(ge=0, le=9)
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", "m", "--invalid-json", "0.2") as server:
        yield server


@pytest.fixture
def labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "labels_for_run.py").write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "labels_for_run", raising=False)
    return "labels_for_run:Label"


def test_lines_get_the_parsed_object_beside_the_answer(
    sim: SimulatorProcess, tmp_path: Path, labels: str
) -> None:
    rows = [
        completion_line(f"c{i}", f"label {i}", max_tokens=200, model="m")
        if i % 2
        else chat_line(f"c{i}", f"label {i}", max_tokens=200, model="m")
        for i in range(60)
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    code = llmbatch_run(
        str(src), "-o", str(out), "--base-url", sim.base_url, "--response-model", labels
    )
    records = read_output(out)
    assert len(records) == 60
    for record in records:
        body = record["response"]["body"]
        if record["error"] is None:
            assert set(record["parsed"]) == {"mood", "urgent", "score"}
            text = body["choices"][0].get("text") or body["choices"][0]["message"]["content"]
            assert json.loads(text) == record["parsed"]
        else:
            assert record["error"]["code"] == "structured_output_error"
            assert body["choices"]  # the answer that failed is kept
    ok = sum(r["error"] is None for r in records)
    assert ok >= 55  # 20 % invalid, re-asked twice: ~0.8 % fail
    assert code == (cli.EXIT_OK if ok == 60 else cli.EXIT_FAILURES)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("nocolon", "expected MODULE:CLASS"),
        ("no_such_module_xyz:Thing", "cannot import no_such_module_xyz"),
        ("json:NoSuchName", "json has no NoSuchName"),
    ],
)
def test_a_bad_response_model_is_a_usage_error(
    sim: SimulatorProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spec: str,
    said: str,
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line("a", "x", model="m")])
    code = llmbatch_run(
        str(src),
        "-o",
        str(tmp_path / "o.jsonl"),
        "--base-url",
        sim.base_url,
        "--response-model",
        spec,
    )
    assert code == cli.EXIT_USAGE
    assert said in capsys.readouterr().err


def test_a_body_with_its_own_json_schema_gets_the_answers_json(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "Check", "schema": schema}}
    rows = [
        chat_line(f"c{i}", f"check {i}", max_tokens=100, model="m", response_format=fmt)
        for i in range(40)
    ]
    rows.append(chat_line("plain", "no schema", max_tokens=4, model="m"))
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    llmbatch_run(str(src), "-o", str(out), "--base-url", sim.base_url)
    records = {r["custom_id"]: r for r in read_output(out)}
    assert "parsed" not in records.pop("plain")
    parsed = [r for r in records.values() if r["error"] is None]
    broken = [r for r in records.values() if r["error"] is not None]
    assert all(set(r["parsed"]) == {"ok", "n"} for r in parsed)
    # The simulator answers a fifth with invalid JSON: no model, so no re-asks.
    assert broken
    assert all(r["error"]["code"] == "structured_output_error" for r in broken)
    assert all(r["response"]["body"]["choices"] for r in broken)
