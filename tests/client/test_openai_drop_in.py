"""The openai-python drop-in, with the real ``openai`` package against a real
simulator process: unchanged calls get batched, tiers, isolation, and return
openai's own types; everything else passes through."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import openai
import pytest

import llmbatch
from llmbatch.openai import AsyncOpenAI, OpenAI
from llmbatch.transports import BatchingTransport
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.asyncio_only("the drop-in hosts its client on asyncio"),
]

MODEL = "llmbatch-sim"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--max-model-len", "512") as server:
        yield server


class Counting(httpx.AsyncBaseTransport):
    """The real network transport, counting the HTTP requests that reach the server."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.posts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.posts.append(request.url.path)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_unchanged_calls_return_openais_types(sim: SimulatorProcess) -> None:
    client = AsyncOpenAI(base_url=sim.base_url, api_key="unused")
    try:
        completion = await client.completions.create(model=MODEL, prompt="hello", max_tokens=4)
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2
        )
        embeddings = await client.embeddings.create(model=MODEL, input=["a", "b", "c"])
        listed = [m.id async for m in await client.models.list()]  # passed through
    finally:
        await client.close()
    assert isinstance(completion, openai.types.Completion)
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4
    assert isinstance(chat, openai.types.chat.ChatCompletion)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content
    assert isinstance(embeddings, openai.types.CreateEmbeddingResponse)
    assert [d.index for d in embeddings.data] == [0, 1, 2]
    assert len(embeddings.data[0].embedding) == 384
    assert listed == [MODEL]


class Recorder:
    """llmbatch's own aiohttp transport, counting the POSTs the server receives."""

    def __init__(self) -> None:
        import llmbatch
        from llmbatch._transports.aiohttp import AiohttpTransport

        self.inner = AiohttpTransport(
            limits=llmbatch.DEFAULT_LIMITS, timeout=llmbatch.DEFAULT_TIMEOUT
        )
        self.posts = 0

    async def send(self, request: object) -> object:
        if getattr(request, "method", "") == "POST":
            self.posts += 1
        return await self.inner.send(request)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_concurrent_calls_are_batched_and_a_bad_one_fails_alone(
    sim: SimulatorProcess,
) -> None:
    wire = Recorder()
    client = AsyncOpenAI(
        base_url=sim.base_url, api_key="unused", llmbatch_options={"transport": wire}
    )
    outcomes: dict[int, object] = {}

    async def call(i: int) -> None:
        prompt = "word " * 2000 if i == 13 else f"prompt {i}"
        try:
            answer = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
            outcomes[i] = answer.choices[0].text
        except openai.BadRequestError as exc:
            outcomes[i] = exc

    try:
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(call, i)
    finally:
        await client.close()
    assert isinstance(outcomes.pop(13), openai.BadRequestError)  # the server's 400, alone
    assert len(outcomes) == 199
    assert all(isinstance(text, str) and text for text in outcomes.values())
    assert wire.posts <= 200 / 4, wire.posts  # far fewer HTTP requests than calls


async def test_the_priority_header_picks_the_tier(sim: SimulatorProcess) -> None:
    client = AsyncOpenAI(base_url=sim.base_url, api_key="unused", default_priority="batch")
    transport = client._client._transport  # type: ignore[attr-defined]
    try:
        await client.completions.create(model=MODEL, prompt="a", max_tokens=1)
        await client.completions.create(
            model=MODEL, prompt="b", max_tokens=1, extra_headers={"x-llmbatch-priority": "realtime"}
        )
        stats = transport._client.stats()
    finally:
        await client.close()
    tiers = {tier.value: s.done for tier, s in stats.tiers.items()}
    assert tiers == {"realtime": 1, "normal": 0, "batch": 1}


async def test_the_tenant_header_names_the_tenant_and_its_limits_hold(
    sim: SimulatorProcess,
) -> None:
    import llmbatch

    tenants = {"strict": llmbatch.TenantLimits(max_in_flight=1, overflow="raise")}
    agent = AsyncOpenAI(
        base_url=sim.base_url,
        api_key="unused",
        default_headers={"x-llmbatch-tenant": "agent-7"},
        llmbatch_options={"tenants": tenants},
    )
    transport = agent._client._transport  # type: ignore[attr-defined]
    try:
        await agent.completions.create(model=MODEL, prompt="a", max_tokens=1)
        await agent.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "b"}],
            max_tokens=1,
            extra_headers={"x-llmbatch-tenant": "agent-8"},
        )
        # Two calls of a tenant allowed one at a time, refusing the rest: one 429.
        strict = {"x-llmbatch-tenant": "strict"}
        outcomes = await _gather(
            agent.completions.create(model=MODEL, prompt="c", max_tokens=1, extra_headers=strict),
            agent.completions.create(model=MODEL, prompt="d", max_tokens=1, extra_headers=strict),
        )
        stats = transport._client.stats()
    finally:
        await agent.close()
    assert stats.tenants["agent-7"].done == 1
    assert stats.tenants["agent-8"].done == 1
    assert sim.peak_running(user="agent-7") == 1  # sent as OpenAI's user too
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(refused) == 1
    assert isinstance(refused[0], openai.RateLimitError)
    assert "strict" in str(refused[0])


async def test_a_spent_max_cost_answers_as_openai_answers_a_spent_quota(
    sim: SimulatorProcess,
) -> None:
    """A 429 ``insufficient_quota`` that openai's retries leave alone (x-should-retry)."""
    agent = AsyncOpenAI(
        base_url=sim.base_url,
        api_key="unused",
        max_retries=3,
        llmbatch_options={
            "prices": {MODEL: llmbatch.Price(input=1.0, output=1.0)},
            "max_cost": 0.0001,
        },
    )
    transport = agent._client._transport  # type: ignore[attr-defined]
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            await agent.completions.create(model=MODEL, prompt="x" * 200, max_tokens=100)
        stats = transport._client.stats()
    finally:
        await agent.close()
    assert caught.value.code == "insufficient_quota"
    assert "max_cost" in str(caught.value)
    assert stats.tiers[llmbatch.Priority.NORMAL].failed == 1  # asked once, not retried
    assert stats.batches_sent == 0


async def _gather(*calls: object) -> list[object]:
    """Each call's answer or exception, started together."""
    outcomes: list[object] = [None] * len(calls)

    async def one(i: int, call: object) -> None:
        try:
            outcomes[i] = await call  # type: ignore[misc]
        except Exception as exc:
            outcomes[i] = exc

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return outcomes


async def test_a_stream_passes_through(sim: SimulatorProcess) -> None:
    wire = Counting()
    client = AsyncOpenAI(
        base_url=sim.base_url,
        api_key="unused",
        http_client=httpx.AsyncClient(transport=BatchingTransport(passthrough=wire)),
    )
    try:
        stream = await client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True)
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    assert chunks
    assert wire.posts == ["/v1/completions"]


def test_the_extra_is_named_when_openai_is_missing() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['openai'] = None\n"
        "try:\n import llmbatch.openai\nexcept ImportError as e: print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'llmbatch[openai]'" in out.stdout
    assert json.loads("1") == 1


async def test_stats_are_the_llmbatch_clients(sim: SimulatorProcess) -> None:
    client = AsyncOpenAI(base_url=sim.base_url, api_key="unused")
    try:
        with pytest.raises(llmbatch.ClientClosedError, match="once a completions, chat"):
            client.stats()
        await client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
        stats = client.stats()
        assert isinstance(stats, llmbatch.Stats)
        assert stats.tiers[llmbatch.Priority.NORMAL].done == 1
    finally:
        await client.close()
    own = AsyncOpenAI(base_url=sim.base_url, api_key="unused", http_client=httpx.AsyncClient())
    with pytest.raises(llmbatch.ClientClosedError, match="its own http_client"):
        own.stats()
    await own.close()


def test_the_sync_drop_in_batches_calls_from_many_threads(sim: SimulatorProcess) -> None:
    client = OpenAI(base_url=sim.base_url, api_key="unused")
    with client:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(
                pool.map(
                    lambda i: client.completions.create(
                        model=MODEL, prompt=f"prompt {i}", max_tokens=2
                    ),
                    range(64),
                )
            )
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        embeddings = client.embeddings.create(model=MODEL, input=["a", "b"])
        listed = [m.id for m in client.models.list()]  # passed through
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="word " * 2000, max_tokens=2)
        stats = client.stats()
    assert all(isinstance(a, openai.types.Completion) and a.choices[0].text for a in answers)
    assert isinstance(chat, openai.types.chat.ChatCompletion)
    assert len(embeddings.data) == 2
    assert listed == [MODEL]
    normal = stats.tiers[llmbatch.Priority.NORMAL]
    assert normal.done == 64 + 1 + 2
    assert stats.batches_sent < 64  # the threads' calls shared HTTP requests


async def test_a_cached_answer_comes_back_as_openais_type(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    """With a response cache a repeated call is answered from the file, unchanged in
    shape: the same text, usage and finish reason, no second request to the server."""
    wire = Recorder()
    path = str(tmp_path) + "/answers.db"
    client = AsyncOpenAI(
        base_url=sim.base_url,
        api_key="unused",
        llmbatch_options={"transport": wire, "cache": path},
    )
    try:
        first = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
        again = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
    finally:
        await client.close()
    assert isinstance(again, openai.types.chat.ChatCompletion)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage == first.usage
    assert again.choices[0].finish_reason == "length"
    assert wire.posts == 1
