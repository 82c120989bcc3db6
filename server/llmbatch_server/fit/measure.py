"""Measure a running server from outside: what ``llmbatch-server fit`` sends.

Three probes, each on an otherwise idle server:

- **decode**: one request of ``k`` short unique prompts (k = 1, 2, 4, ...) with
  ``ignore_eos``, once for ``tokens`` output tokens and once for a quarter as
  many: the difference is ``3/4 tokens`` engine steps with ``k`` sequences (see
  :meth:`Prober.decode_point`). ``/metrics``, where
  the server has vLLM's gauges, shows how many ran: once fewer run than were sent,
  the server's ``max_num_seqs`` is found and larger ``k`` would only queue.
- **TTFT**: a lone streamed request, to its first token.
- **prefill**: single prompts of growing length answered with one token: the
  slope of latency against prompt tokens is the prefill cost per token.
- **batch**: one HTTP request of several short prompts, for the API server's
  cost per prompt.
- **burst**: one-prompt requests sent at once, a few and then many: the API server
  answers them one after another, so the time they take grows by its cost per
  request.

Prompts start with a random word so no prefix cache serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from llmbatch_server._lifetime import in_background
from llmbatch_server.fit.model import BurstPoint, DecodePoint, FittedLimits, PrefillPoint, line

_TEXT = (
    "the quick brown fox jumps over a lazy dog while servers batch prompts and tokens "
    "flow through every step of the engine at its own pace"
)
_WORDS = tuple(_TEXT.split())


@dataclass(frozen=True, slots=True)
class Probe:
    """What to send; the defaults take about a minute on a small CPU model."""

    sequences: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    tokens: int = 32
    prompt_lengths: tuple[int, ...] = (16, 256, 1024)
    repeat: int = 3
    batch_prompts: int = 16
    #: One-prompt requests sent at once, one probe each (at least two sizes).
    burst: tuple[int, ...] = (8, 40)
    timeout: float = 300.0


@dataclass(frozen=True, slots=True)
class Measured:
    decode: tuple[DecodePoint, ...]
    prefill: tuple[PrefillPoint, ...]
    idle_ttft_s: float
    limits: FittedLimits
    batch_prompts: int
    batch_latency_s: float
    batch_prompt_tokens: int
    burst: tuple[BurstPoint, ...] = ()
    #: Inter-token gaps of streams decoding alone (seconds), for the steps' spread.
    gaps: tuple[float, ...] = ()


class Prober:
    """One server, one model; the probes above."""

    def __init__(self, http: httpx.AsyncClient, model: str, probe: Probe) -> None:
        self._http = http
        self._model = model
        self._probe = probe
        # Unseeded: a second fit of the same server must not meet the first one's prompts
        # in its prefix cache.
        self._rng = random.Random()
        self._tokens_per_word = 1.0

    def prompt(self, words: int) -> str:
        """A prompt no earlier one shares a prefix with."""
        head = f"{self._rng.randrange(10**9):09d}"
        return head + " " + " ".join(self._rng.choice(_WORDS) for _ in range(max(words, 1)))

    async def complete(self, prompt: str | list[str], max_tokens: int) -> dict[str, Any]:
        body = {"model": self._model, "prompt": prompt, "max_tokens": max_tokens}
        body |= {"ignore_eos": True, "temperature": 0}
        try:
            response = await self._http.post("/completions", json=body)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A kept-alive connection the server closed as it went idle: once more.
            response = await self._http.post("/completions", json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def calibrate(self) -> None:
        """Tokens per word of :meth:`prompt`, so prompt lengths land near their aim."""
        answer = await self.complete(self.prompt(100), 1)
        self._tokens_per_word = max(answer["usage"]["prompt_tokens"] / 101, 0.1)

    async def stream_ttft(self, prompt: str) -> float:
        """Seconds until the first token of one streamed request."""
        body = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": 2,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        start = time.perf_counter()
        first: float | None = None
        async with self._http.stream("POST", "/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: ") and '"text"' in line:
                    first = time.perf_counter()
        return (first or time.perf_counter()) - start

    async def stream_gaps(self, tokens: int) -> list[float]:
        """The gaps between the tokens of one stream decoding alone."""
        body = {
            "model": self._model,
            "prompt": self.prompt(8),
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        arrivals: list[float] = []
        async with self._http.stream("POST", "/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"text"' in line:
                    arrivals.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(arrivals)]

    async def together(self, k: int, max_tokens: int) -> float:
        """Latency of one request of k prompts: the engine gets all k at once."""
        started = time.perf_counter()
        await self.complete([self.prompt(8) for _ in range(k)], max_tokens)
        return time.perf_counter() - started

    async def decode_point(self, k: int, gauges: Gauges) -> DecodePoint:
        """One engine step with k sequences decoding.

        One request of k prompts with ``tokens`` output tokens each takes the API
        server's work, one prefill and ``tokens - 1`` steps of k sequences; with a
        quarter as many tokens, the same work, the same prefill and fewer steps: the
        difference over the token difference is one step, free of the prefill, the API
        server, the client and the order requests arrive in. Each is the median of ``repeat``
        runs, interleaved: a server sharing its cores with others varies run to run.
        """
        long, short = self._probe.tokens, max(self._probe.tokens // 4, 1)
        gauges.reset()
        long_s, short_s = [], []
        for _ in range(self._probe.repeat):
            long_s.append(await self.together(k, long))
            short_s.append(await self.together(k, short))
        spent = statistics.median(long_s) - statistics.median(short_s)
        tpot = max(spent, 0.0) / (long - short)
        return DecodePoint(k, tpot, gauges.peak_running)

    async def prefill_point(self, tokens: int) -> PrefillPoint:
        words = max(int(tokens / self._tokens_per_word), 1)
        latencies, counts = [], []
        for _ in range(self._probe.repeat):
            started = time.perf_counter()
            answer = await self.complete(self.prompt(words), 1)
            latencies.append(time.perf_counter() - started)
            counts.append(answer["usage"]["prompt_tokens"])
        return PrefillPoint(int(statistics.median(counts)), statistics.median(latencies))

    async def burst_point(self, requests: int) -> BurstPoint:
        """Seconds until the last of ``requests`` one-prompt requests sent at once is
        answered (median of ``repeat``)."""
        runs = []
        for _ in range(self._probe.repeat):
            prompts = [self.prompt(8) for _ in range(requests)]
            started = time.perf_counter()
            await asyncio.gather(*(self.complete(p, 1) for p in prompts))
            runs.append(time.perf_counter() - started)
        return BurstPoint(requests, statistics.median(runs))

    async def batch_point(self) -> tuple[float, int]:
        prompts = [self.prompt(8) for _ in range(self._probe.batch_prompts)]
        latencies, tokens = [], 0
        for _ in range(self._probe.repeat):
            started = time.perf_counter()
            answer = await self.complete(prompts, 1)
            latencies.append(time.perf_counter() - started)
            tokens = answer["usage"]["prompt_tokens"]
            prompts = [self.prompt(8) for _ in prompts]
        return statistics.median(latencies), tokens


class Gauges:
    """Polls vLLM's running gauge in the background; ``peak_running`` since reset."""

    INTERVAL = 0.05

    def __init__(self, http: httpx.AsyncClient, metrics_url: str) -> None:
        self._http = http
        self._url = metrics_url
        self.available = True
        self.peak_running: int | None = None
        self.peak_waiting = 0

    def reset(self) -> None:
        self.peak_running = None
        self.peak_waiting = 0

    async def poll(self) -> None:
        while self.available:
            values = await self.read()
            if values is None:
                self.available = False
                return
            running = int(values.get("vllm:num_requests_running", 0))
            self.peak_running = max(self.peak_running or 0, running)
            self.peak_waiting = max(
                self.peak_waiting, int(values.get("vllm:num_requests_waiting", 0))
            )
            await asyncio.sleep(self.INTERVAL)

    async def read(self) -> dict[str, float] | None:
        """The server's metrics (None: it has no vLLM gauges)."""
        try:
            response = await self._http.get(self._url)
        except httpx.HTTPError:
            return None
        if response.status_code != 200 or "vllm:num_requests_running" not in response.text:
            return None
        return metric_values(response.text)


def metric_values(text: str) -> dict[str, float]:
    """Each series' value summed over its labels, plus ``cache_config_info``'s labels."""
    out: dict[str, float] = {}
    for row in text.splitlines():
        if row.startswith("#") or " " not in row:
            continue
        name_labels, _, value = row.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name == "vllm:cache_config_info":
            for pair in name_labels.partition("{")[2].rstrip("}").split(","):
                key, _, raw = pair.partition("=")
                with contextlib.suppress(ValueError):
                    out[f"cache_config_info.{key.strip()}"] = float(raw.strip('"'))
            continue
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out


async def discover_model(http: httpx.AsyncClient, model: str | None) -> tuple[str, int | None]:
    """The model to probe (the first served, unless named) and its context length."""
    response = await http.get("/models")
    response.raise_for_status()
    cards = response.json()["data"]
    card = next((c for c in cards if c.get("id") == model), None) if model else cards[0]
    if card is None:
        raise ValueError(
            f"model {model!r} is not served; the server has {[c.get('id') for c in cards]}"
        )
    length = card.get("max_model_len")
    return str(card["id"]), int(length) if length else None


def polling(gauges: Gauges) -> contextlib.AbstractAsyncContextManager[None]:
    """The gauges polled for the ``async with`` block."""
    return in_background(gauges.poll())


async def measure(
    base_url: str, probe: Probe, *, api_key: str | None = None, model: str | None = None
) -> tuple[str, Measured]:
    """Run every probe against ``base_url`` (…/v1); (the model, what was measured)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    parts = urlsplit(base_url)
    limits = httpx.Limits(max_connections=max(*probe.sequences, *probe.burst) + 8)
    async with httpx.AsyncClient(
        base_url=base_url.rstrip("/"), headers=headers, timeout=probe.timeout, limits=limits
    ) as http:
        name, max_model_len = await discover_model(http, model)
        prober = Prober(http, name, probe)
        gauges = Gauges(http, f"{parts.scheme}://{parts.netloc}/metrics")
        await prober.complete(prober.prompt(4), 2)  # first-request costs out of the way
        await prober.calibrate()
        decode, ttft, max_num_seqs = await _decode(prober, gauges, probe.sequences)
        prefill = await _prefill(prober, probe, max_model_len)
        batch_latency, batch_tokens = await prober.batch_point()
        burst = [await prober.burst_point(n) for n in sorted(set(probe.burst))]
        gaps = [g for _ in range(probe.repeat) for g in await prober.stream_gaps(probe.tokens)]
        cache = await gauges.read() or {}
    blocks = cache.get("cache_config_info.num_gpu_blocks")
    block_size = cache.get("cache_config_info.block_size")
    fitted_limits = FittedLimits(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_tokens=int(blocks * block_size) if blocks and block_size else None,
        block_size=int(block_size) if block_size else None,
    )
    return name, Measured(
        decode=tuple(decode),
        prefill=prefill,
        idle_ttft_s=ttft,
        limits=fitted_limits,
        batch_prompts=probe.batch_prompts,
        batch_latency_s=batch_latency,
        batch_prompt_tokens=batch_tokens,
        burst=tuple(burst),
        gaps=tuple(gaps),
    )


async def prefill_cost(
    base_url: str,
    *,
    api_key: str | None = None,
    model: str | None = None,
    probe: Probe = Probe(),
) -> tuple[float, tuple[PrefillPoint, ...]]:
    """The prefill probe alone (a few seconds on an idle server): seconds a step
    grows per prompt token, as ``fit`` measures ``per_prefill_token``, and its points."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(
        base_url=base_url.rstrip("/"), headers=headers, timeout=probe.timeout
    ) as http:
        name, max_model_len = await discover_model(http, model)
        prober = Prober(http, name, probe)
        await prober.complete(prober.prompt(4), 2)  # first-request costs out of the way
        await prober.calibrate()
        points = await _prefill(prober, probe, max_model_len)
    _, per_token = line([p.prompt_tokens for p in points], [p.latency_s for p in points])
    return max(per_token, 0.0), points


async def _prefill(
    prober: Prober, probe: Probe, max_model_len: int | None
) -> tuple[PrefillPoint, ...]:
    """The prefill points, at the probe's lengths below half the context."""
    aims = [t for t in probe.prompt_lengths if max_model_len is None or t < max_model_len // 2]
    return tuple([await prober.prefill_point(t) for t in aims or probe.prompt_lengths[:1]])


async def _decode(
    prober: Prober, gauges: Gauges, sequences: Sequence[int]
) -> tuple[list[DecodePoint], float, int | None]:
    """Decode points up to the server's limit; (points, idle TTFT, its max_num_seqs)."""
    points: list[DecodePoint] = []
    idle_ttft = statistics.median([await prober.stream_ttft(prober.prompt(8)) for _ in range(3)])
    max_num_seqs: int | None = None
    async with polling(gauges):
        for k in sorted(set(sequences)):
            point = await prober.decode_point(k, gauges)
            peak = point.peak_running
            if gauges.available and peak and peak < k and gauges.peak_waiting >= k - peak:
                # Fewer ran than were sent and the rest queued: the server's limit;
                # this TPOT mixes both, and larger k would only queue more.
                max_num_seqs = peak
                break
            points.append(point)
    return points, idle_ttft, max_num_seqs
