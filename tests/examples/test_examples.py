"""Every example runs as written, as a subprocess, against a real simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmbatch_server._process import free_port
from llmbatch_server.testing import SimulatorProcess, run_simulator

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIMEOUT = 120


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--speed", "50", "--scheduling-policy", "priority") as server:
        yield server


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow  # ~5 s; CI's demo stage runs the demo itself, its slow stage this test
def test_demo_starts_its_own_simulator() -> None:
    out = _run("demo.py", "--bulk", "300")
    assert "bulk: 300/300 ok" in out
    assert "realtime during bulk" in out
    # It says why realtime is slower beside bulk, and how to change that.
    assert "--slo 8 sets Client(slo=SLO(tpot=0.008))" in out


def test_demo_with_an_slo(sim: SimulatorProcess) -> None:
    out = _run("demo.py", "--url", sim.base_url, "--bulk", "300", "--slo", "8")
    assert "bulk: 300/300 ok" in out
    assert "Client(slo=SLO(tpot=0.008)): the client keeps less bulk in flight to hold it" in out
    # The stats table shows the target, the first token's bound it derived, its score.
    assert "SLO (tpot 8.0 ms, ttft 100 ms derived) met" in out


def test_asyncio_dropin(sim: SimulatorProcess) -> None:
    out = _run("asyncio_dropin.py", env={"LLMBATCH_BASE_URL": sim.base_url})
    assert "500 summaries done" in out


def test_trio_app(sim: SimulatorProcess) -> None:
    out = _run("trio_app.py", env={"LLMBATCH_BASE_URL": sim.base_url})
    assert "100/100 translated" in out
    assert "answer 2:" in out
    assert "streamed:" in out


def test_launch_vllm_with_a_profile() -> None:
    fake = Path(__file__).parent / "fake_vllm_sim" / "vllm"
    out = _run(
        "launch_vllm.py",
        "--model",
        "tiny",
        "--profile",
        "latency",
        "--port",
        str(free_port()),
        "--vllm-bin",
        str(fake),
        env={"FAKE_VLLM_PYTHON": sys.executable},
    )
    assert "'max_in_flight': 64" in out  # the latency profile's --max-num-seqs
    assert "64/64 ok" in out


@pytest.mark.slow  # ~5 s; CI's slow stage runs it
def test_fastapi_chat_stays_responsive_during_a_bulk_job(sim: SimulatorProcess) -> None:
    port = free_port()
    app = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "fastapi_app.py"), "--port", str(port)],
        env={**os.environ, "LLMBATCH_BASE_URL": sim.base_url},
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    http.get("/stats").raise_for_status()
                    break
                except httpx.TransportError:
                    assert app.poll() is None, "the app exited"
                    assert time.monotonic() < deadline, "the app did not start"
                    time.sleep(0.05)
            job = http.post("/jobs", json={"prompts": [f"p{i}" for i in range(3000)]}).json()
            assert job["total"] == 3000
            reply = http.post("/chat", json={"message": "hello", "max_tokens": 16})
            assert reply.status_code == 200
            assert reply.text.strip()
            # The chat answer arrived while the bulk job was still running.
            assert not http.get(f"/jobs/{job['job']}").json()["finished"]
            deadline = time.monotonic() + TIMEOUT
            while not (status := http.get(f"/jobs/{job['job']}").json())["finished"]:
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
            assert status["done"] == 3000
            assert status["failed"] == 0
    finally:
        app.terminate()
        app.wait(10)


@pytest.mark.slow  # ~7 s; CI's slow stage runs it
def test_label_jsonl_resumes_after_sigkill(tmp_path: Path) -> None:
    source, output = tmp_path / "reviews.jsonl", tmp_path / "labels.jsonl"
    source.write_text("".join(f'{{"id": "r{i}", "text": "review {i}"}}\n' for i in range(3000)))
    with run_simulator("--speed", "5") as slow_sim:
        env = {**os.environ, "LLMBATCH_BASE_URL": slow_sim.base_url}
        argv = [
            sys.executable,
            str(EXAMPLES / "label_jsonl.py"),
            str(source),
            str(output),
            "--no-progress",
        ]
        first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + TIMEOUT
        while not output.exists() or output.stat().st_size < 2000:
            assert first.poll() is None, "finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first.kill()  # SIGKILL, mid-run
        first.wait()
        partial = len(output.read_text().splitlines())
        assert 0 < partial < 3000
        out = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=True
        ).stdout
    assert "resuming:" in out
    ids = [json.loads(line)["id"] for line in output.read_text().splitlines() if line.strip()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(3000))  # each exactly once


def test_tune_prints_one_line_per_setting() -> None:
    out = _run("tune.py", "--questions", "3", "--warmup", "0.5", "--slo-tpot-ms", "5")
    assert "bulk" in out
    assert "realtime per token p50" in out
    assert "bulk limit p50" in out
