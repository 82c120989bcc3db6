"""Every HTTP exchange a client makes, and what they show about an outage.

:class:`RecordingTransport` wraps a real transport (llmbatch's
``transport=`` seam: ``send`` and ``aclose``) and logs each exchange: when it was
sent, when its answer (or failure) came, its method, path and outcome. From that log
:func:`per_second` counts what was sent into each second of an outage and
:func:`resume` measures how long the client took to get work answered once the
server was back. Both are pure, so they are tested with made-up logs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "Exchange",
    "RecordingTransport",
    "Resume",
    "aiohttp_transport",
    "per_second",
    "rate",
    "resume",
    "sent_between",
]


@dataclass(frozen=True, slots=True)
class Exchange:
    """One HTTP exchange: ``outcome`` is the status (``"200"``, ``"503"``) or the
    transport error's type name (``"ConnectError"``)."""

    sent: float
    done: float
    method: str
    path: str
    outcome: str

    @property
    def answered(self) -> bool:
        """A 2xx answer to a generation request (the server did work for it)."""
        return self.method == "POST" and self.outcome.startswith("2")

    def to_json(self, origin: float = 0.0) -> list[Any]:
        """Compact: ``[sent, done, method, path, outcome]``, times from ``origin``."""
        return [
            round(self.sent - origin, 4),
            round(self.done - origin, 4),
            self.method,
            self.path,
            self.outcome,
        ]


class RecordingTransport:
    """A transport that logs every exchange of the one it wraps (``time.monotonic``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.log: list[Exchange] = []

    async def send(self, request: Any) -> Any:
        import llmbatch

        path = urlsplit(request.url).path
        sent = time.monotonic()
        try:
            response = await self.inner.send(request)
        except llmbatch.TransportError as exc:
            self.log.append(Exchange(sent, time.monotonic(), request.method, path, _name(exc)))
            raise
        status = str(response.status)
        self.log.append(Exchange(sent, time.monotonic(), request.method, path, status))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def aiohttp_transport() -> Any:
    """llmbatch's own default transport with its default limits and timeouts:
    wrapping the very transport a default client uses keeps the measurement about
    llmbatch."""
    from llmbatch.transports import AiohttpTransport

    return AiohttpTransport()


def sent_between(log: Sequence[Exchange], start: float, end: float) -> list[Exchange]:
    """Exchanges sent in ``[start, end)``."""
    return [e for e in log if start <= e.sent < end]


def per_second(log: Sequence[Exchange], start: float, end: float) -> list[int]:
    """Exchanges sent in each second of ``[start, end)``; a last partial second
    counts only if it is at least half a second long."""
    seconds = max(0, math.floor(end - start + 0.5))
    counts = [0] * seconds
    for e in log:
        k = math.floor(e.sent - start)
        if 0 <= k < seconds and e.sent < end:
            counts[k] += 1
    return counts


def rate(log: Sequence[Exchange], start: float, end: float) -> float | None:
    """Exchanges sent per second in ``[start, end)`` (None for an empty span)."""
    if end <= start:
        return None
    return len(sent_between(log, start, end)) / (end - start)


@dataclass(frozen=True, slots=True)
class Resume:
    """After the server came back, in seconds after ``back`` (None if never): when the
    client first sent anything (a probe), when it sent the first generation request
    the server accepted (work resumed), and when one was first answered."""

    first_sent_s: float | None
    work_sent_s: float | None
    first_answer_s: float | None

    def to_json(self) -> dict[str, float | None]:
        return {
            "first_sent_s": self.first_sent_s,
            "work_sent_s": self.work_sent_s,
            "first_answer_s": self.first_answer_s,
        }


def resume(log: Sequence[Exchange], back: float) -> Resume:
    """How long after ``back`` the client sent again and had work answered again."""

    def since(times: list[float]) -> float | None:
        return min(times) - back if times else None

    after = [e for e in log if e.sent >= back]
    return Resume(
        first_sent_s=since([e.sent for e in after]),
        work_sent_s=since([e.sent for e in after if e.answered]),
        first_answer_s=since([e.done for e in log if e.answered and e.done >= back]),
    )
