"""The fault matrix: 10,000 prompts through ``map`` against a real simulator process
injecting, per HTTP request, 10% HTTP 500, 5% 429 with Retry-After, 5% 503, 2%
connections dropped mid-response and 1% latency spikes past the client's read
timeout, with one poisoned prompt per 100.

Every exchange is recorded by a thin wrapper around the real transport, so the test
checks more than the results: every clean prompt is answered by exactly one HTTP
exchange, every poisoned prompt fails alone with the server's own message, nothing
is lost or duplicated, no exchange is retried beyond ``RetryPolicy.attempts`` or
after anything but a retryable failure, the client's counts agree with what the
server says it injected, and the counts are printed.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field

import pytest

import llmbatch
from llmbatch._transports.aiohttp import AiohttpTransport
from llmbatch.transports import HTTPRequest, HTTPResponse
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.asyncio_only("records exchanges by wrapping the aiohttp transport"),
]

N = 10_000
POISON_EVERY = 100
ATTEMPTS = 12
SERVER_MESSAGE = "prompt rejected: contains 'POISON' (simulated bad input)"
RETRYABLE = {"429", "500", "503", "RemoteProtocolError", "ReadTimeout"}
RETRY = llmbatch.RetryPolicy(attempts=ATTEMPTS, initial_backoff=0.005, max_backoff=0.05)
# The spikes (1.5 s) outlast the read timeout (1 s); everything else takes milliseconds.
TIMEOUT = llmbatch.Timeout(connect=5, read=1.0, write=5, pool=30)
LIMITS = llmbatch.Limits()


@pytest.fixture(scope="module")
def faulty_sim() -> Iterator[SimulatorProcess]:
    with run_simulator(
        "--speed",
        "200",
        "--poison",
        "POISON",
        "--error-rate-500",
        "0.10",
        "--error-rate-429",
        "0.05",
        "--retry-after",
        "0.01",
        "--error-rate-503",
        "0.05",
        "--drop-rate",
        "0.02",
        "--spike-rate",
        "0.01",
        "--spike-ms",
        "1500",
        "--enable-admin",
    ) as server:
        yield server


@dataclass
class Recorder:
    """Every completions exchange: the prompts it carried and how it ended."""

    exchanges: list[tuple[tuple[str, ...], str]] = field(default_factory=list)

    def record(self, prompts: tuple[str, ...] | None, outcome: str) -> None:
        if prompts is not None:
            self.exchanges.append((prompts, outcome))


class RecordingTransport:
    """The real aiohttp transport, with each exchange's outcome written down."""

    def __init__(self, recorder: Recorder) -> None:
        self._inner = AiohttpTransport(limits=LIMITS, timeout=TIMEOUT)
        self._recorder = recorder

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        prompts = _prompts(request)
        try:
            response = await self._inner.send(request)
        except llmbatch.TransportError as exc:
            self._recorder.record(prompts, type(exc).__name__)
            raise
        return _RecordedResponse(response, prompts, self._recorder)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RecordedResponse:
    def __init__(
        self, inner: HTTPResponse, prompts: tuple[str, ...] | None, recorder: Recorder
    ) -> None:
        self._inner = inner
        self._prompts = prompts
        self._recorder = recorder

    @property
    def status(self) -> int:
        return self._inner.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._inner.headers

    async def read(self) -> bytes:
        try:
            content = await self._inner.read()
        except llmbatch.TransportError as exc:
            self._recorder.record(self._prompts, type(exc).__name__)
            raise
        self._recorder.record(self._prompts, str(self.status))
        return content

    def iter_lines(self) -> AsyncIterator[bytes]:
        return self._inner.iter_lines()

    async def aclose(self) -> None:
        await self._inner.aclose()


def _prompts(request: HTTPRequest) -> tuple[str, ...] | None:
    if not request.url.endswith("/completions") or request.body is None:
        return None
    prompt = json.loads(request.body)["prompt"]
    return tuple(prompt) if isinstance(prompt, list) else (prompt,)


@pytest.mark.slow  # ~6 s: every fault kind against real servers; CI's slow stage
async def test_fault_matrix(
    faulty_sim: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = [
        f"POISON item {i}" if i % POISON_EVERY == POISON_EVERY // 2 else f"item {i}"
        for i in range(N)
    ]
    poisoned = {i for i, p in enumerate(prompts) if p.startswith("POISON")}
    recorder = Recorder()
    started = time.monotonic()
    async with llmbatch.Client(
        faulty_sim.base_url, retry=RETRY, limits=LIMITS, transport=RecordingTransport(recorder)
    ) as client:
        results = await client.map(prompts, max_tokens=2, ignore_eos=True)
    # After the drain on exit: the last batch's seats are back too (a snapshot taken
    # the moment map() returns may still count that batch in flight).
    stats = client.stats()
    elapsed = time.monotonic() - started
    injected: dict[str, int] = faulty_sim.set_faults()["injected"]

    # Nothing lost, nothing duplicated, each result where it belongs.
    assert len(results) == N
    assert [r.index for r in results] == list(range(N))
    # Every clean prompt succeeded; every poisoned one failed alone, with the server's
    # own message.
    assert {r.index for r in results if not r.ok} == poisoned
    for i in poisoned:
        error = results[i].error
        assert isinstance(error, llmbatch.BadRequestError)
        assert error.status_code == 400
        assert error.message == SERVER_MESSAGE  # the server's own words, nothing lost
    for r in results:
        if r.ok:
            assert r.unwrap().usage.completion_tokens == 2
            assert r.unwrap().text  # the simulator's words for this prompt

    # Per prompt, from the wire: clean prompts were in exactly one successful
    # exchange; poisoned ones in none, and their last exchange was theirs alone.
    ok_count: Counter[str] = Counter()
    exchanges_of: Counter[str] = Counter()
    alone_400: Counter[str] = Counter()
    for batch, outcome in recorder.exchanges:
        exchanges_of.update(batch)
        if outcome == "200":
            ok_count.update(batch)
        if outcome == "400" and len(batch) == 1:
            alone_400.update(batch)
    for i, prompt in enumerate(prompts):
        if i in poisoned:
            assert ok_count[prompt] == 0, prompt
            assert alone_400[prompt] == 1, prompt
        else:
            assert ok_count[prompt] == 1, prompt
        # The attempts an item reports are exactly the exchanges it was part of.
        result = results[i]
        if isinstance(result.error, llmbatch.RequestError):
            assert result.error.attempts == exchanges_of[prompt], prompt
        else:
            assert result.unwrap().timings.attempts == exchanges_of[prompt], prompt

    # Retries stay within the bound: one batch (the same prompts) is sent at most
    # ATTEMPTS times, retried only after a retryable failure, and ends in a 200 or a
    # 400 (never by running out of attempts), unless a run of 503s made the client
    # hold the server as unavailable: then the batch went back to the queue, and its
    # prompts were answered in other batches (each exactly once, as checked above).
    sends: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for batch, outcome in recorder.exchanges:
        sends[batch].append(outcome)
    for batch, outcomes in sends.items():
        assert len(outcomes) <= ATTEMPTS, (batch[:2], outcomes)
        assert set(outcomes[:-1]) <= RETRYABLE, outcomes
        handed_back = outcomes[-1] in RETRYABLE and all(
            ok_count[p] == 1 or alone_400[p] == 1 for p in batch
        )
        assert outcomes[-1] in ("200", "400") or handed_back, outcomes
    longest_chain = max(len(o) for o in sends.values())

    # The client's view agrees with the server's: each fault the server injected is
    # one failed exchange (a spike that also drew an error is seen as the timeout).
    seen = Counter(outcome for _, outcome in recorder.exchanges)
    for name in ("500", "429", "503", "drop", "spike"):
        assert injected[name] > 0, f"no {name} injected: the matrix did not run"
    # Every spike outlasts the read timeout.
    assert seen["ReadTimeout"] >= injected["spike"]
    for status in ("500", "429", "503"):
        # Answered before anything else; only a spike on the same request hides one.
        assert injected[status] - injected["spike"] <= seen[status] <= injected[status]
    # A drop cuts a 200 body; on a batch the server rejects (400) there is no body
    # to cut, so some injected drops never reach the client as drops.
    assert 0 < seen["RemoteProtocolError"] <= injected["drop"]
    batch_tier = stats.tiers[llmbatch.Priority.BATCH]
    assert stats.batches_sent == len(recorder.exchanges)
    assert stats.bisections == sum(1 for b, o in recorder.exchanges if o == "400" and len(b) > 1)
    assert batch_tier.done == N - len(poisoned)
    assert batch_tier.failed == len(poisoned)
    assert batch_tier.queued == batch_tier.in_flight == 0
    retried = {p for batch, o in sends.items() if len(o) > 1 for p in batch}
    assert batch_tier.retried == len(retried)
    assert "vllm:num_requests_running" in faulty_sim.metrics()

    with capsys.disabled():
        print(
            f"\nfault matrix: {N:,} prompts in {elapsed:.1f} s: {N - len(poisoned):,} ok, "
            f"{len(poisoned)} poisoned failed alone with the server's 400, 0 lost, "
            f"0 duplicated\n"
            f"  HTTP exchanges {len(recorder.exchanges):,}: "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(seen.items()))
            + f"\n  bisections {stats.bisections}, items retried {batch_tier.retried:,}, "
            f"longest retry chain {longest_chain} of {ATTEMPTS} allowed\n"
            f"  injected by the server: {injected}"
        )
