"""Client-side rate limits, end to end: the scheduler's token buckets pace what the
server sees, in tier order, on asyncio and on trio.

The spacing tests run on trio's MockClock (virtual time that jumps when every task is
blocked), so spacing is checked exactly without sleeping; the real-time test runs on
both backends and checks only what is held back within a short bounded wait."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from fake_server import FakeServer

from llmbatch import BatchPolicy, Client, ConfigError, ConfigTypeError, RateLimit
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

ONE_AT_A_TIME = {
    tier: BatchPolicy(max_batch_size=1, max_wait=0) for tier in ("realtime", "normal", "batch")
}


def virtual_trio() -> Any:
    import trio.testing

    return pytest.param(
        ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="trio-virtual-time"
    )


class TimedServer(FakeServer):
    """Records when (by the event loop's clock) and for which prompt each request came."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[float, str]] = []

    def __call__(self, request: HTTPRequest) -> MockResponse:
        response = super().__call__(request)
        if request.method == "POST":
            self.sent.append((anyio.current_time(), self.bodies[-1]["prompt"]))
        return response


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_requests_per_minute_spaces_requests_exactly() -> None:
    server = TimedServer()
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server),
        rate_limit=RateLimit(requests_per_minute=60),
        batching=ONE_AT_A_TIME,
    ) as c:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(c.complete, f"p{i}")
    offsets = [round(t - start, 6) for t, _ in server.sent]
    assert offsets == [0.0, 1.0, 2.0, 3.0, 4.0]  # a burst of one second's worth: one


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_short_budget_goes_to_realtime_first() -> None:
    server = TimedServer()
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server),
        rate_limit=RateLimit(requests_per_minute=60),
        batching=ONE_AT_A_TIME,
    ) as c:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(lambda i=i: c.complete(f"bulk{i}", priority="batch"))
            await anyio.sleep(0.5)  # one bulk request went at once; the bucket is empty
            tg.start_soon(lambda: c.complete("rt", priority="realtime"))
    prompts = [prompt for _, prompt in server.sent]
    # (trio starts tasks in no set order, so which bulk request went first varies.)
    assert prompts[1] == "rt"
    assert sorted(prompts[:1] + prompts[2:]) == ["bulk0", "bulk1", "bulk2"]


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_tokens_per_minute_weighs_each_batch() -> None:
    server = TimedServer()
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server),
        rate_limit=RateLimit(tokens_per_minute=6000),  # 100 tokens/s
        batching=ONE_AT_A_TIME,
    ) as c:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for i in range(3):
                # "pN" estimates 1 token + 49 max_tokens = 50 tokens each.
                tg.start_soon(lambda i=i: c.complete(f"p{i}", max_tokens=49))
    offsets = [round(t - start, 6) for t, _ in server.sent]
    assert offsets == [0.0, 0.0, 0.5]


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_retries_count_against_the_rate_limit() -> None:
    server = TimedServer()
    failures = iter([True, False])

    def flaky(body: dict[str, Any]) -> MockResponse | None:
        if next(failures, False):
            return MockResponse(status=500, json={"error": {"message": "boom"}})
        return None

    server.intercept = flaky
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server),
        rate_limit=RateLimit(requests_per_minute=60),
        batching=ONE_AT_A_TIME,
    ) as c:
        start = anyio.current_time()
        await c.complete("x")
    # The failed attempt used the second's budget: the retry waits for the next one.
    assert [round(t - start, 6) for t, _ in server.sent] == [0.0, 1.0]


async def test_requests_per_minute_holds_back_the_excess_in_real_time() -> None:
    fake = FakeServer()
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(fake),
        rate_limit=RateLimit(requests_per_minute=2),
        batching=ONE_AT_A_TIME,
        on_close="cancel",
    ) as c:
        await c.complete("a")
        # The bucket holds one second's worth (one request): the next waits ~30 s.
        with anyio.move_on_after(0.3):
            await c.complete("b")
        await anyio.lowlevel.checkpoint()
    assert len(fake.bodies) == 1


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_bad_rate_limit_values(value: float) -> None:
    with pytest.raises(ConfigError):
        RateLimit(requests_per_minute=value)


def test_rate_limit_of_the_wrong_type() -> None:
    with pytest.raises(ConfigTypeError):
        RateLimit(tokens_per_minute="100")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Client("http://127.0.0.1:1/v1", rate_limit={"requests_per_minute": 10})  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_429_that_asks_to_wait_holds_every_batch_for_that_server() -> None:
    """One batch meets a 429 asking for 2 s: nothing is sent to the server until the
    2 s have passed (not only that batch's retry), then everything is answered."""
    server = TimedServer()
    refused: list[float] = []

    def limited(body: dict[str, Any]) -> MockResponse | None:
        if not refused:
            refused.append(anyio.current_time())
            return MockResponse(status=429, json={}, headers={"retry-after-ms": "2000"})
        return None

    server.intercept = limited
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server),
        batching=ONE_AT_A_TIME,
    ) as c:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: c.complete("first"))
            await anyio.sleep(0.5)  # the 429 came back at once: the server cools down
            cooling = c.stats().servers[0].cooldown
            for i in range(4):
                tg.start_soon(lambda i=i: c.complete(f"later{i}"))
    assert refused == [start]
    assert cooling is not None
    assert cooling == pytest.approx(1.5)
    later = [t - start for t, prompt in server.sent if prompt != "first"]
    first = [t - start for t, prompt in server.sent if prompt == "first"]
    assert len(later) == 4
    assert min(later) >= 2.0  # none before the wait ended
    assert first[0] == 0.0
    assert 2.0 <= first[1] <= 2.2  # the retry: after the wait, spread by at most a tenth
    assert c.stats().servers[0].cooldown is None


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_429_without_a_wait_holds_only_its_own_batch() -> None:
    server = TimedServer()
    refused: list[float] = []

    def limited(body: dict[str, Any]) -> MockResponse | None:
        if not refused:
            refused.append(anyio.current_time())
            return MockResponse(status=429, json={})
        return None

    server.intercept = limited
    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(server), batching=ONE_AT_A_TIME
    ) as c:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: c.complete("first"))
            await anyio.sleep(0.01)
            assert c.stats().servers[0].cooldown is None
            tg.start_soon(lambda: c.complete("later"))
    later = [t - start for t, prompt in server.sent if prompt == "later"]
    assert later[0] < 0.1  # sent at once, beside the refused batch's backoff


class ProviderServer(TimedServer):
    """Answers with OpenAI's rate-limit headers: 60 requests a minute."""

    def __call__(self, request: HTTPRequest) -> MockResponse:
        response = super().__call__(request)
        response.headers = {
            **response.headers,
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-reset-requests": "1s",
        }
        return response


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_providers_stated_limits_pace_the_client_when_none_is_given() -> None:
    server = ProviderServer()
    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(server), batching=ONE_AT_A_TIME
    ) as c:
        start = anyio.current_time()
        await c.complete("first")  # its answer states the limit
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(lambda i=i: c.complete(f"p{i}"))
    offsets = [t - start for t, _ in server.sent]
    assert len(offsets) == 5
    # 95 % of 60 a minute: a request every 60/57 s from the first answer on, and the
    # first of them once the bucket holds a whole request: the answer said 59 of the
    # minute's 60 are left, a second's worth of 59/60 (at the client's 95 %).
    first_wait = (1 - 59 / 60 * 0.95) * 60 / 57
    assert offsets[-1] == pytest.approx(4 * 60 / 57 + first_wait, rel=0.01)
    assert all(b - a == pytest.approx(60 / 57, rel=0.01) for a, b in pairwise(offsets[1:]))


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_stated_rate_limit_wins_over_what_the_provider_says() -> None:
    server = ProviderServer()
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(server),
        batching=ONE_AT_A_TIME,
        rate_limit=RateLimit(requests_per_minute=600),
    ) as c:
        start = anyio.current_time()
        await c.complete("first")
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(lambda i=i: c.complete(f"p{i}"))
    assert max(t - start for t, _ in server.sent) < 0.5  # 10 a second, not 1
