"""A chat map against the simulator playing a hosted provider's rate limiter.

    python -m llmbatch_bench.experiments.hosted --json out.json
    python -m llmbatch_bench.experiments.hosted --conversations 3000 --rpm 6000 --tpm 90000
    python -m llmbatch_bench.experiments.hosted --processes 2 --third-party 0.5
    python -m llmbatch_bench.experiments.hosted --contender asyncopenai

``--contender asyncopenai`` runs what an app without llmbatch would: openai's
``AsyncOpenAI`` with its own retries (``max_retries=8``: it honours Retry-After and
``retry-after-ms``, with its backoff and jitter) under a plain semaphore of 64
calls, one chat call a conversation. ``--contender both`` runs llmbatch, then
AsyncOpenAI, each against a simulator of its own (a fresh limiter).

No ``RateLimit`` numbers are stated: whatever the client does about the limit it
learns from the answers. With ``--processes N`` the conversations are split over N
worker processes that share ``RateLimit(redis_url=..., key=...)`` through a real
redis-server (what one learns, the others use; a 429's wait holds them all). With
``--third-party F`` another process, an app that knows nothing of llmbatch's key,
spends F of both limits (its own stated ``RateLimit``) for as long as the map runs:
the map's processes see it only through the provider's ``remaining``. Each HTTP
answer's status is recorded by the wire log's transport around llmbatch's own, so
the report counts the 429s as the server gave them, and every conversation's outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import llmbatch
from llmbatch_bench.closedloop.wirelog import RecordingTransport, aiohttp_transport
from llmbatch_server.testing import run_simulator

__all__ = ["main"]

#: Seconds after which the steady rate is measured (the issue's first 10 s).
STEADY_AFTER = 10.0
#: The plain AsyncOpenAI app: its calls at once, and openai's retries of each.
OPENAI_CONCURRENCY = 64
OPENAI_RETRIES = 8
CONTENDERS = ("llmbatch", "asyncopenai")


async def _run_openai(url: str, conversations: int, max_tokens: int) -> dict[str, Any]:
    """AsyncOpenAI with its retries under a semaphore: every POST as (sent, done,
    status), as the wire log records llmbatch's."""
    import importlib.util

    import openai

    # openai 3 sends through httpx2 (httpx's successor), earlier ones through httpx.
    http_lib: Any = importlib.import_module(
        "httpx2" if importlib.util.find_spec("httpx2") else "httpx"
    )
    posts: list[list[Any]] = []

    class Recording(http_lib.AsyncHTTPTransport):  # type: ignore[misc]
        async def handle_async_request(self, request: Any) -> Any:
            sent = time.time()
            try:
                response = await super().handle_async_request(request)
            except http_lib.HTTPError:
                if request.method == "POST":
                    posts.append([sent, time.time(), "error"])
                raise
            if request.method == "POST":
                posts.append([sent, time.time(), str(response.status_code)])
            return response

    limits = http_lib.Limits(max_connections=OPENAI_CONCURRENCY)
    http = http_lib.AsyncClient(transport=Recording(limits=limits), timeout=600)
    client = openai.AsyncOpenAI(
        base_url=url, api_key="unused", max_retries=OPENAI_RETRIES, http_client=http
    )
    models = await client.models.list()
    model = models.data[0].id
    gate = asyncio.Semaphore(OPENAI_CONCURRENCY)
    answered = failed = prompt_tokens = 0
    started = time.perf_counter()

    async def one(i: int) -> None:
        nonlocal answered, failed, prompt_tokens
        async with gate:
            try:
                answer = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"question {i} please"}],
                    max_tokens=max_tokens,
                )
            except openai.APIError:
                failed += 1
                return
        answered += 1
        prompt_tokens += answer.usage.prompt_tokens if answer.usage else 0

    await asyncio.gather(*(one(i) for i in range(conversations)))
    wall = time.perf_counter() - started
    await client.close()
    return {
        "posts": posts,
        "answered": answered,
        "failed": failed,
        "wall_s": round(wall, 2),
        "prompt_tokens": prompt_tokens,
        "rate": None,
        "cooldowns_heard": None,
        "provider_limits": None,
    }


async def _run_client(
    url: str,
    conversations: int,
    max_tokens: int,
    rate_limit: llmbatch.RateLimit | None,
    *,
    first: int = 0,
    seconds: float | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, Any]:
    """One client's map (until ``seconds`` pass or ``stop`` is set, if given); its
    POSTs as (sent, done, outcome) in epoch seconds."""
    transport = RecordingTransport(aiohttp_transport())
    epoch = time.time() - time.monotonic()
    answered = failed = 0
    async with llmbatch.Client(url, transport=transport, rate_limit=rate_limit) as client:
        inputs: Iterator[Any] = (
            [{"role": "user", "content": f"question {i} please"}]
            for i in range(first, first + conversations)
        )
        started = time.perf_counter()

        async def drain() -> None:
            nonlocal answered, failed
            async for _, result in client.map_unordered(inputs, max_tokens=max_tokens):
                if result.error is None:
                    answered += 1
                else:
                    failed += 1

        mapping = asyncio.ensure_future(drain())
        waits: set[asyncio.Future[Any]] = {mapping}
        if stop is not None:
            waits.add(asyncio.ensure_future(stop.wait()))
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        wall = time.perf_counter() - started
        stats = client.stats()
    server = stats.servers[0]
    shared = stats.shared
    return {
        "posts": [
            [e.sent + epoch, e.done + epoch, e.outcome] for e in transport.log if e.method == "POST"
        ],
        "answered": answered,
        "failed": failed,
        "wall_s": round(wall, 2),
        "prompt_tokens": stats.prompt_tokens,
        "rate": None if stats.rate is None else stats.rate.model_dump(mode="json"),
        "cooldowns_heard": None if shared is None else shared.cooldowns_heard,
        "provider_limits": None
        if server.provider_limits is None
        else server.provider_limits.model_dump(mode="json"),
    }


def _summary(
    reports: list[dict[str, Any]],
    third: dict[str, Any] | None,
    *,
    conversations: int,
    max_tokens: int,
    rpm: int,
    tpm: int,
    share: float,
) -> dict[str, Any]:
    """The map's processes together: 429s, the rate after the first 10 s against
    what the limit leaves them (``share`` of it: all of it but a third party's)."""
    posts = [p for r in reports for p in r["posts"]]
    origin = min(p[0] for p in posts)
    answered = sum(r["answered"] for r in reports)
    refused = sum(1 for p in posts if p[2] == "429")
    per_second: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for sent, _, outcome in posts:
        per_second[int(sent - origin)][0 if outcome == "200" else 1] += 1
    # The binding limit in conversations a second: requests, or tokens as the
    # provider counts them (the prompt's, from the usage, and max_tokens).
    prompt_tokens = sum(r["prompt_tokens"] for r in reports)
    per_conversation = prompt_tokens / max(1, answered) + max_tokens
    binding = share * min(rpm / 60, tpm / 60 / per_conversation)
    ok_times = sorted(p[1] - origin for p in posts if p[2] == "200")
    steady = [t for t in ok_times if t >= STEADY_AFTER]
    steady_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else None
    wall = max(p[1] for p in posts) - origin
    out: dict[str, Any] = {
        "conversations": conversations,
        "processes": len(reports),
        "wall_s": round(wall, 2),
        "answered": answered,
        "failed": sum(r["failed"] for r in reports),
        "http_requests": len(posts),
        "http_429": refused,
        "share_429": round(refused / max(1, len(posts)), 4),
        "conversations_per_s": round(answered / wall, 2),
        "binding_per_s": round(binding, 2),
        "steady_per_s": None if steady_rate is None else round(steady_rate, 2),
        "steady_share": None if steady_rate is None else round(steady_rate / binding, 3),
        "http_429_first_second": sum(1 for p in posts if p[2] == "429" and p[1] - origin < 1),
        "per_second_ok_429": {str(k): v for k, v in sorted(per_second.items())},
        "per_process_ok_429": [
            {
                str(k): v
                for k, v in sorted(
                    collections.Counter((int(p[0] - origin), p[2]) for p in r["posts"]).items()
                )
            }
            for r in reports
        ]
        if len(reports) > 1
        else None,
        "rates": [r["rate"] for r in reports],
        "cooldowns_heard": [r["cooldowns_heard"] for r in reports],
        "provider_limits": reports[0]["provider_limits"],
    }
    if third is not None:
        theirs = third["posts"]
        out["third_party"] = {
            "share": round(1 - share, 3),
            "answered": third["answered"],
            "http_requests": len(theirs),
            "http_429": sum(1 for p in theirs if p[2] == "429"),
        }
    return out


def _spawn(args: list[str], *, stdin: int | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "llmbatch_bench.hosted", "--worker", *args]
    return subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, text=True)


def _report(worker: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    stdout, _ = worker.communicate(timeout=timeout)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if worker.returncode != 0 or not lines:
        raise RuntimeError(f"a worker failed (exit {worker.returncode})")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def _worker(args: argparse.Namespace) -> int:
    rate_limit = None
    if args.third_rpm or args.third_tpm:
        rate_limit = llmbatch.RateLimit(
            requests_per_minute=args.third_rpm or None, tokens_per_minute=args.third_tpm or None
        )
    elif args.redis_url:
        rate_limit = llmbatch.RateLimit(redis_url=args.redis_url, key=args.key)

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        if args.until_stdin_closes:
            # The third party: it stops, and says what it did, when the map is done
            # (its parent closes its stdin then).
            reader = asyncio.StreamReader()
            await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
            )

            async def watch() -> None:
                await reader.read()
                stop.set()

            watching = asyncio.ensure_future(watch())
        report = await _run_client(
            args.base_url,
            args.conversations,
            args.max_tokens,
            rate_limit,
            first=args.first,
            seconds=args.seconds,
            stop=stop,
        )
        if args.until_stdin_closes:
            watching.cancel()
        return report

    print(json.dumps(asyncio.run(run())), flush=True)
    return 0


def _measure(args: argparse.Namespace, base_url: str, contender: str) -> dict[str, Any]:
    share = 1.0 - args.third_party
    if contender == "asyncopenai":
        report = asyncio.run(_run_openai(base_url, args.conversations, args.max_tokens))
        return _summary(
            [report], None, conversations=args.conversations, max_tokens=args.max_tokens,
            rpm=args.rpm, tpm=args.tpm, share=share,
        )  # fmt: skip
    if args.processes == 1 and not args.third_party:
        report = asyncio.run(_run_client(base_url, args.conversations, args.max_tokens, None))
        return _summary(
            [report], None, conversations=args.conversations, max_tokens=args.max_tokens,
            rpm=args.rpm, tpm=args.tpm, share=share,
        )  # fmt: skip
    from contextlib import ExitStack

    from llmbatch_server.redis_process import run_redis

    with ExitStack() as stack:
        common = ["--base-url", base_url, "--max-tokens", str(args.max_tokens)]
        redis: list[str] = []
        if args.processes > 1:
            server = stack.enter_context(run_redis())
            redis = ["--redis-url", server.url, "--key", f"hosted-{uuid.uuid4().hex[:8]}"]
        third = None
        if args.third_party:
            # For as long as the map runs (an hour at most).
            third = _spawn([
                *common, "--conversations", str(10**9), "--first", str(10**8),
                "--seconds", "3600", "--until-stdin-closes",
                "--third-rpm", str(round(args.third_party * args.rpm)),
                "--third-tpm", str(round(args.third_party * args.tpm)),
            ], stdin=subprocess.PIPE)  # fmt: skip
            time.sleep(3.0)  # it is spending when the map starts
        part = -(-args.conversations // args.processes)
        workers = []
        for i in range(args.processes):
            count = min(part, args.conversations - i * part)
            workers.append(
                _spawn([*common, *redis, "--conversations", str(count), "--first", str(i * part)])
            )
        reports = [_report(w, timeout=3600) for w in workers]
        third_report = None
        if third is not None:
            assert third.stdin is not None
            third.stdin.close()
            third.stdin = None  # (closed: communicate() leaves it be)
            third_report = _report(third, timeout=60)
    return _summary(
        reports, third_report, conversations=args.conversations, max_tokens=args.max_tokens,
        rpm=args.rpm, tpm=args.tpm, share=share,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.hosted", description=__doc__
    )
    p.add_argument("--conversations", type=int, default=3000, help="default: 3000")
    p.add_argument("--max-tokens", type=int, default=16, help="default: 16")
    p.add_argument("--rpm", type=int, default=6000, help="requests a minute (default: 6000)")
    p.add_argument("--tpm", type=int, default=90000, help="tokens a minute (default: 90000)")
    p.add_argument(
        "--headers",
        choices=("openai", "anthropic", "together"),
        default="openai",
        help="whose rate-limit headers the simulator sends (default: openai)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes sharing a RateLimit key through Redis (default: 1, in process)",
    )
    p.add_argument(
        "--third-party",
        type=float,
        default=0.0,
        help="the share of both limits another app spends meanwhile (default: 0)",
    )
    p.add_argument("--speed", default="50", help="the simulator's speed (default: 50)")
    p.add_argument(
        "--contender",
        choices=(*CONTENDERS, "both"),
        default="llmbatch",
        help="who runs the map: llmbatch, AsyncOpenAI with its retries under a semaphore, "
        "or both, one after the other, each against a fresh limiter (default: llmbatch)",
    )
    p.add_argument("--json", help="write the result here")
    # A worker process's own arguments (internal).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    p.add_argument("--third-rpm", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--third-tpm", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--until-stdin-closes", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.processes < 1 or not 0 <= args.third_party < 1:
        p.error("--processes must be at least 1 and --third-party within [0, 1)")
    if args.contender != "llmbatch" and (args.processes > 1 or args.third_party):
        p.error("--processes and --third-party are llmbatch's alone")
    result = compare(
        args,
        CONTENDERS if args.contender == "both" else (args.contender,),
        command=" ".join(["python -m llmbatch_bench.experiments.hosted", *(argv or sys.argv[1:])]),
    )
    text = json.dumps(result if args.contender == "both" else result[args.contender], indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


def compare(args: argparse.Namespace, contenders: Sequence[str], *, command: str) -> dict[str, Any]:
    """Each contender's map against a simulator of its own playing the limiter."""
    sim_args = [
        "--speed", args.speed, "--no-chat-batch",
        "--rate-limit-rpm", str(args.rpm), "--rate-limit-tpm", str(args.tpm),
        "--rate-limit-headers", args.headers,
    ]  # fmt: skip
    results: dict[str, Any] = {}
    for contender in contenders:
        with run_simulator(*sim_args) as sim:
            result = _measure(args, sim.base_url, contender)
        result["contender"] = contender
        result["command"] = command
        result["simulator"] = " ".join(sim_args)
        results[contender] = result
    return results


def defaults(**overrides: Any) -> argparse.Namespace:
    """The experiment's arguments as ``main`` parses them, with ``overrides``."""
    args = argparse.Namespace(
        conversations=3000, max_tokens=16, rpm=6000, tpm=90000, headers="openai",
        processes=1, third_party=0.0, speed="50",
    )  # fmt: skip
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


if __name__ == "__main__":
    raise SystemExit(main())
