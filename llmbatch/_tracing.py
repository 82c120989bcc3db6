"""The tracing hooks the core calls, when a tracer is installed (``llmbatch.otel``).

The core knows only this protocol; the OpenTelemetry implementation lives behind
the ``otel`` extra. With no tracer installed, each hook point costs one ``is None``
check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llmbatch._calls.request import Request

__all__ = ["Tracer"]


class Tracer(Protocol):
    """Receives a request's life and each HTTP request's, to record them as spans."""

    def capture(self) -> object:
        """The caller's current trace context, to parent requests made later for it
        (a ``map``'s items are made by a feeder task, not by the caller)."""

    def request_started(self, request: Request, parent: object = None) -> None:
        """A request was made (in the caller's context, or under ``parent``)."""

    def request_settled(self, request: Request) -> None:
        """The request has its value or its error."""

    def http_started(self, path: str, url: str, requests: Sequence[Request]) -> object:
        """An HTTP request carrying ``requests`` is about to be sent; returns a handle."""

    def http_ended(self, handle: object, status: int | None, error: BaseException | None) -> None:
        """Its response headers arrived (``status``) or sending failed (``error``)."""
