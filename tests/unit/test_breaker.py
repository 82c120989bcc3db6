"""The circuit breaker on explicit time: when it opens, probes, trials and closes."""

from __future__ import annotations

import pytest

from llmbatch._control.breaker import Breaker, BreakerState


def test_consecutive_failures_open_the_breaker_and_a_success_resets_the_count() -> None:
    breaker = Breaker(failure_threshold=3, probe_interval=1.0)
    breaker.on_success()
    assert not breaker.on_failure(0.0, "refused")
    assert not breaker.on_failure(0.1, "refused")
    breaker.on_success()
    assert not breaker.on_failure(0.2, "refused")
    assert not breaker.on_failure(0.3, "refused")
    assert breaker.on_failure(0.4, "refused")
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allows()


def test_answers_to_requests_sent_before_a_failure_do_not_reset_the_count() -> None:
    # A 503 storm on a busy server: batches sent before it keep finishing with 200
    # while every new request gets a 503. Only an answer to a request sent after the
    # latest failure shows the server is back.
    breaker = Breaker(failure_threshold=3, probe_interval=1.0)
    breaker.on_success(sent_at=0.0)
    assert not breaker.on_failure(1.0, "503")
    breaker.on_success(sent_at=0.5)  # sent before the failure: says nothing since
    assert not breaker.on_failure(1.1, "503")
    breaker.on_success(sent_at=0.9)
    assert breaker.on_failure(1.2, "503")  # the third in a row opens it
    assert breaker.state is BreakerState.OPEN
    breaker.on_success(sent_at=1.0)  # an old batch's answer does not close it either
    assert breaker.state is BreakerState.OPEN
    breaker.on_probe(2.2, healthy=True)
    breaker.trial_sent()
    breaker.on_success(sent_at=2.2)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.failures == 0
    assert not breaker.on_failure(3.0, "503")
    breaker.on_success(sent_at=3.5)  # sent after it: the count starts over
    assert not breaker.on_failure(4.0, "503")
    assert not breaker.on_failure(4.1, "503")


def test_an_open_breaker_probes_then_sends_one_trial_batch_then_closes() -> None:
    breaker = Breaker(failure_threshold=1, probe_interval=1.0)
    breaker.on_success()
    breaker.on_failure(10.0, "503")
    assert breaker.next_probe() == 11.0
    assert not breaker.probe_due(10.5)
    assert breaker.probe_due(11.0)
    breaker.on_probe(11.0, healthy=False)
    assert breaker.next_probe() == 12.0
    breaker.on_probe(12.0, healthy=True)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allows()
    breaker.trial_sent()
    assert not breaker.allows()  # exactly one trial
    breaker.on_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allows()


def test_a_failed_trial_reopens_without_restarting_the_outage_clock() -> None:
    breaker = Breaker(failure_threshold=1, probe_interval=1.0, outage_tolerance=5.0)
    breaker.on_success()
    breaker.on_failure(0.0, "refused")
    breaker.on_probe(1.0, healthy=True)
    breaker.trial_sent()
    breaker.on_failure(1.5, "503")
    assert breaker.state is BreakerState.OPEN
    assert breaker.opened_at == 0.0
    assert not breaker.outage_over_tolerance(5.0)
    assert breaker.outage_over_tolerance(5.1)
    assert breaker.opened == 1


@pytest.mark.parametrize("threshold", [1, 3])
def test_the_outage_clock_starts_when_the_breaker_opens(threshold: int) -> None:
    breaker = Breaker(failure_threshold=threshold, outage_tolerance=120.0)
    breaker.on_success()
    for i in range(threshold):
        breaker.on_failure(float(i), "refused")
    assert breaker.outage_seconds(100.0) == pytest.approx(100.0 - (threshold - 1))
