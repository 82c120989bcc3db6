"""``POST /v1/embeddings`` as vLLM serves an embedding model.

Each input runs through the engine as a prefill-only sequence (vLLM pools the
prompt's hidden states; nothing is generated), so embeddings cost engine time
and share the batch with generation. The vectors are deterministic pseudo-random
unit vectors seeded by the input's token ids: equal inputs give equal vectors,
different inputs nearly orthogonal ones. They carry no meaning.
"""

from __future__ import annotations

import array
import asyncio
import base64
import hashlib
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from llmbatch_server.sim.counting import TokenCounter
from llmbatch_server.sim.engine import Group, Sequence
from llmbatch_server.sim.errors import ApiError
from llmbatch_server.sim.faults import Fault
from llmbatch_server.sim.generate import admit, inject_fault
from llmbatch_server.sim.requests import check_model, check_poison, read_json, render_chat
from llmbatch_server.sim.responses import CutResponse, dumps, usage, wait_or_disconnect
from llmbatch_server.sim.simulator import Simulator

ENCODINGS = ("float", "base64")


@dataclass(frozen=True, kw_only=True)
class EmbeddingRequest:
    """A validated embedding request: the token ids of each input."""

    inputs: list[list[int]]
    encoding_format: str
    normalize: bool
    priority: int


async def embeddings(sim: Simulator, request: Request) -> Response:
    """Serve ``POST /v1/embeddings``."""
    body = await read_json(request)
    fault = await inject_fault(sim, stream=False)
    config = sim.config
    req = parse_embeddings(
        body,
        model=config.model,
        max_model_len=config.limits.max_model_len,
        poison=sim.faults.rates.poison,
        counter=sim.counter,
    )
    await sim.frontend(len(req.inputs))
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_done(group: Group) -> None:
        if not done.done():
            done.set_result(None)

    group = Group(on_done=on_done)
    sequences = [
        Sequence(
            group=group,
            index=i,
            prompt_tokens=len(ids),
            target=0,
            visible=0,
            finish_reason="stop",
            stop_reason=None,
            seed=0,
        )
        for i, ids in enumerate(req.inputs)
    ]
    admit(sim, group, sequences, req.priority)
    if not await wait_or_disconnect(done, request.receive):
        sim.engine.abort(group)
        return Response(status_code=499)
    data = [
        {
            "index": i,
            "object": "embedding",
            "embedding": _encode(vector(ids, config.embedding_dim, req.normalize), req),
        }
        for i, ids in enumerate(req.inputs)
    ]
    prompt_tokens = sum(len(ids) for ids in req.inputs)
    payload = {
        "id": "embd-" + uuid.uuid4().hex,
        "object": "list",
        "created": int(time.time()),
        "model": config.model,
        "data": data,
        "usage": usage(prompt_tokens, 0),
    }
    response_cls = CutResponse if fault is Fault.DROP else Response
    return response_cls(dumps(payload), media_type="application/json")


def parse_embeddings(
    body: dict[str, Any],
    *,
    model: str,
    max_model_len: int,
    poison: tuple[str, ...],
    counter: TokenCounter,
) -> EmbeddingRequest:
    """Validate an embedding request as vLLM's ``EmbeddingCompletionRequest`` (or,
    with ``messages``, ``EmbeddingChatRequest``) and tokenize its inputs."""
    encoding = body.get("encoding_format") or "float"
    if encoding in ("bytes", "bytes_only"):
        raise ApiError(
            400,
            f"encoding_format {encoding!r} is not supported by the simulator",
            param="encoding_format",
        )
    if encoding not in ENCODINGS:
        raise ApiError(
            400,
            "1 validation error:\n  encoding_format: Input should be 'float', 'base64', "
            "'bytes' or 'bytes_only'",
            param="encoding_format",
            error_type="Bad Request",
        )
    dtype = body.get("embed_dtype") or "float32"
    if dtype != "float32":
        raise ApiError(
            400, f"embed_dtype {dtype!r} is not supported by the simulator", param="embed_dtype"
        )
    normalize = body.get("normalize")
    if normalize is not None and not isinstance(normalize, bool):
        raise ApiError(400, "normalize must be a boolean", param="normalize")
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ApiError(400, "priority must be an integer", param="priority")
    check_model(body, model)
    if body.get("dimensions") is not None:
        # What vLLM answers for any model not trained for Matryoshka embeddings.
        raise ApiError(
            400,
            f'Model "{model}" does not support matryoshka representation, changing output '
            "dimensions will lead to poor results.",
        )
    texts_or_ids = _inputs(body)
    check_poison([t for t in texts_or_ids if isinstance(t, str)], poison)
    keep = _truncation(body.get("truncate_prompt_tokens"), max_model_len)
    inputs = []
    for item in texts_or_ids:
        ids = counter.encode(item) if isinstance(item, str) else item
        if keep is not None:
            ids = ids[-keep:]  # vLLM keeps the end of a truncated prompt
        if len(ids) > max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"you requested {len(ids)} tokens in the input for embedding generation. "
                "Please reduce the length of the input.",
            )
        inputs.append(ids)
    return EmbeddingRequest(
        inputs=inputs,
        encoding_format=encoding,
        normalize=normalize is not False,
        priority=priority,
    )


def vector(ids: list[int], dim: int, normalize: bool = True) -> list[float]:
    """The deterministic embedding of a token-id sequence."""
    seed = hashlib.blake2b(array.array("q", ids).tobytes(), digest_size=16).digest()
    words = array.array("I", hashlib.shake_256(seed).digest(4 * dim))
    values = [w / 2147483648.0 - 1.0 for w in words]  # uniform in [-1, 1)
    if not normalize:
        return values
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _encode(values: list[float], req: EmbeddingRequest) -> list[float] | str:
    if req.encoding_format == "base64":
        # float32 in the machine's byte order, as vLLM's default
        # embed_dtype="float32", endianness="native" (what openai-python decodes).
        return base64.b64encode(array.array("f", values).tobytes()).decode()
    return values


def _inputs(body: dict[str, Any]) -> list[str | list[int]]:
    if body.get("messages") is not None:
        return [render_chat(body["messages"])]
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(_token_id(v) for v in value):
            return [list(value)]
        if all(isinstance(v, list) and v and all(_token_id(t) for t in v) for v in value):
            return [list(v) for v in value]
    raise ApiError(
        400,
        "input must be a string, a non-empty list of strings, or token ids",
        param="input",
    )


def _token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _truncation(value: object, max_model_len: int) -> int | None:
    """How many tokens ``truncate_prompt_tokens`` keeps (None: no truncation)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1 or value == 0:
        raise ApiError(
            400, "truncate_prompt_tokens must be -1 or a positive integer", param="input"
        )
    if value == -1:
        return max_model_len
    if value > max_model_len:
        raise ApiError(
            400,
            f"truncate_prompt_tokens value ({value}) is greater than max_model_len "
            f"({max_model_len}). Please, select a smaller truncation size.",
        )
    return value
