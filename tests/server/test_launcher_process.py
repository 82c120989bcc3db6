"""VLLMServer against a fake ``vllm`` executable: readiness, failures, stopping."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from llmbatch_server._process import free_port
from llmbatch_server.launcher import LauncherError, VLLMServer

FAKE_DIR = pathlib.Path(__file__).parent / "fake_vllm"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.asyncio_only("the launcher drives vllm with asyncio subprocesses"),
]


@pytest.fixture(autouse=True)
def fake_vllm_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> pathlib.Path:
    """Put the fake first on PATH and have it record what it was started with."""
    monkeypatch.setenv("PATH", f"{FAKE_DIR}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    return record


def read_record(path: pathlib.Path) -> dict[str, Any]:
    """What the fake recorded about how it was started."""
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def group_alive(pgid: int) -> bool:
    """True while any live (non-zombie) process is in process group ``pgid``.

    Zombies are ignored: an orphaned grandchild may wait for a reaper that a
    container's init never runs, yet it no longer executes anything.
    """
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(cond: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


async def test_ready_then_stopped(fake_vllm_on_path: pathlib.Path) -> None:
    lines: list[str] = []
    port = free_port()
    server = VLLMServer(
        model="tiny", profile="latency", port=port, log=lines.append, startup_timeout=20
    )
    async with server:
        assert server.base_url == f"http://127.0.0.1:{port}/v1"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200
        record = read_record(fake_vllm_on_path)
        assert record["argv"][:2] == ["serve", "tiny"]
        assert record["pgid"] == record["pid"]  # its own process group
        assert record["pgid"] != os.getpgid(0)
        pid = server.pid
        assert pid is not None
    assert wait_until(lambda: not group_alive(pid))
    assert "[vllm] fake vllm starting" in lines


async def test_readiness_waits_for_delayed_health(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_DELAY", "0.8")
    port = free_port()
    started = time.monotonic()
    async with VLLMServer(model="m", port=port, log=lambda _: None, startup_timeout=20):
        assert time.monotonic() - started >= 0.8


async def test_api_key_in_env_not_argv_and_masked(
    fake_vllm_on_path: pathlib.Path,
) -> None:
    lines: list[str] = []
    async with VLLMServer(model="m", port=free_port(), api_key="s3cret", log=lines.append):
        record = read_record(fake_vllm_on_path)
    assert record["api_key"] == "s3cret"
    assert "s3cret" not in " ".join(record["argv"])
    assert "[vllm] using key ***" in lines
    assert not any("s3cret" in line for line in lines)


async def test_early_exit_reports_log_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_EXIT", "3")
    with pytest.raises(LauncherError, match="exited with code 3") as info:
        async with VLLMServer(model="m", port=free_port(), log=lambda _: None):
            pytest.fail("must not become ready")
    assert "simulated start-up failure" in str(info.value)


async def test_startup_timeout_stops_process(
    monkeypatch: pytest.MonkeyPatch, fake_vllm_on_path: pathlib.Path
) -> None:
    monkeypatch.setenv("FAKE_VLLM_DELAY", "60")
    server = VLLMServer(model="m", port=free_port(), log=lambda _: None, startup_timeout=1.0)
    with pytest.raises(LauncherError, match="not ready within 1 s") as info:
        await server.start()
    assert "fake vllm starting" in str(info.value)
    pid = read_record(fake_vllm_on_path)["pid"]
    assert wait_until(lambda: not group_alive(pid))


async def test_stop_kills_group_and_escalates(
    monkeypatch: pytest.MonkeyPatch, fake_vllm_on_path: pathlib.Path
) -> None:
    monkeypatch.setenv("FAKE_VLLM_IGNORE_TERM", "1")
    monkeypatch.setenv("FAKE_VLLM_CHILD", "1")
    server = VLLMServer(model="m", port=free_port(), log=lambda _: None, stop_timeout=0.5)
    async with server:
        record = read_record(fake_vllm_on_path)
        assert pid_alive(record["child"])
    assert wait_until(lambda: not group_alive(record["pid"]))
    assert wait_until(lambda: not pid_alive(record["child"]))


async def test_vllm_bin_must_be_executable(tmp_path: pathlib.Path) -> None:
    with pytest.raises(LauncherError, match="not an executable"):
        VLLMServer(model="m", vllm_bin=str(tmp_path / "nope"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_forwards_signal_and_stops_group(
    sig: signal.Signals, fake_vllm_on_path: pathlib.Path
) -> None:
    """The CLI stops the whole vLLM process group when it is signalled."""
    port = free_port()
    env = {**os.environ, "FAKE_VLLM_CHILD": "1"}
    cli = [sys.executable, str(FAKE_DIR / "launcher_main.py"), "vllm"]
    proc = subprocess.Popen(
        [*cli, "--model", "m", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # bounded by the fake becoming ready
            if line.startswith("vLLM ready at"):
                break
        settings = proc.stderr.readline()
        assert f'llmbatch.Client(base_url="http://127.0.0.1:{port}/v1"' in settings
        assert "llmbatch.Limits(max_in_flight=256," in settings
        record = read_record(fake_vllm_on_path)
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
        assert wait_until(lambda: not group_alive(record["pid"]))
        assert wait_until(lambda: not pid_alive(record["child"]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_vllm_stops_when_the_launcher_is_killed(fake_vllm_on_path: pathlib.Path) -> None:
    """A launcher killed outright (SIGKILL, the OOM killer) cannot stop vLLM itself;
    vLLM, in a session of its own, is told by the kernel instead of serving on."""
    port = free_port()
    cli = [sys.executable, str(FAKE_DIR / "launcher_main.py"), "vllm"]
    proc = subprocess.Popen(
        [*cli, "--model", "m", "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # bounded by the fake becoming ready
            if line.startswith("vLLM ready at"):
                break
        vllm = read_record(fake_vllm_on_path)["pid"]
        assert pid_alive(vllm)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert wait_until(lambda: not pid_alive(vllm))
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
