"""Real vLLM for the ``vllm``-marked suite, started once per session via the launcher.

Opt in with ``LLMBATCH_VLLM_TESTS=1``. ``LLMBATCH_VLLM_BIN`` names the vLLM
executable (default: ``vllm`` on PATH); ``LLMBATCH_VLLM_MODEL`` a model
directory (default: a tiny model made with the vLLM venv's python).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from llmbatch_server._process import free_port
from llmbatch_server.launcher import VLLMServer

SERVER_DIR = pathlib.Path(__file__).resolve().parents[2] / "server"
STARTUP_TIMEOUT = float(os.environ.get("LLMBATCH_VLLM_STARTUP_TIMEOUT", "300"))
#: Small, CPU-friendly engine settings on top of the latency profile.
EXTRA_ARGS = [
    "--enforce-eager",
    "--max-num-seqs",
    "16",
    "--max-model-len",
    "1024",
    # The usage says which prompt tokens the prefix cache served (what they cost).
    "--enable-prompt-tokens-details",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this directory's tests unless opted in and vLLM is installed."""
    reason = _skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(skip)


def _skip_reason() -> str | None:
    if os.environ.get("LLMBATCH_VLLM_TESTS") != "1":
        return "real vLLM tests are opt-in: set LLMBATCH_VLLM_TESTS=1"
    if vllm_bin() is None:
        return "no vLLM executable (set LLMBATCH_VLLM_BIN or put `vllm` on PATH)"
    return None


def vllm_bin() -> str | None:
    configured = os.environ.get("LLMBATCH_VLLM_BIN")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("vllm")


def group_alive(pgid: int) -> bool:
    """True while any live (non-zombie) process is in process group ``pgid``."""
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def wait_group_gone(pgid: int, timeout: float = 5.0) -> bool:
    """Bounded wait for SIGKILLed stragglers to die; True once the group is gone."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="session")
def process_group_alive() -> Callable[[int], bool]:
    """``group_alive`` as a fixture, so test modules need not import conftest."""
    return group_alive


@pytest.fixture(scope="session")
def process_group_gone() -> Callable[[int], bool]:
    """``wait_group_gone`` as a fixture."""
    return wait_group_gone


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model vLLM can load: ``LLMBATCH_VLLM_MODEL`` or a fresh tiny model."""
    configured = os.environ.get("LLMBATCH_VLLM_MODEL")
    if configured:
        return configured
    out = tmp_path_factory.mktemp("tiny-model")
    binary = vllm_bin()
    assert binary is not None
    # The vLLM venv has torch + transformers; the test venv need not.
    python = pathlib.Path(binary).parent / "python"
    subprocess.run(
        [str(python if python.exists() else sys.executable), "-c", _MAKE_MODEL, str(out)],
        env={**os.environ, "PYTHONPATH": str(SERVER_DIR)},
        check=True,
        timeout=300,
    )
    return str(out)


_MAKE_MODEL = (
    "import sys; from llmbatch_server.tiny_model import make_tiny_model; "
    "make_tiny_model(sys.argv[1])"
)


@dataclass
class RunningServer:
    """What tests need to know about the session's vLLM."""

    base_url: str
    model: str
    pgid: int
    max_model_len: int


@pytest.fixture(scope="session")
def make_server(model_dir: str) -> Callable[..., VLLMServer]:
    """A factory of unstarted launcher servers for the test model, on a free port
    (or on ``port=``, to start one again where another was)."""

    def make(port: int | None = None, extra_args: Sequence[str] = ()) -> VLLMServer:
        return VLLMServer(
            model=model_dir,
            profile="latency",
            port=port or free_port(),
            vllm_bin=vllm_bin(),
            extra_args=[*EXTRA_ARGS, *extra_args],
            env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
            startup_timeout=STARTUP_TIMEOUT,
            log=_quiet_log,
        )

    return make


@pytest.fixture(scope="session")
def vllm_server(model_dir: str, make_server: Callable[..., VLLMServer]) -> Iterator[RunningServer]:
    """Start the real vLLM through the launcher's Python API; stop it at the end."""
    server = make_server()
    with ServerThread(server) as pgid:
        yield RunningServer(server.base_url, model_dir, pgid, max_model_len=1024)


@pytest.fixture(scope="session")
def server_thread() -> type[ServerThread]:
    """:class:`ServerThread`, for a module that starts a server of its own."""
    return ServerThread


def _quiet_log(line: str) -> None:
    # Warnings and errors only: the full log is kept in the launcher's tail.
    if " WARNING " in line or " ERROR " in line or "Traceback" in line:
        print(line, file=sys.stderr)


class ServerThread:
    """Run a VLLMServer's lifetime in its own event loop on a thread.

    Session fixtures are synchronous, while each anyio test has its own loop;
    a dedicated loop lets the server outlive every test's loop.
    """

    def __init__(self, server: VLLMServer) -> None:
        self.server = server
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-server", daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        assert self.server.pid is not None
        return self.server.pid

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=self.server.stop_timeout + 30)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with self.server:
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # surfaced to the fixture, not lost in the thread
            self._error = exc
        finally:
            self._ready.set()
