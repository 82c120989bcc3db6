"""The bad-input table: each kind of bad input gets a clear, typed error at the call
site, and requests around it still succeed."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch.transports import MockTransport

pytestmark = pytest.mark.anyio

Call = Callable[[llmbatch.Client], Awaitable[Any]]


async def _first_delta(client: llmbatch.Client, prompt: Any, **kw: Any) -> None:
    async for _ in client.stream(prompt, **kw):
        break


CALL_CASES: list[tuple[str, Call]] = [
    ("complete-empty-prompt", lambda c: c.complete("")),
    ("complete-int-prompt", lambda c: c.complete(123)),  # type: ignore[arg-type]
    ("complete-none-prompt", lambda c: c.complete(None)),  # type: ignore[arg-type]
    ("complete-bytes-prompt", lambda c: c.complete(b"bytes")),  # type: ignore[arg-type]
    ("complete-lone-surrogate", lambda c: c.complete("bad \udcff text")),
    ("complete-huge-prompt", lambda c: c.complete("word " * 200_000)),
    ("complete-negative-max-tokens", lambda c: c.complete("x", max_tokens=-1)),
    ("complete-zero-max-tokens", lambda c: c.complete("x", max_tokens=0)),
    ("complete-oversize-max-tokens", lambda c: c.complete("x", max_tokens=10**7)),
    ("complete-float-max-tokens", lambda c: c.complete("x", max_tokens=1.5)),  # type: ignore[arg-type]
    ("complete-nan-temperature", lambda c: c.complete("x", temperature=math.nan)),
    ("complete-inf-temperature", lambda c: c.complete("x", temperature=math.inf)),
    ("complete-unknown-tier", lambda c: c.complete("x", priority="urgent")),  # type: ignore[arg-type]
    ("complete-negative-timeout", lambda c: c.complete("x", timeout=-1)),
    ("complete-zero-n", lambda c: c.complete("x", n=0)),
    ("chat-empty-messages", lambda c: c.chat([])),
    ("chat-no-role", lambda c: c.chat([{"content": "hi"}])),
    ("chat-unknown-role", lambda c: c.chat([{"role": "wizard", "content": "hi"}])),
    ("chat-int-content", lambda c: c.chat([{"role": "user", "content": 5}])),
    ("chat-string-not-list", lambda c: c.chat("hi")),  # type: ignore[arg-type]
    ("stream-empty-prompt", lambda c: _first_delta(c, "")),
    ("stream-unknown-tier", lambda c: _first_delta(c, "x", priority="vip")),
    ("map-zero-window", lambda c: c.map(["a"], window=0)),
    ("map-unknown-tier", lambda c: c.map(["a"], priority="soon")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call"), CALL_CASES, ids=[n for n, _ in CALL_CASES])
async def test_bad_call_fails_alone(name: str, call: Call) -> None:
    fake = FakeServer()
    async with llmbatch.Client("http://127.0.0.1:9/v1", transport=MockTransport(fake)) as client:
        good: list[llmbatch.Completion] = []

        async def neighbour(i: int) -> None:
            good.append(await client.complete(f"fine {i}", max_tokens=4))

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(neighbour, i)
            with pytest.raises(llmbatch.InvalidRequestError) as info:
                await call(client)
        assert str(info.value)
    assert len(good) == 5
    # Only the neighbours reached the server: the bad call sent nothing.
    sent = [b["prompt"] for b in fake.bodies if "prompt" in b]
    prompts = [p for item in sent for p in (item if isinstance(item, list) else [item])]
    assert sorted(prompts) == [f"fine {i}" for i in range(5)]


def test_map_items_with_bad_input_fail_alone() -> None:
    async def main() -> list[llmbatch.Result[Any]]:
        async with llmbatch.Client(
            "http://127.0.0.1:9/v1", transport=MockTransport(FakeServer())
        ) as client:
            return await client.map(["ok", "", 5, {"prompt": "x", "max_tokens": -3}, "fine"])

    results = anyio.run(main)
    assert [r.ok for r in results] == [True, False, False, False, True]
    assert all(isinstance(r.error, llmbatch.InvalidRequestError) for r in results if not r.ok)


@pytest.mark.parametrize(
    ("kwargs", "env"),
    [
        ({"base_url": "ftp://host/v1"}, {}),
        ({"base_url": "not a url"}, {}),
        ({}, {"LLMBATCH_BASE_URL": "localhost:8000"}),
        ({"model": ""}, {}),
        ({"rate_limit": "100/min"}, {}),
    ],
    ids=["ftp-url", "garbage-url", "env-url-without-scheme", "empty-model", "bad-rate-limit"],
)
def test_bad_client_configuration(
    kwargs: dict[str, Any], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(llmbatch.InvalidRequestError):
        llmbatch.Client(**kwargs)


@pytest.mark.parametrize(
    "limits",
    [{"max_in_flight": 0}, {"reserved_realtime": 300}, {"min_share": {"batch": 1.5}}],
    ids=["zero-in-flight", "reservation-over-limit", "share-over-one"],
)
def test_bad_limits(limits: dict[str, Any]) -> None:
    with pytest.raises(llmbatch.InvalidRequestError):
        llmbatch.Limits(**limits)


def test_jsonl_runner_reports_malformed_lines_by_number(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n'
        "this is not json\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmbatch",
            "run",
            str(source),
            "-o",
            str(tmp_path / "o.jsonl"),
            "--on-malformed",
            "fail",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "in.jsonl:2: not valid JSON" in result.stderr


def test_simulator_cli_rejects_bad_flags() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmbatch_server", "sim", "--speed", "-1", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--speed must be > 0" in result.stderr
