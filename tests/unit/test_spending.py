"""Prices and spending limits, as pure parts: what a usage costs, where a price
comes from, and a ledger that never lets the spend pass its limit while each
request settles for no more than it reserved."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch import ConfigError, ConfigTypeError, Price, SpendingLimitReached
from llmbatch._exceptions import usd
from llmbatch._servers.wire import cached_tokens, split_cached
from llmbatch._spending.ledger import SpendingLedger, Verdict, reserve, settle, verdict_of
from llmbatch._spending.prices import PriceBook, hosted

GPT_4O_MINI = Price(input=0.15, output=0.60, cached_input=0.075)


@pytest.mark.parametrize(
    ("price", "prompt", "completion", "cached", "dollars"),
    [
        # Hand-computed: (uncached * input + cached * cached_input + out * output) / 1e6.
        (GPT_4O_MINI, 1_000_000, 0, 0, 0.15),
        (GPT_4O_MINI, 0, 1_000_000, 0, 0.60),
        (GPT_4O_MINI, 1_000, 100, 200, (800 * 0.15 + 200 * 0.075 + 100 * 0.60) / 1e6),
        (GPT_4O_MINI, 10_000, 1_000, 4_000, 0.0018),
        # No cached price: cached tokens cost the input price.
        (Price(input=2.5, output=10.0), 1_000, 200, 500, (1_000 * 2.5 + 200 * 10.0) / 1e6),
        # More cached than prompt (a server's odd report) counts the prompt at most.
        (GPT_4O_MINI, 100, 0, 500, 100 * 0.075 / 1e6),
        (Price(input=0, output=0), 5, 5, 0, 0.0),
    ],
)
def test_a_usage_costs_its_tokens_at_the_price(
    price: Price, prompt: int, completion: int, cached: int, dollars: float
) -> None:
    assert price.cost(prompt, completion, cached) == pytest.approx(dollars, abs=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"input": -1, "output": 1}, ConfigError),
        ({"input": 1, "output": math.inf}, ConfigError),
        ({"input": "1", "output": 1}, ConfigTypeError),
        ({"input": 1, "output": 1, "cached_input": -0.1}, ConfigError),
    ],
)
def test_a_price_refuses_what_is_not_dollars(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        Price(**kwargs)  # type: ignore[arg-type]


def test_a_stated_price_wins_and_star_prices_every_other_model() -> None:
    mine = Price(input=1.0, output=2.0)
    default = Price(input=3.0, output=4.0)
    book = PriceBook({"gpt-4o-mini": mine, "*": default}, "https://api.openai.com/v1")
    assert book.price("gpt-4o-mini") is mine
    assert book.source("gpt-4o-mini") == "stated"
    assert book.price("anything") is default
    assert book.price(None) is None


def test_the_catalogue_prices_a_hosted_provider_by_its_url() -> None:
    pytest.importorskip("genai_prices")
    book = PriceBook({}, "https://api.openai.com/v1")
    price = book.price("gpt-4o-mini")
    assert price is not None
    assert book.source("gpt-4o-mini") == "genai-prices"
    # What genai-prices' own calculation gives for the same usage.
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=1_000, output_tokens=100, cache_read_tokens=200)
    expected = float(
        calc_price(usage, "gpt-4o-mini", provider_api_url="https://api.openai.com/v1").total_price
    )
    assert price.cost(1_000, 100, 200) == pytest.approx(expected, rel=1e-9)
    assert book.price("no-such-model-anywhere") is None


def test_a_server_the_catalogue_does_not_know_by_url_has_no_price() -> None:
    """A self-hosted model is never charged a provider's rate for sharing its name."""
    pytest.importorskip("genai_prices")
    book = PriceBook({}, "http://127.0.0.1:8000/v1")
    assert book.price("gpt-4o-mini") is None
    assert book.source("gpt-4o-mini") is None


def test_a_ledger_lets_go_waits_then_refuses() -> None:
    ledger = SpendingLedger(1.0, "client")
    assert ledger.verdict(0.6) is Verdict.GO
    ledger.reserve(0.6)
    # Only the reservation stands in the way: it may settle for less.
    assert ledger.verdict(0.6) is Verdict.WAIT
    ledger.settle(0.6, 0.3)
    assert (ledger.spent, ledger.reserved, ledger.holders) == (0.3, 0.0, 0)
    assert ledger.verdict(0.6) is Verdict.GO
    ledger.reserve(0.6)
    ledger.settle(0.6, 0.6)
    # What was spent alone leaves no room: nothing can give it back.
    assert ledger.verdict(0.2) is Verdict.REFUSE
    assert ledger.verdict(0.1) is Verdict.GO
    # More than the whole limit is refused at once.
    assert SpendingLedger(1.0, "map").verdict(1.5) is Verdict.REFUSE


def test_the_strictest_of_several_ledgers_decides() -> None:
    client, job = SpendingLedger(10.0, "client"), SpendingLedger(1.0, "map")
    assert verdict_of((client, job), 0.5) == (Verdict.GO, None)
    job.reserve(0.8)
    assert verdict_of((client, job), 0.5) == (Verdict.WAIT, job)
    client.spend(9.8)
    assert verdict_of((client, job), 0.5) == (Verdict.REFUSE, client)


class _Request:
    def __init__(self, ledgers: tuple[SpendingLedger, ...], estimate: float) -> None:
        self.spending = ledgers
        self.est_cost = estimate
        self.reserved = False


def test_an_answer_after_its_caller_left_is_still_paid_for() -> None:
    ledger = SpendingLedger(1.0, "client")
    request = _Request((ledger,), 0.4)
    reserve(request)
    settle(request, 0.0)  # the caller left: its reservation goes
    assert (ledger.spent, ledger.reserved) == (0.0, 0.0)
    settle(request, 0.25)  # then its answer came
    assert ledger.spent == 0.25
    assert not request.reserved


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.5),  # estimate
            st.floats(min_value=0.0, max_value=1.0),  # the share of it the answer costs
            st.booleans(),  # settle now (else it stays in flight for a while)
        ),
        max_size=60,
    ),
    st.floats(min_value=0.01, max_value=3.0),
)
def test_the_spend_never_passes_the_limit(
    steps: list[tuple[float, float, bool]], limit: float
) -> None:
    """Whatever the order of requests and answers, while each settles for no more than
    it reserved, what is spent never passes the limit; every request is let go,
    held, or refused as the ledger says, and a held one goes once room is made."""
    ledger = SpendingLedger(limit, "client")
    flying: list[tuple[_Request, float]] = []
    for estimate, share, now in steps:
        request = _Request((ledger,), estimate)
        verdict = ledger.verdict(estimate)
        if verdict is Verdict.WAIT:
            assert flying  # only reservations stand in its way
            while flying and ledger.verdict(estimate) is Verdict.WAIT:
                held, held_share = flying.pop(0)
                settle(held, held.est_cost * held_share)
            verdict = ledger.verdict(estimate)
        if verdict is Verdict.GO:
            reserve(request)
            flying.append((request, share))
        else:
            assert verdict is Verdict.REFUSE
            assert ledger.spent + estimate > limit
        if now and flying:
            held, held_share = flying.pop()
            settle(held, held.est_cost * held_share)
        assert ledger.spent <= limit + 1e-9
        assert ledger.spent + ledger.reserved <= limit + 1e-9
    for held, held_share in flying:
        settle(held, held.est_cost * held_share)
    assert ledger.spent <= limit + 1e-9
    assert ledger.reserved == 0.0
    assert ledger.holders == 0


def test_the_refusal_says_whose_limit_what_was_spent_and_what_it_needed() -> None:
    error = SpendingLimitReached(scope="map", limit=5.0, spent=4.99, estimate=0.000022)
    assert str(error) == (
        "the map's max_cost of $5.00 is reached: $4.99 spent, and this request could "
        "cost up to $0.000022; it was not sent"
    )
    assert (error.scope, error.limit, error.spent, error.estimate) == ("map", 5.0, 4.99, 0.000022)


@pytest.mark.parametrize(
    ("dollars", "shown"),
    [(0, "$0.00"), (1234.5, "$1,234.50"), (0.0123, "$0.01"), (0.00099, "$0.00099"),
     (2e-8, "<$0.000001")],
)  # fmt: skip
def test_dollars_read_as_a_person_reads_them(dollars: float, shown: str) -> None:
    assert usd(dollars) == shown


@pytest.mark.parametrize(
    ("data", "cached"),
    [
        ({"usage": {"prompt_tokens_details": {"cached_tokens": 40}}}, 40),
        ({"usage": {"prompt_tokens_details": None}}, 0),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": "40"}}}, 0),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}, 0),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": -3}}}, 0),
        ({"usage": None}, 0),
        ({}, 0),
    ],
)
def test_cached_tokens_are_read_where_the_usage_says_and_ignored_when_malformed(
    data: dict[str, object], cached: int
) -> None:
    assert cached_tokens(data) == cached


@given(
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=64),
    st.floats(min_value=0.0, max_value=1.2),
)
def test_a_batchs_cached_tokens_are_shared_out_exactly(prompts: list[int], share: float) -> None:
    total = sum(prompts)
    cached = int(total * share)
    parts = split_cached(cached, prompts, total)
    assert sum(parts) == min(cached, total) if total else parts == [0] * len(prompts)
    assert all(0 <= part <= prompt for part, prompt in zip(parts, prompts, strict=True))


@pytest.mark.parametrize(
    ("url", "hosted_there"),
    [
        ("https://api.openai.com/v1", True),
        ("https://api.groq.com/openai/v1", True),
        ("http://127.0.0.1:8000/v1", False),
        ("http://[::1]:8000/v1", False),
        ("http://localhost:8000/v1", False),
        ("http://vllm:8000/v1", False),
        ("http://gpu-3.internal:8000/v1", False),
    ],
)
def test_the_catalogue_is_looked_at_only_for_a_public_domain(url: str, hosted_there: bool) -> None:
    """Your own server or a proxy beside it never pays for importing the catalogue."""
    assert hosted(url) is hosted_there
