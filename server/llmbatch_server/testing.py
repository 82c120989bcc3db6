"""Start simulators as real subprocesses on 127.0.0.1 for tests and demos.

    with run_simulator("--speed", "50") as sim:
        async with llmbatch.Client(sim.base_url) as client: ...

    with run_simulators(3, "--speed", "10") as sims:   # three replicas, for failover
        sims[1].kill()                                  # SIGKILL one ...
        sims[1].restart()                               # ... and bring it back, same port

Each server gets a free port from the OS, is ready (``/health`` answered) when
the ``with`` body starts, and is stopped (SIGTERM, then SIGKILL) when it ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx

from llmbatch_server._process import ManagedProcess
from llmbatch_server._process import free_port as free_port  # for a server on a chosen port

DEFAULT_STARTUP_TIMEOUT = 30.0


class SimulatorError(RuntimeError):
    """The simulator did not start; the message carries its log tail."""


class PrefixCacheStats(NamedTuple):
    """A replica's prefix-cache counters, in prompt tokens, since it started."""

    queries: int
    hits: int

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` (0.0 before any query), as vLLM's dashboards plot it."""
        return self.hits / self.queries if self.queries else 0.0


class SimulatorProcess(ManagedProcess):
    """A running simulator subprocess."""

    name = "simulator"
    error = SimulatorError
    startup_timeout = DEFAULT_STARTUP_TIMEOUT

    def __init__(self, args: tuple[str, ...], *, port: int = 0, api_key: str | None = None) -> None:
        super().__init__(tag="sim")
        self.args = args
        self.api_key = api_key
        self.port = port
        self.url = ""
        #: Every replica's URL (more than one with ``--replicas``); ``url`` is the first.
        self.urls: list[str] = []
        self._ready_file = self._dir / "ready"

    def __repr__(self) -> str:
        return f"SimulatorProcess(url={self.url!r}, pid={self.pid})"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ``http://127.0.0.1:PORT/v1``."""
        return self.url + "/v1"

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llmbatch_server",
            "sim",
            "--port",
            str(self.port),
            "--ready-file",
            str(self._ready_file),
            *self.args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key  # not on the command line, where ps shows it
        return env

    def spawn(self) -> None:
        self._ready_file.unlink(missing_ok=True)
        super().spawn()

    def ready(self) -> bool:
        # The simulator writes its URLs once every replica listens.
        return self._ready_file.exists()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the spawned server listens and ``/health`` answers."""
        super().wait_ready(timeout)
        self.urls = [line.removesuffix("/v1") for line in self._ready_file.read_text().split()]
        self.url = self.urls[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        for url in self.urls:
            httpx.get(url + "/health", timeout=timeout or self.startup_timeout).raise_for_status()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def set_faults(self, **rates: Any) -> dict[str, Any]:
        """Change fault rates at runtime (needs ``--enable-admin``); returns the new state."""
        r = httpx.post(self.url + "/admin/faults", json=rates, headers=self._headers(), timeout=10)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def outage(self, seconds: float, mode: str = "503") -> dict[str, Any]:
        """Make the server unavailable for ``seconds`` (needs ``--enable-admin``).

        ``mode="503"`` answers 503 everywhere but ``/metrics`` and
        ``/admin/faults`` (``seconds=0`` ends it); ``mode="refuse"`` stops
        listening and drops every connection, then listens again on the same
        port. Returns the admin state, whose ``outage`` shows the new outage.
        """
        return self.set_faults(outage_mode=mode, outage_seconds=seconds)

    def metrics(self, replica: int = 0) -> str:
        """The ``/metrics`` text (of ``urls[replica]`` with ``--replicas``)."""
        return httpx.get(self.urls[replica] + "/metrics", timeout=10).text

    def prefix_cache(self, replica: int = 0) -> PrefixCacheStats:
        """Prompt tokens looked up in and found in the prefix cache so far.

        Read from ``vllm:prefix_cache_queries_total`` and
        ``vllm:prefix_cache_hits_total``; a bench compares replicas' ``hit_rate``
        to see whether prompts sharing a prefix reached the same one.
        """
        text = self.metrics(replica)
        return PrefixCacheStats(
            queries=_counter(text, "vllm:prefix_cache_queries_total"),
            hits=_counter(text, "vllm:prefix_cache_hits_total"),
        )

    def peak_sequences(self, replica: int = 0) -> int:
        """The most sequences the server has held at once (running and waiting), from
        ``llmbatch_sim:peak_sequences``: proof that clients sharing an in-flight
        budget never sent more, whatever happened between two scrapes."""
        return _counter(self.metrics(replica), "llmbatch_sim:peak_sequences")

    def peak_running(self, replica: int = 0, *, user: str | None = None) -> int:
        """The most sequences the server has run in one engine step
        (``llmbatch_sim:peak_running``): never more than its ``max_num_seqs``. With
        ``user``, the most of that OpenAI ``user``'s requests (0 if it sent none), so
        a test can count per caller at the server."""
        metrics = self.metrics(replica)
        if user is None:
            return _counter(metrics, "llmbatch_sim:peak_running")
        for line in metrics.splitlines():
            if line.startswith("llmbatch_sim:peak_running_by_user{"):
                labels, _, value = line.rpartition(" ")
                found = _USER.search(labels)
                if found is not None and found.group(1) == _escape(user):
                    return int(float(value))
        return 0

    def finished(self, replica: int = 0) -> int:
        """Requests the server has finished (stopped, cut at their length or aborted),
        by its own count (``vllm:request_success_total``): what a client sent, seen
        from the server (a response cache's hits are not in it)."""
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in self.metrics(replica).splitlines()
            if line.startswith("vllm:request_success_total")
        )

    def post_count(self, replica: int = 0) -> int:
        """POST requests the server has answered, by its own count."""
        total = 0
        for line in self.metrics(replica).splitlines():
            if line.startswith("http_requests_total{") and 'method="POST"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total


_USER = re.compile(r'user="((?:[^"\\]|\\.)*)"')


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _counter(metrics: str, name: str) -> int:
    """The value of counter ``name`` in a ``/metrics`` text."""
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", metrics, re.M)
    if match is None:
        raise ValueError(f"{name} not in /metrics")
    return int(float(match.group(1)))


@contextlib.contextmanager
def run_simulators(
    n: int,
    *args: str,
    api_key: str | None = None,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
) -> Iterator[list[SimulatorProcess]]:
    """Run ``n`` simulator processes, each on its own free port, for the ``with`` block.

    They start in parallel and are all ready when the block starts; all are
    stopped when it ends, whatever happened to them inside (a killed one is
    simply not running). Each is a whole server with its own engine, so one can
    be killed (:meth:`SimulatorProcess.kill`) and restarted on its port
    (:meth:`SimulatorProcess.restart`) while the others serve.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    sims = [SimulatorProcess(args, api_key=api_key) for _ in range(n)]
    try:
        for sim in sims:
            sim.spawn()
        for sim in sims:
            sim.wait_ready(startup_timeout)
        yield sims
    finally:
        for sim in sims:
            sim.close()


@contextlib.contextmanager
def run_simulator(
    *args: str,
    port: int = 0,
    api_key: str | None = None,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
) -> Iterator[SimulatorProcess]:
    """Run ``llmbatch-server sim *args`` for the duration of the ``with`` block."""
    sim = SimulatorProcess(args, port=port, api_key=api_key)
    try:
        sim.start(startup_timeout)
        yield sim
    finally:
        sim.close()
