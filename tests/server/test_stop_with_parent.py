"""A server started through ``stop_with_parent`` stops when its parent dies uncleanly."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from llmbatch_server._lifetime import stop_with_parent

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)

#: A parent that starts a long sleeper in a session of its own (as the launcher
#: starts vLLM), prints its pid, then waits to be killed.
PARENT = """
import subprocess, sys, time
from llmbatch_server._lifetime import stop_with_parent
guarded = sys.argv[1] == "guarded"
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"],
    start_new_session=True,
    preexec_fn=stop_with_parent() if guarded else None,
)
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan may wait for a reaper
    that a container's init never runs, yet it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def orphan_after_parent_killed(mode: str) -> int:
    """Start the parent, SIGKILL it once its child runs; the child's pid."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
    finally:
        parent.kill()
        parent.wait(timeout=10)
    return child


def test_the_child_stops_when_its_parent_is_killed() -> None:
    child = orphan_after_parent_killed("guarded")
    assert gone_within(child, 10)


def test_without_it_the_child_outlives_its_parent() -> None:
    """What it prevents: a server in a session of its own is orphaned, still running."""
    child = orphan_after_parent_killed("plain")
    try:
        assert not gone_within(child, 1)
    finally:
        subprocess.run(["kill", "-KILL", str(child)], check=False)
    assert gone_within(child, 10)


def test_not_arranged_from_a_worker_thread() -> None:
    """The signal follows the thread that started the child: from a pool's thread,
    which may end first, it would stop the server early, so it is not set."""
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(stop_with_parent()))
    worker.start()
    worker.join()
    assert found == [None]
    assert callable(stop_with_parent())
