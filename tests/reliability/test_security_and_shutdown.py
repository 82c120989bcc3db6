"""Safe defaults (secrets, TLS, no shell) and graceful shutdown."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import llmbatch
from llmbatch_server.testing import run_simulator

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-very-secret-0123456789"


async def test_api_key_never_in_logs_reprs_errors_or_stats(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmbatch")
    with run_simulator("--zero-latency", api_key="the-right-key") as sim:
        client = llmbatch.Client(sim.base_url, api_key=SECRET)
        assert SECRET not in repr(client)
        with pytest.raises(llmbatch.LLMBatchError) as info:
            async with client:
                pass
        assert SECRET not in str(info.value)
        assert SECRET not in repr(info.value)
        async with llmbatch.Client(sim.base_url, api_key="the-right-key") as ok:
            await ok.complete("hi", max_tokens=2)
            assert "the-right-key" not in repr(ok.stats())
            assert "the-right-key" not in repr(ok)
        assert "the-right-key" not in sim.log_tail(1000)
    assert SECRET not in caplog.text
    assert "the-right-key" not in caplog.text


def test_tls_verification_is_on_by_default() -> None:
    assert llmbatch.Client("https://example.invalid/v1")._verify is True


def test_no_shell_in_subprocesses() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("llmbatch", "server")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"shell\s*=\s*True|os\.system\(|create_subprocess_shell", path.read_text())
    ]
    assert offenders == []


async def test_exit_drains_queued_work_by_default() -> None:
    with run_simulator("--speed", "20") as sim:
        results: list[llmbatch.Completion] = []

        async def ask(client: llmbatch.Client, i: int) -> None:
            results.append(await client.complete(f"q{i}", max_tokens=4))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                async with llmbatch.Client(sim.base_url) as client:
                    for i in range(200):
                        tg.start_soon(ask, client, i)
                    await anyio.lowlevel.checkpoint()  # queued, not done, when the client exits
    assert len(results) == 200


async def test_exit_with_cancel_fails_pending_callers_promptly() -> None:
    with run_simulator("--speed", "0.5") as sim:
        errors: list[BaseException] = []

        async def ask(client: llmbatch.Client, i: int) -> None:
            try:
                await client.complete(f"q{i}", max_tokens=200, ignore_eos=True)
            except llmbatch.RequestError as exc:
                errors.append(exc)

        with anyio.fail_after(30):  # no caller waits forever
            async with anyio.create_task_group() as tg:
                async with llmbatch.Client(sim.base_url, on_close="cancel") as client:
                    for i in range(50):
                        tg.start_soon(ask, client, i)
                    await anyio.sleep(0.2)
    assert len(errors) == 50
    assert all(isinstance(e, llmbatch.RequestCancelled) for e in errors)
