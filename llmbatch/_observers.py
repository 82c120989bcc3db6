"""Observers: a public hook that sees what a client does as it happens, for exporters
of traces, metrics and logs (``llmbatch.otel`` is one). The pull side is
``client.stats()``, which ``llmbatch.prometheus`` reads at each scrape.

A third party subclasses :class:`Observer` and overrides what it needs. The core
calls one private fan-out, :class:`Observers`, shared by everything that reports to
it; with no observer added, each report point costs one attribute test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from llmbatch._logs import Throttle, logger

if TYPE_CHECKING:
    from llmbatch._config import Priority
    from llmbatch._exceptions import LLMBatchError

__all__ = ["ObservedBatch", "ObservedRequest", "Observer", "Observers"]


class ObservedRequest(Protocol):
    """One request as an observer sees it: read-only, valid while the call runs."""

    @property
    def id(self) -> str:
        """llmbatch's id of the request (``req-N``), as its errors carry it."""
        ...

    @property
    def kind(self) -> Literal["completion", "chat", "embedding"]:
        """Which API it calls: a prompt, a conversation, or a text to embed."""
        ...

    @property
    def model(self) -> str:
        """The model it names."""
        ...

    @property
    def priority(self) -> Priority:
        """Its tier."""
        ...

    @property
    def tenant(self) -> str | None:
        """Who it is for (the call's ``tenant=``), or None."""
        ...

    @property
    def max_tokens(self) -> int:
        """The answer's token limit (the call's ``max_tokens``, or its default)."""
        ...

    @property
    def stream(self) -> bool:
        """Its answer is streamed to its caller as it is generated."""
        ...

    @property
    def created_at(self) -> float:
        """When the call was made, on the client's clock (the event loop's)."""
        ...

    @property
    def attempts(self) -> int:
        """HTTP attempts made for it so far."""
        ...

    @property
    def value(self) -> Any:
        """Its answer once it has one (a ``Completion``, ``ChatCompletion`` or
        ``Embedding``), else None."""
        ...

    @property
    def error(self) -> LLMBatchError | None:
        """Its error once it has failed (or was cancelled), else None."""
        ...


class ObservedBatch:
    """One HTTP request as an observer sees it: the requests it carries, where it
    goes, and which attempt it is."""

    __slots__ = ("attempt", "path", "priority", "requests", "url")

    def __init__(
        self,
        *,
        path: str,
        url: str,
        requests: Sequence[ObservedRequest],
        priority: Priority,
        attempt: int,
    ) -> None:
        self.path = path
        """The route, as the server's OpenAI API names it (``/completions``)."""
        self.url = url
        """The whole URL it is sent to."""
        self.requests = requests
        self.priority = priority
        """The tier of every request it carries."""
        self.attempt = attempt
        """1 for the first try, 2 for the first retry, ..."""

    def __repr__(self) -> str:
        return (
            f"<ObservedBatch POST {self.url} requests={len(self.requests)} "
            f"tier={self.priority.value} attempt={self.attempt}>"
        )


class Observer:
    """Sees what a client does as it happens: subclass it, override the methods you
    need (each does nothing by default), and add it with
    ``Client(observers=[...])`` or :meth:`Client.add_observer`::

        class Counter(llmbatch.Observer):
            def request_ended(self, request, kept):
                outcome = "ok" if request.error is None else type(request.error).__name__
                statsd.incr(f"llm.{request.priority.value}.{outcome}")

    Its methods run on the client's event loop, in line with the work: return
    quickly, and never block or await. One that raises is logged (at most once a
    minute per method) and otherwise ignored: an observer never fails a request.
    Prompts and answers are there to read (``request.value``); an exporter that
    must not record them should not.

    What ``request_started`` and ``batch_sent`` return is kept for you and handed
    back when that request or HTTP request ends (a span, a start time).
    """

    def capture(self) -> object:
        """Called in the caller's own task when a ``map`` starts: what to keep of its
        context (a trace context, say). Each request of the map is made later, in
        another task, and gets it back as ``parent``."""
        return None

    def request_started(self, request: ObservedRequest, parent: object) -> object:
        """A request was made: one prompt, conversation or text of a call or a map
        item. ``parent``: what :meth:`capture` returned for a map's requests, None
        for a call's (made in the caller's task). Returns what to keep with it."""
        return None

    def request_ended(self, request: ObservedRequest, kept: object) -> None:
        """The request has its outcome: ``request.value``, or ``request.error``
        (cancellations included). ``kept``: what :meth:`request_started` returned."""

    def batch_sent(self, batch: ObservedBatch, kept: Sequence[object]) -> object:
        """An HTTP request carrying ``batch.requests`` is about to be sent;
        ``kept``: what :meth:`request_started` returned for each of them, in order.
        Returns what to keep with the HTTP request."""
        return None

    def batch_answered(
        self,
        batch: ObservedBatch,
        kept: object,
        status: int | None,
        error: BaseException | None,
    ) -> None:
        """Its answer began: ``status`` (the response's headers arrived; the body
        follows), or it could not be sent (``error``). ``kept``: what
        :meth:`batch_sent` returned."""

    def batch_retrying(self, batch: ObservedBatch, error: BaseException, wait: float) -> None:
        """``batch`` failed with ``error`` and will be sent again after ``wait``
        seconds (as :class:`RetryPolicy` allows)."""


class Observers:
    """A client's observers, called where things happen. Shared by the parts that
    report (given to each when it is built), so adding or removing an observer
    reaches them all; ``on`` is the one test a report point makes."""

    __slots__ = ("_errors", "on", "tuple")

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.tuple: tuple[Observer, ...] = ()
        self.on = False
        self._errors = Throttle(time.monotonic, interval=60.0)
        for observer in observers:
            self.add(observer)

    def add(self, observer: Observer) -> None:
        if observer not in self.tuple:
            self.tuple = (*self.tuple, observer)
            self.on = True

    def remove(self, observer: Observer) -> bool:
        if observer not in self.tuple:
            return False
        self.tuple = tuple(o for o in self.tuple if o is not observer)
        self.on = bool(self.tuple)
        return True

    # -- report points (called only when ``on``) -------------------------------------

    def capture(self) -> object:
        """Each observer's capture, with the observers they belong to."""
        observers = self.tuple
        return observers, [self._call(o.capture) for o in observers]

    def request_started(self, request: Any, parent: object) -> None:
        """Start ``request`` with every observer; what each keeps goes on the request
        (its ``kept``), with the observers that started it."""
        observers = self.tuple
        parents: Sequence[object] = ()
        if isinstance(parent, tuple) and parent and parent[0] is observers:
            parents = parent[1]
        request.kept = (
            observers,
            [
                self._call(o.request_started, request, parents[i] if parents else None)
                for i, o in enumerate(observers)
            ],
        )

    def request_ended(self, request: Any) -> None:
        started = request.kept
        if started is None:
            return
        request.kept = None
        for observer, kept in zip(*started, strict=True):
            self._call(observer.request_ended, request, kept)

    def batch_sent(self, batch: ObservedBatch) -> object:
        observers = self.tuple
        return observers, [
            self._call(o.batch_sent, batch, [_kept_by(o, r) for r in batch.requests])
            for o in observers
        ]

    def batch_answered(
        self, batch: ObservedBatch, sent: Any, status: int | None, error: BaseException | None
    ) -> None:
        for observer, kept in zip(*sent, strict=True):
            self._call(observer.batch_answered, batch, kept, status, error)

    def batch_retrying(self, batch: ObservedBatch, error: BaseException, wait: float) -> None:
        for observer in self.tuple:
            self._call(observer.batch_retrying, batch, error, wait)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except Exception:
            held = self._errors.allow()
            if held is not None:
                logger.exception(
                    "an observer's %s raised (ignored%s)",
                    getattr(method, "__qualname__", method),
                    f"; {held} more since the last report" if held else "",
                )
            return None


def _kept_by(observer: Observer, request: Any) -> object:
    """What ``observer`` kept for ``request`` (None if it did not start it)."""
    started = request.kept
    if started is None:
        return None
    observers, values = started
    for i, other in enumerate(observers):
        if other is observer:
            return values[i]
    return None
