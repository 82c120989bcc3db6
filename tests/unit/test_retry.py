"""The retry rules (``_control.retry``) without a server or a clock: what each failure
means, and how long to wait before the next attempt (hypothesis: never past
``max_backoff``, never shorter than a ``Retry-After`` it may honour)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch import (
    AuthenticationError,
    BadRequestError,
    ConnectError,
    ConnectTimeout,
    NotFoundError,
    RateLimitError,
    ReadTimeout,
    RemoteProtocolError,
    RequestError,
    RetryPolicy,
    ServerError,
    ServiceUnavailableError,
)
from llmbatch._control.retry import Retries, is_backpressure, is_unavailable

QUEUE_FULL = ServiceUnavailableError("the engine's queue is full", status_code=503)
RESTARTING = ServiceUnavailableError("Service Unavailable", status_code=503)


@pytest.mark.parametrize(
    ("error", "retryable", "unavailable"),
    [
        pytest.param(BadRequestError("bad", status_code=400), False, False, id="400"),
        pytest.param(AuthenticationError("key", status_code=401), False, False, id="401"),
        pytest.param(NotFoundError("no model", status_code=404), False, False, id="404"),
        pytest.param(RateLimitError("slow down", status_code=429), True, False, id="429"),
        pytest.param(ServerError("boom", status_code=500), True, False, id="500"),
        pytest.param(QUEUE_FULL, True, False, id="503-queue-full"),
        pytest.param(RESTARTING, True, True, id="503-down"),
        pytest.param(ConnectError("refused"), True, True, id="refused"),
        pytest.param(ConnectTimeout("slow connect"), True, True, id="connect-timeout"),
        pytest.param(RemoteProtocolError("dropped"), True, True, id="dropped"),
        pytest.param(ReadTimeout("no answer"), True, False, id="read-timeout"),
        pytest.param(RequestError("something else"), False, False, id="other"),
    ],
)
def test_what_each_failure_means(error: RequestError, retryable: bool, unavailable: bool) -> None:
    assert Retries(RetryPolicy()).retryable(error) is retryable
    assert is_unavailable(error) is unavailable


def test_a_read_timeout_is_retried_only_as_the_policy_says() -> None:
    # The server may still be working on it; a connect timeout reached no server.
    no = Retries(RetryPolicy(retry_on_timeout=False))
    assert not no.retryable(ReadTimeout("no answer"))
    assert no.retryable(ConnectTimeout("slow connect"))


def test_backpressure_is_a_full_queue_not_an_outage() -> None:
    assert is_backpressure(QUEUE_FULL)
    assert not is_backpressure(RESTARTING)


def test_a_call_may_ask_for_its_own_attempts() -> None:
    retries = Retries(RetryPolicy(attempts=5))
    assert retries.attempts(None) == 5
    assert retries.attempts(2) == 2  # max_retries=1


def test_the_backoff_doubles_under_a_ceiling_with_full_jitter() -> None:
    draws: list[tuple[float, float]] = []

    def top(low: float, high: float) -> float:
        draws.append((low, high))
        return high

    retries = Retries(RetryPolicy(initial_backoff=0.5, max_backoff=3.0), uniform=top)
    error = ServerError("boom", status_code=500)
    assert [retries.backoff(n, error) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    assert all(low == 0 for low, _ in draws)  # full jitter: anywhere from zero


def test_retry_after_is_honoured_up_to_the_ceiling() -> None:
    retries = Retries(RetryPolicy(initial_backoff=0.1, max_backoff=30.0), uniform=lambda a, b: a)
    asked = RateLimitError("slow down", status_code=429, retry_after=7.5)
    assert retries.backoff(1, asked) == 7.5
    greedy = RateLimitError("slow down", status_code=429, retry_after=600.0)
    assert retries.backoff(1, greedy) == 30.0


@given(
    attempt=st.integers(min_value=1, max_value=60),
    initial=st.floats(min_value=0.0, max_value=10.0),
    ceiling=st.floats(min_value=0.0, max_value=120.0),
    retry_after=st.none() | st.floats(min_value=0.0, max_value=1000.0),
    draw=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_backoff_is_never_past_the_ceiling_nor_short_of_what_it_honours(
    attempt: int, initial: float, ceiling: float, retry_after: float | None, draw: float
) -> None:
    retries = Retries(
        RetryPolicy(initial_backoff=initial, max_backoff=ceiling),
        uniform=lambda low, high: low + draw * (high - low),
    )
    error = RateLimitError("slow down", status_code=429, retry_after=retry_after)
    delay = retries.backoff(attempt, error)
    assert 0.0 <= delay <= ceiling
    if retry_after is not None:
        assert delay >= min(retry_after, ceiling)


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (ServerError("boom", status_code=500, should_retry=False), False),
        (RateLimitError("slow", status_code=429, should_retry=False), False),
        (AuthenticationError("who", status_code=401, should_retry=True), True),
        # A refused batch is bisected, not resent whole, whatever the server says.
        (BadRequestError("bad", status_code=400, should_retry=True), False),
        (NotFoundError("gone", status_code=404, should_retry=True), True),
    ],
)
def test_the_servers_x_should_retry_decides(error: RequestError, retried: bool) -> None:
    assert Retries(RetryPolicy()).retryable(error) is retried


@given(left=st.floats(min_value=0.001, max_value=120.0), draw=st.floats(0.0, 1.0))
def test_a_retry_after_a_cooldown_never_goes_early_and_spreads_a_little(
    left: float, draw: float
) -> None:
    retries = Retries(RetryPolicy(), uniform=lambda a, b: a + draw * (b - a))
    wait = retries.after_cooldown(left)
    assert left <= wait <= left * 1.1 + 1e-9
