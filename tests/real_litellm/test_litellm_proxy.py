"""LiteLLM's proxy, a server nobody here wrote, in front of the simulator (CI's
LiteLLM stage). What it sends, measured with litellm 1.108.7 and no database: every
answer carries ``x-ratelimit-{limit,remaining}-{requests,tokens}`` (OpenAI's family,
without resets) for its deployment's ``rpm`` and ``tpm``, which it does not enforce
itself; in front of a provider that limits, it passes that provider's limits on the
same way. The client learns either from them, keeps to them, and loses no
conversation.

Opt in with ``LLMBATCH_LITELLM`` (the ``litellm`` command of an environment with
``litellm[proxy]``; ``server/litellm/ci-stage.sh`` makes one).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import llmbatch
from llmbatch.transports import AiohttpTransport, HTTPRequest, HTTPResponse, Transport
from llmbatch_server.litellm_process import LiteLLMProxyProcess
from llmbatch_server.testing import run_simulator

BINARY = os.environ.get("LLMBATCH_LITELLM")
MODEL = "llmbatch-sim"
CONVERSATIONS = 150

pytestmark = [
    pytest.mark.skipif(
        not BINARY,
        reason="real LiteLLM tests are opt-in: set LLMBATCH_LITELLM to a litellm command "
        "(server/litellm/ci-stage.sh makes one)",
    ),
    pytest.mark.anyio,
    pytest.mark.asyncio_only("one proxy, one backend: the trio path is the same client"),
]


@pytest.fixture(scope="module")
def own_limits() -> Iterator[LiteLLMProxyProcess]:
    """The proxy's deployment limited to 600 requests and 30,000 tokens a minute, in
    front of a simulator that limits nothing."""
    assert BINARY
    with run_simulator("--speed", "50", "--model", MODEL, "--no-chat-batch") as sim:
        with LiteLLMProxyProcess(
            BINARY, upstream=sim.base_url, model=MODEL, rpm=600, tpm=30_000
        ) as proxy:
            yield proxy


@pytest.fixture(scope="module")
def limited_upstream() -> Iterator[LiteLLMProxyProcess]:
    """The proxy with no limits of its own, in front of the simulator playing
    OpenAI's limiter at 600 requests and 12,000 tokens a minute."""
    assert BINARY
    limiter = ("--rate-limit-rpm", "600", "--rate-limit-tpm", "12000")
    with run_simulator("--speed", "50", "--model", MODEL, "--no-chat-batch", *limiter) as sim:
        with LiteLLMProxyProcess(BINARY, upstream=sim.base_url, model=MODEL) as proxy:
            yield proxy


class Recording(Transport):
    """Every POST's send time and status, and its rate-limit headers."""

    def __init__(self) -> None:
        self.inner = AiohttpTransport()
        self.sent: list[tuple[float, int]] = []
        self.headers: list[dict[str, str]] = []

    async def send(self, request: HTTPRequest) -> HTTPResponse:
        at = time.monotonic()
        response = await self.inner.send(request)
        if request.method == "POST":
            self.sent.append((at, response.status))
            headers = response.headers.items()
            self.headers.append({k: v for k, v in headers if "ratelimit" in k or "retry" in k})
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def chat_map(proxy: LiteLLMProxyProcess) -> tuple[Recording, llmbatch.Stats, list[Any]]:
    recording = Recording()
    conversations: list[Any] = [
        [{"role": "user", "content": f"question {i}"}] for i in range(CONVERSATIONS)
    ]
    async with llmbatch.Client(
        proxy.base_url, api_key=proxy.master_key, transport=recording
    ) as client:
        results = await client.map(conversations, max_tokens=16)
        stats = client.stats()
    print({"statuses": Counter(s for _, s in recording.sent), "headers": recording.headers[-1]})
    return recording, stats, results


def busiest_second(recording: Recording) -> int:
    """The most chat requests sent within any one second."""
    times = sorted(at for at, status in recording.sent if status != 404)
    return max(sum(1 for t in times[i:] if t < start + 1.0) for i, start in enumerate(times))


async def test_the_proxys_own_limits_are_learnt_and_kept(
    own_limits: LiteLLMProxyProcess,
) -> None:
    recording, stats, results = await chat_map(own_limits)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert recording.headers[-1]["x-ratelimit-limit-requests"] == "600"
    assert stats.rate is not None
    assert (stats.rate.source, stats.rate.requests_per_minute) == ("learnt", 570)
    assert stats.rate.tokens_per_minute == 28_500
    # 600 a minute, enforced a second at a time: about 10 a second; the busiest
    # second holds the 8 sent before the first answer, a full bucket and its refill.
    # (Before, a 404 for the chat batch route counted as that first answer, and 166
    # conversations went in the first second, before any limit was known.)
    assert busiest_second(recording) <= 30
    assert not [s for _, s in recording.sent if s == 429]


async def test_an_upstream_providers_limits_come_through_the_proxy_and_are_kept(
    limited_upstream: LiteLLMProxyProcess,
) -> None:
    recording, stats, results = await chat_map(limited_upstream)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert stats.rate is not None
    assert (stats.rate.source, stats.rate.tokens_per_minute) == ("learnt", 11_400)
    refused = [s for _, s in recording.sent if s == 429]
    assert len(refused) <= CONVERSATIONS // 100  # the target: at most 1 %
