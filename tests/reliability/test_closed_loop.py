"""Closed-loop admission against a real simulator process: a map rides out a 503
outage and a spell of refused connections with nothing failed and about one probe a
second sent into the outage; too-long prompts fail alone without a bisection storm;
and the controller reads the server's load report and /metrics.

Outages here last a few seconds (bounded); the 15 s storm and 20 s restart of the
issue's targets run in ``llmbatch bench`` (docs/benchmarks.md)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import pytest

import llmbatch
from llmbatch._transports.aiohttp import AiohttpTransport
from llmbatch.transports import HTTPRequest, HTTPResponse
from llmbatch_server.testing import run_simulator

pytestmark = [pytest.mark.anyio, pytest.mark.asyncio_only("records over the aiohttp transport")]


@dataclass
class Recorder:
    """The real aiohttp transport, recording (time, method, path, outcome) per exchange."""

    inner: AiohttpTransport
    log: list[tuple[float, str, str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        path = request.url.split("127.0.0.1", 1)[-1].split("/", 1)[-1]
        if request.method == "POST":
            self.bodies.append(request.body or b"")
        try:
            response = await self.inner.send(request)
        except llmbatch.TransportError as exc:
            self.log.append((time.monotonic(), request.method, path, type(exc).__name__))
            raise
        self.log.append((time.monotonic(), request.method, path, str(response.status)))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    def posts_between(self, start: float, end: float) -> int:
        return sum(1 for t, method, _, _ in self.log if method == "POST" and start <= t < end)

    def sent_between(self, start: float, end: float) -> int:
        return sum(1 for t, _, path, _ in self.log if start <= t < end and "metrics" not in path)


def recorder() -> Recorder:
    return Recorder(
        AiohttpTransport(limits=llmbatch.DEFAULT_LIMITS, timeout=llmbatch.DEFAULT_TIMEOUT)
    )


async def results_of(
    client: llmbatch.Client, n: int, *, at: int, then: object
) -> AsyncIterator[llmbatch.Result[object]]:
    """A map of ``n`` prompts; ``then()`` is called once ``at`` results are in."""
    done = 0
    async for _index, result in client.map_unordered(
        [f"item {i}" for i in range(n)], max_tokens=4, ignore_eos=True
    ):
        done += 1
        if done == at:
            then()  # type: ignore[operator]
        yield result


@pytest.mark.slow  # ~4 s each: an outage and a restart; CI's slow stage
@pytest.mark.parametrize("mode", ["503", "refuse"])
async def test_a_map_rides_out_an_outage_without_failing_or_flooding(mode: str) -> None:
    outage = 3.0
    wire = recorder()
    with run_simulator("--speed", "20", "--enable-admin") as sim:
        started: list[float] = []

        def start_outage() -> None:
            started.append(time.monotonic())
            sim.outage(outage, mode=mode)

        async with llmbatch.Client(sim.base_url, transport=wire) as client:
            with anyio.fail_after(60):
                results = [r async for r in results_of(client, 2000, at=300, then=start_outage)]
            stats = client.stats()
    assert len(results) == 2000
    assert [r.error for r in results if not r.ok] == []
    assert stats.server is not None
    assert stats.server.outages >= 1
    assert stats.server.breaker == "closed"
    # Into the outage (after the first second, when the breaker has opened), about one
    # request a second: a /health probe, and a trial batch once it answers.
    start = started[0]
    during = wire.sent_between(start + 1.0, start + outage)
    assert during <= 2 * (outage - 1.0) + 2, wire.log[-40:]


async def test_streams_started_into_an_outage_wait_for_the_server() -> None:
    with run_simulator("--speed", "20", "--enable-admin") as sim:
        async with llmbatch.Client(sim.base_url) as client:
            await client.complete("warm up", max_tokens=2)  # the server has answered
            sim.outage(2.0, mode="503")

            async def one(i: int, texts: list[str]) -> None:
                texts.append("".join([d async for d in client.stream(f"s{i}", max_tokens=4)]))

            texts: list[str] = []
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for i in range(8):
                        tg.start_soon(one, i, texts)
            stats = client.stats()
    assert len(texts) == 8
    assert all(texts)
    assert stats.tiers[llmbatch.Priority.REALTIME].failed == 0
    assert stats.server is not None
    assert stats.server.outages >= 1


@pytest.mark.parametrize(
    "long",
    [
        # ~600 tokens in 3,240 bytes: the rough estimate (4 bytes a token) already says
        # it is too long, so it goes alone from the start.
        pytest.param("lorem ipsum dolor sit amet " * 120, id="estimated-too-long"),
        # ~515 tokens in 1,200 bytes: the estimate says it fits; the first refusal
        # teaches the client to send such prompts alone.
        pytest.param("{[(<@#$%^&*>)]} " * 75, id="dense-text"),
    ],
)
async def test_too_long_prompts_fail_alone_without_a_bisection_storm(
    long: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's target: with 5 % prompts slightly over the context length, at most
    1.2x the requests of a clean run plus one per bad prompt, and each bad prompt
    fails with the server's own message."""
    normal = "Summarise this note for a colleague: the review moved to Thursday. "
    prompts = [long + str(i) if i % 20 == 7 else f"{normal} {i}" for i in range(2000)]
    bad = {i for i in range(2000) if i % 20 == 7}
    # Full batches only (no idle dispatch), so both runs batch the clean prompts alike
    # whatever the machine's load: what is compared is the too-long handling.
    full = {"batch": llmbatch.BatchPolicy(max_batch_size=64, max_wait=0.05, send_when_idle=False)}
    with run_simulator("--zero-latency", "--max-model-len", "512") as sim:
        clean = recorder()
        async with llmbatch.Client(sim.base_url, transport=clean, batching=full) as client:
            assert all(
                r.ok for r in await client.map([f"{normal} {i}" for i in range(1900)], max_tokens=8)
            )
        wire = recorder()
        async with llmbatch.Client(sim.base_url, transport=wire, batching=full) as client:
            results = await client.map(prompts, max_tokens=8)
    clean_posts = sum(1 for _, method, _, _ in clean.log if method == "POST")
    posts = sum(1 for _, method, _, _ in wire.log if method == "POST")
    # Requests that carried a too-long prompt: one per bad prompt, ideally; each batch
    # still in flight when the server first refuses one costs one more.
    carrying = sum(1 for body in wire.bodies if long.encode() in body)
    assert {r.index for r in results if not r.ok} == bad
    for index in bad:
        error = results[index].error
        assert isinstance(error, llmbatch.BadRequestError)
        assert "maximum context length is 512 tokens" in error.message  # the server's words
    with capsys.disabled():
        print(
            f"\ntoo-long prompts: {posts} requests for 2,000 prompts with {len(bad)} too long, "
            f"{carrying} of them carrying one (a clean run: {clean_posts}; the issue's bound: "
            f"{1.2 * clean_posts + len(bad):.0f})"
        )
    # The bound is 1.2x a clean run plus one per bad prompt. How the clean prompts
    # batch varies with the machine's load (in both runs); what the too-long handling
    # controls is the requests that carry a bad prompt, held here to the bound's slack.
    assert carrying <= len(bad) + 0.2 * clean_posts, (carrying, clean_posts, len(bad))


async def test_the_controller_reads_the_load_report_and_metrics() -> None:
    # A small server, so the map keeps some requests waiting in its own queue.
    with run_simulator("--speed", "50", "--max-num-seqs", "16") as sim:
        async with llmbatch.Client(sim.base_url) as client:
            with anyio.fail_after(60):
                await client.map([f"item {i}" for i in range(600)], max_tokens=16, ignore_eos=True)
            server = client.stats().server
    assert server is not None
    assert server.waiting is not None  # from the endpoint-load-metrics header
    assert server.kv_cache_usage is not None
    assert server.step_time is not None  # from /metrics
    assert server.step_time > 0
    # The server runs 16 at a time: the controller does not keep hundreds waiting there.
    assert server.bulk_limit < server.ceiling


async def test_a_full_queues_503s_are_backpressure_not_an_outage() -> None:
    """vLLM past ``--max-num-queued-reqs`` answers 503: the batch waits a backoff and
    goes back to the client's queue (its retries start afresh), the limit is halved
    while they are many, and nothing is held as an outage or fails."""
    # 8 seats, a queue cap of 4: the client's default limit would put 255 there.
    with run_simulator("--speed", "50", "--max-num-seqs", "8", "--max-num-queued-reqs", "4") as sim:
        retry = llmbatch.RetryPolicy(attempts=2, initial_backoff=0.05)
        async with llmbatch.Client(sim.base_url, retry=retry) as client:
            results = await client.map([f"p{i}" for i in range(300)], max_tokens=4)
            stats = client.stats()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    server = stats.servers[0]
    assert server.outages == 0
    assert "overload_status" in server.signals
    assert server.bulk_limit < 64  # halved from 255 while the refusals were many
