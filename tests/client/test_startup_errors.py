"""Opening a client fails with a typed error that says what to do when no request
could succeed: a base URL without its ``/v1``, a missing or refused API key, a model
the server does not serve. A server that is down at open fails it only without a
``model``; with one, the client opens and requests retry until the server is up.

Against a real simulator and against MockTransport (for exact request counts and
for answers the simulator never gives: 403, a key echoed back, a long model list).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio

MODEL = "sim-model"
KEY = "sk-startup-secret-4242"
ONE_TRY = llmbatch.RetryPolicy(attempts=1)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def keyed_sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--model", MODEL, api_key=KEY) as server:
        yield server


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback URL whose connections are refused: a port bound but not listening
    (kept bound, so no other process can take it during the test)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


# -- a base URL without /v1 ------------------------------------------------------------


@pytest.mark.parametrize("model", [None, MODEL])
async def test_a_base_url_without_v1_suggests_it(sim: SimulatorProcess, model: str | None) -> None:
    with pytest.raises(llmbatch.ServerInfoError) as info:
        async with llmbatch.Client(sim.url, model=model):
            pass
    assert type(info.value) is llmbatch.ServerInfoError
    assert str(info.value) == (
        f"{sim.url}/models answered 404, but {sim.url}/v1/models lists models: "
        f"did you mean {sim.url}/v1?"
    )


def _lists_models_only_at(url: str | None) -> MockTransport:
    """A server answering 404 everywhere but ``url``, where it lists its model."""
    fake = FakeServer()

    def handler(request: HTTPRequest) -> MockResponse:
        if request.url == url:
            return fake(request)
        return MockResponse(status=404, json={"detail": "Not Found"})

    return MockTransport(handler)


async def test_the_v1_variant_is_probed_once_and_only_after_a_404() -> None:
    transport = _lists_models_only_at("http://h:1/v1/models")
    with pytest.raises(llmbatch.ServerInfoError, match="did you mean http://h:1/v1"):
        async with llmbatch.Client("http://h:1", transport=transport):
            pass
    assert [r.url for r in transport.requests] == ["http://h:1/models", "http://h:1/v1/models"]
    # A right URL costs one request; a base URL ending in /v1 is not probed again.
    right = MockTransport(FakeServer())
    async with llmbatch.Client("http://h:1/v1", transport=right, model="fake-model"):
        pass
    assert [r.url for r in right.requests] == ["http://h:1/v1/models"]
    lost = _lists_models_only_at("http://h:1/v1/v1/models")
    with pytest.raises(llmbatch.ServerInfoError, match="could not read the model list"):
        async with llmbatch.Client("http://h:1/v1", transport=lost):
            pass
    assert [r.url for r in lost.requests] == ["http://h:1/v1/models"]


async def test_a_server_without_a_model_list_still_opens_with_a_model() -> None:
    # Some OpenAI-compatible servers have no /models at all: with a model named,
    # that is no reason to refuse.
    async with llmbatch.Client(
        "http://h:1/v1", transport=_lists_models_only_at(None), model="m"
    ) as c:
        assert c.model == "m"
    with pytest.raises(llmbatch.ServerInfoError, match=r"\(Not Found\); is the server up?"):
        async with llmbatch.Client("http://h:1/v1", transport=_lists_models_only_at(None)):
            pass


# -- API keys --------------------------------------------------------------------------


@pytest.mark.parametrize("model", [None, MODEL])
async def test_a_missing_or_wrong_key_is_an_authentication_error_at_open(
    keyed_sim: SimulatorProcess, model: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LLMBATCH_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    url = keyed_sim.base_url
    with pytest.raises(llmbatch.AuthenticationError) as missing:
        async with llmbatch.Client(url, model=model):
            pass
    assert str(missing.value) == (
        f"the server at {url} wants an API key (401: Unauthorized) and none was given; "
        "set LLMBATCH_API_KEY (or OPENAI_API_KEY)"
    )
    with pytest.raises(llmbatch.AuthenticationError) as wrong:
        async with llmbatch.Client(url, model=model, api_key="sk-wrong-1234"):
            pass
    assert str(wrong.value) == (
        f"the server at {url} refused the API key (401: Unauthorized); "
        "check the key (it is not shown here)"
    )
    assert wrong.value.status_code == 401
    assert "sk-wrong-1234" not in repr(wrong.value) + repr(vars(wrong.value))
    async with llmbatch.Client(url, model=model, api_key=KEY) as client:
        assert (await client.complete("hi", max_tokens=2)).text


async def test_a_403_is_a_permission_error_and_an_echoed_key_is_masked() -> None:
    def handler(request: HTTPRequest) -> MockResponse:
        # A careless server quoting the header back: the key must not reach our error.
        quoted = request.headers["Authorization"]
        return MockResponse(status=403, json={"error": {"message": f"{quoted} may not list"}})

    transport = MockTransport(handler)
    with pytest.raises(llmbatch.PermissionDeniedError) as info:
        async with llmbatch.Client("http://h:1/v1", transport=transport, api_key=KEY):
            pass
    shown = str(info.value) + repr(info.value) + repr(vars(info.value))
    assert KEY not in shown
    assert str(info.value) == (
        "the server at http://h:1/v1 does not let this API key list its models "
        "(403: Bearer *** may not list); check the key's permissions (it is not shown here)"
    )
    assert info.value.body == {"error": {"message": "Bearer *** may not list"}}
    assert len(transport.requests) == 1  # no /v1 probe, no retry


# -- unknown models --------------------------------------------------------------------


async def test_an_unknown_model_fails_at_open_listing_the_servers(sim: SimulatorProcess) -> None:
    with pytest.raises(llmbatch.UnknownModelError) as info:
        async with llmbatch.Client(sim.base_url, model="gpt-4o"):
            pass
    error = info.value
    assert isinstance(error, llmbatch.ServerInfoError)
    assert (error.model, error.available) == ("gpt-4o", (MODEL,))
    assert str(error) == (
        f"model 'gpt-4o' is not served at {sim.base_url}, which serves 'sim-model'; "
        "pass one of them as model=..., or model=None for the first"
    )


async def test_a_long_model_list_is_cut_short_and_nothing_else_is_sent() -> None:
    names = [f"m{i}" for i in range(25)]

    def handler(request: HTTPRequest) -> MockResponse:
        return MockResponse(json={"data": [{"id": name} for name in names]})

    transport = MockTransport(handler)
    with pytest.raises(llmbatch.UnknownModelError) as info:
        async with llmbatch.Client("http://h:1/v1", transport=transport, model="m99"):
            pass
    assert info.value.available == tuple(names)
    assert "'m18', 'm19' and 5 more;" in str(info.value)
    assert len(transport.requests) == 1


async def test_a_server_listing_no_models_is_taken_at_its_word_only_without_one() -> None:
    transport = MockTransport(lambda request: MockResponse(json={"data": []}))
    async with llmbatch.Client("http://h:1/v1", transport=transport, model="m") as client:
        assert client.model == "m"
    with pytest.raises(llmbatch.ServerInfoError, match="lists no models, so there is none"):
        async with llmbatch.Client("http://h:1/v1", transport=transport):
            pass


# -- a server that is down -------------------------------------------------------------


async def test_a_server_down_at_open_fails_it_only_without_a_model(refused_url: str) -> None:
    with pytest.raises(llmbatch.ServerInfoError) as info:
        async with llmbatch.Client(refused_url):
            pass
    assert str(info.value).startswith(f"could not read the model list at {refused_url}/models")
    assert str(info.value).endswith("is the server up? Pass model=... to skip this check")
    assert isinstance(info.value.__cause__, llmbatch.ConnectError)
    # With a model named it may come up later: the client opens, requests retry.
    async with llmbatch.Client(refused_url, model="m", retry=ONE_TRY) as client:
        with pytest.raises(llmbatch.ConnectError):
            await client.complete("hi", max_tokens=2)


async def test_a_client_opened_before_its_server_is_up_works_once_it_is() -> None:
    with socket.socket() as sock:  # the port stays refused until the server takes it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        client = llmbatch.Client(f"http://127.0.0.1:{port}/v1", model=MODEL, retry=ONE_TRY)
        await client.__aenter__()
    try:
        with run_simulator("--zero-latency", "--model", MODEL, port=port):
            answer = await client.complete("hi", max_tokens=2)
            assert answer.model == MODEL
    finally:
        await client.__aexit__(None, None, None)
