"""The simulator's HTTP API: vLLM's OpenAI-compatible routes on Starlette."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmbatch_server._lifetime import in_background
from llmbatch_server.sim import metrics
from llmbatch_server.sim.admin import admin_faults
from llmbatch_server.sim.config import SimConfig
from llmbatch_server.sim.embeddings import embeddings
from llmbatch_server.sim.errors import ApiError
from llmbatch_server.sim.generate import Parser, generate
from llmbatch_server.sim.outage import OutageMiddleware
from llmbatch_server.sim.requests import (
    Generation,
    check_prompt_count,
    parse,
    parse_batch_chat,
    read_json,
)
from llmbatch_server.sim.simulator import Simulator

VERSION = "0.32.0"


def build_app(config: SimConfig) -> Starlette:
    """The ASGI app of one simulator; its engine runs while the app's lifespan does."""
    sim = Simulator(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sim.outage.schedule(config.outage)
        async with in_background(sim.engine.run()):
            yield

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if config.api_key and not _authorized(request, config.api_key):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            try:
                return await handler(request)
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

        return endpoint

    limits = config.limits

    def parser(chat: bool) -> Parser:
        def parse_body(body: dict[str, Any]) -> Generation:
            if not chat:
                check_prompt_count(body.get("prompt"), config.max_completion_prompts)
            return parse(
                body,
                chat=chat,
                model=config.model,
                max_model_len=limits.max_model_len,
                poison=sim.faults.rates.poison,
                counter=sim.counter,
                keep_ids=limits.enable_prefix_caching,
            )

        return parse_body

    def parse_batch(body: dict[str, Any]) -> Generation:
        return parse_batch_chat(
            body,
            model=config.model,
            max_model_len=limits.max_model_len,
            poison=sim.faults.rates.poison,
            counter=sim.counter,
            keep_ids=limits.enable_prefix_caching,
        )

    async def completions(request: Request) -> Response:
        return await generate(sim, request, parser(chat=False))

    async def chat_completions(request: Request) -> Response:
        return await generate(sim, request, parser(chat=True))

    async def batch_chat_completions(request: Request) -> Response:
        return await generate(sim, request, parse_batch, load_report=False)

    async def embed(request: Request) -> Response:
        return await embeddings(sim, request)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(config)]})

    async def tokenize(request: Request) -> Response:
        body = await read_json(request)
        chat = "messages" in body
        gen = parse(
            {**body, "max_tokens": 1, "stream": False},
            chat=chat,
            model=config.model,
            max_model_len=config.limits.max_model_len + 1,
            poison=(),
            counter=sim.counter,
            keep_ids=True,
        )
        assert gen.prompt_ids is not None
        ids = gen.prompt_ids[0]
        return JSONResponse(
            {"count": len(ids), "max_model_len": config.limits.max_model_len, "tokens": ids}
        )

    async def faults(request: Request) -> Response:
        return await admin_faults(sim, request)

    async def load(request: Request) -> Response:
        return JSONResponse({"server_load": sim.server_load})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VERSION, "simulator": True})

    async def metrics_endpoint(request: Request) -> Response:
        if config.metrics == "none":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        engine = sim.engine
        running, waiting = engine.gauges
        text = metrics.render(
            engine.metrics,
            model=config.model,
            running=running,
            waiting=waiting,
            kv_usage=engine.kv_usage,
            prefix_queries=engine.kv.queries,
            prefix_hits=engine.kv.hits,
            http_requests=sim.http_requests,
            histograms=config.metrics == "full",
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    routes = [
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        *(
            [Route("/v1/chat/completions/batch", guarded(batch_chat_completions), methods=["POST"])]
            if config.chat_batch
            else []
        ),
        Route("/v1/embeddings", guarded(embed), methods=["POST"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/tokenize", guarded(tokenize), methods=["POST"]),
        Route("/admin/faults", guarded(faults), methods=["GET", "POST"]),
        Route("/load", load, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
        middleware=[
            # Outermost: what an outage refuses reached the server too.
            Middleware(RequestCounter, sim=sim, handlers={route.path for route in routes}),
            Middleware(OutageMiddleware, outage=sim.outage),
            *([Middleware(LoadTracker, sim=sim)] if config.server_load_tracking else []),
        ],
    )
    app.state.simulator = sim
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    # FastAPI's body for unknown routes and methods, which vLLM inherits.
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


class RequestCounter:
    """Counts HTTP requests by handler, method and status class, as vLLM's
    ``http_requests_total`` does (prometheus-fastapi-instrumentator, with vLLM's
    excluded handlers; a path no route serves counts as handler ``none``)."""

    EXCLUDED = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})

    def __init__(self, app: ASGIApp, sim: Simulator, handlers: set[str]) -> None:
        self.app = app
        self.sim = sim
        self.handlers = frozenset(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.EXCLUDED:
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            handler = path if path in self.handlers else "none"
            self.sim.http_requests[(handler, scope["method"], f"{status // 100}xx")] += 1


class LoadTracker:
    """Counts requests in flight on the routes vLLM's ``load_aware_call`` wraps.

    With ``--enable-server-load-tracking`` vLLM counts each such request from
    arrival until its response (a stream: its last event) is sent, and serves
    the count at ``GET /load``.
    """

    PATHS = frozenset(
        {
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/chat/completions/batch",
            "/v1/embeddings",
        }
    )

    def __init__(self, app: ASGIApp, sim: Simulator) -> None:
        self.app = app
        self.sim = sim

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.PATHS:
            await self.app(scope, receive, send)
            return
        self.sim.server_load += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.sim.server_load -= 1


def _authorized(request: Request, key: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())


def _model_card(config: SimConfig) -> dict[str, Any]:
    hosted = config.rate_limit_rpm is not None or config.rate_limit_tpm is not None
    return {
        "id": config.model,
        "object": "model",
        "created": 0,
        # Playing a hosted provider, it says what OpenAI's model list says.
        "owned_by": "system" if hosted else "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.limits.max_model_len,
    }
