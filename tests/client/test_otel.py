"""llmbatch.otel with the real OpenTelemetry SDK: a span per request under the
caller's span, a span per HTTP request linked to the requests it carried, failures
marked, nothing recorded once uninstrumented."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_server import POISON, FailsFirstPost, FakeServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import llmbatch
import llmbatch.otel
from llmbatch import BatchPolicy, Client, RetryPolicy
from llmbatch.transports import MockTransport

pytestmark = pytest.mark.anyio

NO_WAIT = RetryPolicy(initial_backoff=0.0, max_backoff=0.0, outage_tolerance=0)


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def make(handler: Any = None, **kw: Any) -> Client:
    kw.setdefault("retry", NO_WAIT)
    return Client("http://127.0.0.1:1/v1", transport=MockTransport(handler or FakeServer()), **kw)


def by_kind(spans: tuple[ReadableSpan, ...]) -> tuple[list[ReadableSpan], list[ReadableSpan]]:
    requests = [s for s in spans if s.kind is SpanKind.INTERNAL and s.name != "app"]
    http = [s for s in spans if s.kind is SpanKind.CLIENT]
    return requests, http


async def test_map_items_are_children_of_the_callers_span_and_linked_from_batches(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    tracer = provider.get_tracer("app")
    client = make(batching={"batch": BatchPolicy(max_batch_size=8)})
    llmbatch.otel.instrument(client, provider)  # before the client opens
    async with client:
        with tracer.start_as_current_span("app") as app:
            results = await client.map([f"p{i}" for i in range(20)], max_tokens=3)
    assert all(r.ok for r in results)
    requests, http = by_kind(exporter.get_finished_spans())
    assert len(requests) == 20
    app_id = app.get_span_context().span_id
    assert all(s.parent is not None and s.parent.span_id == app_id for s in requests)
    assert {s.name for s in requests} == {"text_completion fake-model"}
    first = requests[0].attributes or {}
    assert first["gen_ai.operation.name"] == "text_completion"
    assert first["llmbatch.tier"] == "batch"
    assert first["llmbatch.outcome"] == "done"
    assert first["gen_ai.usage.output_tokens"] == 3
    # Every request is linked from exactly one HTTP span, and points back to it.
    linked = [link.context.span_id for s in http for link in s.links]
    assert sorted(linked) == sorted(s.context.span_id for s in requests)
    assert sum((s.attributes or {})["llmbatch.batch.size"] for s in http) == 20
    for span in http:
        assert span.name == "POST /completions"
        assert (span.attributes or {})["http.response.status_code"] == 200
        assert span.parent is None or len(span.links) == 1
    http_ids = {format(s.context.span_id, "016x") for s in http}
    for span in requests:
        (event,) = [e for e in span.events if e.name == "llmbatch.http"]
        assert (event.attributes or {})["llmbatch.http.span_id"] in http_ids


async def test_a_lone_call_nests_its_http_span_and_failures_are_marked(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    client = make()
    async with client:
        llmbatch.otel.instrument(client, provider)  # after it opened
        await client.complete("hello", priority="realtime", max_tokens=2, tenant="agent-7")
        with pytest.raises(llmbatch.BadRequestError):
            await client.complete(f"{POISON} prompt", max_tokens=2)
    requests, http = by_kind(exporter.get_finished_spans())
    ok, bad = requests
    assert (ok.attributes or {})["llmbatch.tier"] == "realtime"
    assert (ok.attributes or {})["llmbatch.tenant"] == "agent-7"
    assert "llmbatch.tenant" not in (bad.attributes or {})  # a call without a tenant
    assert ok.status.status_code is StatusCode.UNSET
    assert bad.status.status_code is StatusCode.ERROR
    assert (bad.attributes or {})["error.type"] == "BadRequestError"
    assert (bad.attributes or {})["llmbatch.outcome"] == "failed"
    assert len(http) == 2
    assert http[0].parent is not None
    assert http[0].parent.span_id == ok.context.span_id  # a batch of one: its child
    assert (http[1].attributes or {})["http.response.status_code"] == 400
    assert http[1].status.status_code is StatusCode.ERROR


async def test_each_attempt_and_bisection_part_is_an_http_span(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    client = make(FailsFirstPost(503, "busy"))
    llmbatch.otel.instrument(client, provider)
    async with client:
        prompts = [f"p{i}" for i in range(8)]
        prompts[5] = f"{POISON} 5"
        results = await client.map(prompts, max_tokens=2)
        stats = client.stats()
    assert [r.ok for r in results] == [True] * 5 + [False] + [True] * 2
    requests, http = by_kind(exporter.get_finished_spans())
    assert len(http) == stats.batches_sent
    statuses = [(s.attributes or {})["http.response.status_code"] for s in http]
    assert statuses.count(503) == 1
    poisoned = next(s for s in requests if (s.attributes or {})["llmbatch.outcome"] == "failed")
    carried = [s for s in http if poisoned.context.span_id in {x.context.span_id for x in s.links}]
    # The first attempt (503), its retry, then every bisection part down to one.
    assert len(carried) == len([e for e in poisoned.events if e.name == "llmbatch.http"]) >= 4
    assert (poisoned.attributes or {})["llmbatch.attempts"] == len(carried)


async def test_uninstrument_stops_recording(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    client = make()
    llmbatch.otel.instrument(client, provider)
    async with client:
        await client.complete("one")
        llmbatch.otel.uninstrument(client)
        await client.complete("two")
    requests, http = by_kind(exporter.get_finished_spans())
    assert (len(requests), len(http)) == (1, 1)


def test_instrument_refuses_what_is_not_a_client() -> None:
    with pytest.raises(llmbatch.ConfigTypeError):
        llmbatch.otel.instrument(object())  # type: ignore[arg-type]


def test_import_llmbatch_does_not_import_opentelemetry() -> None:
    import subprocess
    import sys

    code = "import sys, llmbatch; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
