"""The router on its own: homes, balance, models (properties: test_routing_properties)."""

from __future__ import annotations

from factories import make_request as make

from llmbatch import BatchPolicy, Limits, Priority
from llmbatch._scheduler.queues import Group, TierQueue
from llmbatch._scheduler.routing import AFFINITY_SLACK_SEQUENCES, Router
from llmbatch._scheduler.seats import Seats

NORMAL = Priority.NORMAL


def fleet(n: int) -> tuple[list[Seats], Router]:
    servers = [Seats(i, Limits(max_in_flight=100, reserved_realtime=0)) for i in range(n)]
    router = Router(servers)
    router.models_changed()
    return servers, router


def group_of(prefix: tuple[int, ...], model: str = "m") -> Group:
    tier = TierQueue(BatchPolicy())
    request = make(model=model)
    request.prefix = prefix
    return tier.enqueue(request, 0.0)


def test_a_prefix_goes_home_until_home_is_far_busier() -> None:
    servers, router = fleet(2)
    group = group_of((1, 2))
    router.remember(servers[1], tuple(group.items))
    assert router.route(NORMAL, group) == (servers[1], True)
    servers[1].book(NORMAL, AFFINITY_SLACK_SEQUENCES + 1, 0)
    target, affine = router.route(NORMAL, group)
    assert (target, affine) == (servers[0], False)


def test_a_home_does_not_move_when_a_batch_is_balanced_elsewhere() -> None:
    servers, router = fleet(2)
    group = group_of((7,))
    items = tuple(group.items)
    router.remember(servers[0], items)
    router.remember(servers[1], items)
    assert router.route(NORMAL, group)[0] is servers[0]
    servers[0].active = False  # its home is removed: the next batch finds a new one
    router.models_changed()
    router.remember(servers[1], items)
    assert router.route(NORMAL, group) == (servers[1], True)


def test_only_servers_that_serve_the_model_take_it() -> None:
    servers, router = fleet(3)
    servers[0].models = frozenset({"a"})
    servers[1].models = frozenset({"b"})
    servers[2].models = frozenset({"b"})
    router.models_changed()
    group = group_of((), model="a")
    for _ in range(10):
        assert router.route(NORMAL, group)[0] is servers[0]
    unknown = group_of((), model="c")  # no server lists it: anywhere (it says why)
    picked = {router.route(NORMAL, unknown)[0] for _ in range(20)}
    assert len(picked) > 1


def test_no_seat_anywhere_routes_nowhere() -> None:
    servers, router = fleet(2)
    for s in servers:
        s.book(NORMAL, 100, 0)
    group = group_of(())
    assert router.route(NORMAL, group) == (None, False)
