"""Prometheus metrics for llmbatch clients (``pip install 'llmbatch[prometheus]'``).

::

    import prometheus_client
    import llmbatch.prometheus

    async with llmbatch.Client() as client:
        llmbatch.prometheus.register(client)
        prometheus_client.start_http_server(9464, addr="127.0.0.1")
        ...

``register`` adds a collector to a ``prometheus_client`` registry (the default one
unless told otherwise). It reads ``client.stats()`` at each scrape, so the request
path pays nothing for it. Several clients may share a registry, told apart by
``labels`` (the same label names for all of them). Every metric is named
``llmbatch_*``; docs/metrics.md lists them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client.core import (
        REGISTRY,
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "llmbatch.prometheus needs prometheus-client: pip install 'llmbatch[prometheus]'"
    ) from exc

import llmbatch
from llmbatch import ConfigError, ConfigTypeError, SignalSource

if TYPE_CHECKING:
    from llmbatch import Client, Histogram, Stats

__all__ = ["LLMBatchCollector", "register", "unregister"]

_BREAKER_STATES = ("closed", "open", "half_open")
#: The tenant label of every tenant not named in ``tenants=`` (few label values).
OTHER_TENANTS = "other"


class LLMBatchCollector(Collector):
    """Collects every registered client's ``stats()`` at scrape time.

    One per registry (``register`` makes it); clients are held weakly, so a client
    that is gone stops being reported instead of being kept alive. It reads only
    what any exporter may: ``client.stats()``.
    """

    def __init__(self) -> None:
        self._clients: list[tuple[weakref.ref[Client], tuple[tuple[str, str], ...]]] = []
        self._lock = threading.Lock()

    def add(self, client: Client, labels: Mapping[str, str]) -> None:
        """Report ``client`` with these constant labels."""
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._prune()
            for ref, other in self._clients:
                if ref() is client:
                    raise ConfigError("this client is already registered", field="client")
                if [k for k, _ in other] != [k for k, _ in key]:
                    raise ConfigError(
                        "every client in one registry needs the same label names: "
                        f"{[k for k, _ in other]} registered, {[k for k, _ in key]} given",
                        field="labels",
                    )
                if other == key:
                    raise ConfigError(
                        f"a client with labels {dict(key)} is already registered; give this "
                        "one labels that tell it apart",
                        field="labels",
                    )
            self._clients.append((weakref.ref(client), key))

    def remove(self, client: Client) -> bool:
        """Stop reporting ``client``; False if it was not registered."""
        with self._lock:
            before = len(self._clients)
            self._clients = [(r, k) for r, k in self._clients if r() not in (client, None)]
            return len(self._clients) < before

    def _prune(self) -> None:
        self._clients = [(r, k) for r, k in self._clients if r() is not None]

    def describe(self) -> Iterator[Metric]:
        # Nothing up front: the registry then skips its duplicate-name check for this
        # collector, and metric families are built per scrape.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._prune()
            clients = [(r(), dict(k)) for r, k in self._clients]
        snapshots: list[tuple[Stats, dict[str, str]]] = []
        for client, labels in clients:
            if client is None:
                continue
            try:
                snapshots.append((client.stats(), labels))
            except Exception:  # not open yet, or closed and gone: nothing to report
                continue
        names = sorted(snapshots[0][1]) if snapshots else []
        return iter(_families(snapshots, names))


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, LLMBatchCollector] = (
    weakref.WeakKeyDictionary()
)
_registry_lock = threading.Lock()


def register(
    client: Client,
    registry: CollectorRegistry | None = None,
    *,
    labels: Mapping[str, str] | None = None,
) -> LLMBatchCollector:
    """Report ``client``'s metrics in ``registry`` (default: prometheus_client's).

    ``labels`` are constant labels on every series of this client (``{"app":
    "search"}``), needed to tell several clients in one registry apart. A client
    may be registered before it opens; it is reported while it is open and after
    it closes (its final counts), until :func:`unregister` or until it is gone.
    A ``with_options`` view reports its client's figures: register the client.
    """
    if not isinstance(client, llmbatch.Client):
        raise ConfigTypeError(
            f"register() takes a llmbatch.Client, got {type(client).__name__}", field="client"
        )
    checked = _check_labels(labels)
    target = REGISTRY if registry is None else registry
    with _registry_lock:
        collector = _collectors.get(target)
        if collector is None:
            collector = _collectors[target] = LLMBatchCollector()
            target.register(collector)
    collector.add(client, checked)
    return collector


def unregister(client: Client, registry: CollectorRegistry | None = None) -> bool:
    """Stop reporting ``client`` in ``registry``; False if it was not registered."""
    collector = _collectors.get(REGISTRY if registry is None else registry)
    return collector is not None and collector.remove(client)


_RESERVED = frozenset(
    {"tier", "outcome", "server", "state", "result", "le", "tenant", "kind", "source"}
)


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise ConfigTypeError("labels must be a dict of str to str", field="labels")
    for name, value in labels.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigTypeError("labels must be a dict of str to str", field="labels")
        if not name.isidentifier() or name.startswith("__"):
            raise ConfigError(f"{name!r} is not a valid Prometheus label name", field="labels")
        if name in _RESERVED:
            raise ConfigError(f"label {name!r} is used by llmbatch's own metrics", field="labels")
    return dict(labels)


def _families(snapshots: list[tuple[Stats, dict[str, str]]], names: list[str]) -> list[Metric]:
    """Every metric family, one sample per client (and tier, outcome, server...)."""

    def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"llmbatch_{name}", doc, labels=[*names, *extra])

    def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
        return CounterMetricFamily(f"llmbatch_{name}", doc, labels=[*names, *extra])

    def histogram(name: str, doc: str, extra: tuple[str, ...] = ()) -> HistogramMetricFamily:
        return HistogramMetricFamily(f"llmbatch_{name}", doc, labels=[*names, *extra])

    queued = gauge("queued_requests", "Requests waiting in the client, by tier.", ("tier",))
    in_flight = gauge("in_flight_requests", "Requests sent and not yet answered.", ("tier",))
    requests = counter(
        "requests",
        "Requests finished, by tier and outcome (done, failed, cancelled).",
        ("tier", "outcome"),
    )
    retried = counter(
        "retried_requests", "Requests that needed more than one HTTP attempt.", ("tier",)
    )
    latency = histogram(
        "request_duration_seconds",
        "From the call to the complete answer, successful requests.",
        ("tier",),
    )
    queue_wait = histogram(
        "queue_wait_seconds", "From the call until the request's batch was sent.", ("tier",)
    )
    http = counter("http_requests", "HTTP requests sent (retries and bisection parts included).")
    retries = counter("http_retries", "HTTP requests sent again after a failed attempt.")
    bisections = counter("bisections", "400-answered batches split to isolate bad items.")
    batch_size = histogram("batch_size", "Prompts per HTTP request sent.")
    prompt_tokens = counter("prompt_tokens", "Prompt tokens of answered requests.")
    completion_tokens = counter("completion_tokens", "Completion tokens of answered requests.")
    server = ("server",)
    limit = gauge(
        "admission_limit",
        "Sequences normal and batch work may have in flight on the server now.",
        server,
    )
    ceiling = gauge("admission_ceiling", "Limits.max_in_flight: the limit's ceiling.", server)
    server_in_flight = gauge(
        "server_in_flight_requests", "Requests in flight on the server, every tier.", server
    )
    ejected = gauge(
        "server_ejected", "1 while the server is out of rotation for being slow.", server
    )
    reserve = gauge("realtime_reserve", "In-flight seats kept free for realtime now.", server)
    step = gauge("server_step_seconds", "Observed time per output token on the server.", server)
    ttft = gauge("server_ttft_seconds", "Observed realtime time to first token.", server)
    waiting = gauge("server_waiting_requests", "Requests in the server's own queue.", server)
    api_queue = gauge(
        "server_api_queue_requests",
        "This client's requests the server holds in its API process, not yet in its engine.",
        server,
    )
    kv = gauge("server_kv_cache_usage_ratio", "The server's KV-cache use, 0 to 1.", server)
    breaker = gauge(
        "breaker_state", "1 for the circuit breaker's current state.", ("server", "state")
    )
    outages = counter("outages", "Times the server became unavailable.", server)
    aim = gauge("slo_aim_ratio", "The share of the SLO latencies are held to now.", server)
    slo = counter(
        "slo_answers", "Realtime answers within the SLO (met) or not (missed).", (*server, "result")
    )
    unreachable = gauge(
        "slo_unreachable",
        "1 while bulk is at one sequence and the server is still over the SLO.",
        server,
    )
    signal = gauge(
        "server_signal_live",
        "1 for each source that reported on the server lately (0 for the others).",
        (*server, "source"),
    )
    tenant = ("tenant",)
    tenant_queued = gauge(
        "tenant_queued_requests",
        "A tenant's requests waiting in the client (queued, or held by its limits).",
        tenant,
    )
    tenant_in_flight = gauge(
        "tenant_in_flight_requests", "A tenant's requests sent and not yet answered.", tenant
    )
    tenant_requests = counter(
        "tenant_requests",
        "A tenant's requests finished, by outcome (done, failed, cancelled).",
        (*tenant, "outcome"),
    )
    tenant_tokens = counter(
        "tenant_tokens",
        "A tenant's answered tokens, by kind (prompt, completion).",
        (*tenant, "kind"),
    )

    cost = counter(
        "cost_dollars", "Dollars the answers cost at their models' prices, by tier.", ("tier",)
    )
    model_tokens = counter(
        "model_tokens",
        "Tokens the server was paid for, by model and kind (prompt, cached, completion).",
        ("model", "kind"),
    )
    model_cost = counter(
        "model_cost_dollars", "Dollars the answers cost, by model (no price: 0).", ("model",)
    )
    tenant_cost = counter("tenant_cost_dollars", "Dollars a tenant's answers cost.", tenant)
    spending = gauge(
        "max_cost_dollars",
        "The client's max_cost, and what is spent and reserved under it (state).",
        ("state",),
    )

    cache_answers = counter(
        "cache_answers",
        "Answers of the response cache, by outcome: hit (read from it), miss (looked up "
        "and sent), shared (with an identical request in flight), stored.",
        ("outcome",),
    )
    cache_saved_tokens = counter(
        "cache_saved_tokens",
        "Tokens the response cache's hits and shared answers saved, by kind.",
        ("kind",),
    )
    cache_saved_cost = counter(
        "cache_saved_dollars", "Dollars the response cache's hits and shared answers saved."
    )

    for stats, labels in snapshots:
        own = [labels[n] for n in names]
        if stats.cache is not None:
            kept = stats.cache
            for outcome, n in (
                ("hit", kept.hits),
                ("miss", kept.misses),
                ("shared", kept.shared),
                ("stored", kept.stored),
            ):
                cache_answers.add_metric([*own, outcome], n)
            for kind, n in (
                ("prompt", kept.saved.prompt_tokens),
                ("completion", kept.saved.completion_tokens),
            ):
                cache_saved_tokens.add_metric([*own, kind], n)
            cache_saved_cost.add_metric(own, kept.saved.dollars)
        for tier, t in stats.tiers.items():
            cost.add_metric([*own, tier.value], t.cost.dollars)
        for model, paid in stats.models.items():
            for kind, tokens in (
                ("prompt", paid.prompt_tokens),
                ("cached", paid.cached_tokens),
                ("completion", paid.completion_tokens),
            ):
                model_tokens.add_metric([*own, model, kind], tokens)
            model_cost.add_metric([*own, model], paid.dollars)
        if stats.spending is not None:
            limits = stats.spending
            for state, dollars in (
                ("limit", limits.max_cost),
                ("spent", limits.spent),
                ("reserved", limits.reserved),
            ):
                spending.add_metric([*own, state], dollars)
        for tier, t in stats.tiers.items():
            at = [*own, tier.value]
            queued.add_metric(at, t.queued)
            in_flight.add_metric(at, t.in_flight)
            for outcome, n in (("done", t.done), ("failed", t.failed), ("cancelled", t.cancelled)):
                requests.add_metric([*at, outcome], n)
            retried.add_metric(at, t.retried)
            _observe(latency, at, t.latency_histogram)
            _observe(queue_wait, at, t.queue_wait_histogram)
        http.add_metric(own, stats.batches_sent)
        retries.add_metric(own, stats.retries)
        bisections.add_metric(own, stats.bisections)
        _observe(batch_size, own, stats.batch_size_histogram)
        prompt_tokens.add_metric(own, stats.prompt_tokens)
        completion_tokens.add_metric(own, stats.completion_tokens)
        for s in stats.servers:
            at = [*own, s.base_url]
            limit.add_metric(at, s.bulk_limit)
            server_in_flight.add_metric(at, s.in_flight)
            ejected.add_metric(at, 1.0 if s.ejected else 0.0)
            ceiling.add_metric(at, s.ceiling)
            reserve.add_metric(at, s.realtime_reserve)
            for family, value in (
                (step, s.step_time),
                (ttft, s.ttft),
                (waiting, s.waiting),
                (api_queue, s.api_queue),
            ):
                if value is not None:
                    family.add_metric(at, value)
            if s.kv_cache_usage is not None:
                kv.add_metric(at, s.kv_cache_usage)
            for state in _BREAKER_STATES:
                breaker.add_metric([*at, state], 1.0 if s.breaker == state else 0.0)
            outages.add_metric(at, s.outages)
            if s.slo_aim is not None:
                aim.add_metric(at, s.slo_aim)
            slo.add_metric([*at, "met"], s.slo_met)
            slo.add_metric([*at, "missed"], s.slo_missed)
            unreachable.add_metric(at, 1.0 if s.slo_unreachable else 0.0)
            for source in SignalSource:  # every source, so a series never just disappears
                signal.add_metric([*at, source.value], 1.0 if source in s.signals else 0.0)
        # Tenants named in tenants= have series of their own; every other tenant is
        # summed under "other", so label values stay few and never jump.
        shown = [(name, t) for name, t in sorted(stats.tenants.items()) if t.named]
        if stats.other_tenants is not None:
            shown.append((OTHER_TENANTS, stats.other_tenants))
        for name, counts in shown:
            at = [*own, name]
            tenant_queued.add_metric(at, counts.queued)
            tenant_in_flight.add_metric(at, counts.in_flight)
            for outcome, n in (
                ("done", counts.done),
                ("failed", counts.failed),
                ("cancelled", counts.cancelled),
            ):
                tenant_requests.add_metric([*at, outcome], n)
            tenant_tokens.add_metric([*at, "prompt"], counts.prompt_tokens)
            tenant_tokens.add_metric([*at, "completion"], counts.completion_tokens)
            tenant_cost.add_metric(at, counts.cost.dollars)
    families: list[Any] = [
        queued,
        in_flight,
        requests,
        retried,
        latency,
        queue_wait,
        http,
        retries,
        bisections,
        batch_size,
        prompt_tokens,
        completion_tokens,
        limit,
        ceiling,
        server_in_flight,
        ejected,
        reserve,
        step,
        ttft,
        waiting,
        api_queue,
        kv,
        breaker,
        outages,
        aim,
        slo,
        unreachable,
        signal,
        tenant_queued,
        tenant_in_flight,
        tenant_requests,
        tenant_tokens,
        tenant_cost,
        cost,
        model_tokens,
        model_cost,
        spending,
        cache_answers,
        cache_saved_tokens,
        cache_saved_cost,
    ]
    return families


def _observe(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    buckets = [(_bound(bound), float(count)) for bound, count in h.cumulative()]
    family.add_metric(labels, buckets, h.sum)


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
