"""Client-side rate limits (aiolimiter, asyncio only)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from fake_server import FakeServer

from llmbatch import BatchPolicy, Client, InvalidRequestError, RateLimit
from llmbatch.transports import MockTransport

pytestmark = pytest.mark.anyio

ONE_AT_A_TIME = {"normal": BatchPolicy(max_batch_size=1, max_wait=0)}


async def test_requests_per_minute_holds_back_the_excess() -> None:
    fake = FakeServer()
    limit = RateLimit(requests_per_minute=2)
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(fake),
        rate_limit=limit,
        batching=ONE_AT_A_TIME,
        on_close="cancel",
    ) as c:
        await c.complete("a")
        await c.complete("b")
        # The bucket (2 per minute) is empty now: the third waits ~30 s.
        with anyio.move_on_after(0.3):
            await c.complete("c")
    assert len(fake.bodies) == 2


async def test_tokens_per_minute_is_weighted_by_request_size() -> None:
    fake = FakeServer()
    limit = RateLimit(tokens_per_minute=300)
    async with Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(fake),
        rate_limit=limit,
        batching=ONE_AT_A_TIME,
        on_close="cancel",
    ) as c:
        await c.complete("a", max_tokens=200)  # ~201 estimated tokens
        with anyio.move_on_after(0.3):
            await c.complete("b", max_tokens=200)  # would exceed 300/min
        await anyio.lowlevel.checkpoint()
    assert len(fake.bodies) == 1


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_rate_limit_under_trio_is_refused_clearly() -> None:
    client = Client(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(FakeServer()),
        rate_limit=RateLimit(requests_per_minute=10),
    )
    with pytest.raises(InvalidRequestError, match="asyncio"):
        async with client:
            pass


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_bad_rate_limit_values(value: float) -> None:
    with pytest.raises(InvalidRequestError):
        RateLimit(requests_per_minute=value)
