"""What a job costs, end to end through MockTransport: tokens and dollars by tier,
tenant and model against a hand-written table of fixed usages, and spending limits
(``max_cost``) on the client and on a map."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

import llmbatch
from llmbatch import (
    Client,
    ConfigError,
    ConfigTypeError,
    InvalidRequestError,
    Limits,
    Price,
    RetryPolicy,
    SpendingLimitReached,
    SyncClient,
)
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=1, initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)

#: Each answer's usage, fixed per model: (prompt, cached, completion) tokens.
USAGE = {"small": (10_000, 4_000, 1_000), "big": (1_000, 500, 200)}
PRICES = {
    "small": Price(input=0.15, output=0.60, cached_input=0.075),
    "big": Price(input=2.50, output=10.00, cached_input=1.25),
}
#: The same, by hand: (6,000 x 0.15 + 4,000 x 0.075 + 1,000 x 0.60) / 1e6 and
#: (500 x 2.50 + 500 x 1.25 + 200 x 10.00) / 1e6.
SMALL, BIG = 0.0018, 0.003875


class FixedUsage:
    """Serves models ``small`` and ``big``; every prompt or conversation is charged
    its model's fixed usage, summed over a batch, cached tokens included."""

    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            data = [{"id": m, "object": "model", "max_model_len": 100_000} for m in USAGE]
            return MockResponse(json={"object": "list", "data": data})
        body = json.loads(request.body or b"{}")
        self.requests += 1
        model = body["model"]
        prompt, cached, completion = USAGE[model]
        if "messages" in body:
            count = 1
            choices: list[dict[str, Any]] = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ]
        else:
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            count = len(prompts)
            choices = [{"index": i, "text": "ok", "finish_reason": "stop"} for i in range(count)]
        usage = {
            "prompt_tokens": prompt * count,
            "completion_tokens": completion * count,
            "total_tokens": (prompt + completion) * count,
            "prompt_tokens_details": {"cached_tokens": cached * count},
        }
        if body.get("stream"):
            head = {"id": "x", "model": model, "created": 1}
            delta = {
                "index": 0,
                "delta": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
            lines = [
                b"data: " + json.dumps({**head, "choices": [delta]}).encode(),
                b"",
                b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode(),
                b"",
                b"data: [DONE]",
                b"",
            ]
            return MockResponse(lines=lines)
        return MockResponse(
            json={"id": "x", "model": model, "created": 1, "choices": choices, "usage": usage}
        )


def client(server: Any, **kw: Any) -> Client:
    kw.setdefault("retry", FAST_RETRY)
    kw.setdefault("model", "small")
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(server), **kw)


async def test_tokens_and_dollars_by_tier_tenant_and_model_match_the_table() -> None:
    async with client(FixedUsage(), prices=PRICES) as c:

        async def realtime(i: int) -> None:
            await c.complete(f"rt {i}", priority="realtime", tenant="a")

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(realtime, i)
        await c.map([f"bulk {i}" for i in range(10)], tenant="b")
        for i in range(2):
            await c.chat([{"role": "user", "content": f"q {i}"}], model="big", tenant="a")
        stats = c.stats()
    # The table, by hand.
    tiers = {"realtime": (3, 3 * SMALL), "batch": (10, 10 * SMALL), "normal": (2, 2 * BIG)}
    for tier, (answers, dollars) in tiers.items():
        cost = stats.tiers[llmbatch.Priority(tier)].cost
        assert cost.answers == answers
        assert cost.dollars == pytest.approx(dollars, abs=1e-12)
    assert stats.models["small"].answers == 13
    assert stats.models["small"].dollars == pytest.approx(13 * SMALL, abs=1e-12)
    assert stats.models["small"].cached_tokens == 13 * 4_000
    assert stats.models["big"].dollars == pytest.approx(2 * BIG, abs=1e-12)
    assert stats.models["big"].prompt_tokens == 2 * 1_000
    assert stats.tenants["a"].cost.dollars == pytest.approx(3 * SMALL + 2 * BIG, abs=1e-12)
    assert stats.tenants["b"].cost.dollars == pytest.approx(10 * SMALL, abs=1e-12)
    assert stats.tenants["a"].cost.answers == 5
    assert stats.cost.dollars == pytest.approx(13 * SMALL + 2 * BIG, abs=1e-12)
    assert round(stats.cost.dollars, 2) == 0.03  # to the cent: $0.0312
    assert stats.cost.completion_tokens == 13 * 1_000 + 2 * 200
    assert stats.cost.unpriced == 0
    assert "cost: $0.03" in str(stats)
    assert "small $0.02" in str(stats)


async def test_a_streamed_answer_is_counted_with_its_cached_tokens() -> None:
    async with client(FixedUsage(), prices=PRICES) as c:
        pieces = [p async for p in c.stream([{"role": "user", "content": "hi"}], model="big")]
        assert "".join(pieces) == "ok"
        stats = c.stats()
    assert stats.models["big"].cached_tokens == 500
    assert stats.cost.dollars == pytest.approx(BIG, abs=1e-12)


async def test_without_a_price_tokens_are_counted_and_the_answers_said_unpriced() -> None:
    async with client(FixedUsage()) as c:
        await c.map(["a", "b"])
        stats = c.stats()
    assert (stats.cost.answers, stats.cost.unpriced, stats.cost.dollars) == (2, 2, 0.0)
    assert stats.models["small"].prompt_tokens == 20_000
    assert "cost:" not in str(stats)


async def test_the_clients_max_cost_is_never_passed_and_the_rest_fail_clearly() -> None:
    server = FixedUsage()
    # Each answer costs SMALL ($0.0018); max_tokens=5000 reserves $0.003 for each.
    async with client(server, prices=PRICES, max_cost=0.01) as c:
        results = await c.map([f"p {i}" for i in range(20)], max_tokens=5_000)
        stats = c.stats()
    done = [r for r in results if r.ok]
    refused = [r for r in results if not r.ok]
    assert done
    assert refused
    assert all(isinstance(r.error, SpendingLimitReached) for r in refused)
    error = refused[0].error
    assert isinstance(error, SpendingLimitReached)
    assert error.scope == "client"
    assert stats.spending is not None
    assert stats.spending.spent == pytest.approx(len(done) * SMALL)
    assert stats.spending.spent <= 0.01
    assert stats.spending.reserved == 0.0
    assert stats.spending.held == 0
    # Every answered request was sent; none of the refused ones was.
    assert server.requests <= len(done)
    assert "max_cost $0.01" in str(stats)


async def test_requests_wait_for_reservations_that_settle_for_less() -> None:
    """max_tokens reserves 100x what each answer costs: a limit that holds two
    reservations still lets every one of twenty go, in turn, and none is refused."""
    prices = {"small": Price(input=0.0, output=1.0)}

    def answer(request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            return MockResponse(json={"object": "list", "data": [{"id": "small"}]})
        body = json.loads(request.body or b"{}")
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = [{"index": i, "text": "ok", "finish_reason": "stop"} for i in range(len(prompts))]
        usage = {"prompt_tokens": 0, "completion_tokens": 10 * len(prompts), "total_tokens": 10}
        return MockResponse(json={"id": "x", "model": "small", "choices": choices, "usage": usage})

    reserved_each = 1_000 / 1e6  # max_tokens=1000 at $1 per million
    async with client(answer, prices=prices, max_cost=2.5 * reserved_each) as c:
        results = await c.map([f"p{i}" for i in range(20)], max_tokens=1_000)
        stats = c.stats()
    assert all(r.ok for r in results)
    assert stats.spending is not None
    assert stats.spending.spent == pytest.approx(20 * 10 / 1e6)


async def test_a_maps_own_max_cost_stops_that_map_alone() -> None:
    async with client(FixedUsage(), prices=PRICES) as c:
        capped = await c.map([f"p {i}" for i in range(10)], max_cost=3 * SMALL, max_tokens=5_000)
        free = await c.map([f"q {i}" for i in range(10)])
        stats = c.stats()
    assert 0 < sum(r.ok for r in capped) <= 3
    refused = [r.error for r in capped if not r.ok]
    assert all(isinstance(e, SpendingLimitReached) and e.scope == "map" for e in refused)
    assert all(r.ok for r in free)
    assert stats.spending is None  # the client itself has no limit


async def test_a_max_cost_without_a_price_fails_at_the_call_or_at_opening() -> None:
    async with client(FixedUsage()) as c:
        with pytest.raises(InvalidRequestError, match="max_cost needs the price of model 'small'"):
            await c.map(["a"], max_cost=1.0)
        with pytest.raises(ConfigError, match="max_cost must be a finite number > 0"):
            await c.map(["a"], max_cost=0)
    with pytest.raises(ConfigError, match="max_cost needs the price of model 'small'"):
        async with client(FixedUsage(), max_cost=1.0):
            pass


async def test_a_single_call_past_the_limit_raises_the_refusal() -> None:
    async with client(FixedUsage(), prices=PRICES, max_cost=0.000001) as c:
        with pytest.raises(
            SpendingLimitReached, match=r"the client's max_cost of \$0\.000001 is reached"
        ):
            await c.complete("too dear", max_tokens=100)
        assert c.stats().tiers[llmbatch.Priority.NORMAL].failed == 1


def test_a_sync_client_keeps_its_limit_too() -> None:
    with SyncClient(
        "http://127.0.0.1:1/v1",
        transport=MockTransport(FixedUsage()),
        model="small",
        retry=FAST_RETRY,
        limits=Limits(max_in_flight=4, reserved_realtime=1),
        prices=PRICES,
        max_cost=5 * SMALL,
    ) as c:
        results = c.map([f"p {i}" for i in range(12)], max_tokens=5_000)
        stats = c.stats()
    assert 0 < sum(r.ok for r in results) <= 5
    assert stats.spending is not None
    assert stats.spending.spent <= 5 * SMALL + 1e-12


def test_a_bad_prices_argument_names_the_model() -> None:
    with pytest.raises(ConfigTypeError, match="prices\\['m'\\] must be a Price"):
        Client("http://127.0.0.1:1/v1", prices={"m": 1.0})  # type: ignore[dict-item]
