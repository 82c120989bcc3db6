"""Every prompt reaches the server once: hypothesis draws the faults of two replicas
(500, 503, 429, refused and dropped connections, in any order), poisoned prompts and
callers that give up at any moment, and a fake server counts what it was sent.

Whatever the retries, bisections, outage requeues and failovers did, no prompt is
answered twice, none is sent again once answered, a result is a success exactly when
the server answered that prompt (with that prompt's own answer), and a poisoned
prompt fails alone without ever being answered. Time is trio's MockClock, so every
backoff, outage wait and cancellation happens at once and the same way each run.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmbatch
from llmbatch import ConnectError, RemoteProtocolError
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

SERVERS = ("http://a.test:8000/v1", "http://b.test:8000/v1")
FAULTS = ("500", "503", "429", "refuse", "drop")
PROMPTS = 24
RETRY = llmbatch.RetryPolicy(
    attempts=4, initial_backoff=0.01, max_backoff=0.05, outage_tolerance=2.0
)
#: Callers and the map share the client; batches of up to 4 prompts.
BATCHING = {
    tier: llmbatch.BatchPolicy(max_batch_size=4, max_wait=0.005) for tier in ("normal", "batch")
}


@dataclass
class CountingServers:
    """Both replicas: each POST takes the next fault of its replica (then answers),
    and what was sent and answered is counted per prompt."""

    faults: dict[str, list[str]]
    poisoned: frozenset[str]
    sent: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)
    sent_after_answer: list[str] = field(default_factory=list)

    async def __call__(self, request: HTTPRequest) -> MockResponse:
        host = urlsplit(request.url).netloc
        if request.url.endswith("/models"):
            return MockResponse(json={"data": [{"id": "m", "max_model_len": 4096}]})
        if request.method != "POST":  # /health probes, /metrics
            return MockResponse(status=200 if request.url.endswith("/health") else 404)
        prompt = json.loads(request.body or b"{}")["prompt"]
        prompts: list[str] = prompt if isinstance(prompt, list) else [prompt]
        for prompt in prompts:
            self.sent[prompt] += 1
            if self.answered[prompt]:
                self.sent_after_answer.append(prompt)
        await anyio.sleep(0.01)  # the server's work, in virtual time
        fault = self.faults[host].pop(0) if self.faults[host] else "ok"
        if fault == "refuse":
            raise ConnectError(f"cannot connect to {host}: connection refused")
        if fault == "drop":  # before an answer was written: nothing was answered
            raise RemoteProtocolError("connection dropped mid-response")
        if fault in ("500", "503", "429"):
            headers = {"retry-after": "0.05"} if fault == "429" else {}
            return MockResponse(
                status=int(fault), json={"error": {"message": fault}}, headers=headers
            )
        if self.poisoned.intersection(prompts):
            return MockResponse(status=400, json={"error": {"message": "poisoned prompt"}})
        for prompt in prompts:
            self.answered[prompt] += 1
        choices = [
            {"index": i, "text": f"echo:{p}", "finish_reason": "length"}
            for i, p in enumerate(prompts)
        ]
        usage = {"prompt_tokens": len(prompts), "completion_tokens": len(prompts)}
        return MockResponse(json={"id": "x", "model": "m", "choices": choices, "usage": usage})


faults = st.lists(st.sampled_from(FAULTS), max_size=10)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    faults_a=faults,
    faults_b=faults,
    poisoned=st.sets(st.integers(0, PROMPTS - 1), max_size=3),
    give_up=st.lists(
        st.one_of(st.none(), st.floats(0.0, 0.2)), min_size=PROMPTS // 2, max_size=PROMPTS // 2
    ),
)
def test_every_prompt_reaches_the_server_once(
    faults_a: list[str], faults_b: list[str], poisoned: set[int], give_up: list[float | None]
) -> None:
    prompts = [f"p{i}" for i in range(PROMPTS)]
    servers = CountingServers(
        # Copies: the server consumes them, and hypothesis reports what it drew.
        faults={
            urlsplit(SERVERS[0]).netloc: list(faults_a),
            urlsplit(SERVERS[1]).netloc: list(faults_b),
        },
        poisoned=frozenset(prompts[i] for i in poisoned),
    )
    results: dict[str, Any] = {}

    async def run() -> None:
        async with llmbatch.Client(
            list(SERVERS),
            transport=MockTransport(servers),
            retry=RETRY,
            batching=BATCHING,  # type: ignore[arg-type]
        ) as client:

            async def caller(prompt: str, patience: float | None) -> None:
                # A caller that gives up leaves its request cancelled, wherever it is.
                with anyio.move_on_after(1e9 if patience is None else patience):
                    try:
                        results[prompt] = await client.complete(prompt, max_tokens=2)
                    except llmbatch.LLMBatchError as exc:
                        results[prompt] = exc
                    return
                results[prompt] = "gave up"

            async def mapper(items: list[str]) -> None:
                answers = await client.map(items, max_tokens=2)
                for prompt, result in zip(items, answers, strict=True):
                    results[prompt] = result.value if result.ok else result.error

            with anyio.fail_after(120):  # virtual seconds: every call ends
                async with anyio.create_task_group() as tg:
                    for prompt, patience in zip(prompts[: PROMPTS // 2], give_up, strict=True):
                        tg.start_soon(caller, prompt, patience)
                    tg.start_soon(mapper, prompts[PROMPTS // 2 :])

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))

    assert set(results) == set(prompts)  # every call ended
    assert not servers.sent_after_answer, servers.sent_after_answer
    for prompt in prompts:
        result = results[prompt]
        assert servers.answered[prompt] <= 1, (prompt, servers.answered[prompt])
        if isinstance(result, llmbatch.Completion):
            assert servers.answered[prompt] == 1, prompt
            assert result.text == f"echo:{prompt}"  # its own answer, not a neighbour's
        if prompt in servers.poisoned:
            # Never answered; usually a 400 of its own (or the last fault, once the
            # retries of a half it was bisected into ran out).
            assert not isinstance(result, llmbatch.Completion), prompt
            assert servers.answered[prompt] == 0
        elif not isinstance(result, llmbatch.Completion) and result != "gave up":
            # Failed for good: only after the server answered nothing for it.
            assert servers.answered[prompt] == 0, (prompt, result)


@pytest.mark.parametrize("prompt_count", [1])
def test_the_counting_server_counts(prompt_count: int) -> None:
    # The property above is only as good as its counter: a fault-free run is
    # answered once per prompt, and a resend would be seen.
    servers = CountingServers(faults={"a.test:8000": [], "b.test:8000": []}, poisoned=frozenset())

    async def run() -> None:
        async with llmbatch.Client(SERVERS[0], transport=MockTransport(servers)) as client:
            await client.complete("p0", max_tokens=2)
        body = json.dumps({"prompt": ["p0"]}).encode()
        await servers(HTTPRequest("POST", SERVERS[0] + "/completions", {}, body))

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert servers.answered["p0"] == 2
    assert servers.sent_after_answer == ["p0"] * prompt_count
