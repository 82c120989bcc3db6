"""Outages: 503 everywhere, or refused connections and a re-bind on the same port;
and ``GET /load``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from llmbatch_server.testing import SimulatorProcess, run_simulator

BODY = {"prompt": "x", "max_tokens": 2}
LONG = {"prompt": "long", "max_tokens": 3000, "ignore_eos": True, "stream": True}


def _poll(check: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait until ``check()`` holds, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:
        # The listener closed while this request was on a connection it had taken:
        # "disconnected without a response", the outage starting. Ask again.
        return False
    return False


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--speed", "1", "--enable-admin", "--enable-server-load-tracking") as s:
        yield s


def test_503_outage_keeps_metrics_and_admin_up(sim: SimulatorProcess) -> None:
    state = sim.outage(60)  # ended below, so its length never matters
    assert state["outage"]["mode"] == "503"
    try:
        with httpx.Client(base_url=sim.url, timeout=10) as http:
            r = http.post("/v1/completions", json=BODY)
            assert r.status_code == 503
            assert r.json()["error"]["code"] == 503
            assert http.get("/health").status_code == 503
            assert http.get("/v1/models").status_code == 503
            assert http.get("/metrics").status_code == 200
            outage = http.get("/admin/faults").json()["outage"]
            assert outage["mode"] == "503"
            assert 0 < outage["remaining"] <= 60
    finally:
        sim.outage(0)
    assert httpx.post(sim.base_url + "/completions", json=BODY, timeout=10).status_code == 200


def test_503_outage_ends_by_itself(sim: SimulatorProcess) -> None:
    sim.outage(0.3)
    _poll(lambda: _healthy(sim.url))
    assert httpx.get(sim.url + "/admin/faults", timeout=10).json()["outage"] is None


def test_refuse_outage_refuses_connections_cuts_streams_then_listens_again(
    sim: SimulatorProcess,
) -> None:
    with httpx.Client(base_url=sim.url, timeout=30) as http:
        assert http.get("/health").status_code == 200  # a pooled keep-alive connection
        with http.stream("POST", "/v1/completions", json=LONG) as stream:
            lines = stream.iter_lines()
            next(lines)  # running
            sim.outage(3, mode="refuse")
            with pytest.raises(httpx.TransportError):
                for _ in lines:  # cut off mid-stream, like a server restart
                    pass
        _poll(lambda: _refused(sim.url), timeout=2)
        # The pooled connection was closed too: the client has to reconnect.
        with pytest.raises(httpx.ConnectError):
            http.get("/health")
        _poll(lambda: _healthy(sim.url))  # same port, listening again
        assert http.post("/v1/completions", json=BODY).status_code == 200
    metrics = sim.metrics()
    assert 'vllm:num_requests_running{model_name="llmbatch-sim"} 0' in metrics


def test_bad_outage_requests_are_400(sim: SimulatorProcess) -> None:
    for fields in (
        {"outage_mode": "nap", "outage_seconds": 1},
        {"outage_mode": "503", "outage_seconds": -1},
        {"outage_seconds": "long"},
    ):
        r = httpx.post(sim.url + "/admin/faults", json=fields, timeout=10)
        assert r.status_code == 400, fields
    assert httpx.get(sim.url + "/health", timeout=10).status_code == 200


def test_load_counts_requests_in_flight(sim: SimulatorProcess) -> None:
    with httpx.Client(base_url=sim.url, timeout=30) as http:
        assert http.get("/load").json() == {"server_load": 0}
        with http.stream("POST", "/v1/completions", json=LONG) as stream:
            lines = stream.iter_lines()
            next(lines)
            assert http.get("/load").json() == {"server_load": 1}
        _poll(lambda: http.get("/load").json()["server_load"] == 0)


def test_load_stays_zero_without_tracking() -> None:
    with (
        run_simulator("--speed", "1") as sim,
        httpx.Client(base_url=sim.url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json=LONG) as stream,
    ):
        lines = stream.iter_lines()
        next(lines)
        assert http.get("/load").json() == {"server_load": 0}


@pytest.mark.slow  # a simulator of its own and a 2 s outage (CI's slow stage)
def test_outage_by_flag_refuses_then_recovers() -> None:
    with run_simulator(
        "--outage-mode", "refuse", "--outage-after", "1.5", "--outage-seconds", "1.5"
    ) as sim:
        _poll(lambda: _refused(sim.url))
        _poll(lambda: _healthy(sim.url))
