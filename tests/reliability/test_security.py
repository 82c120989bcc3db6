"""Safe defaults, tested: secrets never shown, TLS verified, loopback-only servers,
no shell, and the simulator's fault-injection admin endpoint off unless enabled."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import ssl
import subprocess
import sys
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSStream
from fake_server import FakeServer

import llmbatch
from llmbatch.transports import HTTPRequest
from llmbatch_server.cli import main as server_main
from llmbatch_server.launcher.server import LauncherError, VLLMServer
from llmbatch_server.sim.config import SimConfig
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-very-secret-0123456789"
WRONG = "sk-wrong-key-9876543210"


def everything_shown(error: BaseException) -> str:
    """What a user could ever see of an error: message, repr, attributes, and the
    whole formatted traceback with its causes."""
    shown = [str(error), repr(error), repr(vars(error))]
    shown += traceback.format_exception(error)
    return "\n".join(shown)


@pytest.fixture(scope="module")
def keyed_sim() -> Iterator[SimulatorProcess]:
    with run_simulator(
        "--zero-latency", "--poison", "POISON", "--enable-admin", api_key=SECRET
    ) as sim:
        yield sim


async def test_api_key_never_in_logs_reprs_errors_or_stats(
    keyed_sim: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmbatch")
    shown: list[str] = []
    keyed_sim.set_faults(error_500=0.3, error_429=0.2)  # retries get logged at DEBUG
    try:
        retry = llmbatch.RetryPolicy(attempts=20, initial_backoff=0.001, max_backoff=0.01)
        client = llmbatch.Client(keyed_sim.base_url, api_key=SECRET, retry=retry)
        shown.append(repr(client))
        async with client:
            shown.append(repr(client))
            results = await client.map(["fine", "POISON here", "also fine"], max_tokens=2)
            shown.append(repr(results))
            shown.append(everything_shown(results[1].error))  # type: ignore[arg-type]
            with pytest.raises(llmbatch.BadRequestError) as info:
                await client.chat([{"role": "user", "content": "POISON"}], max_tokens=2)
            shown.append(everything_shown(info.value))
            async for delta in client.stream("stream me", max_tokens=3):
                shown.append(delta)
            shown.append(repr(client.stats()))
            shown.append(str(client.stats()))
            shown.append(client.stats().model_dump_json())
    finally:
        keyed_sim.set_faults(error_500=0.0, error_429=0.0)
    assert results[0].ok
    assert not results[1].ok
    assert results[2].ok
    assert client.stats().tiers[llmbatch.Priority.BATCH].retried > 0  # the logs saw retries
    assert "retrying" in caplog.text
    # A wrong key fails at entry, model named or not, with a typed error that does
    # not echo it.
    for model in (None, "llmbatch-sim"):
        with pytest.raises(llmbatch.AuthenticationError) as wrong:
            async with llmbatch.Client(keyed_sim.base_url, api_key=WRONG, model=model):
                pass
        assert "refused the API key" in str(wrong.value)
        shown.append(everything_shown(wrong.value))
    shown.append(caplog.text)
    shown.append(keyed_sim.log_tail(10_000))  # the server's own log
    shown.append(repr(keyed_sim))
    text = "\n".join(shown)
    assert SECRET not in text
    assert WRONG not in text


def test_api_key_from_the_environment_stays_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBATCH_API_KEY", SECRET)
    client = llmbatch.Client("http://127.0.0.1:9/v1")
    assert SECRET not in repr(client)
    assert "api_key=set" in repr(client)
    request = HTTPRequest("POST", "http://x/v1", {"Authorization": f"Bearer {SECRET}"}, b"{}")
    assert SECRET not in repr(request)


@pytest.mark.parametrize(
    "key", [SECRET + "\n", SECRET + " ", "sk-é-" + SECRET, "\t" + SECRET], ids=repr
)
def test_a_malformed_api_key_is_refused_without_echoing_it(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key with a newline (read from a file) used to reach the HTTP library, whose
    error quoted the header, key included, in the error and in the retry log."""
    with pytest.raises(llmbatch.InvalidRequestError) as info:
        llmbatch.Client("http://127.0.0.1:9/v1", api_key=key)
    assert SECRET not in everything_shown(info.value)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(llmbatch.InvalidRequestError):
        llmbatch.Client("http://127.0.0.1:9/v1")


def test_config_reprs_hide_secrets() -> None:
    config = SimConfig(api_key=SECRET)
    assert SECRET not in repr(config)
    assert SECRET not in str(config)
    for value in (
        llmbatch.Limits(),
        llmbatch.RetryPolicy(),
        llmbatch.Timeout(),
        llmbatch.BatchPolicy(),
        llmbatch.RateLimit(requests_per_minute=10),
    ):
        assert "key" not in repr(value).lower()


# -- TLS ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@asynccontextmanager
async def tls_server(cert: Path, key: Path) -> AsyncIterator[str]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate, answering like
    vLLM (one request per connection); yields its base URL. anyio streams, so it
    serves under asyncio and trio alike."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    fake = FakeServer()

    async def handle(tcp: anyio.abc.SocketStream) -> None:
        async with tcp:
            try:
                tls = await TLSStream.wrap(tcp, server_side=True, ssl_context=context)
                reader = BufferedByteReceiveStream(tls)
                head = await reader.receive_until(b"\r\n\r\n", 65536)
                method, path = head.decode().split(" ", 2)[:2]
                length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
                body = await reader.receive_exactly(int(length.group(1))) if length else b""
                answer = fake(HTTPRequest(method, path, {}, body))
                await tls.send(
                    f"HTTP/1.1 {answer.status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(answer.content)}\r\nConnection: close\r\n\r\n".encode()
                    + answer.content
                )
            except (OSError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass  # the client refused our certificate: exactly what is tested

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield f"https://127.0.0.1:{port}/v1"
        finally:
            tg.cancel_scope.cancel()


# Each transport on the backends it supports (aiohttp needs asyncio).
TLS_MATRIX = [
    pytest.param("asyncio", "aiohttp", id="asyncio-aiohttp"),
    pytest.param("asyncio", "httpx", id="asyncio-httpx"),
    # On trio httpx's ConnectError has an empty message (the certificate error hides
    # behind trio.BrokenResourceError); the transport digs the reason out.
    pytest.param("trio", "httpx", id="trio-httpx"),
]


@pytest.mark.parametrize(("anyio_backend", "transport"), TLS_MATRIX)
async def test_tls_certificates_are_verified_by_default(
    self_signed: tuple[Path, Path], transport: Literal["aiohttp", "httpx"]
) -> None:
    async with tls_server(*self_signed) as url:
        with anyio.fail_after(30):
            # Only an explicit opt-out talks to a server it cannot verify.
            async with llmbatch.Client(url, verify=False, transport=transport) as insecure:
                answer = await insecure.complete("hi", max_tokens=2)
            assert answer.text == "echo:hi:0"
            retry = llmbatch.RetryPolicy(attempts=1)
            async with llmbatch.Client(url, model="m", retry=retry, transport=transport) as c:
                with pytest.raises(llmbatch.ConnectError) as info:
                    await c.complete("hi", max_tokens=2)
    assert "certificate" in str(info.value).lower()
    assert "verify=False turns the check off" in str(info.value)


# -- servers bind loopback, refuse exposure without a key ------------------------------


def _without_key_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}


def test_simulator_binds_loopback_by_default() -> None:
    with run_simulator("--zero-latency") as sim:
        assert sim.url.startswith("http://127.0.0.1:")


def test_simulator_refuses_a_public_bind_without_an_api_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmbatch_server", "sim", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_without_key_env(),
    )
    assert result.returncode != 0
    assert "refusing to bind non-loopback host '0.0.0.0' without an API key" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--host", "::", "--port", "0"],
        ["sim", "--host", "192.0.2.1", "--port", "0"],
        ["vllm", "--model", "m", "--host", "0.0.0.0", "--dry-run"],
        ["vllm", "--model", "m", "--host", "example.com", "--dry-run"],
        # A --host passed through to `vllm serve` used to bypass the check.
        ["vllm", "--model", "m", "--dry-run", "--", "--host", "0.0.0.0"],
        ["vllm", "--model", "m", "--dry-run", "--", "--host=0.0.0.0"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_servers_refuse_a_public_bind_without_an_api_key(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert server_main(argv) != 0
    captured = capsys.readouterr()
    assert "refusing to bind non-loopback host" in captured.err
    assert "vllm serve" not in captured.out  # nothing was started or printed as started


def test_launcher_library_refuses_a_passed_through_public_host() -> None:
    with pytest.raises(LauncherError, match=re.escape("non-loopback host '0.0.0.0'")):
        VLLMServer(model="m", vllm_bin=sys.executable, extra_args=["--host", "0.0.0.0"])


def test_launcher_binds_loopback_by_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert server_main(["vllm", "--model", "m", "--dry-run"]) == 0
    assert "--host 127.0.0.1" in capsys.readouterr().out


# -- no shell ---------------------------------------------------------------------------

SHELL_PATTERN = re.compile(
    r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(|create_subprocess_shell"
    r"|subprocess\.getoutput|subprocess\.getstatusoutput|os\.exec\w*p\w*\(\s*['\"]/bin/sh"
)


def test_the_shell_pattern_catches_what_it_should() -> None:
    for bad in (
        "subprocess.run(cmd, shell=True)",
        "Popen(x, shell = True)",
        "os.system('ls')",
        "await asyncio.create_subprocess_shell(cmd)",
        "subprocess.getoutput('id')",
    ):
        assert SHELL_PATTERN.search(bad), bad
    assert not SHELL_PATTERN.search("subprocess.run([sys.executable, '-m', 'x'], check=True)")


def test_no_shell_anywhere_in_the_library_or_server() -> None:
    sources = [p for folder in ("llmbatch", "server") for p in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 30
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if SHELL_PATTERN.search(line)
    ]
    assert offenders == []


# -- the fault-injection admin endpoint -------------------------------------------------


def test_admin_endpoint_is_off_unless_enabled() -> None:
    with run_simulator("--zero-latency") as sim:
        assert httpx.get(sim.url + "/admin/faults").status_code == 404
        post = httpx.post(sim.url + "/admin/faults", json={"error_500": 1.0})
        assert post.status_code == 404
        # And the POST changed nothing: requests still succeed.
        answer = httpx.post(
            sim.base_url + "/completions",
            json={"model": "llmbatch-sim", "prompt": "hi", "max_tokens": 2},
        )
        assert answer.status_code == 200


def test_admin_endpoint_needs_the_api_key_when_enabled(keyed_sim: SimulatorProcess) -> None:
    assert httpx.get(keyed_sim.url + "/admin/faults").status_code == 401
    wrong = {"Authorization": f"Bearer {WRONG}"}
    assert httpx.post(keyed_sim.url + "/admin/faults", json={}, headers=wrong).status_code == 401
    state: dict[str, Any] = keyed_sim.set_faults()
    assert state["rates"]["error_500"] == 0.0
    assert SECRET not in json.dumps(state)
