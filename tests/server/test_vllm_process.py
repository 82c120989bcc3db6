"""``VLLMProcess``, what ``llmbatch bench --vllm`` runs vLLM with, on the fake vLLM:
started through the launcher, its processes told apart, killed as a crash would,
restarted on its port, pinned to a core, stopped with nothing left behind."""

from __future__ import annotations

import json
import os
import pathlib
import time

import httpx
import pytest

from llmbatch_server.vllm_process import VLLMProcess, VLLMProcessError

FAKE = pathlib.Path(__file__).parent / "fake_vllm" / "vllm"

pytest.importorskip("psutil", reason="VLLMProcess tells vLLM's processes apart with psutil")


def _record(path: pathlib.Path) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def test_start_kill_restart_stop(tmp_path: pathlib.Path) -> None:
    record = tmp_path / "record.json"
    server = VLLMProcess(
        "m",
        ("--enforce-eager",),
        vllm_bin=str(FAKE),
        env={"FAKE_VLLM_RECORD": str(record), "FAKE_VLLM_CHILD": "1"},
    )
    server.start(timeout=30)
    try:
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        seen = _record(record)
        assert "--enforce-eager" in seen["argv"]  # type: ignore[operator]
        api, engine = server.processes()
        assert api == seen["pid"]
        assert engine == [seen["child"]]  # the API server's children are the engine
        server.kill()
        assert _gone(int(api))
        assert _gone(int(engine[0]))
        record.unlink()
        server.restart(timeout=30)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        restarted = _record(record)["pid"]
        assert restarted != api
    finally:
        server.stop()
    assert _gone(int(restarted))  # type: ignore[call-overload]
    assert server.pid is not None
    assert _gone(server.pid)


def test_pinned_to_a_core(tmp_path: pathlib.Path) -> None:
    record = tmp_path / "record.json"
    cpu = min(os.sched_getaffinity(0))
    server = VLLMProcess(
        "m", vllm_bin=str(FAKE), cpus=str(cpu), env={"FAKE_VLLM_RECORD": str(record)}
    )
    server.start(timeout=30)
    try:
        seen = _record(record)
    finally:
        server.stop()
    assert seen["affinity"] == [cpu]
    assert seen["omp_bind"] == str(cpu)


def test_a_vllm_that_cannot_start_says_why() -> None:
    server = VLLMProcess("m", vllm_bin=str(FAKE), env={"FAKE_VLLM_EXIT": "3"})
    with pytest.raises(VLLMProcessError, match="simulated start-up failure"):
        server.start(timeout=30)
