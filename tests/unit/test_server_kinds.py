"""What kind of server answers, and how it takes a request's priority: the rules on
answers recorded from each server's documented shapes, then what a client sends to
each (counted at fake servers)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch._scheduler import Scheduler
from llmbatch._servers.kinds import (
    GENERIC,
    Dialect,
    PriorityField,
    ServerKind,
    dialect_of,
    kind_from_models,
    llamacpp,
    parse_version,
    sglang,
    vllm,
)
from llmbatch._servers.server import Server
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

# /v1/models entries as each server answers them (ids shortened).
VLLM_MODELS = [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]
SGLANG_MODELS = [{"id": "m", "object": "model", "owned_by": "sglang", "root": "m"}]
LLAMA_CPP_MODELS = [{"id": "m.gguf", "object": "model", "owned_by": "llamacpp", "meta": {}}]
OTHER_MODELS = [{"id": "m", "object": "model", "owned_by": "organization-owner"}]
# SGLang's GET /get_server_info: its server arguments (a few of many).
SGLANG_PRIORITY_ON = {
    "enable_priority_scheduling": True,
    "schedule_low_priority_values_first": False,
}
SGLANG_PRIORITY_OFF = {"enable_priority_scheduling": False}


def kind_of(models: list[dict[str, Any]]) -> ServerKind | None:
    dialect = kind_from_models(models)
    return None if dialect is None else dialect.kind


def test_the_model_list_says_what_the_server_is() -> None:
    assert kind_of(VLLM_MODELS) is ServerKind.VLLM
    assert kind_of(SGLANG_MODELS) is ServerKind.SGLANG
    assert kind_of(LLAMA_CPP_MODELS) is ServerKind.LLAMA_CPP
    assert kind_of(OTHER_MODELS) is None
    assert kind_of([{"id": "m"}]) is None
    for kind in ServerKind:
        assert dialect_of(kind).kind is kind


def test_each_kind_takes_priority_its_own_way_or_not_at_all() -> None:
    lower = vllm.DIALECT.priority_field({"version": "0.32.0"})
    assert lower == PriorityField(lower_first=True)
    assert [lower.value(rank) for rank in (0, 1, 2)] == [0, 1, 2]  # realtime lowest
    higher = sglang.DIALECT.priority_field(SGLANG_PRIORITY_ON)
    assert higher is not None
    assert [higher.value(rank) for rank in (0, 1, 2)] == [2, 1, 0]  # realtime highest
    low_first = {**SGLANG_PRIORITY_ON, "schedule_low_priority_values_first": True}
    assert sglang.DIALECT.priority_field(low_first) == PriorityField(lower_first=True)
    # Off, or not known: nothing is sent (a field read the wrong way round would put
    # bulk ahead of realtime).
    assert sglang.DIALECT.priority_field(SGLANG_PRIORITY_OFF) is None
    assert sglang.DIALECT.priority_field(None) is None
    assert llamacpp.DIALECT.priority_field({"total_slots": 4}) is None
    assert GENERIC.priority_field(None) is None


def test_llama_cpp_states_its_slots_and_no_other_kind_does() -> None:
    assert llamacpp.DIALECT.stated_seats({"total_slots": 16}) == 16
    for props in (None, {}, {"total_slots": 0}, {"total_slots": True}, {"total_slots": "4"}):
        assert llamacpp.DIALECT.stated_seats(props) is None
    assert vllm.DIALECT.stated_seats({"total_slots": 16}) is None


def test_versions_are_read_from_what_each_server_says() -> None:
    assert parse_version("0.12.0rc1") == (0, 12, 0)
    assert parse_version("v0.9+cpu") == (0, 9, 0)
    assert parse_version("dev") is None
    assert parse_version(None) is None
    assert vllm.DIALECT.version({"version": "0.11.2"}) == (0, 11, 2)
    assert vllm.DIALECT.version(None) is None
    assert sglang.DIALECT.version({"version": "0.5.3"}) == (0, 5, 3)


class KindOfServer(FakeServer):
    """A fake server that lists its models as ``models`` say and answers SGLang's
    server info; records the priority each completion request carried."""

    def __init__(self, models: list[dict[str, Any]], server_info: object = None) -> None:
        super().__init__()
        self.listed = models
        self.server_info = server_info
        self.priorities: list[object] = []
        self.gets: list[str] = []

    def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.method == "GET":
            self.gets.append(request.url.rsplit("/", 1)[-1])
        if request.url.endswith("/models"):
            return MockResponse(json={"object": "list", "data": self.listed})
        if request.url.endswith("/get_server_info"):
            if self.server_info is None:
                return MockResponse(status=404, json={"detail": "Not Found"})
            return MockResponse(json=self.server_info)
        if request.method == "POST":
            self.priorities.append(json.loads(request.body or b"{}").get("priority", "absent"))
        return super().__call__(request)


SERVERS = [
    pytest.param(VLLM_MODELS, None, "vllm", [0, 2], ["models", "version"], id="vllm"),
    pytest.param(
        SGLANG_MODELS,
        SGLANG_PRIORITY_ON,
        "sglang",
        [2, 0],
        ["models", "get_server_info"],
        id="sglang-priority-on",
    ),
    pytest.param(
        SGLANG_MODELS,
        SGLANG_PRIORITY_OFF,
        "sglang",
        ["absent"] * 2,
        ["models", "get_server_info"],
        id="sglang-priority-off",
    ),
    pytest.param(
        LLAMA_CPP_MODELS, None, "llama.cpp", ["absent"] * 2, ["models", "props"], id="llama.cpp"
    ),
    pytest.param(OTHER_MODELS, None, "openai-compatible", ["absent"] * 2, ["models"], id="other"),
]


@pytest.mark.parametrize(("models", "info", "kind", "sent", "asked"), SERVERS)
async def test_each_server_is_sent_the_priority_it_understands(
    models: list[dict[str, Any]], info: object, kind: str, sent: list[object], asked: list[str]
) -> None:
    server = KindOfServer(models, info)
    async with llmbatch.Client("http://127.0.0.1:1/v1", transport=MockTransport(server)) as c:
        await c.complete("urgent", priority="realtime")
        await c.complete("bulk", priority="batch")
        assert c.stats().servers[0].kind == kind
    assert server.priorities == sent
    assert server.gets[: len(asked)] == asked  # what its kind says about itself, once


async def test_priority_scheduling_true_sends_vllms_convention_to_an_unknown_server() -> None:
    server = KindOfServer(OTHER_MODELS)
    transport = MockTransport(server)
    async with llmbatch.Client(
        "http://127.0.0.1:1/v1", transport=transport, priority_scheduling=True
    ) as c:
        await c.complete("urgent", priority="realtime")
    assert server.priorities == [0]


def virtual_trio() -> Any:
    import trio.testing

    clock = trio.testing.MockClock(autojump_threshold=0)
    return pytest.param(("trio", {"clock": clock}), id="trio-virtual-time")


@pytest.mark.parametrize("anyio_backend", [virtual_trio()])
async def test_a_server_back_from_an_outage_is_asked_again_what_it_is() -> None:
    # SGLang restarted with priority scheduling switched on: after the outage the
    # client reads its server info again and sends the field from then on.
    import trio

    server = KindOfServer(SGLANG_MODELS, SGLANG_PRIORITY_OFF)
    down = False

    def answer(request: HTTPRequest) -> MockResponse:
        if down:
            return MockResponse(status=503, json={"error": {"message": "restarting"}})
        return server(request)

    retry = llmbatch.RetryPolicy(attempts=10, initial_backoff=0.01, outage_tolerance=60)
    async with llmbatch.Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(answer), retry=retry
    ) as c:
        await c.complete("before", priority="realtime")
        down = True
        server.server_info = SGLANG_PRIORITY_ON

        async def come_back() -> None:
            nonlocal down
            await trio.sleep(5)
            down = False

        async with trio.open_nursery() as nursery:
            nursery.start_soon(come_back)
            await c.complete("during", priority="realtime")  # waits out the outage
        await c.complete("after", priority="realtime")
        assert c.stats().servers[0].outages == 1
    assert server.priorities == ["absent", 2, 2]
    assert server.gets.count("get_server_info") == 2


@pytest.mark.parametrize(
    ("dialect", "priority_scheduling", "refill"),
    [
        pytest.param(vllm.DIALECT, None, 64, id="vllm"),
        pytest.param(vllm.DIALECT, False, 0, id="vllm-priority-off"),
        pytest.param(GENERIC, None, 0, id="other"),
        pytest.param(GENERIC, True, 64, id="other-priority-on"),
    ],
)
def test_a_refill_queue_only_where_the_server_puts_realtime_first(
    dialect: Dialect, priority_scheduling: bool | None, refill: int
) -> None:
    """Bulk may keep a batch queued beyond the seats (``AdmissionController.refill``)
    only where each tier goes with its priority: elsewhere realtime would wait
    behind that batch."""
    limits = llmbatch.Limits(max_in_flight=256)
    server = Server(
        llmbatch.Replica("http://127.0.0.1:1/v1"),
        headers={},
        transport=MockTransport(FakeServer()),
        seats=Scheduler(limits=limits).seats[0],
        limits=limits,
        retry=llmbatch.RetryPolicy(),
        slo=None,
        refill=64,
        priority_scheduling=priority_scheduling,
    )
    server.priority_field = dialect.priority_field({"version": "0.32.0"})
    server.control(0.0, blocked=True, realtime_in_flight=0, bulk_in_flight=0)
    assert server.controller.refill == refill
    if refill:  # the server refuses the field: no refill from then on
        server.on_priority_refused("Priority scheduling is not enabled.")
        server.control(1.0, blocked=True, realtime_in_flight=0, bulk_in_flight=0)
        assert server.controller.refill == 0


async def test_stats_show_the_refill_until_the_first_realtime_call() -> None:
    server = KindOfServer(VLLM_MODELS)
    async with llmbatch.Client("http://127.0.0.1:1/v1", transport=MockTransport(server)) as c:
        await c.map([f"bulk {i}" for i in range(8)])
        assert c.stats().servers[0].bulk_refill == 64  # the batch tier's max_batch_size
        await c.complete("urgent", priority="realtime")
        await c.map(["bulk again"])  # a control tick after it
        assert c.stats().servers[0].bulk_refill == 0


def test_a_server_reads_each_load_report_it_has_not_read_already(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone caller's answers repeat the same report: it is parsed when its text
    changes, and every answer's report still reaches the controller."""
    from llmbatch._servers import server as _server
    from llmbatch._servers.load import Load, parse_load_header

    parsed: list[str | None] = []

    def counting(value: str | None) -> Load | None:
        parsed.append(value)
        return parse_load_header(value)

    monkeypatch.setattr(_server, "parse_load_header", counting)
    server = _server.Server(
        llmbatch.Replica("http://127.0.0.1:8000/v1"),
        headers={},
        transport=MockTransport(lambda request: MockResponse(status=200)),
        seats=Scheduler(limits=llmbatch.Limits()).seats[0],
        limits=llmbatch.Limits(),
        retry=llmbatch.RetryPolicy(),
        slo=None,
    )
    seen: list[tuple[int | None, int | None]] = []
    controller = server.controller
    on_load = controller.on_load

    def noting(now: float, *, waiting: int | None, running: int | None, **kw: object) -> None:
        seen.append((waiting, running))
        on_load(now, waiting=waiting, running=running, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(controller, "on_load", noting)

    def report(waiting: int, running: int) -> dict[str, str]:
        named = {"num_requests_waiting": waiting, "num_requests_running": running}
        return {"endpoint-load-metrics": "JSON " + json.dumps({"named_metrics": named})}

    for now, headers in enumerate([report(0, 1), report(0, 1), report(2, 5), {}, report(2, 5)]):
        server.on_response(200, headers, float(now))
    assert seen == [(0, 1), (0, 1), (2, 5), (2, 5)]  # (no report: nothing to say)
    assert len(parsed) == 4  # the repeats read once each run: 1, 2, (none), 2 again
    assert (controller.waiting, controller.running) == (2, 5)
