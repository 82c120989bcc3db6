"""Routing among replicas under random workloads (hypothesis), on a fake clock.

The scheduler routes each batch to one replica. Whatever happens to the replicas
(limits cut, one unavailable or allowed a single trial batch, one removed, batches
that failed over and came back), these hold after every step:

- no replica has more in flight than its ceiling, nor more bulk work than its bulk
  limit allowed when the batch was sent;
- a batch goes only to an active replica that takes batches and serves its model
  (when some replica lists the model);
- a replica allowed one trial batch gets at most one;
- every request is answered exactly once in the end, whatever it went through.
"""

from __future__ import annotations

import random
from collections import Counter

from factories import make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmbatch import BatchPolicy, Limits, Priority
from llmbatch._calls.request import Request
from llmbatch._scheduler import Scheduler

TIERS = (Priority.REALTIME, Priority.NORMAL, Priority.BATCH)
MODELS = ("m1", "m2")
PREFIXES = ((1, 2, 3), (1, 2, 4), (7,), ())

models_st = st.one_of(st.none(), st.sets(st.sampled_from(MODELS), min_size=1).map(frozenset))
op_st = st.one_of(
    st.tuples(
        st.just("add"),
        st.tuples(st.sampled_from(TIERS), st.sampled_from(MODELS), st.sampled_from(PREFIXES)),
    ),
    st.tuples(st.just("poll"), st.floats(0.0, 0.3)),
    st.tuples(st.just("finish"), st.integers(0, 10)),
    st.tuples(st.just("fail_over"), st.integers(0, 10)),
    st.tuples(st.just("sendable"), st.tuples(st.integers(0, 3), st.sampled_from([None, 0, 1]))),
    st.tuples(st.just("limit"), st.tuples(st.integers(0, 3), st.integers(1, 8))),
    st.tuples(st.just("remove"), st.integers(1, 3)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ceiling=st.integers(1, 8),
    replica_models=st.lists(models_st, min_size=1, max_size=4),
    ops=st.lists(op_st, max_size=80),
    seed=st.integers(0, 2**16),
)
def test_routing_keeps_every_replica_within_its_limits_and_answers_everything_once(
    ceiling: int,
    replica_models: list[frozenset[str] | None],
    ops: list[tuple[str, object]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    limits = Limits(max_in_flight=ceiling, max_in_flight_tokens=100_000, reserved_realtime=0)
    policy = BatchPolicy(max_batch_size=3, max_wait=0.1)
    s = Scheduler(policies=dict.fromkeys(TIERS, policy), limits=limits)
    s.set_models(0, replica_models[0])
    for models in replica_models[1:]:
        s.add_replica(models)
    added: list[Request] = []
    in_flight: list[Request] = []
    answered: Counter[int] = Counter()
    now = 0.0

    def poll(flush: bool = False) -> None:
        caps = [(r.bulk_cap, r.sendable) for r in s.seats]
        result = s.poll(now, flush=flush)
        trials: Counter[int] = Counter()
        for batch in result.batches:
            replica = s.seats[batch.replica]
            _cap, sendable = caps[batch.replica]
            assert replica.active, "a batch went to a removed replica"
            assert sendable != 0, "a batch went to an unavailable replica"
            model = batch.requests[0].spec.model
            if _servable(s, model):
                assert replica.models is None or model in replica.models, "model not served"
            if sendable == 1:
                trials[batch.replica] += 1
                assert trials[batch.replica] == 1, "more than one trial batch"
            for request in batch.requests:
                assert request.replica == batch.replica
            in_flight.extend(batch.requests)
        for replica in s.seats:
            assert replica.in_flight <= replica.ceiling, "over the ceiling"
            assert replica.in_flight == sum(r.replica == replica.index for r in in_flight)
        for batch in result.batches:
            replica = s.seats[batch.replica]
            if batch.priority is not Priority.REALTIME:
                assert replica.bulk_in_flight <= caps[batch.replica][0], "over the bulk limit"

    for op, arg in ops:
        if op == "add":
            tier, model, prefix = arg  # type: ignore[misc]
            request = make_request(tier, at=now, model=model, max_tokens=4)
            request.prefix = prefix
            s.add(request)
            added.append(request)
        elif op == "poll":
            now += arg  # type: ignore[operator]
            poll()
        elif op in ("finish", "fail_over") and in_flight:
            request = in_flight.pop(int(arg) % len(in_flight))  # type: ignore[call-overload]
            if op == "finish":
                s.finish(request)
                answered[id(request)] += 1
            else:
                s.requeue([request])  # its replica failed: it goes again, anywhere
        elif op == "sendable":
            index, value = arg  # type: ignore[misc]
            if index < len(s.seats):
                s.seats[index].sendable = value
        elif op == "limit":
            index, value = arg  # type: ignore[misc]
            if index < len(s.seats):
                s.set_bulk_limit(value, index)
        elif op == "remove":
            index = int(arg)  # type: ignore[call-overload]
            if index < len(s.seats) and sum(r.active for r in s.seats) > 1:
                s.remove_replica(index)

    # Drain: every replica back, everything sent and answered.
    for replica in s.seats:
        replica.sendable = None
    for _ in range(10 * len(added) + 10):
        if not s.has_queued and not in_flight:
            break
        now += 0.2
        poll(flush=True)
        rng.shuffle(in_flight)
        while in_flight:
            request = in_flight.pop()
            s.finish(request)
            answered[id(request)] += 1
    for request in added:
        assert answered[id(request)] == 1, "a request was not answered exactly once"


def _servable(s: Scheduler, model: str) -> bool:
    """Some active replica serves ``model``, or may (it has not said what it serves)."""
    return any(r.active and (r.models is None or model in r.models) for r in s.seats)


def test_affinity_sends_a_prefix_back_where_it_went_unless_that_replica_is_far_busier() -> None:
    limits = Limits(max_in_flight=200, max_in_flight_tokens=10**6, reserved_realtime=0)
    policy = BatchPolicy(max_batch_size=1, max_wait=0.0)
    s = Scheduler(policies=dict.fromkeys(TIERS, policy), limits=limits)
    for _ in range(3):
        s.add_replica(None)

    def send(prefix: tuple[int, ...]) -> int:
        request = make_request(Priority.NORMAL, prompt="x")
        request.prefix = prefix
        s.add(request)
        (batch,) = s.poll(0.0).batches
        return batch.replica

    first = send((10, 11))
    # The same prefix, and a longer one sharing it, go where it went.
    assert {send((10, 11)) for _ in range(5)} == {first}
    assert send((10, 11, 12)) == first
    # Busier than the least busy by more than 32 sequences and 1.5x: load wins.
    assert s.seats[first].in_flight == 7
    for _ in range(20):
        send((99, 100 + _))  # unrelated prefixes spread by power of two choices
    busy = s.seats[first]
    least = min(r.in_flight for r in s.seats)
    while busy.in_flight - least <= 32 or busy.in_flight <= 1.5 * least:
        request = make_request(Priority.NORMAL, prompt="x")
        request.prefix = (10, 11)
        s.add(request)
        s.poll(0.0)
        least = min(r.in_flight for r in s.seats)
    assert send((10, 11)) != first
