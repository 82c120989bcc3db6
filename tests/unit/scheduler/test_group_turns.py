"""Groups of one tier share it by the tokens each has sent: none waits on another
that never empties."""

from __future__ import annotations

from factories import make_request as make
from hypothesis import example, given, settings
from hypothesis import strategies as st

from llmbatch import BatchPolicy, Limits, Priority
from llmbatch._scheduler import Scheduler

BULK = Priority.BATCH
READY = BatchPolicy(max_batch_size=4, max_wait=0.0, send_when_idle=True)


def scheduler(max_in_flight: int) -> Scheduler:
    return Scheduler(
        policies={p: READY for p in Priority},
        limits=Limits(max_in_flight=max_in_flight, reserved_realtime=0),
    )


def test_a_later_group_is_not_held_behind_one_that_keeps_refilling() -> None:
    """The issue's case: caller A's map refills its group without end; caller B's
    requests (other parameters, so another group) arrive later."""
    s = scheduler(max_in_flight=4)
    for i in range(8):
        s.add(make(BULK, prompt=f"a{i}", max_tokens=4))
    (first,) = s.poll(0.0).batches  # A's first batch fills every seat
    for i in range(3):
        s.add(make(BULK, prompt=f"b{i}", max_tokens=5))  # B arrives
    s.finish_batch(first.requests, BULK, 0)
    for i in range(4):
        s.add(make(BULK, prompt=f"a-more{i}", max_tokens=4))  # A refills
    second = s.poll(1.0).batches
    # B's turn first (all three of its requests); A takes the seat left.
    assert [len(b.requests) for b in second] == [3, 1]
    assert {r.spec.params["max_tokens"] for r in second[0].requests} == {5}


@settings(max_examples=150, deadline=None)
# Found by hypothesis (2026-11-27): group 2 emptied with each batch and, filling
# again, started level with the least-served group, so group 0 waited while it sent
# 35 tokens: emptying forgave its debt.
@example(groups=3, seats=5, steps=[(1, 6), (0, 5), (1, 1), (2, 4), (2, 3), (0, 0)])
@given(
    groups=st.integers(min_value=2, max_value=5),
    seats=st.integers(min_value=1, max_value=8),
    steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), min_size=5, max_size=60),
)
def test_a_group_with_work_waits_a_bounded_number_of_tokens(
    groups: int, seats: int, steps: list[tuple[int, int]]
) -> None:
    """Shares go by tokens, so a group of small requests may send more batches than
    one of large requests; but while a group has work, no other sends more than one
    batch of each of the two's tokens before it goes (the waiting group's lead, at
    most its own last batch, and the sender's batch that overtakes it)."""
    s = scheduler(max_in_flight=seats)
    batch = READY.max_batch_size
    # Each group's largest request so far: prompts grow by a digit as ``now`` does.
    sizes = [0] * groups
    in_flight = []
    owed: dict[tuple[int, int], int] = {}  # (waiting, sender) -> sender's tokens since
    queued = dict.fromkeys(range(groups), 0)
    now = 0.0
    for group, arrivals in steps:
        group %= groups
        for i in range(arrivals):
            request = make(BULK, prompt=f"{group}-{now}-{i}", max_tokens=group + 1)
            sizes[group] = max(sizes[group], request.est_tokens)
            s.add(request, nowait=False)
            queued[group] += 1
        for sent_batch in s.poll(now).batches:
            sent = sent_batch.requests[0].spec.params["max_tokens"] - 1
            queued[sent] -= len(sent_batch.requests)
            for key in [k for k in owed if k[0] == sent]:
                del owed[key]
            for other in range(groups):
                if other != sent and queued[other] > 0:
                    n = owed[(other, sent)] = owed.get((other, sent), 0) + sent_batch.tokens
                    assert n <= batch * (sizes[other] + sizes[sent]), (other, sent, owed)
            in_flight.append(sent_batch)
        if in_flight:  # the server answers the oldest batch
            done = in_flight.pop(0)
            s.finish_batch(done.requests, BULK, 0)
        now += 1.0
