# mypy: disable-error-code="arg-type, list-item"
# (wrong argument types are what this table is about)
"""The bad-input table: every kind of bad input gets a clear, typed error where it is
given (an exception at the call, a failed ``Result`` for a ``map`` item, an error
line or exit code for the CLIs), while five requests running concurrently on the
same client still succeed, and nothing of a rejected call reaches the server.

``CASES`` is the table; docs/reliability.md lists every row (a test checks that).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from fake_server import FakeServer

import llmbatch
from llmbatch._cli import main as llmbatch_main
from llmbatch.transports import MockTransport
from llmbatch_server.cli import main as server_main
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
Invalid = llmbatch.InvalidRequestError


@dataclass
class Ctx:
    """What a case may use: the running client, the simulator, a scratch folder."""

    client: llmbatch.Client
    sim_url: str
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture[str]


@dataclass(frozen=True)
class Case:
    """One row: ``run`` gives the bad input; ``expect`` is the error type (or a CLI
    exit code) and ``message`` a fragment of what the user is told."""

    id: str
    where: str
    example: str
    run: Callable[[Ctx], Awaitable[Any]]
    expect: type[BaseException] | int
    message: str
    item: bool = False  # a map item: the call succeeds, that item's Result fails


async def first_delta(ctx: Ctx, prompt: Any, **kw: Any) -> None:
    async for _ in ctx.client.stream(prompt, **kw):
        break


async def map_around(ctx: Ctx, bad: Any) -> list[llmbatch.Result[Any]]:
    """The bad item between two good ones."""
    return await ctx.client.map(["good before", bad, "good after"], max_tokens=2)


async def new_client(**kwargs: Any) -> None:
    llmbatch.Client(**kwargs)


async def with_env(ctx: Ctx, name: str, value: str, **kwargs: Any) -> None:
    ctx.monkeypatch.setenv(name, value)
    llmbatch.Client(**kwargs)


async def make(factory: Callable[..., object], **kwargs: Any) -> None:
    factory(**kwargs)


async def unknown_model(ctx: Ctx) -> None:
    async with llmbatch.Client(ctx.sim_url, model="no-such-model") as client:
        await client.complete("hi", max_tokens=2)


def jsonl(custom_id: str, **body: Any) -> bytes:
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/completions"}
    return json.dumps({**line, "body": {"prompt": "hi", "max_tokens": 2, **body}}).encode()


async def run_cli(ctx: Ctx, main: Callable[[list[str]], int], argv: list[str]) -> tuple[int, str]:
    """Run a CLI in-process (in a worker thread: it has its own event loop)."""

    def call() -> int:
        try:
            return main(argv)
        except SystemExit as exc:  # argparse usage errors
            return int(exc.code or 0)

    code = await anyio.to_thread.run_sync(call)
    return code, ctx.capsys.readouterr().err


async def job_with(ctx: Ctx, bad_line: bytes) -> tuple[int, str]:
    """``llmbatch run --on-malformed skip`` on [good, bad, good]: the good lines are
    answered (unless the whole file is refused); returns the exit code and what the
    user is told (stderr plus the bad line's error in the output)."""
    source, output = ctx.tmp / "in.jsonl", ctx.tmp / "out.jsonl"
    source.write_bytes(b"\n".join([jsonl("a"), bad_line, jsonl("c")]) + b"\n")
    argv = ["run", str(source), "-o", str(output), "--base-url", ctx.sim_url]
    code, err = await run_cli(ctx, llmbatch_main, [*argv, "--on-malformed", "skip"])
    told = [err]
    if code != 3:  # 3: the input was refused whole, nothing sent
        lines = [json.loads(line) for line in output.read_text().splitlines()]
        by_id = {line["custom_id"]: line for line in lines}
        assert by_id["a"]["error"] is None
        assert by_id["c"]["error"] is None
        told += [json.dumps(line["error"]) for line in lines if line["error"]]
    else:
        assert not output.exists() or not output.read_text()
    return code, "\n".join(told)


NAN = math.nan
CASES: list[Case] = [
    # -- complete ------------------------------------------------------------------
    Case(
        "complete-empty-prompt",
        "complete",
        'complete("")',
        lambda c: c.client.complete(""),
        Invalid,
        "prompt must not be empty",
    ),
    Case(
        "complete-int-prompt",
        "complete",
        "complete(123)",
        lambda c: c.client.complete(123),
        Invalid,
        "prompt must be a str, got int",
    ),
    Case(
        "complete-none-prompt",
        "complete",
        "complete(None)",
        lambda c: c.client.complete(None),
        Invalid,
        "prompt must be a str, got NoneType",
    ),
    Case(
        "complete-bytes-prompt",
        "complete",
        'complete(b"hi")',
        lambda c: c.client.complete(b"hi"),
        Invalid,
        "prompt must be a str, got bytes",
    ),
    Case(
        "complete-non-utf8-prompt",
        "complete",
        'complete("bad \\udcff")',
        lambda c: c.client.complete("bad \udcff text"),
        Invalid,
        "prompt is not valid Unicode text",
    ),
    Case(
        "complete-huge-prompt",
        "complete",
        'complete("word " * 200_000)',
        lambda c: c.client.complete("word " * 200_000),
        Invalid,
        "exceeds the server's max_model_len of 4096",
    ),
    Case(
        "complete-negative-max-tokens",
        "complete",
        "max_tokens=-1",
        lambda c: c.client.complete("x", max_tokens=-1),
        Invalid,
        "max_tokens must be a positive int, got -1",
    ),
    Case(
        "complete-zero-max-tokens",
        "complete",
        "max_tokens=0",
        lambda c: c.client.complete("x", max_tokens=0),
        Invalid,
        "max_tokens must be a positive int, got 0",
    ),
    Case(
        "complete-oversize-max-tokens",
        "complete",
        "max_tokens=10**7",
        lambda c: c.client.complete("x", max_tokens=10**7),
        Invalid,
        "max_tokens=10000000 exceeds the server's max_model_len",
    ),
    Case(
        "complete-float-max-tokens",
        "complete",
        "max_tokens=1.5",
        lambda c: c.client.complete("x", max_tokens=1.5),
        Invalid,
        "max_tokens must be a positive int, got 1.5",
    ),
    Case(
        "complete-bool-max-tokens",
        "complete",
        "max_tokens=True",
        lambda c: c.client.complete("x", max_tokens=True),
        Invalid,
        "max_tokens must be a positive int, got True",
    ),
    Case(
        "complete-nan-temperature",
        "complete",
        "temperature=nan",
        lambda c: c.client.complete("x", temperature=NAN),
        Invalid,
        "temperature must be a finite number, got nan",
    ),
    Case(
        "complete-inf-temperature",
        "complete",
        "temperature=inf",
        lambda c: c.client.complete("x", temperature=math.inf),
        Invalid,
        "temperature must be a finite number, got inf",
    ),
    Case(
        "complete-negative-temperature",
        "complete",
        "temperature=-1",
        lambda c: c.client.complete("x", temperature=-1),
        Invalid,
        "temperature must be between 0.0 and 100.0",
    ),
    Case(
        "complete-top-p-over-one",
        "complete",
        "top_p=1.5",
        lambda c: c.client.complete("x", top_p=1.5),
        Invalid,
        "top_p must be between 0.0 and 1.0",
    ),
    Case(
        "complete-unknown-tier",
        "complete",
        'priority="urgent"',
        lambda c: c.client.complete("x", priority="urgent"),
        Invalid,
        "unknown priority 'urgent'",
    ),
    Case(
        "complete-negative-timeout",
        "complete",
        "timeout=-1",
        lambda c: c.client.complete("x", timeout=-1),
        Invalid,
        "timeout must be a positive number of seconds",
    ),
    Case(
        "complete-nan-timeout",
        "complete",
        "timeout=nan",
        lambda c: c.client.complete("x", timeout=NAN),
        Invalid,
        "timeout must be a positive number of seconds",
    ),
    Case(
        "complete-zero-n",
        "complete",
        "n=0",
        lambda c: c.client.complete("x", n=0),
        Invalid,
        "n must be a positive int, got 0",
    ),
    Case(
        "complete-stop-not-str",
        "complete",
        "stop=5",
        lambda c: c.client.complete("x", stop=5),
        Invalid,
        "stop must be a str or a list of str",
    ),
    Case(
        "complete-reserved-param",
        "complete",
        'model="other"',
        lambda c: c.client.complete("x", model="other"),
        Invalid,
        "'model' is set by llmbatch",
    ),
    Case(
        "complete-unserialisable-param",
        "complete",
        "seed=object()",
        lambda c: c.client.complete("x", seed=object()),
        Invalid,
        "parameters must be JSON-serialisable",
    ),
    Case(
        "complete-nan-in-extra-param",
        "complete",
        'logit_bias={"1": nan}',
        lambda c: c.client.complete("x", logit_bias={"1": NAN}),
        Invalid,
        "parameters must be JSON-serialisable",
    ),
    # -- chat ----------------------------------------------------------------------
    Case(
        "chat-empty-messages",
        "chat",
        "chat([])",
        lambda c: c.client.chat([]),
        Invalid,
        "messages must not be empty",
    ),
    Case(
        "chat-string-not-list",
        "chat",
        'chat("hi")',
        lambda c: c.client.chat("hi"),
        Invalid,
        "messages must be a list",
    ),
    Case(
        "chat-message-not-dict",
        "chat",
        'chat(["hi"])',
        lambda c: c.client.chat(["hi"]),
        Invalid,
        "messages[0] must be a dict, got str",
    ),
    Case(
        "chat-no-role",
        "chat",
        '[{"content": "hi"}]',
        lambda c: c.client.chat([{"content": "hi"}]),
        Invalid,
        "messages[0] has unknown role None",
    ),
    Case(
        "chat-unknown-role",
        "chat",
        '[{"role": "wizard", ...}]',
        lambda c: c.client.chat([{"role": "wizard", "content": "hi"}]),
        Invalid,
        "messages[0] has unknown role 'wizard'",
    ),
    Case(
        "chat-int-content",
        "chat",
        '[{"role": "user", "content": 5}]',
        lambda c: c.client.chat([{"role": "user", "content": 5}]),
        Invalid,
        "messages[0].content must be a str or a list of parts",
    ),
    Case(
        "chat-non-utf8-content",
        "chat",
        '"content": "\\udcff"',
        lambda c: c.client.chat([{"role": "user", "content": "\udcff"}]),
        Invalid,
        "messages[0].content is not valid Unicode text",
    ),
    # -- stream --------------------------------------------------------------------
    Case(
        "stream-empty-prompt",
        "stream",
        'stream("")',
        lambda c: first_delta(c, ""),
        Invalid,
        "prompt must not be empty",
    ),
    Case(
        "stream-unknown-tier",
        "stream",
        'priority="vip"',
        lambda c: first_delta(c, "x", priority="vip"),
        Invalid,
        "unknown priority 'vip'",
    ),
    Case(
        "stream-negative-max-tokens",
        "stream",
        "max_tokens=-2",
        lambda c: first_delta(c, "x", max_tokens=-2),
        Invalid,
        "max_tokens must be a positive int, got -2",
    ),
    # -- map (the whole call) ------------------------------------------------------
    Case(
        "map-not-iterable",
        "map",
        "map(123)",
        lambda c: c.client.map(123),
        Invalid,
        "map() takes an iterable of inputs, got int",
    ),
    Case(
        "map-single-str",
        "map",
        'map("hello")',
        lambda c: c.client.map("hello"),
        Invalid,
        "not a single str or dict",
    ),
    Case(
        "map-zero-window",
        "map",
        "window=0",
        lambda c: c.client.map(["a"], window=0),
        Invalid,
        "window must be a positive int",
    ),
    Case(
        "map-unknown-tier",
        "map",
        'priority="soon"',
        lambda c: c.client.map(["a"], priority="soon"),
        Invalid,
        "unknown priority 'soon'",
    ),
    # -- map items (that item's Result fails; its neighbours are answered) ----------
    Case(
        "map-item-int",
        "map item",
        "5",
        lambda c: map_around(c, 5),
        Invalid,
        "a map item must be a str, a list of messages or a dict, got int",
        item=True,
    ),
    Case(
        "map-item-empty",
        "map item",
        '""',
        lambda c: map_around(c, ""),
        Invalid,
        "prompt must not be empty",
        item=True,
    ),
    Case(
        "map-item-dict-without-prompt",
        "map item",
        '{"max_tokens": 3}',
        lambda c: map_around(c, {"max_tokens": 3}),
        Invalid,
        "needs exactly one of 'prompt' or 'messages'",
        item=True,
    ),
    Case(
        "map-item-negative-max-tokens",
        "map item",
        '{"prompt": "x", "max_tokens": -3}',
        lambda c: map_around(c, {"prompt": "x", "max_tokens": -3}),
        Invalid,
        "max_tokens must be a positive int, got -3",
        item=True,
    ),
    Case(
        "map-item-nan-temperature",
        "map item",
        '{"prompt": "x", "temperature": nan}',
        lambda c: map_around(c, {"prompt": "x", "temperature": NAN}),
        Invalid,
        "temperature must be a finite number, got nan",
        item=True,
    ),
    Case(
        "map-item-unknown-tier",
        "map item",
        '{"prompt": "x", "priority": "urgent"}',
        lambda c: map_around(c, {"prompt": "x", "priority": "urgent"}),
        Invalid,
        "unknown priority 'urgent'",
        item=True,
    ),
    Case(
        "map-item-bad-chat",
        "map item",
        '[{"role": "wizard", ...}]',
        lambda c: map_around(c, [{"role": "wizard", "content": "x"}]),
        Invalid,
        "unknown role 'wizard'",
        item=True,
    ),
    # -- client configuration and environment --------------------------------------
    Case(
        "config-ftp-url",
        "Client",
        'Client("ftp://host/v1")',
        lambda c: new_client(base_url="ftp://host/v1"),
        Invalid,
        "base_url must be an http(s) URL",
    ),
    Case(
        "config-garbage-url",
        "Client",
        'Client("not a url")',
        lambda c: new_client(base_url="not a url"),
        Invalid,
        "base_url must be an http(s) URL",
    ),
    Case(
        "env-url-without-scheme",
        "env",
        "LLMBATCH_BASE_URL=localhost:8000",
        lambda c: with_env(c, "LLMBATCH_BASE_URL", "localhost:8000"),
        Invalid,
        "got 'localhost:8000'",
    ),
    Case(
        "env-openai-url-without-host",
        "env",
        "OPENAI_BASE_URL=http://",
        lambda c: with_env(c, "OPENAI_BASE_URL", "http://"),
        Invalid,
        "base_url must be an http(s) URL",
    ),
    Case(
        "env-api-key-with-newline",
        "env",
        "LLMBATCH_API_KEY=$'sk-x\\n'",
        lambda c: with_env(c, "LLMBATCH_API_KEY", "sk-x\n"),
        Invalid,
        "api_key must be a str of printable ASCII",
    ),
    Case(
        "config-empty-model",
        "Client",
        'Client(model="")',
        lambda c: new_client(model=""),
        Invalid,
        "model must be a non-empty str or None",
    ),
    Case(
        "config-rate-limit-str",
        "Client",
        'rate_limit="100/min"',
        lambda c: new_client(rate_limit="100/min"),
        Invalid,
        "rate_limit must be a RateLimit",
    ),
    Case(
        "config-bad-on-close",
        "Client",
        'on_close="later"',
        lambda c: new_client(on_close="later"),
        Invalid,
        "on_close must be 'drain' or 'cancel'",
    ),
    Case(
        "config-bad-transport",
        "Client",
        'transport="curl"',
        lambda c: new_client(transport="curl"),
        Invalid,
        "transport must be 'aiohttp', 'httpx' or a Transport",
    ),
    Case(
        "config-zero-in-flight",
        "Limits",
        "Limits(max_in_flight=0)",
        lambda c: make(llmbatch.Limits, max_in_flight=0),
        Invalid,
        "Limits.max_in_flight must be an int >= 1",
    ),
    Case(
        "config-reservation-over-limit",
        "Limits",
        "Limits(reserved_realtime=300)",
        lambda c: make(llmbatch.Limits, reserved_realtime=300),
        Invalid,
        "Limits.reserved_realtime must be an int in 0..max_in_flight-1",
    ),
    Case(
        "config-share-over-one",
        "Limits",
        'min_share={"batch": 1.5}',
        lambda c: make(llmbatch.Limits, min_share={"batch": 1.5}),
        Invalid,
        "Limits.min_share values must be in [0, 1)",
    ),
    Case(
        "config-share-unknown-tier",
        "Limits",
        'min_share={"urgent": 0.1}',
        lambda c: make(llmbatch.Limits, min_share={"urgent": 0.1}),
        Invalid,
        "unknown priority 'urgent'",
    ),
    Case(
        "config-zero-attempts",
        "RetryPolicy",
        "RetryPolicy(attempts=0)",
        lambda c: make(llmbatch.RetryPolicy, attempts=0),
        Invalid,
        "RetryPolicy.attempts must be an int >= 1",
    ),
    Case(
        "config-nan-backoff",
        "RetryPolicy",
        "initial_backoff=nan",
        lambda c: make(llmbatch.RetryPolicy, initial_backoff=NAN),
        Invalid,
        "RetryPolicy.initial_backoff must be a finite number >= 0",
    ),
    Case(
        "config-negative-timeout",
        "Timeout",
        "Timeout(read=-1)",
        lambda c: make(llmbatch.Timeout, read=-1),
        Invalid,
        "Timeout.read must be None or a positive number",
    ),
    Case(
        "config-batch-over-1024",
        "BatchPolicy",
        "max_batch_size=2000",
        lambda c: make(llmbatch.BatchPolicy, max_batch_size=2000),
        Invalid,
        "BatchPolicy.max_batch_size must be an int in 1..1024",
    ),
    Case(
        "config-unknown-model",
        "server",
        'Client(model="no-such-model")',
        unknown_model,
        llmbatch.NotFoundError,
        "The model `no-such-model` does not exist",
    ),
    # -- the JSONL runner (llmbatch run IN.jsonl, --on-malformed skip) --------------
    Case(
        "jsonl-not-json",
        "llmbatch run",
        "this is not json",
        lambda c: job_with(c, b"this is not json"),
        1,
        "in.jsonl:2: not valid JSON",
    ),
    Case(
        "jsonl-non-utf8",
        "llmbatch run",
        b'{"custom_id": "\\xff"}'.decode(),
        lambda c: job_with(c, b'{"custom_id": "\xff"}'),
        1,
        "in.jsonl:2: not valid JSON ('utf-8' codec",
    ),
    Case(
        "jsonl-not-an-object",
        "llmbatch run",
        "[1, 2]",
        lambda c: job_with(c, b"[1, 2]"),
        1,
        "in.jsonl:2: not a JSON object",
    ),
    Case(
        "jsonl-no-custom-id",
        "llmbatch run",
        '{"method": "POST", ...}',
        lambda c: job_with(c, jsonl("").replace(b'"custom_id": ""', b'"x": 1')),
        1,
        "in.jsonl:2: custom_id must be a non-empty string",
    ),
    Case(
        "jsonl-get-method",
        "llmbatch run",
        '"method": "GET"',
        lambda c: job_with(c, jsonl("b").replace(b'"POST"', b'"GET"')),
        1,
        "in.jsonl:2: method must be POST, got 'GET'",
    ),
    Case(
        "jsonl-unknown-url",
        "llmbatch run",
        '"url": "/v1/embeddings"',
        lambda c: job_with(c, jsonl("b").replace(b"/v1/completions", b"/v1/embeddings")),
        1,
        "in.jsonl:2: url must be one of /v1/completions, /v1/chat/completions",
    ),
    Case(
        "jsonl-empty-prompt",
        "llmbatch run",
        '"prompt": ""',
        lambda c: job_with(c, jsonl("b", prompt="")),
        1,
        "in.jsonl:2: body.prompt must be a non-empty string",
    ),
    Case(
        "jsonl-stream",
        "llmbatch run",
        '"stream": true',
        lambda c: job_with(c, jsonl("b", stream=True)),
        1,
        "in.jsonl:2: streaming requests cannot run in a batch job",
    ),
    Case(
        "jsonl-nan-temperature",
        "llmbatch run",
        '"temperature": NaN',
        lambda c: job_with(
            c, jsonl("b").replace(b'"max_tokens"', b'"temperature": NaN, "max_tokens"')
        ),
        1,
        "temperature must be a finite number, got nan",
    ),
    Case(
        "jsonl-negative-max-tokens",
        "llmbatch run",
        '"max_tokens": -5',
        lambda c: job_with(c, jsonl("b", max_tokens=-5)),
        1,
        "max_tokens must be a positive int, got -5",
    ),
    Case(
        "jsonl-duplicate-custom-id",
        "llmbatch run",
        'custom_id "a" twice',
        lambda c: job_with(c, jsonl("a")),
        3,
        "in.jsonl:2: duplicate custom_id 'a' (first on line 1)",
    ),
    # -- command lines -------------------------------------------------------------
    Case(
        "cli-run-missing-input",
        "llmbatch run",
        "llmbatch run nope.jsonl",
        lambda c: run_cli(
            c, llmbatch_main, ["run", str(c.tmp / "nope.jsonl"), "-o", str(c.tmp / "o.jsonl")]
        ),
        2,
        "nope.jsonl: no such file",
    ),
    Case(
        "cli-run-zero-in-flight",
        "llmbatch run",
        "--max-in-flight 0",
        lambda c: run_cli(
            c, llmbatch_main, ["run", "i.jsonl", "-o", "o.jsonl", "--max-in-flight", "0"]
        ),
        2,
        "must be a positive integer",
    ),
    Case(
        "cli-run-bad-base-url",
        "llmbatch run",
        "--base-url localhost",
        lambda c: job_cli_bad_url(c),
        2,
        "base_url must be an http(s) URL",
    ),
    Case(
        "cli-sim-negative-speed",
        "llmbatch-server sim",
        "--speed -1",
        lambda c: run_cli(c, server_main, ["sim", "--speed", "-1", "--port", "0"]),
        2,
        "--speed must be > 0",
    ),
    Case(
        "cli-sim-bad-error-rate",
        "llmbatch-server sim",
        "--error-rate-500 2",
        lambda c: run_cli(c, server_main, ["sim", "--error-rate-500", "2", "--port", "0"]),
        2,
        "error_500 must be a probability in [0, 1]",
    ),
    Case(
        "cli-sim-port-not-int",
        "llmbatch-server sim",
        "--port eighty",
        lambda c: run_cli(c, server_main, ["sim", "--port", "eighty"]),
        2,
        "argument --port: invalid int value",
    ),
    Case(
        "cli-vllm-unknown-profile",
        "llmbatch-server vllm",
        "--profile turbo",
        lambda c: run_cli(
            c, server_main, ["vllm", "--model", "m", "--profile", "turbo", "--dry-run"]
        ),
        2,
        "argument --profile: invalid choice: 'turbo'",
    ),
]


async def job_cli_bad_url(ctx: Ctx) -> tuple[int, str]:
    source = ctx.tmp / "in.jsonl"
    source.write_bytes(jsonl("a") + b"\n")
    argv = ["run", str(source), "-o", str(ctx.tmp / "o.jsonl"), "--base-url", "localhost"]
    return await run_cli(ctx, llmbatch_main, argv)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency") as server:
        yield server


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_bad_input_fails_alone(
    case: Case,
    sim: SimulatorProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("LLMBATCH_BASE_URL", "OPENAI_BASE_URL", "LLMBATCH_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeServer()
    neighbours: list[str] = []
    async with llmbatch.Client("http://127.0.0.1:9/v1", transport=MockTransport(fake)) as client:
        ctx = Ctx(client, sim.base_url, tmp_path, monkeypatch, capsys)

        async def neighbour(i: int) -> None:
            answer = await client.complete(f"fine {i}", max_tokens=4)
            neighbours.append(answer.text)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(neighbour, i)
                told = await check(case, ctx)
    assert case.message in told, told
    assert sorted(neighbours) == [f"echo:fine {i}:0" for i in range(5)]
    # Nothing of a rejected call was sent: only the neighbours (and, for a map
    # item, the good items around it) reached the server.
    sent: set[str] = set()
    for body in fake.bodies:
        prompt = body.get("prompt", [])
        sent.update([prompt] if isinstance(prompt, str) else prompt)
    assert sent <= {f"fine {i}" for i in range(5)} | {"good before", "good after"}


async def check(case: Case, ctx: Ctx) -> str:
    """Run one case; returns what the user is told."""
    if isinstance(case.expect, int):
        code, told = await case.run(ctx)
        assert code == case.expect, told
        return str(told)
    if case.item:
        results = await case.run(ctx)
        assert [r.ok for r in results] == [True, False, True]
        assert isinstance(results[1].error, case.expect)
        return str(results[1].error)
    with pytest.raises(case.expect) as info:
        await case.run(ctx)
    return str(info.value)


def test_the_table_is_broad() -> None:
    assert len(CASES) >= 25
    assert len({case.id for case in CASES}) == len(CASES)
    surfaces = {case.where for case in CASES}
    assert {"complete", "chat", "stream", "map", "map item", "env", "llmbatch run"} <= surfaces


def test_the_docs_list_every_case() -> None:
    docs = (ROOT / "docs" / "reliability.md").read_text()
    missing = [case.id for case in CASES if f"`{case.id}`" not in docs]
    assert missing == []
