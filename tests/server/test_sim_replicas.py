"""Several simulators at once: run_simulators() (one process each, for failover)
and ``--replicas N`` (one process, consecutive ports)."""

from __future__ import annotations

import socket
import time

import httpx
import psutil
import pytest

from llmbatch_server.testing import SimulatorError, run_simulator, run_simulators

BODY = {"prompt": "Which replica answers?", "max_tokens": 8, "seed": 1}


def _answer(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
    r.raise_for_status()
    text: str = r.json()["choices"][0]["text"]
    return text


def test_replicas_fail_over_and_come_back_on_the_same_port() -> None:
    with run_simulators(3, "--speed", "50") as sims:
        ports = {sim.port for sim in sims}
        assert len(ports) == 3
        answers = {_answer(sim.url) for sim in sims}
        assert len(answers) == 1  # one model: every replica answers alike
        victim = sims[1]
        url, pid = victim.url, victim.pid
        victim.kill()  # SIGKILL: a crash, no goodbye
        assert not victim.running
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=5)
        assert {_answer(sims[0].url), _answer(sims[2].url)} == answers
        victim.restart()
        assert (victim.url, victim.pid != pid) == (url, True)
        assert _answer(victim.url) in answers
    # All stopped on leaving the block, the restarted one too.
    assert not any(sim.running for sim in sims)


def test_idle_replicas_use_next_to_no_cpu() -> None:
    with run_simulators(4, "--speed", "10") as sims:
        procs = [psutil.Process(sim.pid) for sim in sims]
        _answer(sims[0].url)  # each has started; now leave them alone
        before = [sum(p.cpu_times()[:2]) for p in procs]
        window = 1.0
        time.sleep(window)  # measuring a quiet second is the point here
        used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before, strict=True)]
    assert max(used) < 0.05 * window, used  # the engine sleeps until work arrives


def test_replicas_option_serves_independent_simulators() -> None:
    with run_simulator("--replicas", "3", "--speed", "50", "--enable-admin") as sim:
        assert len(sim.urls) == 3
        assert len({u.rsplit(":", 1)[1] for u in sim.urls}) == 3
        assert len({_answer(u) for u in sim.urls}) == 1
        first, second, _ = sim.urls
        # Each has its own admin, faults and engine: an outage on one is its own.
        r = httpx.post(second + "/admin/faults", json={"outage_seconds": 60}, timeout=10)
        assert r.status_code == 200
        try:
            assert httpx.get(second + "/health", timeout=10).status_code == 503
            assert httpx.get(first + "/health", timeout=10).status_code == 200
        finally:
            httpx.post(second + "/admin/faults", json={"outage_seconds": 0}, timeout=10)
        assert httpx.get(second + "/health", timeout=10).status_code == 200
    assert not sim.running


def _free_pair() -> int:
    """A port p such that p and p + 1 were free a moment ago."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no two consecutive free ports")


def test_replicas_take_consecutive_ports_from_port() -> None:
    for attempt in range(3):  # another process may grab a port between check and use
        port = _free_pair()
        try:
            with run_simulator("--replicas", "2", "--speed", "50", port=port) as sim:
                assert [int(u.rsplit(":", 1)[1]) for u in sim.urls] == [port, port + 1]
                return
        except SimulatorError:
            if attempt == 2:
                raise
