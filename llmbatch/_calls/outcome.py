"""Where a request ends: its outcome is set here, once (the first wins), then counted
by the recorder and told to the observers. The dispatcher settles what a server
answered; the engine what never reached one, or was cancelled on the way.

Setting an outcome and counting it go through this one door, so no outcome goes
uncounted or is counted twice; the recorder only counts what it is told.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llmbatch._exceptions import DeadlineExceeded, LLMBatchError, RequestCancelled
from llmbatch._spending.ledger import settle

if TYPE_CHECKING:
    from llmbatch._calls.request import Request
    from llmbatch._observers import Observers
    from llmbatch._recorder import StatsRecorder
    from llmbatch._spending.prices import PriceBook

__all__ = ["Outcomes"]


class Outcomes:
    """Settles requests for one client, counting each outcome in its recorder."""

    __slots__ = ("observers", "prices", "recorder")

    def __init__(
        self, recorder: StatsRecorder, observers: Observers, prices: PriceBook | None = None
    ) -> None:
        self.recorder = recorder
        self.observers = observers
        self.prices = prices
        """Each model's price: what answers cost is counted with it (None: not)."""

    def answered(
        self,
        requests: Sequence[Request],
        values: Sequence[object],
        now: float,
        prompts: Sequence[int],
        completions: Sequence[int],
        cached: Sequence[int] | None = None,
    ) -> None:
        """Give each request of one answered batch its value, and count those it
        settles (one settled already, cancelled or past its deadline, keeps its
        outcome). A batch shares its tier and model, so it is counted in one go.

        What the answers cost counts for every request, settled or not (the server
        did the work), by tier and model, and against the requests' spending limits;
        a tenant's, like its tokens, for its requests this settles. ``cached``: each
        request's prompt tokens read from the server's prompt cache."""
        first = requests[0]
        prices = self.prices
        price = None if prices is None else prices.price(first.spec.model)
        hits = cached if cached is not None else [0] * len(requests)
        observers = self.observers
        latencies: list[float] = []
        retried = prompt_total = completion_total = 0
        # Per tenant: prompt, completion and cached tokens, latencies. A batch's
        # requests share a spec, and with it their tenant, unless it mixes tenants.
        by_tenant: dict[str, list[Any]] | None = None
        last_spec: object = None
        entry: list[Any] = []
        for request, value, prompt, completion, hit in zip(
            requests, values, prompts, completions, hits, strict=True
        ):
            if request.spending:
                settle(request, 0.0 if price is None else price.cost(prompt, completion, hit))
            if not request.set_value(value):
                continue
            latency = now - request.created_at
            latencies.append(latency)
            retried += request.retried
            prompt_total += prompt
            completion_total += completion
            spec = request.spec
            if spec.tenant is not None:
                if spec is not last_spec:
                    last_spec = spec
                    if by_tenant is None:
                        by_tenant = {}
                    entry = by_tenant.setdefault(spec.tenant, [0, 0, [], 0])
                entry[0] += prompt
                entry[1] += completion
                entry[2].append(latency)
                entry[3] += hit
            if request.kept is not None:  # started with observers (some may be gone since)
                observers.request_ended(request)
        recorder = self.recorder
        recorder.answered(first.priority, latencies, retried, prompt_total, completion_total, now)
        paid = (sum(prompts), sum(hits) if cached is not None else 0, sum(completions))
        recorder.paid(
            first.priority,
            first.spec.model or "",
            len(requests),
            paid,
            None if price is None else price.cost(paid[0], paid[2], paid[1]),
        )
        if by_tenant is not None:
            for name, (prompt, completion, tenant_latencies, hit) in by_tenant.items():
                recorder.tenant_answered(name, prompt, completion, tenant_latencies, now)
                recorder.tenant_paid(
                    name,
                    (len(tenant_latencies), prompt, hit, completion),
                    None if price is None else price.cost(prompt, completion, hit),
                    now,
                )

    def failed(self, request: Request, error: LLMBatchError) -> bool:
        """Give ``request`` its error and count it as failed, or as cancelled for a
        cancellation or a deadline; False if it was settled already."""
        if request.reserved:
            settle(request, 0.0)  # no answer: it cost nothing (or its answer will say)
        if not request.set_error(error):
            return False
        self.recorder.ended(
            request.priority,
            request.spec.tenant,
            request.created_at,
            cancelled=isinstance(error, RequestCancelled | DeadlineExceeded),
            retried=request.retried,
        )
        if request.kept is not None:
            self.observers.request_ended(request)
        return True

    def cancelled(self, request: Request, reason: str) -> bool:
        """End ``request`` with :class:`RequestCancelled` saying ``reason`` ("the caller
        went away", "the client closed before ..."); False if it was settled already."""
        return self.failed(
            request, RequestCancelled(reason, request_id=request.id, attempts=request.attempts)
        )
