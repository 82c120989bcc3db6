"""SyncClient: the client's methods, blocking, from plain code, from many threads at
once (batched together), from inside a thread that runs its own event loop, and
opened and closed in separate steps (as notebook cells do). Against a real
simulator process."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

import llmbatch
from llmbatch_server.testing import SimulatorProcess, run_simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency") as server:
        yield server


def test_every_method_blocks_and_answers(sim: SimulatorProcess) -> None:
    with llmbatch.SyncClient(sim.base_url) as client:
        assert client.complete("hello", max_tokens=3).usage.completion_tokens == 3
        assert client.chat([{"role": "user", "content": "hi"}], max_tokens=3).text
        assert "".join(client.stream("once upon", max_tokens=4))
        chunks = list(client.stream_chunks("once upon", max_tokens=4, ignore_eos=True))
        assert all(isinstance(chunk, llmbatch.CompletionChunk) for chunk in chunks)
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 4
        chat = list(client.stream_chunks([{"role": "user", "content": "hi"}], max_tokens=2))
        assert isinstance(chat[0], llmbatch.ChatCompletionChunk)
        assert chat[0].choices[0].delta.role == "assistant"
        results = client.map([f"p{i}" for i in range(40)], max_tokens=2)
        assert [r.index for r in results] == list(range(40))
        assert sorted(i for i, _ in client.map_unordered(["a", "b", "c"])) == [0, 1, 2]
        assert len(list(client.imap(["a", "b"]))) == 2
        assert len(client.embed(["a", "b"])) == 2  # type: ignore[arg-type]
        assert client.stats().tiers[llmbatch.Priority.BATCH].done == 45
        assert client.stats().tiers[llmbatch.Priority.REALTIME].done == 3
    with pytest.raises(llmbatch.ClientClosedError):
        client.complete("after close")


def test_calls_from_many_threads_share_batches(sim: SimulatorProcess) -> None:
    answers: list[str] = []
    with llmbatch.SyncClient(
        sim.base_url, batching={"normal": llmbatch.BatchPolicy(max_wait=0.05)}
    ) as client:

        def worker(n: int) -> None:
            for i in range(10):
                answers.append(client.complete(f"thread {n} call {i}", max_tokens=2).text)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        stats = client.stats()
    assert len(answers) == 160
    assert stats.batches_sent < 160  # the threads' calls were batched together
    assert stats.max_batch_size > 1


def test_usable_from_a_thread_that_runs_an_event_loop(sim: SimulatorProcess) -> None:
    async def handler(client: llmbatch.SyncClient) -> str:
        # Blocking inside a coroutine stalls this loop, but the client's own loop runs
        # in another thread, so the call completes.
        return client.complete("from a loop", max_tokens=2).text

    with llmbatch.SyncClient(sim.base_url) as client:
        assert asyncio.run(handler(client))


def test_opened_and_closed_in_separate_steps(sim: SimulatorProcess) -> None:
    client = llmbatch.SyncClient(sim.base_url).open()  # one notebook cell
    try:
        text = client.complete("cell two", max_tokens=2).text  # another
    finally:
        client.close()  # a third
    assert text
    client.close()  # closing twice is harmless
    assert "state=closed" in repr(client)


def test_the_first_call_opens_it_as_the_async_client_does(sim: SimulatorProcess) -> None:
    client = llmbatch.SyncClient(sim.base_url)
    with pytest.raises(llmbatch.ClientClosedError, match="once the client has been opened"):
        client.stats()  # reading it opens nothing
    assert "state=unopened" in repr(client)
    urgent = client.with_options(priority="realtime")
    answers: list[str] = []
    # Concurrent first calls from several threads, one through a view: opened once.
    threads = [
        threading.Thread(target=lambda c=c: answers.append(c.complete("hi", max_tokens=2).text))
        for c in (client, client, urgent, client)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == 4
    assert "state=open" in repr(client)
    client.close()
    assert client.stats().tiers[llmbatch.Priority.REALTIME].done == 1  # the last snapshot
    with pytest.raises(llmbatch.ClientClosedError, match="closed; make a new one"):
        client.complete("after close")
    with pytest.raises(llmbatch.ClientClosedError, match="closed; make a new one"):
        client.open()


def test_a_client_left_open_is_closed_at_exit(sim: SimulatorProcess) -> None:
    # Never closed: the interpreter's exit closes it (its connections too) and does not
    # wait forever on the loop's thread, as it did before the first call could open it.
    script = textwrap.dedent(
        f"""
        import llmbatch

        client = llmbatch.SyncClient({sim.base_url!r})
        print(client.complete("hi", max_tokens=2).text != "")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert "Traceback" not in done.stderr
    assert "Unclosed" not in done.stderr


def test_with_options_view_shares_the_loop(sim: SimulatorProcess) -> None:
    client = llmbatch.SyncClient(sim.base_url)
    urgent = client.with_options(priority="realtime", max_retries=0)
    with pytest.raises(llmbatch.ClientClosedError):
        urgent.open()
    with client:
        assert urgent.complete("hi", max_tokens=2).text
        assert client.stats().tiers[llmbatch.Priority.REALTIME].done == 1
    with pytest.raises(llmbatch.ClientClosedError):
        urgent.complete("after close")


# Every public method of Client, and its constructor: one added there must be added here.
SAME_SIGNATURE = sorted(
    name
    for name, member in vars(llmbatch.Client).items()
    if callable(member)
    and (name == "__init__" or not name.startswith("_"))
    # aclose: close()'s twin for contextlib.aclosing, which a sync client has no use for.
    and name != "aclose"
)


@pytest.mark.parametrize("name", SAME_SIGNATURE)
def test_sync_methods_take_the_async_ones_parameters(name: str) -> None:
    # Editors and help() show the parameters, and a keyword that works on one works
    # on the other: names, kinds and defaults agree (annotations may differ: a
    # SyncClient's map takes no async iterable).
    def shape(function: object) -> list[tuple[str, object, object]]:
        parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
        return [(p.name, p.kind, p.default) for p in parameters]

    assert shape(getattr(llmbatch.SyncClient, name)) == shape(getattr(llmbatch.Client, name))


def test_a_map_option_wrong_for_every_item_raises_at_the_call(sim: SimulatorProcess) -> None:
    with llmbatch.SyncClient(sim.base_url) as client:
        with pytest.raises(llmbatch.InvalidTypeError, match="did you mean 'max_tokens'"):
            client.map(["a", "b"], max_tokenz=4)
        with pytest.raises(llmbatch.InvalidTypeError, match="did you mean 'max_tokens'"):
            next(client.imap(["a", "b"], max_tokenz=4))
        assert client.stats().tiers[llmbatch.Priority.BATCH].done == 0
        # Keywords reach the client as given.
        assert [r.ok for r in client.map(["a", "b"], max_tokens=2, temperature=0)] == [True] * 2
