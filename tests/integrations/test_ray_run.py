"""``llmbatch run --ray`` on a real local Ray against a real simulator process:
shards in, shards out, every custom_id exactly once, failures as error records,
a rerun that resumes, and a run that stops early. Marked ``ray`` (deselected by
default, as the rest of the Ray tests: ``pytest -m "not slow"
tests/integrations/test_ray_run.py``)."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfiles import llmbatch_run

from llmbatch._jobs import cli
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None,
        reason="Ray is not installed: pip install 'llmbatch[ray]' (CI's ray stage does)",
    ),
]

MODEL = "sim-model"
SHARDS, PER_SHARD = 3, 700
POISONED = "r1234"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL, "--poison", "POISON") as server:
        yield server


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    # The run joins this session rather than starting its own (and leaves it up).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def write_shards(directory: Path) -> set[str]:
    directory.mkdir()
    ids = set()
    for shard in range(SHARDS):
        with (directory / f"shard-{shard}.jsonl").open("w") as f:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                custom_id = f"r{i}"
                ids.add(custom_id)
                poison = " POISON" if custom_id == POISONED else ""
                if i % 2:
                    url, body = "/v1/completions", {"prompt": f"prompt {i}{poison}"}
                else:
                    url = "/v1/chat/completions"
                    body = {"messages": [{"role": "user", "content": f"hi {i}{poison}"}]}
                line = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
                line["body"] |= {"model": MODEL, "max_tokens": 3}
                f.write(json.dumps(line) + "\n")
    return ids


def records(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for shard in sorted(directory.glob("part-*.jsonl"))
        for line in shard.read_text().splitlines()
    ]


@pytest.mark.timeout(240)
def test_shards_in_shards_out_each_custom_id_once_then_resume(
    sim: SimulatorProcess,
    local_ray: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = write_shards(tmp_path / "in")
    out = tmp_path / "out"
    argv = [str(tmp_path / "in"), "-o", str(out), "--ray", "--base-url", sim.base_url]
    summary = tmp_path / "summary.json"
    assert llmbatch_run(*argv, "--batch-size", "200", "--summary-json", str(summary)) == 1
    written = records(out)
    assert Counter(r["custom_id"] for r in written) == dict.fromkeys(ids, 1)
    failed = [r for r in written if r["error"] is not None]
    assert [r["custom_id"] for r in failed] == [POISONED]
    assert failed[0]["error"]["code"] == "bad_request_error"
    assert "POISON" in failed[0]["error"]["message"]
    assert failed[0]["response"]["status_code"] == 400
    answered = [r for r in written if r["error"] is None]
    assert all(r["response"]["status_code"] == 200 for r in answered)
    assert {r["response"]["body"]["object"] for r in answered} == {
        "text_completion",
        "chat.completion",
    }
    data = json.loads(summary.read_text())
    assert (data["input_lines"], data["done"], data["failed"]) == (len(ids), len(ids) - 1, 1)
    assert data["completion_tokens"] == 3 * (len(ids) - 1)
    assert data["complete"]
    # One shard per actor that got work (which ones did is Ray's scheduling).
    assert 1 <= len(list(out.glob("part-*.jsonl"))) <= 2
    assert f"{len(ids) - 1:,} done, 1 failed" in capsys.readouterr().err

    # A rerun sends nothing and writes nothing; --retry-failed sends the one failure.
    assert llmbatch_run(*argv) == 1
    assert f"0 done, 0 failed, 0 retried, {len(ids):,} already" in capsys.readouterr().err
    assert len(records(out)) == len(ids)
    assert llmbatch_run(*argv, "--retry-failed") == 1
    assert f"0 done, 1 failed, 0 retried, {len(ids) - 1:,} already" in capsys.readouterr().err
    assert Counter(r["custom_id"] for r in records(out)) == dict.fromkeys(ids, 1)


@pytest.mark.timeout(120)
def test_a_glob_with_an_unknown_model_stops_with_exit_4(
    sim: SimulatorProcess,
    local_ray: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_shards(tmp_path / "in")
    out = tmp_path / "out"
    argv = [str(tmp_path / "in" / "shard-[01].jsonl"), "-o", str(out), "--ray"]
    code = llmbatch_run(*argv, "--base-url", sim.base_url, "--model", "gpt-4o")
    assert code == cli.EXIT_STOPPED
    err = capsys.readouterr().err
    assert "stopped early: the server does not serve model 'gpt-4o'" in err
    assert "pass --model NAME with one of them" in err
    assert records(out) == []


@pytest.mark.timeout(240)
def test_a_second_job_with_the_cache_is_answered_from_it(
    sim: SimulatorProcess, local_ray: None, tmp_path: Path
) -> None:
    """``--ray --cache``: the actors share the file; a second job of the same lines,
    into another output, is answered from it (the server's answers do not grow)."""

    write_shards(tmp_path / "in")
    cache = str(tmp_path / "answers.db")
    texts = []
    for run in range(2):
        out = tmp_path / f"out-{run}"
        before = sim.finished()
        argv = [str(tmp_path / "in"), "-o", str(out), "--ray", "--base-url", sim.base_url]
        assert llmbatch_run(*argv, "--cache", cache) == 1  # the poisoned line fails
        sent = sim.finished() - before
        texts.append(
            {
                r["custom_id"]: json.dumps(r["response"]["body"]["choices"])
                for r in records(out)
                if r["error"] is None
            }
        )
        if run == 0:
            assert sent == SHARDS * PER_SHARD - 1
        else:
            assert sent == 0
    assert texts[1] == texts[0]
