"""The event loop's clock, resolved once per client.

``anyio.current_time()`` looks up the async backend on every call; llmbatch reads
the clock several times per request, so it binds the running loop's own clock once.
Using the loop's clock (not ``time.monotonic``) keeps trio's ``MockClock`` in charge
in tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import sniffio

__all__ = ["Clock", "loop_clock"]

Clock = Callable[[], float]


def loop_clock() -> Clock:
    """The running event loop's ``now()`` (call from inside the loop)."""
    if sniffio.current_async_library() == "asyncio":
        return asyncio.get_running_loop().time
    import trio

    return trio.current_time
