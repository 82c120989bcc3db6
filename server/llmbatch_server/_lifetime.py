"""Servers started here do not outlive the process that started them.

The launcher and the test helpers start servers in sessions of their own, so that
stopping one reaches its whole process group and a terminal's Ctrl-C reaches only
their parent, which stops them in order. The other side of a session of its own is
that nothing stops the server when its parent dies without cleaning up (SIGKILL, the
OOM killer, a crash, a CI job's timeout): a vLLM kept serving on its port, and on a
GPU kept its memory. On Linux each child asks the kernel to send it SIGTERM when its
parent dies (``prctl(PR_SET_PDEATHSIG)``), which vLLM, llama.cpp, Redis and the
simulator all take as "stop"; elsewhere nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

__all__ = ["in_background", "stop_with_parent"]

_PR_SET_PDEATHSIG = 1


def stop_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` (or asyncio's
    ``create_subprocess_exec``) that has the child sent ``sig`` when this process
    dies; None where that cannot be arranged.

    Only from the main thread: the kernel sends the signal when the *thread* that
    started the child ends, and a worker thread (a pool's) may end long before the
    process does.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    parent = os.getpid()
    signum = int(sig)

    def preexec() -> None:
        # In the child, between fork and exec: prctl was looked up before the fork.
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took
            os.kill(os.getpid(), signum)

    return preexec


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, object]) -> AsyncIterator[None]:
    """Run ``work`` as a task for the ``async with`` block; cancelled and awaited
    when the block ends, so it never outlives its owner either."""
    task = asyncio.ensure_future(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
