"""An in-process OpenAI-compatible handler for MockTransport-based tests.

It answers like vLLM (list prompts, choice index = prompt_idx * n + j, one usage per
request, 400 for the whole list when any prompt is poisoned; the chat batch route of
vLLM 0.32+, which ``chat_batch=False`` removes; 404 for unknown routes; streams of
completions and chats with a final usage event) and records what it saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmbatch.transports import HTTPRequest, MockResponse

POISON = "POISON"


def _words(text: str) -> int:
    return max(1, len(text.split()))


@dataclass
class FakeServer:
    """Call it with an HTTPRequest; inspect ``bodies`` afterwards."""

    model: str = "fake-model"
    max_model_len: int = 4096
    bodies: list[dict[str, Any]] = field(default_factory=list)
    #: Optional hook run before answering; return a MockResponse to override.
    intercept: Callable[[dict[str, Any]], MockResponse | None] | None = None
    #: Serve POST /v1/chat/completions/batch (vLLM 0.32+).
    chat_batch: bool = True
    #: The path of every POST, in order.
    paths: list[str] = field(default_factory=list)

    def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            return MockResponse(
                json={
                    "object": "list",
                    "data": [
                        {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
                    ],
                }
            )
        if request.url.endswith("/health"):
            return MockResponse(status=200)
        body = json.loads(request.body or b"{}")
        path = request.url.split("/v1", 1)[-1].split("?", 1)[0]
        if request.method == "POST":
            self.paths.append(path)
        routes = ["/completions", "/chat/completions"]
        if self.chat_batch:
            routes.append("/chat/completions/batch")
        if path not in routes:
            return MockResponse(status=404, json={"detail": "Not Found"})
        self.bodies.append(body)
        if self.intercept is not None:
            override = self.intercept(body)
            if override is not None:
                return override
        if path == "/chat/completions":
            return self._chat(body)
        if path == "/chat/completions/batch":
            return self._chat_batch(body)
        return self._completions(body)

    def _completions(self, body: dict[str, Any]) -> MockResponse:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        if any(POISON in p for p in prompts):
            return MockResponse(
                status=400,
                json={
                    "error": {
                        "message": "This prompt is poisoned",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                },
            )
        n = body.get("n", 1)
        max_tokens = body.get("max_tokens", 16)
        choices = []
        for i, prompt in enumerate(prompts):
            for j in range(n):
                choices.append(
                    {
                        "index": i * n + j,
                        "text": f"echo:{prompt}:{j}",
                        "logprobs": None,
                        "finish_reason": "length",
                    }
                )
        prompt_tokens = sum(_words(p) for p in prompts)
        completion_tokens = len(prompts) * n * max_tokens
        if body.get("stream"):
            lines = []
            for c in choices:
                for k, piece in enumerate((c["text"][:3], c["text"][3:])):
                    chunk = {
                        "id": "cmpl-1",
                        "model": self.model,
                        "choices": [
                            {
                                "index": c["index"],
                                "text": piece,
                                "finish_reason": "length" if k == 1 else None,
                            }
                        ],
                    }
                    lines += [b"data: " + json.dumps(chunk).encode(), b""]
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
            lines += [
                b"data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": usage}).encode(),
                b"",
                b"data: [DONE]",
                b"",
            ]
            return MockResponse(lines=lines)
        return MockResponse(
            json={
                "id": "cmpl-1",
                "object": "text_completion",
                "model": self.model,
                "choices": choices,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    def _chat(self, body: dict[str, Any]) -> MockResponse:
        answer = self._chat_answer([body["messages"]], body)
        if body.get("stream") and answer.status == 200:
            return _chat_stream(answer.json)  # type: ignore[arg-type]
        return answer

    def _chat_batch(self, body: dict[str, Any]) -> MockResponse:
        return self._chat_answer(body["messages"], body)

    def _chat_answer(
        self, conversations: list[list[dict[str, Any]]], body: dict[str, Any]
    ) -> MockResponse:
        """``n`` answers per conversation; a call of the first tool when ``tools`` are
        given; logprobs when asked; a system fingerprint."""
        lasts = [conversation[-1]["content"] for conversation in conversations]
        if any(POISON in last for last in lasts):
            return MockResponse(
                status=400, json={"error": {"message": "poisoned chat", "code": 400}}
            )
        n = body.get("n", 1)
        choices = []
        for i, last in enumerate(lasts):
            for j in range(n):
                message: dict[str, Any] = {"role": "assistant", "content": f"re:{last}"}
                finish = "stop"
                if body.get("tools"):
                    name = body["tools"][0].get("function", {}).get("name", "tool")
                    arguments = json.dumps({"q": last})
                    message = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call-{i}-{j}",
                                "type": "function",
                                "function": {"name": name, "arguments": arguments},
                            }
                        ],
                    }
                    finish = "tool_calls"
                choice: dict[str, Any] = {
                    "index": i * n + j,
                    "message": message,
                    "finish_reason": finish,
                }
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": [{"token": "re", "logprob": -0.5}]}
                choices.append(choice)
        count = len(lasts) * n
        return MockResponse(
            json={
                "id": "chat-1",
                "object": "chat.completion",
                "model": body.get("model", self.model),
                "system_fingerprint": "fp-fake",
                "choices": choices,
                "usage": {
                    "prompt_tokens": 3 * count,
                    "completion_tokens": 2 * count,
                    "total_tokens": 5 * count,
                },
            }
        )


def _event(data: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(data).encode(), b""]


def _chat_stream(answer: dict[str, Any]) -> MockResponse:
    """A chat answer as vLLM streams it: a role event, the content in two pieces (or a
    tool call: its id and name, then its arguments), the finish reason on the last
    piece, then a usage event with no choices."""
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": 1700000000}
    head["model"] = answer["model"]
    choice = answer["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        function = call["function"]
        deltas += [
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"arguments": function["arguments"]}}]},
        ]
    else:
        content = message["content"]
        deltas += [{"content": content[:3]}, {"content": content[3:]}]
    lines: list[bytes] = []
    for k, delta in enumerate(deltas):
        last = k == len(deltas) - 1
        event = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        if last:
            event["finish_reason"] = finish
        lines += _event({**head, "choices": [event]})
    lines += _event({**head, "choices": [], "usage": answer["usage"]})
    lines += [b"data: [DONE]", b""]
    return MockResponse(lines=lines)


class FailsFirstPost:
    """A :class:`FakeServer` whose first POST gets ``status`` (a retryable failure);
    every request after it is answered."""

    def __init__(self, status: int = 500, message: str = "boom") -> None:
        self.fake = FakeServer()
        self.status = status
        self.message = message
        self.failed = False

    def __call__(self, request: HTTPRequest) -> MockResponse:
        if request.method == "POST" and not self.failed:
            self.failed = True
            return MockResponse(status=self.status, json={"error": {"message": self.message}})
        return self.fake(request)
