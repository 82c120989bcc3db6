"""What llmbatch logs: one WARNING per retried batch (at most one per interval, with
a count of those held back), bisection detail at DEBUG with one INFO summary."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fake_server import POISON, FakeServer

from llmbatch import BatchPolicy, Client, RetryPolicy
from llmbatch._logs import Throttle
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

NO_WAIT = RetryPolicy(initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "llmbatch" and r.levelno == level]


def test_throttle_lets_one_through_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = Throttle(lambda: now[0], interval=5.0)
    assert throttle.allow() == 0
    assert [throttle.allow() for _ in range(3)] == [None, None, None]
    now[0] = 4.9
    assert throttle.allow() is None
    now[0] = 5.0
    assert throttle.allow() == 4  # the four held back since the last one
    assert throttle.allow() is None


class FailsFirstAttempts:
    """Every batch's first two attempts get a 500 (the prompt's first use)."""

    def __init__(self) -> None:
        self.fake = FakeServer()
        self.seen: dict[str, int] = {}

    def __call__(self, request: HTTPRequest) -> Any:
        if request.method != "POST":
            return self.fake(request)
        key = request.body or b""
        count = self.seen[key.decode()] = self.seen.get(key.decode(), 0) + 1
        if count <= 2:
            return MockResponse(status=500, json={"error": {"message": "flaky"}})
        return self.fake(request)


@pytest.mark.anyio
async def test_many_retried_batches_log_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmbatch")
    batching = {"batch": BatchPolicy(max_batch_size=4)}
    client = Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(FailsFirstAttempts()),
        retry=NO_WAIT,
        batching=batching,
    )
    async with client:
        results = await client.map([f"p{i}" for i in range(40)], max_tokens=2)
    assert all(r.ok for r in results)
    assert client.stats().retries >= 20  # ten batches, two retries each
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 1  # the rest held back within the interval
    assert "retrying" in warnings[0].getMessage()
    assert "500" in warnings[0].getMessage() or "flaky" in warnings[0].getMessage()
    debug = [r for r in records(caplog, logging.DEBUG) if "retrying" in r.getMessage()]
    assert len(debug) >= 19  # every retry the warning did not report


@pytest.mark.anyio
async def test_one_poisoned_prompt_logs_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmbatch")
    prompts = [f"p{i}" for i in range(64)]
    prompts[37] = f"{POISON} p37"
    client = Client("http://127.0.0.1:1/v1", transport=MockTransport(FakeServer()), retry=NO_WAIT)
    async with client:
        results = await client.map(prompts, max_tokens=2)
    assert [i for i, r in enumerate(results) if not r.ok] == [37]
    infos = records(caplog, logging.INFO)
    assert len(infos) == 1
    message = infos[0].getMessage()
    assert "400 on a batch of 64" in message
    assert "1 failed alone, 63 answered" in message
    splits = [r for r in records(caplog, logging.DEBUG) if "resending in" in r.getMessage()]
    assert len(splits) == client.stats().bisections >= 6  # log2(64) levels, at DEBUG
