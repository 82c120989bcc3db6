"""The server side of a bench run: the simulator the harness may start, and what
it can read about any server while a job runs.

``llmbatch_server`` is imported only here and only when asked: the client package
never depends on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = [
    "MetricsSampler",
    "ServerInfo",
    "api_posts",
    "check_prompts_fit",
    "discover",
    "machine_busy",
    "parse_metrics",
    "process_cpu",
    "read_api_posts",
    "serve_flag",
    "simulator",
    "vllm",
    "wait_idle",
]


def serve_flag(model: str, profile: str, vllm_args: Sequence[str], flag: str) -> str | None:
    """The value ``vllm serve`` gets for ``flag`` from the launcher's ``profile`` and
    ``vllm_args`` (None: not set)."""
    from llmbatch_server.launcher.profiles import build_argv, flag_value

    return flag_value(build_argv(model=model, profile=profile, extra=list(vllm_args)), flag)


def check_prompts_fit(
    model: str, profile: str, vllm_args: Sequence[str], shape: str, max_tokens: int
) -> None:
    """Raise ValueError, before any engine starts, if the longest prompt of ``shape``
    plus ``max_tokens`` exceeds the context ``vllm serve`` would get (counted with the
    model directory's ``tokenizer.json`` where it and the ``tokenizers`` package are
    there; unchecked otherwise): vLLM would refuse it only after minutes of start-up."""
    from pathlib import Path

    from llmbatch_bench.jobs import prompt

    length = serve_flag(model, profile, vllm_args, "--max-model-len")
    path = Path(model) / "tokenizer.json"
    if length is None or not path.is_file():
        return
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    tokenizer = Tokenizer.from_file(str(path))
    # (Numbered as high as a run numbers them: their digits are tokens too.)
    texts = [prompt(99_999_990 + i, shape) for i in range(10)]
    longest = max(len(e.ids) for e in tokenizer.encode_batch(texts))
    if longest + max_tokens > int(length):
        raise ValueError(
            f"--prompts {shape}: its longest prompt is {longest:,} tokens on this model's "
            f"tokenizer, {longest + max_tokens:,} with --max-tokens {max_tokens}, past the "
            f"server's --max-model-len {length}; give vLLM a longer one (-- --max-model-len "
            f"{4096 if longest + max_tokens <= 4096 else 8192})"
        )


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Where a server is and what runs it."""

    base_url: str
    model: str
    max_model_len: int | None = None
    #: The simulator's arguments when the harness started it, else None.
    sim_args: tuple[str, ...] | None = None
    pid: int | None = None
    #: A vLLM the harness started: its API server's pid and its engine's (engine
    #: core, workers), whose CPU is counted apart.
    api_pid: int | None = None
    engine_pids: tuple[int, ...] = ()
    #: The harness started it scheduling by priority (``--scheduling-policy
    #: priority``): llmbatch sends its tiers' priorities there by default.
    priority: bool = False


def discover(base_url: str, api_key: str | None, model: str | None) -> ServerInfo:
    """Ask ``/v1/models`` which model to use (the first, unless ``model`` is given)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=30)
    response.raise_for_status()
    cards = response.json()["data"]
    card = next((c for c in cards if c.get("id") == model), None) if model else cards[0]
    if card is None:
        names = [c.get("id") for c in cards]
        raise ValueError(f"model {model!r} not served at {base_url}; it serves {names}")
    return ServerInfo(base_url.rstrip("/"), str(card["id"]), card.get("max_model_len"))


@contextlib.contextmanager
def simulator(args: Sequence[str]) -> Iterator[ServerInfo]:
    """Run ``llmbatch-server sim *args`` on a free loopback port for the block."""
    try:
        from llmbatch_server.testing import run_simulator
    except ImportError as exc:
        raise RuntimeError(
            "the simulator needs the llmbatch-server package (pip install -e ./server); "
            "or pass --url to bench a running server"
        ) from exc
    with run_simulator(*args) as sim:
        info = discover(sim.base_url, sim.api_key, None)
        yield ServerInfo(
            info.base_url, info.model, info.max_model_len, sim_args=tuple(args), pid=sim.pid
        )


@contextlib.contextmanager
def vllm(
    model: str,
    args: Sequence[str] = (),
    *,
    profile: str = "latency",
    vllm_bin: str | None = None,
    api_key: str | None = None,
) -> Iterator[ServerInfo]:
    """Run a real vLLM through ``llmbatch-server vllm`` on a free loopback port."""
    try:
        from llmbatch_server.vllm_process import VLLMProcess
    except ImportError as exc:
        raise RuntimeError(
            "--vllm needs the llmbatch-server package (pip install -e ./server)"
        ) from exc
    priority = serve_flag(model, profile, args, "--scheduling-policy") == "priority"
    server = VLLMProcess(model, args, profile=profile, vllm_bin=vllm_bin)
    server.start()
    try:
        info = discover(server.base_url, api_key, None)
        api, engine = server.processes()
        yield dataclasses.replace(info, api_pid=api, engine_pids=tuple(engine), priority=priority)
    finally:
        server.stop()


class MetricsSampler:
    """Polls a vLLM-style ``/metrics`` in a thread while a job runs.

    Reports the mean running and waiting sequences: whether the server was full is
    what explains a throughput number. Any server without those metrics just yields
    nothing. Also the server's CPU seconds: the process's when the harness started it
    (``server_cpu_s``); for a server at ``--url``, its API server's own count, where
    its ``/metrics`` exports ``process_cpu_seconds_total`` (``api_server_cpu_s``: vLLM's
    API server does; its engine core is another process, not counted). For a vLLM
    the harness started, both by process: ``api_server_cpu_s`` and ``engine_cpu_s``.
    """

    INTERVAL = 0.1

    def __init__(self, info: ServerInfo, api_key: str | None = None) -> None:
        parts = urlsplit(info.base_url)
        self._url = f"{parts.scheme}://{parts.netloc}/metrics"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._pid = info.pid
        self._api_pid = info.api_pid
        self._engine_pids = info.engine_pids
        self._engine_cpu_start: float | None = None
        self._stop = threading.Event()
        self._running: list[float] = []
        self._waiting: list[float] = []
        self._thread: threading.Thread | None = None
        self._cpu_start: float | None = None
        self._api_cpu_start: float | None = None
        self._busy_start: float | None = None
        self._wall_start = 0.0

    def __enter__(self) -> MetricsSampler:
        self._cpu_start = self._server_cpu()
        self._engine_cpu_start = self._engine_cpu()
        if self._pid is None:
            self._api_cpu_start = self._api_server_cpu()
        self._busy_start = machine_busy()
        self._wall_start = time.perf_counter()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._running:
            out["server_running_mean"] = round(sum(self._running) / len(self._running), 1)
            out["server_waiting_mean"] = round(sum(self._waiting) / len(self._waiting), 1)
        cpu = self._server_cpu()
        if cpu is not None and self._cpu_start is not None:
            out["server_cpu_s"] = round(cpu - self._cpu_start, 3)
        if self._api_cpu_start is not None:
            api = self._api_server_cpu()
            if api is not None:
                out["api_server_cpu_s"] = round(api - self._api_cpu_start, 3)
        engine = self._engine_cpu()
        if engine is not None and self._engine_cpu_start is not None:
            out["engine_cpu_s"] = round(engine - self._engine_cpu_start, 3)
        busy, wall = machine_busy(), time.perf_counter() - self._wall_start
        if busy is not None and self._busy_start is not None and wall > 0:
            # Everything the machine's CPUs did meanwhile, in cores: the client and the
            # server, plus whatever else runs here (noise on a shared machine).
            out["machine_busy_cores"] = round((busy - self._busy_start) / wall, 2)
        return out

    def _server_cpu(self) -> float | None:
        return None if self._pid is None else process_cpu(self._pid)

    def _engine_cpu(self) -> float | None:
        if not self._engine_pids:
            return None
        times = [process_cpu(pid) for pid in self._engine_pids]
        return None if None in times else sum(t for t in times if t is not None)

    def _api_server_cpu(self) -> float | None:
        """The API server's CPU seconds: by its pid when the harness started it, else
        ``process_cpu_seconds_total`` from its ``/metrics`` (None if absent)."""
        if self._api_pid is not None:
            return process_cpu(self._api_pid)
        try:
            text = httpx.get(self._url, headers=self._headers, timeout=5).text
        except httpx.HTTPError:
            return None
        values = parse_metrics(text, ("process_cpu_seconds_total",))
        return values.get("process_cpu_seconds_total")

    def _poll(self) -> None:
        with httpx.Client(headers=self._headers, timeout=5) as http:
            while not self._stop.wait(self.INTERVAL):
                try:
                    text = http.get(self._url).text
                except httpx.HTTPError:
                    continue
                values = parse_metrics(
                    text, ("vllm:num_requests_running", "vllm:num_requests_waiting")
                )
                if len(values) != 2:
                    return  # not a vLLM-style server: nothing to learn
                self._running.append(values["vllm:num_requests_running"])
                self._waiting.append(values["vllm:num_requests_waiting"])


def process_cpu(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used (None without psutil, or if it is gone)."""
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def machine_busy() -> float | None:
    """CPU seconds all CPUs spent not idle since boot (None without psutil)."""
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_metrics(text: str, names: Sequence[str]) -> dict[str, float]:
    """Sum each named series over its label sets (Prometheus text format)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            with contextlib.suppress(ValueError, IndexError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_posts(text: str) -> int | None:
    """POST requests to the ``/v1/...`` routes a server has counted, from the
    ``http_requests_total`` it exports (vLLM's API server and the simulator, by
    handler, method and status); None when it exports no such counter."""
    total: int | None = None
    for line in text.splitlines():
        if not line.startswith("http_requests_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        found = dict(_LABEL.findall(labels))
        posted = found.get("method") == "POST" and found.get("handler", "").startswith("/v1/")
        with contextlib.suppress(ValueError):
            total = (total or 0) + (int(float(value)) if posted else 0)
    return total


def read_api_posts(base_url: str, api_key: str | None = None) -> int | None:
    """:func:`api_posts` of the server at ``base_url``, now (None if unreadable)."""
    parts = urlsplit(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{parts.scheme}://{parts.netloc}/metrics", headers=headers, timeout=5)
    except httpx.HTTPError:
        return None
    return api_posts(response.text) if response.status_code == 200 else None


def wait_idle(info: ServerInfo, api_key: str | None = None, timeout: float = 30.0) -> None:
    """Wait until the server reports nothing running or waiting (after a cancelled
    run the next job must not start on a busy server)."""
    parts = urlsplit(info.base_url)
    url = f"{parts.scheme}://{parts.netloc}/metrics"
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=headers, timeout=5) as http:
        while time.monotonic() < deadline:
            try:
                values = parse_metrics(http.get(url).text, _GAUGES)
            except httpx.HTTPError:
                return
            if len(values) != 2 or not any(values.values()):
                return
            time.sleep(0.1)
