"""Requests built the way the client builds them, for tests of the pure scheduler."""

from __future__ import annotations

from llmbatch import Priority
from llmbatch._calls.request import Request
from llmbatch._calls.spec import check_call
from llmbatch._calls.validate import check_prompt


def make_request(
    priority: Priority = Priority.NORMAL,
    *,
    at: float = 0.0,
    prompt: str = "hello",
    max_tokens: int = 10,
    timeout: float | None = None,
    temperature: float | None = None,
    stream: bool = False,
    model: str = "m",
    tenant: str | None = None,
    tenant_as_user: bool = True,
) -> Request:
    """A completion request created at ``at`` (its deadline is ``at + timeout``)."""
    spec = check_call(
        "completion",
        "complete",
        {
            "priority": priority,
            "model": model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "timeout": timeout,
            "tenant": tenant,
        },
        stream=stream,
        tenant_as_user=tenant_as_user,
    )
    return Request(
        spec, prompt, None, check_prompt(prompt, n=spec.n, max_tokens=spec.max_tokens), at
    )
