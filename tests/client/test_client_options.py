"""openai-python's client options: ``Client(timeout=number, max_retries=,
default_headers=)``, per-call ``max_retries=``, and ``with_options(...)`` views that
share one engine. Through MockTransport, under asyncio and trio."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch import Client, DeadlineExceeded, Priority, RetryPolicy, ServerError
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

NO_WAIT = RetryPolicy(attempts=5, initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)


class Failing:
    """Answers every POST with a 500, counting them; /models as the fake server."""

    def __init__(self) -> None:
        self.fake = FakeServer()
        self.posts = 0

    def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.method == "POST":
            self.posts += 1
            return MockResponse(status=500, json={"error": {"message": "boom"}})
        return self.fake(request)


class Hanging:
    """Holds every POST until the test ends (a server that never answers)."""

    def __init__(self) -> None:
        self.fake = FakeServer()

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.method == "POST":
            await anyio.sleep_forever()
        return self.fake(request)


def make(handler: Any, **kw: Any) -> tuple[Client, MockTransport]:
    transport = MockTransport(handler)
    kw.setdefault("retry", NO_WAIT)
    return Client("http://127.0.0.1:1/v1", transport=transport, **kw), transport


async def test_max_retries_on_the_client_bounds_attempts() -> None:
    server = Failing()
    client, _ = make(server, max_retries=1)
    async with client:
        with pytest.raises(ServerError) as info:
            await client.complete("x")
    assert server.posts == 2
    assert info.value.attempts == 2


@pytest.mark.parametrize("retries", [0, 2])
async def test_max_retries_per_call_overrides_the_client(retries: int) -> None:
    server = Failing()
    client, _ = make(server)  # 5 attempts by default
    async with client:
        with pytest.raises(ServerError):
            await client.complete("x", max_retries=retries)
        assert server.posts == retries + 1
        server.posts = 0
        results = await client.map(["a", "b"], max_retries=0)
    assert server.posts == 1  # one batch, one attempt
    assert all(not r.ok for r in results)


async def test_calls_with_different_max_retries_do_not_share_a_batch() -> None:
    fake = FakeServer()
    client, _ = make(fake, batching={"normal": llmbatch.BatchPolicy(max_wait=0.05)})
    async with client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.complete("a", max_retries=0))
            tg.start_soon(lambda: client.complete("b", max_retries=3))
    assert len(fake.bodies) == 2


async def test_timeout_number_is_each_calls_deadline() -> None:
    client, _ = make(Hanging(), timeout=0.05)
    async with client:
        with pytest.raises(DeadlineExceeded):
            await client.complete("never answered")
        # a call's own timeout still wins
        with pytest.raises(DeadlineExceeded):
            await client.complete("never answered", timeout=0.01)
    assert client.with_options(timeout=None)._defaults is None  # a view can lift it


async def test_default_headers_go_with_every_request() -> None:
    fake = FakeServer()
    client, transport = make(fake, default_headers={"X-Team": "search"})
    async with client:
        await client.complete("a")
        await client.complete("b", extra_headers={"X-Team": "ads", "X-Call": "1"})
    first, *posts = transport.requests
    assert first.url.endswith("/models")
    assert first.headers["X-Team"] == "search"
    assert posts[0].headers["X-Team"] == "search"
    assert posts[1].headers["X-Team"] == "ads"
    assert posts[1].headers["X-Call"] == "1"


async def test_a_view_has_its_own_defaults_and_shares_the_engine() -> None:
    fake = FakeServer()
    client, transport = make(fake)
    urgent = client.with_options(priority="realtime", max_retries=0, default_headers={"X-V": "1"})
    async with client:
        assert urgent.model == "fake-model"  # learnt by the client after the view was made
        await urgent.complete("from the view")
        await client.complete("from the client")
        await urgent.chat([{"role": "user", "content": "hi"}])
        results = await urgent.map(["m1", "m2"])
        assert all(r.ok for r in results)
        stats = urgent.stats()  # one engine: the view sees the client's counts
    assert stats.tiers[Priority.REALTIME].done == 4
    assert stats.tiers[Priority.NORMAL].done == 1
    view_posts = [r for r in transport.requests if r.headers.get("X-V") == "1"]
    assert len(view_posts) == 3  # complete, chat, the map's batch
    assert "x-v" not in {k.lower() for k in transport.requests[2].headers}


async def test_a_call_argument_wins_over_the_view() -> None:
    fake = FakeServer(model="a")
    client, _ = make(fake)
    view = client.with_options(priority="batch", model="a")
    async with client:
        await view.complete("x", priority="realtime")
        stats = client.stats()
    assert stats.tiers[Priority.REALTIME].done == 1
    assert fake.bodies[0]["model"] == "a"


async def test_a_view_of_a_view_keeps_what_the_second_does_not_set() -> None:
    client, _ = make(FakeServer())
    view = client.with_options(priority="realtime", default_headers={"A": "1"})
    view2 = view.with_options(max_retries=2, default_headers={"B": "2"})
    defaults = view2._defaults
    assert defaults is not None
    assert defaults.get("priority") is Priority.REALTIME
    assert defaults.get("max_retries") == 2
    assert defaults.headers == {"A": "1", "B": "2"}
    assert client._defaults is None  # the client itself is untouched


async def test_a_view_has_no_lifetime_of_its_own() -> None:
    client, _ = make(FakeServer())
    view = client.with_options(priority="realtime")
    with pytest.raises(llmbatch.ClientClosedError, match="shares its client's lifetime"):
        async with view:
            pass
    async with client:
        assert (await view.complete("x")).text
    with pytest.raises(llmbatch.ClientClosedError):
        await view.complete("after the client closed")


def test_bad_options_raise_typed_errors_at_the_call_site() -> None:
    client, _ = make(FakeServer())
    with pytest.raises(llmbatch.InvalidRequestError, match="unknown priority"):
        client.with_options(priority="urgent")
    with pytest.raises(llmbatch.InvalidTypeError, match="max_retries"):
        client.with_options(max_retries="3")  # type: ignore[arg-type]
    with pytest.raises(llmbatch.InvalidRequestError, match="max_retries must be >= 0"):
        client.with_options(max_retries=-1)
    with pytest.raises(llmbatch.InvalidRequestError, match="timeout must be a positive"):
        client.with_options(timeout=0)
    with pytest.raises(llmbatch.InvalidRequestError, match="line break"):
        client.with_options(default_headers={"X": "a\r\nB: c"})
    with pytest.raises(TypeError):
        client.with_options(temperature=0.5)  # type: ignore[call-arg]


def test_bad_client_options_raise_config_errors() -> None:
    with pytest.raises(llmbatch.ConfigTypeError, match="timeout"):
        Client(timeout="30")  # type: ignore[arg-type]
    with pytest.raises(llmbatch.ConfigError, match="timeout must be a positive"):
        Client(timeout=-1)
    with pytest.raises(llmbatch.ConfigTypeError, match="max_retries"):
        Client(max_retries=1.5)  # type: ignore[arg-type]
    with pytest.raises(llmbatch.ConfigError, match="max_retries must be >= 0"):
        Client(max_retries=-1)
    with pytest.raises(llmbatch.ConfigTypeError, match="default_headers"):
        Client(default_headers={"X": 1})  # type: ignore[dict-item]


def test_header_values_stay_out_of_the_repr() -> None:
    client, _ = make(FakeServer())
    view = client.with_options(default_headers={"Authorization": "Bearer sk-secret"})
    assert "sk-secret" not in repr(view)
    assert "Authorization" in repr(view)
