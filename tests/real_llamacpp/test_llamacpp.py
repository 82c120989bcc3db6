"""llama.cpp's own server as a second real engine (CI's llama.cpp stage): the client
reads what it states and reports (slots, ``llamacpp:*`` metrics), keeps a slot free
for realtime since it takes no priority, and a map survives its kill and restart.

Opt in with ``LLMBATCH_LLAMA_SERVER`` (the ``llama-server`` binary) and
``LLMBATCH_LLAMA_MODEL`` (a GGUF); ``server/llama-cpp/build.sh`` and ``model.sh``
make both.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator

import anyio
import httpx
import pytest

import llmbatch
from llmbatch_server.llama_process import LlamaServerProcess

BINARY = os.environ.get("LLMBATCH_LLAMA_SERVER")
MODEL = os.environ.get("LLMBATCH_LLAMA_MODEL")
SLOTS = 16

pytestmark = [
    pytest.mark.skipif(
        not (BINARY and MODEL),
        reason="real llama.cpp tests are opt-in: set LLMBATCH_LLAMA_SERVER and "
        "LLMBATCH_LLAMA_MODEL (server/llama-cpp/build.sh and model.sh make them)",
    ),
    pytest.mark.anyio,
    pytest.mark.asyncio_only("one engine, one backend: the trio path is the same client"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServerProcess]:
    assert BINARY
    assert MODEL
    with LlamaServerProcess(BINARY, MODEL, parallel=SLOTS) as process:
        yield process


def _deferred(server: LlamaServerProcess) -> int:
    text = httpx.get(server.base_url[: -len("/v1")] + "/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("llamacpp:requests_deferred"):
            return int(float(line.split()[-1]))
    raise AssertionError("no llamacpp:requests_deferred in /metrics")


async def test_the_client_reads_what_llama_cpp_states_and_reports(
    server: LlamaServerProcess,
) -> None:
    async with llmbatch.Client(server.base_url) as client:
        prompts = [f"prompt {i}" for i in range(5000)]
        started = time.monotonic()
        async for _index, result in client.map_unordered(prompts, max_tokens=16):
            assert result.ok
            if time.monotonic() - started > 1.5:  # three /metrics reads, with work there
                state = client.stats().servers[0]
                break
    assert state.kind == "llama.cpp"
    seats = state.inference("seats")
    assert seats is not None
    assert (seats.value, seats.source) == (SLOTS, "stated")
    assert "total_slots 16" in seats.evidence
    assert state.bulk_limit <= SLOTS - state.realtime_reserve
    assert "metrics_gauges" in state.signals


async def test_bulk_leaves_a_slot_free_so_realtime_never_queues_behind_it(
    server: LlamaServerProcess,
) -> None:
    """llama.cpp takes no priority: a realtime request that finds every slot taken
    waits behind bulk in its queue. The client keeps bulk below the stated slots."""
    deferred: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            deferred.append(_deferred(server))
            time.sleep(0.05)

    deadline = time.monotonic() + 30
    while _deferred(server):  # what an earlier test left queued there drains first
        assert time.monotonic() < deadline, "llama.cpp's queue did not drain"
        await anyio.sleep(0.1)
    watcher = threading.Thread(target=watch, daemon=True)
    try:
        async with llmbatch.Client(server.base_url) as client:
            bulk = [f"bulk {i} the river and the mountain" for i in range(3000)]
            async with anyio.create_task_group() as tg:
                results: list[llmbatch.Result[llmbatch.Completion]] = []

                async def run_bulk() -> None:
                    results.extend(await client.map(bulk, max_tokens=32))

                tg.start_soon(run_bulk)
                await anyio.sleep(1.0)
                watcher.start()  # while bulk saturates what the client lets through
                # At least 20 calls, and on until the watcher has 20 reads of the
                # queue: a busy llama-server answers /metrics slowly (in CI once, 6
                # reads in 20 calls' time), and the check needs the reads.
                i = 0
                ends = time.monotonic() + 60
                while i < 20 or (len(deferred) < 20 and time.monotonic() < ends):
                    answer = await client.complete(
                        f"realtime {i}", priority="realtime", max_tokens=8
                    )
                    assert answer.text is not None
                    await anyio.sleep(0.1)
                    i += 1
                tg.cancel_scope.cancel()
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=5)
    assert len(deferred) >= 20
    assert max(deferred) == 0, f"llama.cpp queued requests: {Counter(deferred)}"


async def test_a_map_survives_a_kill_and_restart_with_every_result_once() -> None:
    assert BINARY
    assert MODEL
    process = LlamaServerProcess(BINARY, MODEL, parallel=SLOTS)
    process.start()
    retry = llmbatch.RetryPolicy(attempts=5, outage_tolerance=60)
    seen: Counter[int] = Counter()
    try:
        async with llmbatch.Client(process.base_url, retry=retry) as client:
            prompts = [f"prompt {i}" for i in range(1500)]
            killed = False
            async for index, result in client.map_unordered(prompts, max_tokens=16):
                assert result.ok, result.error
                seen[index] += 1
                if len(seen) == 300 and not killed:
                    killed = True
                    process.kill()
                    await anyio.to_thread.run_sync(process.start)  # the same port
            assert client.stats().tiers[llmbatch.Priority.BATCH].retried >= 1
    finally:
        process.stop()
    assert seen == Counter(range(1500))


async def test_structured_outputs_go_as_json_schema(server: LlamaServerProcess) -> None:
    # llama.cpp's dialect: a json_schema field, which it honours for a list of
    # prompts on /v1/completions (where it ignores response_format).
    import enum

    from pydantic import BaseModel, Field

    class Kind(enum.Enum):
        BUG = "bug"
        FEATURE = "feature"

    class Ticket(BaseModel):
        kind: Kind
        urgent: bool
        priority: int = Field(ge=0, le=9)

    async with llmbatch.Client(server.base_url) as client:
        results = await client.map(
            [f"Ticket {i}: classify it as JSON." for i in range(100)],
            response_model=Ticket,
            max_tokens=200,
        )
        stats = client.stats().structured
    ok = sum(r.ok for r in results)
    print(f"llama.cpp structured: {ok}/100 validated, {stats.reasked} re-asked")
    assert ok >= 99, [str(r.error) for r in results if not r.ok][:3]


async def test_a_batchs_usage_counts_every_prompt_not_the_first_alone(
    server: LlamaServerProcess,
) -> None:
    # llama.cpp answers a list of prompts with its first prompt's usage: read as the
    # list's, eight prompts of 8 tokens each came to 8 tokens in all, one apiece.
    one_request = llmbatch.BatchPolicy(max_batch_size=8, max_wait=1.0, send_when_idle=False)
    async with llmbatch.Client(server.base_url, batching={"batch": one_request}) as client:
        results = await client.map([f"Count to {i}:" for i in range(8)], max_tokens=8)
        stats = client.stats()
    assert all(r.ok for r in results), [str(r.error) for r in results if not r.ok][:3]
    assert stats.max_batch_size == 8
    answers = [r.value for r in results]
    assert {a.timings.batch_size for a in answers} == {8}
    for answer in answers:
        if answer.finish_reason == "length":  # (a tiny random model seldom stops)
            assert answer.usage.completion_tokens == 8
        assert answer.usage.prompt_tokens >= 3
    assert stats.completion_tokens >= 8 * sum(a.finish_reason == "length" for a in answers)


async def test_vllms_guided_fields_constrain_llama_cpps_answers(
    server: LlamaServerProcess,
) -> None:
    # The same call a vLLM user writes: guided_json and guided_choice in extra_body,
    # sent as llama.cpp's json_schema and grammar (it ignores the guided_* names and
    # answers a tiny random model's free text, which is never one of the choices).
    import json

    schema = {
        "type": "object",
        "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}},
        "required": ["label"],
    }
    choices = ["positive", "negative", "neutral"]
    async with llmbatch.Client(server.base_url) as client:
        schemed = await client.map(
            [f"Is message {i} spam?" for i in range(40)],
            # A grammar lets the model pad with whitespace: room for it to finish.
            max_tokens=200,
            extra_body={"guided_json": schema},
        )
        chosen = await client.map(
            [f"Sentiment of review {i}:" for i in range(40)],
            max_tokens=10,
            extra_body={"guided_choice": choices},
        )
        with pytest.raises(llmbatch.InvalidRequestError, match="no regex constraint"):
            await client.complete("x", extra_body={"guided_regex": "a+"})
    labels = [json.loads(r.value.text)["label"] for r in schemed if r.ok]
    assert len(labels) == 40, [str(r.error) for r in schemed if not r.ok][:3]
    assert set(labels) <= {"spam", "ham"}
    assert all(r.ok for r in chosen), [str(r.error) for r in chosen if not r.ok][:3]
    assert {r.value.text for r in chosen} <= set(choices)
