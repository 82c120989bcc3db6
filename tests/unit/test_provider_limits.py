"""Rate-limit headers read into ProviderLimits (``_servers/limits/``): each
provider's family from recorded header sets, durations, timestamps and epoch
resets, absent and malformed values (ignored and counted), and the reading's age."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch import ProviderLimits
from llmbatch._servers.kinds import GENERIC
from llmbatch._servers.limits import read_limits
from llmbatch._servers.limits.values import parse_duration
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


#: The wall clock the answers below came at: 2026-11-27T12:00:00Z.
NOW = 1_795_780_800.0


def read(headers: dict[str, str]) -> ProviderLimits | None:
    return read_limits(headers, now=NOW)


def test_openais_family_is_read_whole() -> None:
    assert read(OPENAI) == ProviderLimits(
        family="openai",
        requests_limit=5000,
        requests_remaining=4999,
        requests_reset=0.012,
        tokens_limit=90000,
        tokens_remaining=89000,
        tokens_reset=360.0,
    )


ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-requests-reset": "2026-11-27T12:00:00.015Z",
    "anthropic-ratelimit-tokens-limit": "400000",
    "anthropic-ratelimit-tokens-remaining": "398000",
    "anthropic-ratelimit-tokens-reset": "2026-11-27T12:00:01Z",
    "anthropic-ratelimit-input-tokens-limit": "400000",
    "anthropic-ratelimit-input-tokens-remaining": "399000",
    "anthropic-ratelimit-input-tokens-reset": "2026-11-27T12:00:01Z",
    "anthropic-ratelimit-output-tokens-limit": "80000",
    "anthropic-ratelimit-output-tokens-remaining": "79000",
    "anthropic-ratelimit-output-tokens-reset": "2026-11-27T11:59:59Z",  # already past
    "retry-after": "1",
}
TOGETHER = {
    "x-ratelimit-limit": "100",
    "x-ratelimit-limit-dynamic": "60",
    "x-ratelimit-remaining": "58",
    "x-ratelimit-reset": "0.5",
    "x-tokenlimit-limit": "200000",
    "x-tokenlimit-remaining": "190000",
}
FIREWORKS = {
    "x-ratelimit-limit-tokens-prompt": "3600000",
    "x-ratelimit-limit-tokens-generated": "36000",
}


def test_anthropics_family_with_timestamps_and_tokens_apart() -> None:
    assert read(ANTHROPIC) == ProviderLimits(
        family="anthropic",
        window=60.0,
        requests_limit=4000,
        requests_remaining=3999,
        requests_reset=pytest.approx(0.015, abs=1e-6),
        tokens_limit=400000,
        tokens_remaining=398000,
        tokens_reset=1.0,
        input_tokens_limit=400000,
        input_tokens_remaining=399000,
        input_tokens_reset=1.0,
        output_tokens_limit=80000,
        output_tokens_remaining=79000,
        output_tokens_reset=0.0,
    )


def test_togethers_family_is_per_second_and_the_moving_limit_wins() -> None:
    assert read(TOGETHER) == ProviderLimits(
        family="together",
        window=1.0,
        requests_limit=60,
        requests_remaining=58,
        requests_reset=0.5,
        tokens_limit=200000,
        tokens_remaining=190000,
    )


def test_fireworks_states_prompt_and_generated_tokens_apart() -> None:
    limits = read(FIREWORKS)
    assert limits is not None
    assert (limits.family, limits.window) == ("fireworks", 60.0)
    assert (limits.input_tokens_limit, limits.output_tokens_limit) == (3600000, 36000)
    assert limits.tokens_limit is None  # no combined limit to learn


def test_a_proxy_sending_two_families_gives_each_field_once() -> None:
    limits = read({**OPENAI, **FIREWORKS})
    assert limits is not None
    assert limits.family == "openai+fireworks"
    assert (limits.requests_limit, limits.input_tokens_limit) == (5000, 3600000)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1795780830", 30.0),  # epoch seconds
        ("1795780830000", 30.0),  # epoch milliseconds
        ("Fri, 27 Nov 2026 12:00:30 GMT", 30.0),  # an HTTP date
        ("2026-11-27T12:00:30+00:00", 30.0),
        ("2026-11-27T12:00:30", 30.0),  # no zone: UTC
        ("2020-01-01T00:00:00Z", 0.0),  # past
        ("30", 30.0),
        ("30s", 30.0),
    ],
)
def test_a_reset_may_be_a_duration_seconds_an_epoch_or_a_time(value: str, seconds: float) -> None:
    limits = read({"x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": value})
    assert limits is not None
    assert limits.requests_reset == pytest.approx(seconds)
    assert limits.malformed == 0


def test_an_answer_without_the_family_says_nothing() -> None:
    assert read({"content-type": "application/json"}) is None
    # vLLM's own load header is not a rate limit.
    assert read({"endpoint-load-metrics": "TEXT named_metrics.x=1"}) is None


def test_a_malformed_value_is_none_counted_and_the_rest_still_read() -> None:
    limits = read(
        {
            "x-ratelimit-remaining-tokens": "lots",
            "x-ratelimit-remaining-requests": "7",
            "x-ratelimit-reset-requests": "soon",
            "x-ratelimit-limit-requests": "inf",
        }
    )
    assert limits is not None
    assert limits.tokens_remaining is None
    assert limits.requests_remaining == 7
    assert (limits.requests_reset, limits.requests_limit) == (None, None)
    assert limits.malformed == 3


def test_every_kind_reads_every_family_by_default() -> None:
    assert GENERIC.provider_limits(OPENAI) == read_limits(OPENAI)
    assert GENERIC.provider_limits(ANTHROPIC) is not None


def test_a_reading_ages_toward_its_resets_and_stops_at_zero() -> None:
    limits = ProviderLimits(requests_reset=1.0, tokens_reset=10.0, tokens_remaining=5)
    later = limits.aged(4.0)
    assert later.requests_reset == 0.0
    assert later.tokens_reset == 6.0
    assert later.tokens_remaining == 5


NAMES = [
    *OPENAI,
    *ANTHROPIC,
    *TOGETHER,
    *FIREWORKS,
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
]
VALUES = st.one_of(
    st.text(max_size=24),
    st.integers(-(10**15), 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.sampled_from(["1s", "6m0s", "12ms", "1e400", "-1", "nan", "2026-13-45T99:00:00Z"]),
)


@given(st.dictionaries(st.sampled_from(NAMES), VALUES))
def test_no_header_value_raises_whatever_it_holds(headers: dict[str, str]) -> None:
    limits = read(headers)
    if limits is not None:
        numbers = [getattr(limits, f.name) for f in fields(limits) if f.name not in ("family",)]
        assert all(v is None or v >= 0 for v in numbers)
        # Each unreadable value counted once, and no more than were there.
        assert limits.malformed <= len(headers)
    error = error_from_response(429, headers, b"")
    assert error.retry_after is None or error.retry_after >= 0
    assert error.should_retry in (True, False, None)


def test_what_is_learnt_a_minute_from_each_family() -> None:
    from llmbatch._servers.server import _per_minute

    # OpenAI's: per minute where the reset is within one; the 6-minute token reset
    # is not a per-minute limit.
    assert _per_minute(read(OPENAI)) == (5000, None)  # type: ignore[arg-type]
    assert _per_minute(read(ANTHROPIC)) == (4000, 400000)  # type: ignore[arg-type]
    # Together's per second, scaled to a minute.
    assert _per_minute(read(TOGETHER)) == (3600, 12_000_000)  # type: ignore[arg-type]
    # Fireworks' prompt and generated limits apart: no combined bucket to learn.
    assert _per_minute(read(FIREWORKS)) is None  # type: ignore[arg-type]
    # Groq's requests reset over a day: not spread over its minutes.
    groq = {
        "x-ratelimit-limit-requests": "14400",
        "x-ratelimit-remaining-requests": "14370",
        "x-ratelimit-reset-requests": "2m59.56s",
        "x-ratelimit-limit-tokens": "18000",
        "x-ratelimit-remaining-tokens": "17997",
        "x-ratelimit-reset-tokens": "7.66s",
    }
    assert _per_minute(read(groq)) == (None, 18000)  # type: ignore[arg-type]
