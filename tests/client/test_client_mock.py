"""The client end to end through MockTransport, under asyncio and trio."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
from typing import Any

import anyio
import pytest
from fake_server import POISON, FakeServer

import llmbatch
from llmbatch import (
    BadRequestError,
    BatchPolicy,
    Client,
    ClientClosedError,
    Completion,
    ConnectError,
    DeadlineExceeded,
    InvalidRequestError,
    Limits,
    QueueFull,
    RateLimitError,
    RequestCancelled,
    RetryPolicy,
    ServerError,
)
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

# Plain retries, no waiting out outages: these tests are about what one request sees.
FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)


def client(fake: Any, **kw: Any) -> Client:
    kw.setdefault("retry", FAST_RETRY)
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(fake), **kw)


async def test_complete_returns_text_usage_and_timings() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        assert c.model == "fake-model"
        assert c.max_model_len == 4096
        answer = await c.complete("hello world", priority="realtime", max_tokens=5)
    assert isinstance(answer, Completion)
    assert answer.text == "echo:hello world:0"
    assert answer.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 5)
    assert not answer.usage.estimated
    assert answer.timings.batch_size == 1
    assert answer.timings.attempts == 1
    assert fake.bodies[0] == {"max_tokens": 5, "model": "fake-model", "prompt": "hello world"}


async def test_map_batches_into_list_prompts_and_keeps_order() -> None:
    fake = FakeServer()
    prompts = [f"prompt number {i}" for i in range(50)]
    async with client(fake) as c:
        results = await c.map(prompts, max_tokens=3)
    assert [r.unwrap().text for r in results] == [f"echo:{p}:0" for p in prompts]
    assert [r.index for r in results] == list(range(50))
    assert all(isinstance(b["prompt"], list) for b in fake.bodies)
    assert sum(len(b["prompt"]) for b in fake.bodies) == 50
    # Usage is apportioned per item and sums exactly to what the server reported.
    assert sum(r.unwrap().usage.completion_tokens for r in results) == 50 * 3
    assert sum(r.unwrap().usage.prompt_tokens for r in results) == 50 * 3


async def test_poisoned_prompt_fails_alone_after_bisection() -> None:
    fake = FakeServer()
    prompts = [f"p{i}" for i in range(32)]
    prompts[13] = f"{POISON} me"
    async with client(fake) as c:
        results = await c.map(prompts, max_tokens=2)
        stats = c.stats()
    failed = [r for r in results if not r.ok]
    assert [r.index for r in failed] == [13]
    error = failed[0].error
    assert isinstance(error, BadRequestError)
    assert error.status_code == 400
    assert "poisoned" in str(error)
    assert error.request_id is not None
    assert all(r.ok for i, r in enumerate(results) if i != 13)
    assert stats.bisections >= 1
    assert stats.tiers[llmbatch.Priority.BATCH].failed == 1
    assert stats.tiers[llmbatch.Priority.BATCH].done == 31


async def test_n_choices_are_demultiplexed_by_index() -> None:
    fake = FakeServer()
    # (No idle dispatch: trio may run one caller before the others are queued.)
    together = BatchPolicy(max_batch_size=4, max_wait=0.05, send_when_idle=False)
    async with client(fake, batching={"normal": together}) as c:
        async with anyio.create_task_group() as tg:
            out: dict[str, Completion] = {}

            async def one(p: str) -> None:
                out[p] = await c.complete(p, n=2, max_tokens=1)

            for p in ("a", "b", "c"):
                tg.start_soon(one, p)
    assert len(fake.bodies) == 1
    for p, answer in out.items():
        assert [ch.text for ch in answer.choices] == [f"echo:{p}:0", f"echo:{p}:1"]


async def test_chat_and_stream() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        chat = await c.chat([{"role": "user", "content": "hi"}], max_tokens=4)
        deltas = [d async for d in c.stream("tell me", max_tokens=4)]
    assert chat.text == "re:hi"
    assert chat.finish_reason == "stop"
    assert chat.usage.total_tokens == 5
    assert "".join(deltas) == "echo:tell me:0"
    assert len(deltas) == 2
    assert fake.bodies[-1]["stream"] is True
    assert fake.bodies[-1]["stream_options"] == {"include_usage": True}


async def test_retries_429_then_succeeds_honouring_retry_after() -> None:
    fake = FakeServer()
    calls = {"n": 0}

    def flaky(body: dict[str, Any]) -> MockResponse | None:
        calls["n"] += 1
        if calls["n"] == 1:
            return MockResponse(
                status=429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "0.2"}
            )
        return None

    fake.intercept = flaky
    retry = RetryPolicy(attempts=3, initial_backoff=0.0, max_backoff=5.0)
    async with client(fake, retry=retry) as c:
        start = anyio.current_time()
        answer = await c.complete("x")
        elapsed = anyio.current_time() - start
    assert answer.timings.attempts == 2
    assert elapsed >= 0.2
    assert c.stats().tiers[llmbatch.Priority.NORMAL].retried == 1


async def test_retries_are_bounded_then_the_error_is_typed() -> None:
    fake = FakeServer()
    fake.intercept = lambda body: MockResponse(status=500, json={"error": {"message": "boom"}})
    async with client(fake) as c:
        with pytest.raises(ServerError) as info:
            await c.complete("x")
    assert info.value.attempts == 3
    assert info.value.status_code == 500
    assert len(fake.bodies) == 3
    # The retry machinery (tenacity) is private: nothing of it reaches the caller.
    chain = [info.value, info.value.__cause__, info.value.__context__]
    assert not any(type(e).__module__.startswith("tenacity") for e in chain if e is not None)


def test_a_first_attempt_that_succeeds_never_loads_the_retry_machinery() -> None:
    import subprocess
    import sys

    # In a fresh interpreter: tenacity is imported only once something has failed.
    program = (
        "import sys, anyio, llmbatch\n"
        "from llmbatch.transports import MockResponse, MockTransport\n"
        "async def main():\n"
        "    transport = MockTransport(lambda r: MockResponse(json={'id': 'c', 'object': "
        "'text_completion', 'created': 0, 'model': 'm', 'choices': [{'index': 0, 'text': "
        "'ok', 'finish_reason': 'stop'}]}))\n"
        "    async with llmbatch.Client('http://h/v1', model='m', transport=transport) as c:\n"
        "        await c.complete('x')\n"
        "anyio.run(main)\n"
        "print('tenacity' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


async def test_client_errors_are_not_retried() -> None:
    fake = FakeServer()
    fake.intercept = lambda body: MockResponse(status=401, json={"error": "Unauthorized"})
    async with client(fake) as c:
        with pytest.raises(llmbatch.AuthenticationError) as info:
            await c.complete("x")
    assert info.value.attempts == 1
    assert str(info.value).startswith("Unauthorized")


async def test_connection_errors_are_retried_then_reported() -> None:
    def handler(request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            return FakeServer()(request)
        raise ConnectError("cannot connect: refused")

    async with Client(
        "http://127.0.0.1:1/v1", transport=MockTransport(handler), retry=FAST_RETRY
    ) as c:
        with pytest.raises(ConnectError) as info:
            await c.complete("x")
    assert info.value.attempts == 3


async def test_rate_limit_error_carries_retry_after() -> None:
    fake = FakeServer()
    fake.intercept = lambda body: MockResponse(
        status=429, json={"error": {"message": "no"}}, headers={"Retry-After": "0"}
    )
    async with client(fake) as c:
        with pytest.raises(RateLimitError) as info:
            await c.complete("x")
    assert info.value.retry_after == 0.0


BAD_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("empty prompt", {"prompt": ""}),
    ("non-string prompt", {"prompt": 42}),
    ("bytes prompt", {"prompt": b"hi"}),
    ("lone surrogate", {"prompt": "bad \ud800 text"}),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -1}),
    ("zero max_tokens", {"prompt": "x", "max_tokens": 0}),
    ("float max_tokens", {"prompt": "x", "max_tokens": 1.5}),
    ("oversize max_tokens", {"prompt": "x", "max_tokens": 10_000}),
    ("NaN temperature", {"prompt": "x", "temperature": math.nan}),
    ("infinite temperature", {"prompt": "x", "temperature": math.inf}),
    ("negative temperature", {"prompt": "x", "temperature": -1}),
    ("top_p above 1", {"prompt": "x", "top_p": 1.5}),
    ("unknown tier", {"prompt": "x", "priority": "urgent"}),
    ("zero n", {"prompt": "x", "n": 0}),
    ("bad stop", {"prompt": "x", "stop": 3}),
    ("non-JSON extra", {"prompt": "x", "logit_bias": object()}),
    ("NaN in extra", {"prompt": "x", "repetition_penalty": math.nan}),
    ("reserved extra", {"prompt": "x", "stream": True}),
    ("negative timeout", {"prompt": "x", "timeout": -1}),
    ("prompt longer than max_model_len", {"prompt": "word " * 40_000}),
]


@pytest.mark.parametrize(("case", "kwargs"), BAD_CALLS, ids=[c for c, _ in BAD_CALLS])
async def test_bad_input_fails_at_the_call_and_touches_nothing(
    case: str, kwargs: dict[str, Any]
) -> None:
    fake = FakeServer()
    async with client(fake) as c:
        kwargs = dict(kwargs)
        prompt = kwargs.pop("prompt")
        with pytest.raises(InvalidRequestError):
            await c.complete(prompt, **kwargs)
        assert fake.bodies == []
        assert (await c.complete("fine")).text == "echo:fine:0"


BAD_MESSAGES: list[object] = [
    [],
    "hi",
    [{"role": "wizard", "content": "hi"}],
    [{"content": "hi"}],
    ["hi"],
    [{"role": "user", "content": 3}],
]


@pytest.mark.parametrize("messages", BAD_MESSAGES)
async def test_bad_messages_fail_at_the_call(messages: Any) -> None:
    fake = FakeServer()
    async with client(fake) as c:
        with pytest.raises(InvalidRequestError):
            await c.chat(messages)
    assert fake.bodies == []


async def test_map_turns_bad_items_into_results_and_runs_the_rest() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        results = await c.map(
            [
                "ok",
                "",
                3,
                {"prompt": "meta", "metadata": {"row": 7}},
                {"nothing": 1},
                [{"role": "user", "content": "chat"}],
            ]
        )
    assert [r.ok for r in results] == [True, False, False, True, False, True]
    assert all(isinstance(r.error, InvalidRequestError) for r in results if not r.ok)
    assert results[3].metadata == {"row": 7}
    assert results[5].unwrap().text == "re:chat"


async def test_map_reports_a_failing_input_iterator_after_finishing_the_rest() -> None:
    def prompts() -> Any:
        yield "a"
        yield "b"
        raise RuntimeError("source broke")

    fake = FakeServer()
    seen = []
    async with client(fake) as c:
        with pytest.raises(RuntimeError, match="source broke"):
            async for index, result in c.map_unordered(prompts()):
                seen.append((index, result.ok))
    assert sorted(seen) == [(0, True), (1, True)]


async def test_use_after_async_with_is_a_clear_error() -> None:
    # Use before it (opening on first use, trio's refusal): tests/client/test_lifetime.py.
    c = client(FakeServer())
    async with c:
        pass
    with pytest.raises(ClientClosedError):
        await c.complete("x")
    with pytest.raises(ClientClosedError):
        async with c:
            pass


class Gate:
    """A handler that holds every completion request until released."""

    def __init__(self) -> None:
        self.fake = FakeServer()
        self.release = anyio.Event()
        self.arrived = 0

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        if not request.url.endswith("/models"):
            self.arrived += 1
            await self.release.wait()
        return self.fake(request)


async def test_cancelled_caller_leaves_the_queue_at_once() -> None:
    gate = Gate()
    limits = Limits(max_in_flight=2, reserved_realtime=1)
    async with client(
        gate, limits=limits, batching={"normal": BatchPolicy(max_batch_size=1, max_wait=0)}
    ) as c:
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.complete, "holds the only bulk slot")
            await anyio.wait_all_tasks_blocked()
            with anyio.move_on_after(0.05):
                await c.complete("queued then cancelled")
            stats = c.stats()
            assert stats.tiers[llmbatch.Priority.NORMAL].queued == 0
            assert stats.tiers[llmbatch.Priority.NORMAL].cancelled == 1
            gate.release.set()
    assert gate.arrived == 1
    assert c.stats().tiers[llmbatch.Priority.NORMAL].done == 1


async def test_deadline_while_in_flight_raises_deadline_exceeded() -> None:
    gate = Gate()
    async with client(gate) as c:
        with pytest.raises(DeadlineExceeded) as info:
            await c.complete("slow", timeout=0.05)
        gate.release.set()
    assert info.value.request_id is not None
    assert info.value.attempts == 1


async def test_backpressure_nowait_raises_queue_full() -> None:
    gate = Gate()
    limits = Limits(max_in_flight=2, reserved_realtime=1, max_queued=1)
    async with client(
        gate, limits=limits, batching={"normal": BatchPolicy(max_batch_size=1, max_wait=0)}
    ) as c:
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.complete, "in flight")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(c.complete, "queued")
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(QueueFull):
                await c.complete("one too many", nowait=True)
            gate.release.set()


async def test_close_drains_queued_work_by_default() -> None:
    fake = FakeServer()
    results: list[str] = []
    slow = {"normal": BatchPolicy(max_batch_size=100, max_wait=30.0, send_when_idle=False)}
    async with client(fake, batching=slow) as c:

        async def one() -> None:
            results.append((await c.complete("queued")).text)

        assert c._runtime.task_group is not None
        c._runtime.task_group.start_soon(one)
        await anyio.wait_all_tasks_blocked()
    assert results == ["echo:queued:0"]


async def test_close_with_cancel_fails_waiting_callers() -> None:
    gate = Gate()
    errors: list[BaseException] = []
    slow = {"normal": BatchPolicy(max_batch_size=100, max_wait=30.0, send_when_idle=False)}
    c = client(gate, on_close="cancel", batching=slow)

    async def one(prompt: str, priority: str) -> None:
        try:
            await c.complete(prompt, priority=priority)
        except RequestCancelled as exc:
            errors.append(exc)

    async with anyio.create_task_group() as callers, c:
        callers.start_soon(one, "in flight", "realtime")
        callers.start_soon(one, "queued", "normal")
        await anyio.wait_all_tasks_blocked()
        assert gate.arrived == 1
    assert len(errors) == 2
    assert c.stats().tiers[llmbatch.Priority.NORMAL].queued == 0


async def test_api_key_is_sent_but_never_shown() -> None:
    seen: list[HTTPRequest] = []
    fake = FakeServer()

    def handler(request: HTTPRequest) -> MockResponse:
        seen.append(request)
        return fake(request)

    c = Client("http://127.0.0.1:1/v1", api_key="sk-secret-123", transport=MockTransport(handler))
    assert "sk-secret" not in repr(c)
    async with c:
        await c.complete("x")
        assert "sk-secret" not in repr(c.stats())
    assert seen[-1].headers["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(seen[-1])


async def test_env_vars_configure_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://10.0.0.1:9/v1")
    monkeypatch.setenv("LLMBATCH_BASE_URL", "http://127.0.0.1:7/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai")
    c = Client(transport=MockTransport(FakeServer()))
    assert c.base_url == "http://127.0.0.1:7/v1"
    assert c._config.api_key == "from-openai"


@pytest.mark.parametrize("url", ["not a url", "ftp://x/v1", "http:///v1", ""])
def test_bad_base_url_is_rejected(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBATCH_BASE_URL", "ftp://bad")
    with pytest.raises(InvalidRequestError):
        Client(url)


async def test_priority_scheduling_sends_vllm_priority() -> None:
    fake = FakeServer()
    async with client(fake, priority_scheduling=True) as c:
        await c.complete("a", priority="realtime")
        await c.complete("b", priority="batch")
    assert [b["priority"] for b in fake.bodies] == [0, 2]


async def test_map_unordered_break_cancels_the_rest() -> None:
    fake = FakeServer()
    async with client(fake) as c:
        async for _index, _result in c.map_unordered((f"p{i}" for i in range(10_000)), window=8):
            break
        await anyio.wait_all_tasks_blocked()
        stats = c.stats()
    # Only about one window was ever pulled from the 10,000-item generator.
    total = sum(
        b for b in (len(x["prompt"]) if isinstance(x["prompt"], list) else 1 for x in fake.bodies)
    )
    assert total <= 16
    assert stats.tiers[llmbatch.Priority.BATCH].queued == 0


async def test_leaving_map_unordered_sends_nothing_more() -> None:
    fake = FakeServer()
    sent: list[str] = []

    async def first_answer_then_silence(request: HTTPRequest) -> MockResponse:
        if not request.url.endswith("/models"):
            sent.append(json.loads(request.body or b"{}")["prompt"])
            if len(sent) > 1:
                await anyio.sleep_forever()
        response: MockResponse = fake(request)
        return response

    one_per_request = {
        tier: BatchPolicy(max_batch_size=1, max_wait=0) for tier in llmbatch.Priority
    }
    async with client(first_answer_then_silence, batching=one_per_request, on_close="cancel") as c:
        results = c.map_unordered([f"p{i}" for i in range(100)], window=1)
        async with contextlib.aclosing(results):
            async for _ in results:
                break  # taking p0's result freed the window's one place
        await anyio.wait_all_tasks_blocked()
        in_flight = c.stats().tiers[llmbatch.Priority.BATCH].in_flight
    assert (sent, in_flight) == (["p0"], 0)


@pytest.mark.asyncio_only("on trio the task group lives in the task that opens the client")
async def test_a_client_opened_in_one_task_closes_in_another() -> None:
    """As a notebook does: each cell runs as a task of its own."""
    import asyncio

    fake = FakeServer()
    c = client(fake)
    await asyncio.create_task(c.__aenter__())  # cell 1
    answer = await asyncio.create_task(c.complete("hi"))  # cell 2
    results = await asyncio.create_task(c.map(["a", "b"]))  # cell 3
    await asyncio.create_task(c.__aexit__(None, None, None))  # cell 4
    assert answer.text == "echo:hi:0"
    assert all(r.ok for r in results)
    with pytest.raises(ClientClosedError):
        await c.complete("after")


async def test_a_404_for_a_model_loaded_since_says_so() -> None:
    # The model list is read again on the 404: an adapter loaded between the request
    # and the answer is named, not reported missing.
    fake = FakeServer()

    def missing(body: dict[str, Any]) -> MockResponse | None:
        fake.model = "adapter-1"  # /v1/models lists it from now on
        error = {"message": "The model `adapter-1` does not exist.", "code": 404}
        return MockResponse(status=404, json={"error": error})

    fake.intercept = missing
    async with Client("http://127.0.0.1:1/v1", transport=MockTransport(fake)) as client:
        with pytest.raises(llmbatch.NotFoundError) as info:
            await client.complete("hi", model="adapter-1")
    assert str(info.value).startswith(
        "The model `adapter-1` does not exist. (its /v1/models lists 'adapter-1' now "
        "(loaded since the request was sent?))"
    )


async def test_a_map_naming_an_unknown_model_reads_the_list_once_not_per_batch() -> None:
    fake = FakeServer()
    fake.intercept = lambda body: MockResponse(
        status=404, json={"error": {"message": f"The model `{body['model']}` does not exist."}}
    )
    transport = MockTransport(fake)
    async with Client("http://127.0.0.1:1/v1", transport=transport) as client:
        opened = len(transport.requests)
        results = await client.map([f"p{i}" for i in range(256)], model="gpt-4", max_tokens=1)
    assert all(isinstance(r.error, llmbatch.NotFoundError) for r in results)
    assert all("serves 'fake-model'" in str(r.error) for r in results)
    batches = len(fake.bodies)
    reads = [r for r in transport.requests[opened:] if r.url.endswith("/models")]
    assert batches >= 4
    assert len(reads) == 1  # within a second, the list read for the first 404 serves all


@pytest.mark.asyncio_only("reads the asyncio task's coroutine chain")
@pytest.mark.parametrize("method", ["complete", "chat"])
async def test_a_waiting_call_is_suspended_in_one_coroutine(method: str) -> None:
    """A call waits on its request's future in its own frame, not through helpers: a
    gather of 100,000 calls holds a frame for each coroutine a call is suspended in
    (about 230 bytes each; docs/benchmarks.md, "Burst")."""
    import asyncio

    fake, release = FakeServer(), anyio.Event()

    async def slow(request: HTTPRequest) -> MockResponse:
        if not request.url.endswith("/models"):  # (the client reads them as it opens)
            await release.wait()
        return fake(request)

    async with client(slow) as c:
        call = (
            c.complete("hi", max_tokens=1)
            if method == "complete"
            else c.chat([{"role": "user", "content": "hi"}], max_tokens=1)
        )
        task = asyncio.ensure_future(call)
        try:
            for _ in range(100):  # until the request is on its way
                await anyio.sleep(0.001)
                if fake.bodies:
                    break
            awaited = task.get_coro().cr_await
        finally:
            release.set()
        # A future's own iterator: no coroutine (and no frame) between it and the call.
        assert awaited is not None
        assert not inspect.iscoroutine(awaited), awaited
        assert not inspect.isgenerator(awaited), awaited
        assert (await task).text
