"""Rate-limit headers read into ProviderLimits (``_servers/rate_headers.py``):
OpenAI's durations, absent and malformed headers, and the reading's age."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch import ProviderLimits
from llmbatch._servers.kinds import GENERIC
from llmbatch._servers.rate_headers import openai_rate_headers, parse_duration
from llmbatch._servers.wire import error_from_response


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("12ms", 0.012),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("20", 20.0),
        ("", None),
        ("soon", None),
        ("1x", None),
        ("s1", None),
        ("-3", None),
        (None, None),
    ],
)
def test_durations_as_openai_writes_them(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == (None if seconds is None else pytest.approx(seconds))


@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_a_duration_reads_back_as_its_parts(h: int, m: int, s: int, ms: int) -> None:
    text = f"{h}h{m}m{s}s{ms}ms"
    assert parse_duration(text) == pytest.approx(h * 3600 + m * 60 + s + ms / 1000)


OPENAI = {
    "x-ratelimit-limit-requests": "5000",
    "x-ratelimit-remaining-requests": "4999",
    "x-ratelimit-reset-requests": "12ms",
    "x-ratelimit-limit-tokens": "90000",
    "x-ratelimit-remaining-tokens": "89000",
    "x-ratelimit-reset-tokens": "6m0s",
}


def test_openais_family_is_read_whole() -> None:
    assert openai_rate_headers(OPENAI) == ProviderLimits(
        requests_limit=5000,
        requests_remaining=4999,
        requests_reset=0.012,
        tokens_limit=90000,
        tokens_remaining=89000,
        tokens_reset=360.0,
    )


def test_an_answer_without_the_family_says_nothing() -> None:
    assert openai_rate_headers({"content-type": "application/json"}) is None
    # vLLM's own load header is not a rate limit.
    assert openai_rate_headers({"endpoint-load-metrics": "TEXT named_metrics.x=1"}) is None


def test_a_malformed_value_is_none_and_the_rest_still_read() -> None:
    limits = openai_rate_headers(
        {"x-ratelimit-remaining-tokens": "lots", "x-ratelimit-remaining-requests": "7"}
    )
    assert limits is not None
    assert limits.tokens_remaining is None
    assert limits.requests_remaining == 7


def test_every_kind_reads_openais_family_by_default() -> None:
    assert GENERIC.provider_limits(OPENAI) == openai_rate_headers(OPENAI)


def test_a_reading_ages_toward_its_resets_and_stops_at_zero() -> None:
    limits = ProviderLimits(requests_reset=1.0, tokens_reset=10.0, tokens_remaining=5)
    later = limits.aged(4.0)
    assert later.requests_reset == 0.0
    assert later.tokens_reset == 6.0
    assert later.tokens_remaining == 5


NAMES = [*OPENAI, "retry-after", "retry-after-ms", "x-should-retry"]


@given(st.dictionaries(st.sampled_from(NAMES), st.text(max_size=20)))
def test_no_header_value_raises_whatever_it_holds(headers: dict[str, str]) -> None:
    limits = openai_rate_headers(headers)
    if limits is not None:
        for value in (limits.requests_reset, limits.tokens_reset):
            assert value is None or value >= 0
    error = error_from_response(429, headers, b"")
    assert error.retry_after is None or error.retry_after >= 0
    assert error.should_retry in (True, False, None)
