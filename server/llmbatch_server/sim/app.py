"""The simulator's HTTP API: vLLM's OpenAI-compatible routes on Starlette."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from llmbatch_server.sim import metrics, tokenizer
from llmbatch_server.sim.config import SimConfig
from llmbatch_server.sim.engine import Engine, Group, Overloaded, Sequence
from llmbatch_server.sim.faults import Fault, FaultInjector
from llmbatch_server.sim.requests import ApiError, Generation, parse
from llmbatch_server.sim.responses import (
    SSE_DONE,
    CutResponse,
    EventStream,
    chunk,
    completion_body,
    dumps,
    sse,
    usage,
    wait_or_disconnect,
)

VERSION = "0.32.0"


class Simulator:
    """One simulated server: engine, fault injector and the front-end queue."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config.limits, config.step)
        self.faults = FaultInjector(config.faults, seed=config.seed)
        self._frontend_free_at = 0.0
        self.http_requests = 0

    async def frontend(self, prompts: int) -> None:
        """Model the API server's serial per-request work (fewer, larger requests win)."""
        cost = self.config.step.frontend_seconds(prompts)
        if cost <= 0:
            return
        now = time.monotonic()
        self._frontend_free_at = max(self._frontend_free_at, now) + cost
        delay = self._frontend_free_at - now
        if delay > 0.0002:  # below this, sleeping costs more than it models
            await asyncio.sleep(delay)

    def sequences(self, gen: Generation, group: Group) -> list[Sequence]:
        limit = self.config.limits.max_model_len
        seed = self.config.seed if gen.seed is None else gen.seed
        out = []
        for p, (prompt, count) in enumerate(zip(gen.prompts, gen.prompt_tokens, strict=True)):
            max_tokens = gen.max_tokens if gen.max_tokens is not None else limit - count
            for j in range(gen.n):
                out.append(_sequence(group, p * gen.n + j, prompt, count, max_tokens, gen, seed))
        return out


def _sequence(
    group: Group, index: int, prompt: str, count: int, max_tokens: int, gen: Generation, seed: int
) -> Sequence:
    out_seed = tokenizer.output_seed(prompt, index, seed)
    target, visible, reason, stop_reason = max_tokens, max_tokens, "length", None
    if not gen.ignore_eos:
        natural = max(tokenizer.natural_length(out_seed), gen.min_tokens)
        if natural < max_tokens:
            target, visible, reason = natural, natural, "stop"
    if gen.stop:
        for position in range(gen.min_tokens, target):
            w = tokenizer.word(out_seed, position)
            hit = next((s for s in gen.stop if s and s in w), None)
            if hit is not None:
                target, visible, reason, stop_reason = position + 1, position, "stop", hit
                break
    return Sequence(
        group=group,
        index=index,
        prompt_tokens=count,
        target=target,
        visible=visible,
        finish_reason=reason,
        stop_reason=stop_reason,
        seed=out_seed,
    )


def build_app(config: SimConfig) -> Starlette:
    """The ASGI app of one simulator; its engine runs while the app's lifespan does."""
    sim = Simulator(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.ensure_future(sim.engine.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if config.api_key and not _authorized(request, config.api_key):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            try:
                return await handler(request)
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)

        return endpoint

    async def completions(request: Request) -> Response:
        return await _generate(sim, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _generate(sim, request, chat=True)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(config)]})

    async def tokenize(request: Request) -> Response:
        body = await _json(request)
        chat = "messages" in body
        gen = parse(
            {**body, "max_tokens": 1, "stream": False},
            chat=chat,
            model=config.model,
            max_model_len=config.limits.max_model_len + 1,
            poison=(),
        )
        ids = tokenizer.token_ids(gen.prompts[0])
        return JSONResponse(
            {"count": len(ids), "max_model_len": config.limits.max_model_len, "tokens": ids}
        )

    async def admin_faults(request: Request) -> Response:
        if not config.enable_admin:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if request.method == "POST":
            changes = await _json(request)
            try:
                sim.faults.rates = sim.faults.rates.update(**changes)
            except (TypeError, ValueError) as exc:
                raise ApiError(400, str(exc)) from None
        return JSONResponse(
            {"rates": dataclasses.asdict(sim.faults.rates), "injected": sim.faults.injected}
        )

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VERSION, "simulator": True})

    async def metrics_endpoint(request: Request) -> Response:
        engine = sim.engine
        text = metrics.render(
            engine.metrics,
            model=config.model,
            running=engine.num_running,
            waiting=engine.num_waiting,
            kv_usage=engine.kv_usage,
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    routes = [
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/tokenize", guarded(tokenize), methods=["POST"]),
        Route("/admin/faults", guarded(admin_faults), methods=["GET", "POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.simulator = sim
    return app


def _authorized(request: Request, key: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _model_card(config: SimConfig) -> dict[str, Any]:
    return {
        "id": config.model,
        "object": "model",
        "created": 0,
        "owned_by": "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.limits.max_model_len,
    }


async def _generate(sim: Simulator, request: Request, *, chat: bool) -> Response:
    sim.http_requests += 1
    config = sim.config
    body = await _json(request)
    fault, delay = sim.faults.draw(stream=bool(body.get("stream")))
    if delay:
        await asyncio.sleep(delay)
    if fault is Fault.ERROR_500:
        raise ApiError(500, "simulated internal server error")
    if fault is Fault.ERROR_429:
        retry_after = f"{sim.faults.rates.retry_after:g}"
        err = ApiError(429, "simulated rate limit; retry later")
        return JSONResponse(err.body(), status_code=429, headers={"Retry-After": retry_after})
    if fault is Fault.ERROR_503:
        raise ApiError(503, "The server is overloaded (simulated); retry later")
    gen = parse(
        body,
        chat=chat,
        model=config.model,
        max_model_len=config.limits.max_model_len,
        poison=sim.faults.rates.poison,
    )
    await sim.frontend(len(gen.prompts))
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    prompt_tokens = sum(gen.prompt_tokens)
    if gen.stream:
        return _stream(
            sim,
            gen,
            request_id,
            prompt_tokens,
            cut=fault is Fault.DROP,
            error=fault is Fault.STREAM_ERROR,
        )
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def on_done(group: Group) -> None:
        if not done.done():
            done.set_result(None)

    group = Group(on_done=on_done)
    sequences = sim.sequences(gen, group)
    try:
        sim.engine.add(group, sequences, gen.priority)
    except Overloaded:
        raise ApiError(503, "The server is overloaded: too many queued requests") from None
    if not await wait_or_disconnect(done, request.receive):
        sim.engine.abort(group)
        return Response(status_code=499)
    payload = completion_body(request_id, config.model, sequences, prompt_tokens, chat=chat)
    response_cls = CutResponse if fault is Fault.DROP else Response
    return response_cls(dumps(payload), media_type="application/json")


def _stream(
    sim: Simulator, gen: Generation, request_id: str, prompt_tokens: int, *, cut: bool, error: bool
) -> Response:
    model = sim.config.model
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    sent: dict[int, int] = {}
    total = 0
    group = Group()

    def on_tokens(seq: Sequence, generated: int) -> None:
        nonlocal total
        previous = sent.get(seq.index, 0)
        piece = seq.text(previous, generated)
        sent[seq.index] = generated
        total += 1
        queue.put_nowait(
            sse(chunk(request_id, model, seq, piece, chat=gen.chat, first=previous == 0))
        )
        if error and total == 3:
            queue.put_nowait(sse(ApiError(500, "simulated error during generation").body()))
            queue.put_nowait(SSE_DONE)
            queue.put_nowait(None)
            sim.engine.abort(group)

    def on_done(g: Group) -> None:
        if gen.include_usage:
            completion_tokens = sum(s.generated for s in g.sequences)
            kind = "chat.completion.chunk" if gen.chat else "text_completion"
            queue.put_nowait(
                sse(
                    {
                        "id": request_id,
                        "object": kind,
                        "created": int(time.time()),
                        "model": model,
                        "choices": [],
                        "usage": usage(prompt_tokens, completion_tokens),
                    }
                )
            )
        queue.put_nowait(SSE_DONE)
        queue.put_nowait(None)

    group.on_tokens = on_tokens
    group.on_done = on_done
    sequences = sim.sequences(gen, group)
    try:
        sim.engine.add(group, sequences, gen.priority)
    except Overloaded:
        raise ApiError(503, "The server is overloaded: too many queued requests") from None
    return EventStream(queue, lambda: sim.engine.abort(group), cut=cut)
