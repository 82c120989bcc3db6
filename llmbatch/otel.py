"""OpenTelemetry spans for llmbatch (``pip install 'llmbatch[otel]'``).

::

    import llmbatch.otel

    async with llmbatch.Client() as client:
        llmbatch.otel.instrument(client)   # the global tracer provider, or pass one
        ...

Each request is a span (``text_completion MODEL``, ``chat MODEL``, ``embeddings
MODEL``), a child of the caller's current span (for ``map``, of the span current
when ``map`` was called), from the call until its answer or error. Each HTTP
request is a span of its own (``POST /completions``, kind CLIENT) linked to the
spans of every request it carries; a request's span has an ``llmbatch.http``
event for each HTTP request it went in, with that span's ids, so a trace can be
followed both ways. A batch of one is also the child of its request's span.
Attributes follow OpenTelemetry's GenAI and HTTP conventions where they apply
(``gen_ai.*``, ``http.*``, ``url.full``, ``server.*``) and ``llmbatch.*``
otherwise. Prompts and answers are never recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "llmbatch.otel needs opentelemetry-api: pip install 'llmbatch[otel]'"
    ) from exc

import llmbatch
from llmbatch import (
    ConfigTypeError,
    DeadlineExceeded,
    ObservedBatch,
    ObservedRequest,
    Observer,
    RequestCancelled,
)

if TYPE_CHECKING:
    from llmbatch import Client

__all__ = ["instrument", "uninstrument"]

_OPERATIONS = {"completion": "text_completion", "chat": "chat", "embedding": "embeddings"}


def instrument(client: Client, tracer_provider: trace.TracerProvider | None = None) -> None:
    """Record ``client``'s requests and HTTP requests as spans.

    ``tracer_provider`` defaults to OpenTelemetry's global one. Works before or
    after the client opens; a ``with_options`` view shares its client's tracing.
    Instrumenting again replaces the first (one set of spans per client). It is an
    :class:`llmbatch.Observer` added to the client: the public hook any exporter
    may use.
    """
    if not isinstance(client, llmbatch.Client):
        raise ConfigTypeError(
            f"instrument() takes a llmbatch.Client, got {type(client).__name__}", field="client"
        )
    uninstrument(client)
    tracer = trace.get_tracer("llmbatch", llmbatch.__version__, tracer_provider=tracer_provider)
    client.add_observer(SpanObserver(tracer))


def uninstrument(client: Client) -> None:
    """Stop recording spans for ``client`` (requests already started still end)."""
    for observer in client.observers:
        if isinstance(observer, SpanObserver):
            client.remove_observer(observer)


class SpanObserver(Observer):
    """A client's requests and HTTP requests as OpenTelemetry spans."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def capture(self) -> object:
        return otel_context.get_current()

    def request_started(self, request: ObservedRequest, parent: object) -> object:
        operation = _OPERATIONS[request.kind]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": request.model,
            "llmbatch.tier": request.priority.value,
            "llmbatch.request.id": request.id,
        }
        if request.kind != "embedding":
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.stream:
            attributes["llmbatch.stream"] = True
        if request.tenant is not None:
            attributes["llmbatch.tenant"] = request.tenant
        return self._tracer.start_span(
            f"{operation} {request.model}",
            context=parent,  # type: ignore[arg-type]  # None: the current context
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )

    def request_ended(self, request: ObservedRequest, kept: object) -> None:
        span = kept
        if not isinstance(span, trace.Span):
            return
        span.set_attribute("llmbatch.attempts", request.attempts)
        error = request.error
        if error is None:
            span.set_attribute("llmbatch.outcome", "done")
            usage = getattr(request.value, "usage", None)
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            response_id = getattr(request.value, "id", None)
            if response_id:
                span.set_attribute("gen_ai.response.id", response_id)
            finish = getattr(request.value, "finish_reason", None)
            if finish:
                span.set_attribute("gen_ai.response.finish_reasons", [finish])
        else:
            cancelled = isinstance(error, RequestCancelled | DeadlineExceeded)
            span.set_attribute("llmbatch.outcome", "cancelled" if cancelled else "failed")
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()

    def batch_sent(self, batch: ObservedBatch, kept: Sequence[object]) -> object:
        spans = [span for span in kept if isinstance(span, trace.Span)]
        parts = urlsplit(batch.url)
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "url.full": batch.url,
            "server.address": parts.hostname or "",
            "llmbatch.batch.size": len(batch.requests),
            "llmbatch.tier": batch.priority.value,
        }
        if parts.port is not None:
            attributes["server.port"] = parts.port
        # A batch of one belongs under its request; a larger one under none of them.
        parent = (
            trace.set_span_in_context(spans[0])
            if len(batch.requests) == 1 and spans
            else otel_context.Context()
        )
        span = self._tracer.start_span(
            f"POST {batch.path}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=[Link(s.get_span_context()) for s in spans],
        )
        ids = span.get_span_context()
        event = {
            "llmbatch.http.trace_id": trace.format_trace_id(ids.trace_id),
            "llmbatch.http.span_id": trace.format_span_id(ids.span_id),
        }
        for request_span in spans:
            request_span.add_event("llmbatch.http", event)
        return span

    def batch_answered(
        self,
        batch: ObservedBatch,
        kept: object,
        status: int | None,
        error: BaseException | None,
    ) -> None:
        handle = kept
        if not isinstance(handle, trace.Span):
            return
        if status is not None:
            handle.set_attribute("http.response.status_code", status)
            if status >= 400:
                handle.set_attribute("error.type", str(status))
                handle.set_status(Status(StatusCode.ERROR))
        elif error is not None:
            handle.set_attribute("error.type", type(error).__name__)
            handle.set_status(Status(StatusCode.ERROR, str(error)))
        handle.end()
