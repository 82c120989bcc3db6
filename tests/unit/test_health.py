"""The fleet's health policy on explicit time: which servers take work, ejection of
a slow one, failover, the outage error."""

from __future__ import annotations

import pytest
from factories import make_request

from llmbatch import Limits, Replica, RetryPolicy
from llmbatch._calls.request import Request
from llmbatch._exceptions import ConnectError
from llmbatch._runtime.health import SLOW_FACTOR, Health
from llmbatch._scheduler import Scheduler
from llmbatch._servers.server import Server
from llmbatch.transports import MockResponse, MockTransport

LIMITS = Limits(max_in_flight=16, reserved_realtime=2)


async def _back(server: Server) -> None:
    pass


def fleet(n: int, now: list[float]) -> tuple[Health, list[Server]]:
    scheduler = Scheduler(limits=LIMITS)
    health = Health(scheduler, lambda: now[0], on_back=_back)
    servers: list[Server] = []
    transport = MockTransport(lambda request: MockResponse(status=200))
    for i in range(n):
        server = Server(
            Replica(f"http://s{i}:8000/v1"),
            headers={},
            transport=transport,
            seats=scheduler.seats[0] if i == 0 else scheduler.add_replica(),
            limits=LIMITS,
            retry=RetryPolicy(outage_tolerance=10.0),
            slo=None,
        )
        # The health policy's own questions need no dispatcher to send with.
        health.join(server, None)  # type: ignore[arg-type]
        servers.append(server)
    return health, servers


def fail(server: Server, now: float, times: int = 5) -> None:
    for k in range(times):
        # One of several: worth waiting for.
        server.on_unavailable(now + k * 0.01, ConnectError("refused"), patient=True)


def test_a_server_takes_work_as_its_breaker_allows() -> None:
    now = [0.0]
    health, (a, b) = fleet(2, now)
    health.sync(0.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert a.seats.sendable is None  # closed: freely
    fail(a, 0.0)
    assert a.breaker.state.value == "open"
    assert health.can_fail_over(a)  # b is up
    assert not health.can_fail_over(b)  # a is not


def test_all_over_tolerance_only_when_every_live_server_is() -> None:
    now = [0.0]
    health, (a, b) = fleet(2, now)
    fail(a, 0.0)
    assert not health.all_over_tolerance()  # b is up
    fail(b, 0.0)
    now[0] = 5.0
    assert not health.all_over_tolerance()  # down, within the tolerance
    now[0] = 11.0
    assert health.all_over_tolerance()
    error = health.outage_error(_request())
    assert "every server (2;" in str(error)
    assert "outage tolerance of 10s" in str(error)


def test_a_removed_server_does_not_count_either_way() -> None:
    now = [0.0]
    health, (a, b) = fleet(2, now)
    assert b.seats is not None
    b.seats.active = False  # removed, breaker closed: it serves nobody
    fail(a, 0.0)
    now[0] = 11.0
    assert health.all_over_tolerance()
    assert health.live() == [a]


def test_a_server_far_slower_than_its_peers_is_ejected() -> None:
    now = [0.0]
    health, servers = fleet(3, now)
    for server, step in zip(servers, (0.01, 0.011, 0.01 * SLOW_FACTOR * 1.5), strict=True):
        server.controller.on_step_time(step)
    health.control(1.0, health.live(), frozenset())
    assert [s.ejected for s in servers] == [False, False, True]
    assert servers[2].breaker.state.value == "open"


def _request() -> Request:
    return make_request()


def test_a_server_cooling_down_after_a_429_takes_nothing_until_it_ends() -> None:
    now = [0.0]
    health, (a, b) = fleet(2, now)
    a.on_response(429, {"retry-after": "3"}, 1.0)
    assert a.cooldown_until == 4.0
    health.sync(2.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert a.seats.sendable == 0
    assert b.seats.sendable is None  # the other server is not held
    assert health.next_probe(health.live(), None) == 4.0  # the loop wakes when it ends
    assert a.stats(2.0).cooldown == 2.0
    health.sync(4.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert a.seats.sendable is None
    assert health.next_probe(health.live(), None) is None
    assert a.stats(4.0).cooldown is None


def test_a_cooldown_is_capped_by_the_retry_policys_max_backoff() -> None:
    now = [0.0]
    _, (a,) = fleet(1, now)
    a.on_response(429, {"retry-after": "3600"}, 0.0)
    assert a.cooldown_until == RetryPolicy().max_backoff
    a.on_response(429, {}, 0.0)  # no wait asked: nothing changes
    a.on_response(503, {"retry-after": "9999"}, 0.0)  # a 503's wait is its batch's own
    assert a.cooldown_until == RetryPolicy().max_backoff


def test_the_lowest_limits_the_servers_state_pace_the_client() -> None:
    now = [0.0]
    health, (a, b) = fleet(2, now)
    openai = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "90000",
        "x-ratelimit-remaining-tokens": "89000",
        "x-ratelimit-reset-tokens": "6m0s",  # a window longer than a minute: not learnt
    }
    a.on_response(200, openai, 0.0, sent_at=0.0)
    b.on_response(200, {**openai, "x-ratelimit-limit-requests": "300"}, 0.0, sent_at=0.0)
    assert a.learnt_rate == (600, None)
    health.sync(0.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    scheduler = health._scheduler
    assert scheduler.rate_learnt == (300, None)
    assert scheduler.rate is not None
    assert scheduler.rate.requests is not None
    assert scheduler.rate.requests.rate == pytest.approx(300 * 0.95 / 60)
    assert scheduler.rate.tokens is None


def test_a_429_slows_a_learnt_budget_down_once_and_quiet_speeds_it_up() -> None:
    now = [0.0]
    health, (a,) = fleet(1, now)
    limits = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
    }
    a.on_response(200, limits, 0.0, sent_at=0.0)
    health.sync(0.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    rate = health._scheduler.rate
    assert rate is not None
    assert rate.speed == 1.0
    a.on_response(429, limits, 0.1, sent_at=0.0)
    health.sync(0.1, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    health.sync(0.2, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert rate.speed == pytest.approx(0.75)  # once: no new 429 at the second look
    for k in range(1, 40):
        health.sync(0.2 + k, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert rate.speed == 1.0


def test_what_an_answer_says_is_left_caps_what_the_client_holds() -> None:
    # Another process spends the same key: the provider's per-second bucket holds 6
    # of its 10 requests and 200 of its 1,500 tokens; the client's learnt buckets,
    # full by their own count, hold no more than their share of that.
    now = [0.0]
    health, (a,) = fleet(1, now)
    full = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "600",
        "x-ratelimit-reset-requests": "0ms",
        "x-ratelimit-limit-tokens": "90000",
        "x-ratelimit-remaining-tokens": "90000",
        "x-ratelimit-reset-tokens": "0ms",
    }
    a.on_response(200, full, 0.0, sent_at=0.0)
    health.sync(0.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    rate = health._scheduler.rate
    assert rate is not None
    requests, tokens = rate.buckets
    assert requests is not None
    assert tokens is not None
    assert (requests.level, tokens.level) == (pytest.approx(9.5), pytest.approx(1425))
    spent = {
        **full,
        "x-ratelimit-remaining-requests": "360",  # 6 a second
        "x-ratelimit-remaining-tokens": "12000",  # 200 a second
        "x-ratelimit-reset-requests": "400ms",
        "x-ratelimit-reset-tokens": "870ms",
    }
    a.on_response(200, spent, 0.0, sent_at=0.0)
    health.sync(0.0, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert (requests.level, tokens.level) == (pytest.approx(5.7), pytest.approx(190))
    # Read once: the next turn, with no new answer, refills by time as before.
    health.sync(0.1, health.live(), tg=None, wake=lambda: None)  # type: ignore[arg-type]
    assert requests.wait_time(0.1, 1) == 0.0
    assert tokens.level == pytest.approx(190)


def test_metrics_are_read_after_work_that_came_and_went_between_two_looks() -> None:
    # Short requests one at a time (bulk held to one sequence on a fast server) are
    # mostly between two sends whenever the watcher looks: what was sent since its
    # last look counts as work, or the idle step times are never read.
    pytest.importorskip("trio")
    import trio
    import trio.testing

    from llmbatch._config import Priority
    from llmbatch._runtime.health import METRICS_INTERVAL

    now = [0.0]
    health, (server,) = fleet(1, now)
    reads: list[float] = []

    async def read_metrics(at: float) -> None:
        reads.append(trio.current_time())

    server.read_metrics = read_metrics  # type: ignore[method-assign]
    seats = server.seats

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(health.watch_metrics, server, lambda: None)
            await trio.sleep(2.2 * METRICS_INTERVAL)  # idle: nothing to read
            assert reads == []
            # One sequence out and back, between two looks.
            seats.book(Priority.BATCH, 1, 10)
            seats.book(Priority.BATCH, -1, -10)
            await trio.sleep(METRICS_INTERVAL)
            assert len(reads) == 1
            await trio.sleep(2 * METRICS_INTERVAL)  # idle again
            assert len(reads) == 1
            seats.book(Priority.REALTIME, 1, 10)  # there now
            await trio.sleep(2 * METRICS_INTERVAL)
            assert len(reads) == 3
            nursery.cancel_scope.cancel()

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_hosted_endpoint_gets_a_few_bulk_sequences_until_it_answers() -> None:
    # A hosted endpoint's first answer says its rate limits: a first burst of the
    # whole bulk limit would meet them blind. Realtime is not held.
    from llmbatch._servers.server import FIRST_ANSWER_BULK

    now = [0.0]
    _, (hosted, vllm, bare) = fleet(3, now)
    await hosted.detect([{"id": "gpt-4o-mini", "owned_by": "system"}])  # OpenAI's
    await vllm.detect([{"id": "m", "owned_by": "vllm"}])
    await bare.detect([{"id": "m"}])  # says nothing of itself: not taken for hosted
    full = hosted.controller.limit
    assert full > FIRST_ANSWER_BULK
    limits = (hosted.bulk_limit, vllm.bulk_limit, bare.bulk_limit)
    assert limits == (FIRST_ANSWER_BULK, full, full)

    def control() -> bool:
        return hosted.control(0.0, blocked=True, realtime_in_flight=0, bulk_in_flight=0)

    assert control()  # the held limit is handed on
    hosted.on_response(200, {}, 0.1)  # a probe of what it is: not an answer to work
    assert hosted.bulk_limit == FIRST_ANSWER_BULK
    # A 404 for a route it lacks (LiteLLM's proxy and the chat batch route) says
    # nothing of its limits either.
    hosted.on_response(404, {}, 0.15, sent_at=0.1)
    assert hosted.bulk_limit == FIRST_ANSWER_BULK
    hosted.on_response(429, {"retry-after": "1"}, 0.2, sent_at=0.1)  # a limit's answer
    assert hosted.bulk_limit == full
    assert control()  # and the whole limit handed on at once


def test_prompts_a_batched_answer_still_holds_are_not_read_as_an_api_queue() -> None:
    # 16 sequences in flight in two batches of 8; the engine runs 6 and has finished
    # 10 it has not sent back (each batch waits for its last prompt): none of it
    # waits in the API process.
    from llmbatch._config import Priority
    from llmbatch._servers.load import Load, MetricsSample

    now = [0.0]
    _, (a,) = fleet(1, now)

    def read(running: int, finished: float) -> int | None:
        sample = MetricsSample(load=Load(waiting=0, running=running), finished=finished)
        unsent = a._finished_unsent(sample)
        return max(0, a.seats.in_flight - running - unsent)

    a.seats.book(Priority.BATCH, 16, 160)
    assert read(16, 100.0) == 0  # the first read: the count starts here
    assert read(6, 110.0) == 0  # 10 finished, none back: not queued anywhere
    a.seats.book(Priority.BATCH, -8, -80)  # the first batch's answer
    a.answered_sequences += 8
    assert read(6, 110.0) == 0  # 2 finished of the second batch wait for the rest
    a.seats.book(Priority.BATCH, 8, 80)  # a new batch, not yet in the engine
    assert read(6, 110.0) == 8
    # Another client's finished requests never make more unsent than is in flight.
    assert read(0, 10_000.0) == 0
    assert a._unsent == a.seats.in_flight
