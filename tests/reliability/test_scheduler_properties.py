"""Scheduler invariants under random workloads (hypothesis), on explicit time.

Every request ends exactly once (dispatched or expired); no request is in two
batches; batches respect their policy and compatibility; in-flight limits and
realtime reservations are never exceeded; deadlines fire; queues drain.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch import BatchPolicy, Limits, Priority
from llmbatch._request import Request, validate
from llmbatch._scheduler import Scheduler

TIERS = list(Priority)
POLICY = BatchPolicy(max_batch_size=4, max_wait=0.5, max_batch_tokens=400)

request_st = st.tuples(
    st.sampled_from(TIERS),
    st.integers(1, 250),  # max_tokens
    st.sampled_from([None, 0.5]),  # temperature: two compatibility classes
    st.one_of(st.none(), st.floats(0.1, 3.0)),  # relative deadline
)
op_st = st.one_of(
    st.tuples(st.just("add"), request_st),
    st.tuples(st.just("tick"), st.floats(0.0, 0.6)),
    st.tuples(st.just("finish"), st.integers(0, 10)),
)


def _request(
    now: float, tier: Priority, max_tokens: int, temp: float | None, rel_deadline: float | None
) -> Request:
    spec = validate(
        kind="completion",
        priority=tier,
        model="m",
        prompt="hello there",
        params={"max_tokens": max_tokens, "temperature": temp},
        timeout=None,
        stream=False,
        max_model_len=None,
    )
    request = Request(
        spec, created_at=now, deadline=None if rel_deadline is None else now + rel_deadline
    )
    request.enqueued_at = now
    return request


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op_st, max_size=120))
def test_scheduler_invariants(ops: list[tuple[str, object]]) -> None:
    limits = Limits(max_in_flight=6, max_in_flight_tokens=600, reserved_realtime=2, max_queued=1000)
    s = Scheduler(policies=dict.fromkeys(TIERS, POLICY), limits=limits)
    now = 0.0
    submitted: list[Request] = []
    ended: dict[int, str] = {}
    in_flight: list[Request] = []

    def poll(flush: bool = False) -> None:
        result = s.poll(now, flush=flush)
        for request in result.expired:
            assert id(request) not in ended, "a request ended twice"
            assert request.deadline is not None
            assert request.deadline <= now
            ended[id(request)] = "expired"
        for batch in result.batches:
            assert 1 <= len(batch.requests) <= POLICY.max_batch_size
            assert len({r.spec.compat_key for r in batch.requests}) == 1
            assert all(r.priority is batch.priority for r in batch.requests)
            if len(batch.requests) > 1:
                assert batch.tokens <= POLICY.max_batch_tokens
            for request in batch.requests:
                assert id(request) not in ended, "a request was in two batches"
                ended[id(request)] = "dispatched"
                in_flight.append(request)
        assert s.in_flight == len(in_flight) <= limits.max_in_flight
        assert s.in_flight_tokens <= limits.max_in_flight_tokens
        bulk = sum(1 for r in in_flight if r.priority is not Priority.REALTIME)
        assert bulk <= limits.max_in_flight - limits.reserved_realtime

    for op, arg in ops:
        if op == "add":
            request = _request(now, *arg)  # type: ignore[misc]
            submitted.append(request)
            s.add(request)
        elif op == "tick":
            now += arg  # type: ignore[operator]
        else:
            for _ in range(min(int(arg), len(in_flight))):  # type: ignore[call-overload]
                s.finish(in_flight.pop(0))
        poll()
    # Drain: everything still queued leaves by dispatch or deadline.
    for _ in range(10_000):
        if s.idle and not in_flight:
            break
        while in_flight:
            s.finish(in_flight.pop())
        now += 0.5
        poll(flush=True)
    assert len(ended) == len(submitted), "a request never ended"
    for request in submitted:
        if request.deadline is not None and ended[id(request)] == "expired":
            assert request.deadline <= now
