"""The simulator as a hosted provider's rate limiter (``sim/limiter.py``): per-second
buckets of a minute's limits, the 429 and its wait, each family's headers; then a real
simulator answering with them."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch_server.sim.limiter import RateLimiter, Refused
from llmbatch_server.testing import run_simulator


def limiter(
    rpm: int | None = 600, tpm: int | None = None, family: str = "openai"
) -> tuple[RateLimiter, list[float]]:
    now = [0.0]
    return (
        RateLimiter(
            requests_per_minute=rpm,
            tokens_per_minute=tpm,
            family=family,  # type: ignore[arg-type]
            clock=lambda: now[0],
        ),
        now,
    )


def test_a_minutes_requests_go_a_seconds_worth_at_a_time() -> None:
    limit, now = limiter(rpm=600)  # 10 a second
    assert all(limit.take(1) is None for _ in range(10))
    refused = limit.take(1)
    assert refused == Refused("requests", pytest.approx(0.1))
    now[0] = 0.1
    assert limit.take(1) is None
    assert limit.refused == 1


def test_tokens_count_and_a_large_request_overdraws_once_the_bucket_is_full() -> None:
    limit, now = limiter(rpm=None, tpm=6000)  # 100 tokens a second
    assert limit.take(60) is None
    refused = limit.take(60)
    assert refused is not None
    assert refused.limit == "tokens"
    assert refused.wait == pytest.approx(0.2)
    now[0] = 0.6  # full again
    assert limit.take(250) is None  # more than a second's worth: goes when full
    later = limit.take(1)
    assert later is not None
    assert later.wait == pytest.approx(1.51)  # the overdraft (150) and one more


@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 50)), max_size=200))
def test_no_second_admits_more_than_a_seconds_worth_plus_one_request(
    steps: list[tuple[float, int]],
) -> None:
    limit, now = limiter(rpm=None, tpm=6000)
    admitted: list[tuple[float, int]] = []
    for gap, tokens in steps:
        now[0] += gap
        if limit.take(tokens) is None:
            admitted.append((now[0], tokens))
    for start, _ in admitted:
        window = sum(t for at, t in admitted if start <= at < start + 1.0)
        assert window <= 2 * 100 + 50  # a full bucket, a second's refill, one overdraft


def test_openais_headers() -> None:
    limit, _ = limiter(rpm=600, tpm=6000)
    limit.take(30)
    headers = limit.headers()
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert headers["x-ratelimit-remaining-requests"] == "540"  # 9 of 10 a second, a minute's
    assert headers["x-ratelimit-remaining-tokens"] == "4200"
    assert headers["x-ratelimit-reset-tokens"] == "300ms"
    refused = limit.take(500)
    assert refused is not None
    on_429 = limit.headers(refused)
    assert on_429["retry-after-ms"] == str(int(refused.wait * 1000 + 0.999))
    assert on_429["retry-after"] == "1"


def test_anthropics_headers() -> None:
    limit, _ = limiter(rpm=600, family="anthropic")
    limit.take(1)
    headers = limit.headers()
    assert headers["anthropic-ratelimit-requests-limit"] == "600"
    assert headers["anthropic-ratelimit-requests-remaining"] == "540"
    datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"])
    assert limit.headers(Refused("requests", 0.2))["retry-after"] == "1"  # whole seconds


def test_togethers_headers_are_per_second() -> None:
    limit, _ = limiter(rpm=600, tpm=60_000, family="together")
    limit.take(100)
    headers = limit.headers()
    assert headers["x-ratelimit-limit"] == "10"
    assert headers["x-ratelimit-remaining"] == "9"
    assert headers["x-tokenlimit-limit"] == "1000"
    assert headers["x-tokenlimit-remaining"] == "900"
    assert float(headers["x-ratelimit-reset"]) == pytest.approx(0.1)
    assert limit.headers(Refused("tokens", 0.2))["retry-after"] == "1"


@pytest.mark.parametrize("family", ["openai", "anthropic", "together"])
def test_the_client_learns_the_limits_each_family_states(family: str) -> None:
    # The simulator's headers read back by llmbatch: the minute's limits it was given.
    from llmbatch._servers.limits import read_limits
    from llmbatch._servers.server import _per_minute

    limit, now = limiter(rpm=6_000, tpm=90_000, family=family)
    limit.take(500)
    now[0] += 0.5  # a reset within the second
    limits = read_limits(limit.headers())
    assert limits is not None
    assert limits.family == family
    assert limits.malformed == 0
    assert _per_minute(limits) == (6_000, 90_000)


@pytest.mark.parametrize(("rpm", "tpm"), [(None, None), (0, None), (None, -1)])
def test_a_limiter_needs_a_limit(rpm: int | None, tpm: int | None) -> None:
    with pytest.raises(ValueError, match="a minute"):
        limiter(rpm=rpm, tpm=tpm)


def test_a_simulator_playing_a_provider_answers_with_its_headers_and_429s() -> None:
    with run_simulator("--speed", "100", "--rate-limit-rpm", "120") as sim:  # 2 a second
        body = {"model": "llmbatch-sim", "prompt": "hi", "max_tokens": 2}
        with httpx.Client(base_url=sim.base_url, timeout=10) as http:
            answers = [http.post("/completions", json=body) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "120"
    assert int(answers[2].headers["retry-after-ms"]) > 0
    assert "Rate limit reached for requests" in answers[2].json()["error"]["message"]


def test_limits_stated_without_a_reset_are_a_minutes() -> None:
    """LiteLLM's proxy states its deployments' rpm and tpm in OpenAI's headers with
    no reset; a reset longer than a minute (Groq's requests a day) is still not
    learnt."""
    from llmbatch._servers.limits import read_limits
    from llmbatch._servers.server import _per_minute

    litellm = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "29986",
    }
    limits = read_limits(litellm)
    assert limits is not None
    assert _per_minute(limits) == (600, 30_000)
    daily = read_limits({**litellm, "x-ratelimit-reset-requests": "2h0m0s"})
    assert daily is not None
    assert _per_minute(daily) == (None, 30_000)
