"""The generation routes: completions, chat completions and batched chat.

A validated :class:`Generation` becomes engine sequences; the answer is one JSON
body when they finish, or server-sent events as tokens arrive.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from llmbatch_server.sim import metrics
from llmbatch_server.sim.engine import Group, Overloaded, Sequence
from llmbatch_server.sim.errors import ApiError
from llmbatch_server.sim.faults import Fault
from llmbatch_server.sim.requests import Generation, read_json
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
from llmbatch_server.sim.simulator import Simulator

#: Turns a request body into a validated generation (raises ApiError).
Parser = Callable[[dict[str, Any]], Generation]


async def generate(
    sim: Simulator, request: Request, parse: Parser, *, load_report: bool = True
) -> Response:
    """Serve one generation request: faults first, then validation, then the engine.

    ``load_report``: answer an ``endpoint-load-metrics-format`` request header on
    a non-streaming 200, as vLLM's completion and chat routes do (its batched
    chat route does not).
    """
    body = await read_json(request)
    fault = await inject_fault(sim, stream=bool(body.get("stream")))
    gen = parse(body)
    limited = _rate_limit(sim, gen)
    await sim.frontend(len(gen.prompts))
    request_id = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
    prompt_tokens = sum(gen.prompt_tokens)
    if gen.stream:
        stream = _stream(
            sim,
            gen,
            request_id,
            prompt_tokens,
            cut=fault is Fault.DROP,
            error=fault is Fault.STREAM_ERROR,
        )
        stream.raw_headers += [(k.encode(), v.encode()) for k, v in limited.items()]
        return stream
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def on_done(group: Group) -> None:
        if not done.done():
            done.set_result(None)

    group = Group(on_done=on_done, user=gen.user)
    sequences = sim.sequences(gen, group)
    admit(sim, group, sequences, gen.priority)
    if not await wait_or_disconnect(done, request.receive):
        sim.engine.abort(group)
        return Response(status_code=499)
    payload = completion_body(
        request_id,
        sim.config.model,
        sequences,
        prompt_tokens,
        chat=gen.chat,
        cached_tokens=sim.cached_tokens(gen, sequences),
    )
    headers = dict(limited)
    fmt = request.headers.get(metrics.LOAD_FORMAT_HEADER)
    if load_report and fmt and sim.config.load_header:
        engine = sim.engine
        waiting = engine.gauges[1]
        headers.update(metrics.load_report(fmt, waiting=waiting, kv_usage=engine.kv_usage))
    response_cls = CutResponse if fault is Fault.DROP else Response
    return response_cls(dumps(payload), media_type="application/json", headers=headers)


def _rate_limit(sim: Simulator, gen: Generation) -> dict[str, str]:
    """The provider's headers for this request's answer; a 429 if it is over the
    limit (its tokens: the prompts' and all it may generate, as OpenAI counts)."""
    limiter = sim.limiter
    if limiter is None:
        return {}
    room = sim.config.limits.max_model_len
    budget = sum(
        tokens + gen.n * (gen.max_tokens if gen.max_tokens is not None else room - tokens)
        for tokens in gen.prompt_tokens
    )
    refused = limiter.take(budget)
    if refused is not None:
        raise ApiError(
            429,
            f"Rate limit reached for {refused.limit} (simulated); "
            f"please try again in {refused.wait:.3f}s",
            headers=limiter.headers(refused),
        )
    return limiter.headers()


async def inject_fault(sim: Simulator, *, stream: bool) -> Fault:
    """Draw this request's fault: raise the error ones, wait out a latency spike,
    and return the kind the response itself must carry out (drop, stream error)."""
    fault, delay = sim.faults.draw(stream=stream)
    if delay:
        await asyncio.sleep(delay)
    if fault is Fault.ERROR_500:
        raise ApiError(500, "simulated internal server error")
    if fault is Fault.ERROR_429:
        retry_after = f"{sim.faults.rates.retry_after:g}"
        raise ApiError(
            429, "simulated rate limit; retry later", headers={"Retry-After": retry_after}
        )
    if fault is Fault.ERROR_503:
        raise ApiError(503, "The server is overloaded (simulated); retry later")
    return fault


def admit(sim: Simulator, group: Group, sequences: list[Sequence], priority: int) -> None:
    try:
        sim.engine.add(group, sequences, priority)
    except Overloaded:
        raise ApiError(503, "The server is overloaded: too many queued requests") from None


def _stream(
    sim: Simulator, gen: Generation, request_id: str, prompt_tokens: int, *, cut: bool, error: bool
) -> Response:
    model = sim.config.model
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    sent: dict[int, int] = {}
    total = 0
    group = Group(user=gen.user)

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
                        "usage": usage(
                            prompt_tokens,
                            completion_tokens,
                            sim.cached_tokens(gen, g.sequences),
                        ),
                    }
                )
            )
        queue.put_nowait(SSE_DONE)
        queue.put_nowait(None)

    group.on_tokens = on_tokens
    group.on_done = on_done
    sequences = sim.sequences(gen, group)
    admit(sim, group, sequences, gen.priority)
    return EventStream(queue, lambda: sim.engine.abort(group), cut=cut)
