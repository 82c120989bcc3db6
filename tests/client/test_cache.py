"""The response cache through the client: hits answered without the server (and
charged nothing), a map run again sending only what is new, samples kept apart,
per-call control, what is kept and what is not, streams, and identical requests in
flight sharing one exchange, with their callers leaving in any order."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_server import FakeServer
from pydantic import BaseModel, field_validator

import llmbatch
from llmbatch import (
    Cache,
    Client,
    ConfigError,
    ConfigTypeError,
    InvalidRequestError,
    InvalidTypeError,
    Price,
    RequestCancelled,
    RetryPolicy,
    SyncClient,
)
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=1, initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)
URL = "http://cache.test/v1"


class Counter:
    """A server whose every generated choice is numbered (so a re-sent prompt gets a
    new text and a stored one the old); counts prompts by text; may hold answers
    until ``release`` is set; refuses prompts with ``BAD`` (400) and ``FLAKY`` (503)."""

    def __init__(self) -> None:
        self.serial = 0
        self.prompts: list[str] = []
        self.hold: anyio.Event | None = None
        self.cancelled = 0
        self.arrived = anyio.Event()
        self.gone = anyio.Event()

    def count(self, text: str) -> int:
        return self.prompts.count(text)

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            data = [{"id": "m", "object": "model", "root": "/weights/m", "max_model_len": 4096}]
            return MockResponse(json={"object": "list", "data": data})
        body = json.loads(request.body or b"{}")
        path = request.url.split("/v1", 1)[1].split("?")[0]
        if path == "/embeddings":
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            self.prompts += inputs
            items = [
                {"object": "embedding", "index": i, "embedding": [float(len(t)), 0.5]}
                for i, t in enumerate(inputs)
            ]
            usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
            return MockResponse(
                json={"object": "list", "data": items, "model": "m", "usage": usage}
            )
        if path.startswith("/chat"):
            conversations = body["messages"] if path.endswith("/batch") else [body["messages"]]
            texts = [c[-1]["content"] for c in conversations]
        else:
            texts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        self.prompts += texts
        self.arrived.set()
        if self.hold is not None:
            try:
                await self.hold.wait()
            except BaseException:
                self.cancelled += 1
                self.gone.set()
                raise
        if any("BAD" in t for t in texts):
            return MockResponse(status=400, json={"error": {"message": "bad prompt", "code": 400}})
        if any("FLAKY" in t for t in texts):
            return MockResponse(status=503, json={"error": {"message": "busy"}})
        n = body.get("n", 1)
        choices = []
        for i, text in enumerate(texts):
            for j in range(n):
                self.serial += 1
                answer = f"{text}#{self.serial}"
                if text.startswith("json:"):
                    answer = text[5:]
                finish = "stop" if text.startswith("json:") else "length"
                choice: dict[str, Any] = {"index": i * n + j, "finish_reason": finish}
                if path.startswith("/chat"):
                    choice["message"] = {"role": "assistant", "content": answer}
                else:
                    choice["text"] = answer
                choices.append(choice)
        count = len(texts) * n
        usage = {"prompt_tokens": 10 * len(texts), "completion_tokens": 5 * count}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return MockResponse(json={"id": "x", "model": "m", "choices": choices, "usage": usage})


def client(server: Any, cache: object, **options: Any) -> Client:
    return Client(URL, transport=MockTransport(server), retry=FAST_RETRY, cache=cache, **options)


async def test_a_call_asked_again_is_answered_from_the_cache(tmp_path: Path) -> None:
    server = Counter()
    path = tmp_path / "answers.db"
    async with client(server, path, prices={"m": Price(input=1.0, output=2.0)}) as c:
        first = await c.complete("hello", temperature=0, max_tokens=5)
        again = await c.complete("hello", temperature=0, max_tokens=5)
        chat = await c.chat([{"role": "user", "content": "hi"}], temperature=0)
        chat_again = await c.chat([{"role": "user", "content": "hi"}], temperature=0)
        vector = await c.embed("abc")
        vector_again = await c.embed("abc")
        stats = c.stats()
    assert (first.from_cache, again.from_cache) == (False, True)
    assert again.text == first.text
    assert again.usage == first.usage
    assert again.timings.attempts == 0
    assert again.timings.batch_size == 0
    assert chat_again.text == chat.text
    assert chat_again.from_cache
    assert vector_again.embedding == vector.embedding
    assert vector_again.from_cache
    assert server.prompts == ["hello", "hi", "abc"]
    cache = stats.cache
    assert cache is not None
    assert (cache.hits, cache.misses, cache.stored) == (3, 3, 3)
    # Saved: the hits' tokens at the client's price (10 prompt, 5 completion each, the
    # embedding 1 prompt token).
    assert cache.saved.prompt_tokens == 10 + 10 + 1
    assert cache.saved.dollars == pytest.approx((21 * 1.0 + 10 * 2.0) / 1e6)
    assert "cache: 3 hits, 3 misses" in str(stats)
    # Nothing a hit did reached the tiers' counters.
    assert stats.batches_sent == 3
    # Another client on the same file (another key, other headers) finds them.
    async with client(server, path, api_key="sk-other", default_headers={"x-t": "1"}) as c:
        assert (await c.complete("hello", temperature=0, max_tokens=5)).text == first.text
    assert server.prompts == ["hello", "hi", "abc"]


async def test_a_map_run_again_sends_only_what_is_new(tmp_path: Path) -> None:
    server = Counter()
    path = tmp_path / "answers.db"
    prompts = [f"p{i}" for i in range(100)]
    async with client(server, path) as c:
        first = await c.map(prompts, temperature=0, max_tokens=4)
    grown = prompts + [f"new{i}" for i in range(10)]
    server.prompts.clear()
    async with client(server, path) as c:
        unordered = [r async for _, r in c.map_unordered(grown, temperature=0, max_tokens=4)]
        stats = c.stats()
    assert sorted(server.prompts) == sorted(f"new{i}" for i in range(10))
    # Hits come back first, before any new prompt's answer.
    assert [r.from_cache for r in unordered] == [True] * 100 + [False] * 10
    by_index = {r.index: r for r in unordered}
    assert [by_index[i].text for i in range(100)] == [r.text for r in first]
    assert stats.cache is not None
    assert stats.cache.hits == 100


async def test_identical_prompts_in_one_map_at_temperature_0_are_sent_once(
    tmp_path: Path,
) -> None:
    server = Counter()
    async with client(server, tmp_path / "c.db") as c:
        results = await c.map(["a", "b", "a", "a", "b"], temperature=0)
        stats = c.stats()
    assert sorted(server.prompts) == ["a", "b"]
    assert results[0].text == results[2].text == results[3].text
    assert [r.from_cache for r in results] == [False, False, True, True, True]
    assert stats.cache is not None
    assert stats.cache.shared == 3


async def test_samples_stay_apart_and_a_rerun_finds_each_again(tmp_path: Path) -> None:
    """At the server's default temperature two identical prompts in one map are two
    samples (two keys), and a second run gets the same samples back in order."""
    server = Counter()
    path = tmp_path / "c.db"
    async with client(server, path) as c:
        first = [r.text for r in await c.map(["q", "q", "q"])]
        seeded = await c.map(["s", "s"], temperature=0.8, seed=1)
    assert len(set(first)) == 3
    assert server.count("q") == 3
    assert server.count("s") == 1
    async with client(server, path) as c:
        assert [r.text for r in await c.map(["q", "q", "q"])] == first
        fourth = await c.map(["q"] * 4)
        assert [r.text for r in seeded] == [
            r.text for r in await c.map(["s", "s"], temperature=0.8, seed=1)
        ]
    assert [r.from_cache for r in fourth] == [True, True, True, False]
    assert server.count("q") == 4


async def test_cache_false_refresh_and_a_view(tmp_path: Path) -> None:
    server = Counter()
    async with client(server, tmp_path / "c.db") as c:
        first = await c.complete("x", temperature=0)
        skipped = await c.complete("x", temperature=0, cache=False)
        refreshed = await c.complete("x", temperature=0, cache="refresh")
        after = await c.complete("x", temperature=0)
        uncached = c.with_options(cache=False)
        viewed = await uncached.complete("x", temperature=0)
        mapped = await c.map(["x"], temperature=0, cache=False)
        with pytest.raises(InvalidTypeError, match="cache must be"):
            await c.complete("x", cache="sometimes")  # type: ignore[typeddict-item]
    assert not skipped.from_cache
    assert skipped.text != first.text
    assert not refreshed.from_cache
    assert after.from_cache
    assert after.text == refreshed.text
    assert not viewed.from_cache
    assert not mapped[0].from_cache
    assert server.count("x") == 5


async def test_a_namespace_starts_afresh(tmp_path: Path) -> None:
    server = Counter()
    path = tmp_path / "c.db"
    async with client(server, Cache(path, namespace="v1")) as c:
        await c.complete("x", temperature=0)
    async with client(server, Cache(path, namespace="v2")) as c:
        assert not (await c.complete("x", temperature=0)).from_cache
    async with client(server, Cache(path, namespace="v1")) as c:
        assert (await c.complete("x", temperature=0)).from_cache
    assert server.count("x") == 2


async def test_only_answers_are_kept(tmp_path: Path) -> None:
    """A 400 for this prompt, a 503 and a cancelled call are asked again next time;
    an answer cut by max_tokens is kept as it is."""
    server = Counter()
    path = tmp_path / "c.db"
    counts = []
    for _ in range(2):
        async with client(server, path) as c:
            results = await c.map(["BAD", "FLAKY", "ok"], temperature=0, max_tokens=1)
            with anyio.move_on_after(0.05):
                server.hold = anyio.Event()
                await c.complete("slow", temperature=0)
            server.hold = None
        counts.append([server.count(p) for p in ("BAD", "FLAKY", "ok", "slow")])
    assert [type(r.error).__name__ for r in results[:2]] == [
        "BadRequestError",
        "ServiceUnavailableError",
    ]
    assert results[2].from_cache
    assert results[2].response is None
    assert results[2].value is not None
    assert results[2].value.finish_reason == "length"
    # The second run sent each failure and the cancelled call again, not the answer.
    sent_again = [after - before for before, after in zip(*counts, strict=True)]
    assert sent_again[2] == 0
    assert all(n >= 1 for n in sent_again[:2])
    assert sent_again[3] == 1


class Reading(BaseModel):
    value: int


class Positive(BaseModel):
    value: int

    @field_validator("value")
    @classmethod
    def positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be positive")
        return value


async def test_a_structured_hit_is_validated_again(tmp_path: Path) -> None:
    server = Counter()
    path = tmp_path / "c.db"
    prompt = 'json:{"value": -3}'
    async with client(server, path) as c:
        first = await c.complete(prompt, temperature=0, response_model=Reading)
        again = await c.complete(prompt, temperature=0, response_model=Reading)
        mapped = await c.map([prompt], temperature=0, response_model=Reading)
    assert first.parsed == again.parsed == Reading(value=-3)
    assert again.from_cache
    assert mapped[0].value == Reading(value=-3)
    assert mapped[0].from_cache
    assert server.count(prompt) == 1
    # The same schema, a stricter validator: the stored answer no longer validates, so
    # it is asked again (and fails validation on its own, after its re-asks).
    async with client(server, path) as c:
        with pytest.raises(llmbatch.StructuredOutputError):
            await c.complete(prompt, temperature=0, response_model=Positive, max_reasks=0)
    assert server.count(prompt) == 2


async def test_a_stream_reads_a_stored_answer_and_stores_its_own(tmp_path: Path) -> None:
    server = FakeServer()
    path = tmp_path / "c.db"
    async with client(server, path) as c:
        streamed = "".join([d async for d in c.stream("hello", temperature=0, max_tokens=4)])
        again = [d async for d in c.stream("hello", temperature=0, max_tokens=4)]
        done = await c.complete("hello", temperature=0, max_tokens=4)
        chunks = [
            ch async for ch in c.stream_chunks([{"role": "user", "content": "yo"}], temperature=0)
        ]
        replayed = [
            ch async for ch in c.stream_chunks([{"role": "user", "content": "yo"}], temperature=0)
        ]
    assert again == [streamed]
    assert done.text == streamed
    assert done.from_cache
    assert "".join(ch.text for ch in replayed) == "".join(ch.text for ch in chunks)
    assert replayed[0].choices[0].delta.content == "re:yo"
    assert replayed[-1].usage is not None
    assert replayed[-1].usage.completion_tokens == 2
    assert len(server.bodies) == 2


async def test_a_hit_is_charged_nothing(tmp_path: Path) -> None:
    """Once the spending limit is spent, a stored answer still comes back."""
    server = Counter()
    path = tmp_path / "c.db"
    async with client(server, path) as c:
        await c.complete("x", temperature=0, max_tokens=5)
    price = {"m": Price(input=1_000_000.0, output=1_000_000.0)}
    async with client(server, path, prices=price, max_cost=1.0) as c:
        assert (await c.complete("x", temperature=0, max_tokens=5)).from_cache
        with pytest.raises(llmbatch.SpendingLimitReached):
            await c.complete("y", temperature=0, max_tokens=5)
        stats = c.stats()
    assert stats.spending is not None
    assert stats.spending.spent == 0.0
    assert stats.cache is not None
    assert stats.cache.saved.dollars == pytest.approx(15.0)


async def test_identical_calls_in_flight_share_one_exchange(tmp_path: Path) -> None:
    server = Counter()
    server.hold = anyio.Event()
    answers: list[Any] = [None] * 3
    async with client(server, tmp_path / "c.db") as c:

        async def call(i: int) -> None:
            answers[i] = await c.complete("same", temperature=0)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(call, i)
            await server.arrived.wait()
            await anyio.sleep(0.01)
            server.hold.set()
    assert server.count("same") == 1
    assert len({a.text for a in answers}) == 1
    assert len({id(a) for a in answers}) == 3  # each caller its own object
    assert sorted(a.from_cache for a in answers) == [False, True, True]


async def test_the_first_caller_leaving_keeps_the_exchange_for_the_others(
    tmp_path: Path,
) -> None:
    server = Counter()
    server.hold = anyio.Event()
    async with client(server, tmp_path / "c.db") as c:
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            first = anyio.CancelScope()

            async def leader() -> None:
                with first:
                    await c.complete("same", temperature=0)

            async def follower() -> None:
                got.append(await c.complete("same", temperature=0))

            tg.start_soon(leader)
            await server.arrived.wait()
            tg.start_soon(follower)
            await anyio.sleep(0.01)
            first.cancel()
            await anyio.sleep(0.01)
            server.hold.set()
        assert got[0].text.startswith("same#")
        assert server.cancelled == 0
        # Stored for the next caller too.
        assert (await c.complete("same", temperature=0)).from_cache


async def test_every_caller_leaving_cancels_the_exchange(tmp_path: Path) -> None:
    server = Counter()
    server.hold = anyio.Event()
    async with client(server, tmp_path / "c.db") as c:
        async with anyio.create_task_group() as tg:
            scopes = [anyio.CancelScope(), anyio.CancelScope()]

            async def call(scope: anyio.CancelScope) -> None:
                with scope:
                    await c.complete("same", temperature=0)

            tg.start_soon(call, scopes[0])
            await server.arrived.wait()
            tg.start_soon(call, scopes[1])
            await anyio.sleep(0.01)
            scopes[1].cancel()  # the follower first: the exchange goes on
            await anyio.sleep(0.01)
            assert server.cancelled == 0
            scopes[0].cancel()
            with anyio.fail_after(5):
                await server.gone.wait()
        server.hold = None
        answer = await c.complete("same", temperature=0)
    assert not answer.from_cache
    assert server.count("same") == 2


async def test_followers_share_a_failure_of_the_request_and_not_a_timeout(
    tmp_path: Path,
) -> None:
    server = Counter()
    server.hold = anyio.Event()
    outcomes: dict[str, list[object]] = {"BAD": [], "slow": []}
    async with client(server, tmp_path / "c.db") as c:

        async def call(prompt: str, timeout: float | None) -> None:
            # (Their own max_tokens: the two prompts never share an HTTP request.)
            size = 2 if prompt == "BAD" else 3
            try:
                answer = await c.complete(prompt, temperature=0, timeout=timeout, max_tokens=size)
                outcomes[prompt].append(answer)
            except llmbatch.LLMBatchError as exc:
                outcomes[prompt].append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "BAD", None)
            tg.start_soon(call, "slow", 0.05)  # its first ask times out
            await server.arrived.wait()
            tg.start_soon(call, "BAD", None)
            tg.start_soon(call, "slow", None)
            await anyio.sleep(0.2)
            server.hold.set()
    bad = outcomes["BAD"]
    assert [type(o).__name__ for o in bad] == ["BadRequestError", "BadRequestError"]
    assert server.count("BAD") == 1
    slow = outcomes["slow"]
    assert isinstance(slow[0], llmbatch.DeadlineExceeded)
    assert isinstance(slow[1], llmbatch.Completion)
    assert not slow[1].from_cache
    assert server.count("slow") == 2


async def test_a_map_left_early_settles_its_followers(tmp_path: Path) -> None:
    server = Counter()
    server.hold = anyio.Event()
    async with client(server, tmp_path / "c.db") as c:
        with anyio.move_on_after(0.1):
            await c.map(["a", "a", "a"], temperature=0)
        server.hold = None
        again = await c.map(["a", "a"], temperature=0)
    assert [r.ok for r in again] == [True, True]


def test_a_sync_client_uses_the_cache(tmp_path: Path) -> None:
    server = Counter()
    path = tmp_path / "c.db"
    with SyncClient(URL, transport=MockTransport(server), cache=path) as c:
        c.complete("x", temperature=0)
        assert c.complete("x", temperature=0).from_cache
        assert all(r.from_cache for r in c.map(["x"], temperature=0))
    assert server.count("x") == 1


def test_bad_cache_settings_fail_at_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(ConfigTypeError, match="cache must be a path"):
        Client(URL, cache=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="a local file or a Redis URL"):
        Client(URL, cache="s3://bucket/answers")
    with pytest.raises(ConfigError, match="max_size"):
        Cache(tmp_path / "c.db", max_size=10)
    with pytest.raises(ConfigTypeError, match="namespace"):
        Cache(tmp_path / "c.db", namespace=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        raise InvalidRequestError("x")
    assert repr(Cache("a.db")) == (
        "Cache('a.db', namespace='', max_size=2147483648, max_age=None, keep_failures=None)"
    )
    assert "secret" not in repr(Cache("redis://:secret@localhost:6379/0"))
    with pytest.raises(ConfigError, match="max_age"):
        Cache("a.db", max_age=-1)
    with pytest.raises(ConfigError, match="keep_failures"):
        Cache("a.db", keep_failures=0)


async def test_what_an_answer_says_of_itself_is_not_the_cache_of_a_call_without_one() -> None:
    server = Counter()
    async with client(server, None) as c:
        answer = await c.complete("x", temperature=0)
        results = await c.map(["x"])
        stats = c.stats()
    assert not answer.from_cache
    assert not results[0].from_cache
    assert stats.cache is None
    assert "cache:" not in str(stats)


def test_results_pickle_with_their_mark(tmp_path: Path) -> None:
    import pickle

    with SyncClient(URL, transport=MockTransport(Counter()), cache=tmp_path / "c.db") as c:
        c.complete("x", temperature=0)
        answer = c.complete("x", temperature=0)
    assert pickle.loads(pickle.dumps(answer)).text == answer.text


async def test_requests_cancelled_by_closing_are_not_kept(tmp_path: Path) -> None:
    server = Counter()
    server.hold = anyio.Event()
    path = tmp_path / "c.db"
    failed: list[BaseException] = []
    async with client(server, path, on_close="cancel") as c:

        async def call() -> None:
            try:
                await c.complete("x", temperature=0)
            except RequestCancelled as exc:
                failed.append(exc)

        c._runtime.task_group.start_soon(call)  # type: ignore[union-attr]
        await server.arrived.wait()
    server.hold = None
    async with client(server, path) as c:
        assert not (await c.complete("x", temperature=0)).from_cache


async def test_entries_of_an_older_key_version_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a key holds changed: answers stored before are asked again, never misread."""
    import llmbatch._cache.key as keys

    server = Counter()
    path = tmp_path / "c.db"
    monkeypatch.setattr(keys, "KEY_VERSION", keys.KEY_VERSION - 1)
    async with client(server, path) as c:
        old = await c.complete("x", temperature=0)
    monkeypatch.undo()
    async with client(server, path) as c:
        new = await c.complete("x", temperature=0)
        again = await c.complete("x", temperature=0)
    assert not new.from_cache
    assert new.text != old.text
    assert again.from_cache
    assert again.text == new.text
    assert server.count("x") == 2


async def test_a_stored_entry_that_cannot_be_read_is_asked_again(tmp_path: Path) -> None:
    import sqlite3

    server = Counter()
    path = tmp_path / "c.db"
    async with client(server, path) as c:
        await c.complete("x", temperature=0)
    with sqlite3.connect(path) as connection:
        connection.execute('UPDATE answers SET value = \'[1, "completion", "cut\'')
    async with client(server, path) as c:
        answer = await c.complete("x", temperature=0)
        stats = c.stats()
    assert not answer.from_cache
    assert stats.cache is not None
    assert stats.cache.unreadable == 1
    assert server.count("x") == 2


async def test_failures_of_the_request_are_kept_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_failures: a 400 for this prompt and a structured answer that failed after
    its re-asks are raised again without asking, until their time is up; a 503 never
    is."""
    import types

    import llmbatch._runtime.caching as caching

    server = Counter()
    path = tmp_path / "c.db"
    kept = Cache(path, keep_failures=3600)
    counts = []
    for _ in range(2):
        async with client(server, kept) as c:
            with pytest.raises(llmbatch.BadRequestError):
                await c.complete("BAD", temperature=0)
            results = await c.map(["BAD", "FLAKY"], temperature=0, max_tokens=2)
            with pytest.raises(llmbatch.StructuredOutputError) as failed:
                await c.complete(
                    'json:{"value": -1}', temperature=0, response_model=Positive, max_reasks=0
                )
        counts.append([server.count(p) for p in ("BAD", "FLAKY", 'json:{"value": -1}')])
    first, second = counts
    assert second[0] == first[0]  # the 400s kept: not asked again
    assert second[1] > first[1]  # a 503 is never kept
    assert second[2] == first[2] == 1
    assert "kept in the response cache" in str(failed.value)
    assert failed.value.text == '{"value": -1}'
    assert isinstance(results[0].error, llmbatch.BadRequestError)
    # Without keep_failures they are asked again; past their time too.
    async with client(server, path) as c:
        with pytest.raises(llmbatch.BadRequestError):
            await c.complete("BAD", temperature=0)
    assert server.count("BAD") == second[0] + 1
    # A kept failure's expiry is wall-clock time: the clock is moved by hand, so a slow
    # machine cannot expire it between two calls.
    wall = [time.time()]
    monkeypatch.setattr(caching, "time", types.SimpleNamespace(time=lambda: wall[0]))
    async with client(server, Cache(path, namespace="short", keep_failures=10)) as c:
        for passed in (0.0, 11.0, 9.0):
            wall[0] += passed
            with pytest.raises(llmbatch.BadRequestError):
                await c.complete("BAD", temperature=0)
    assert server.count("BAD") == second[0] + 3


async def test_an_embedding_read_back_is_at_index_0(tmp_path: Path) -> None:
    """(Its index was its place in the HTTP request that carried it.)"""
    server = Counter()
    async with client(server, tmp_path / "c.db") as c:
        batch = await c.map([{"input": t} for t in ("a", "bb", "ccc")])
        alone = await c.embed("ccc")
    assert batch[2].value is not None
    assert alone.from_cache
    assert alone.index == 0
    assert alone.embedding == batch[2].value.embedding
