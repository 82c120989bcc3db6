"""The one lifecycle every server wrapper shares (llmbatch_server._process), on real
child processes: ready when its check says so, errors that carry the log, stop and
kill that leave nothing running, a directory that goes with close()."""

from __future__ import annotations

import sys
from typing import ClassVar

import pytest

from llmbatch_server._process import ManagedProcess


class _Fails(RuntimeError):
    pass


class _Script(ManagedProcess):
    """A Python child that prints, then (if asked) writes its ready file and sleeps."""

    name = "script"
    error = _Fails
    poll_interval = 0.01
    own_group: ClassVar[bool] = False

    def __init__(self, code: str) -> None:
        super().__init__(tag="script")
        self.code = code
        self.ready_file = self._dir / "ready"

    def argv(self) -> list[str]:
        return [sys.executable, "-c", self.code.replace("READY", repr(str(self.ready_file)))]

    def ready(self) -> bool:
        return self.ready_file.exists()


_SERVE = "import pathlib, time; print('hello'); pathlib.Path(READY).touch(); time.sleep(60)"


@pytest.mark.parametrize("own_group", [False, True])
def test_ready_then_stopped(own_group: bool) -> None:
    script = _Script(_SERVE)
    script.own_group = own_group
    with script:
        assert script.running
        pid = script.pid
        assert pid is not None
    assert not script.running
    assert not script._dir.exists()  # close() took the log with it


def test_a_child_that_exits_first_raises_the_class_error_with_its_log() -> None:
    script = _Script("import sys; print('no model here'); sys.exit(3)")
    with pytest.raises(_Fails, match=r"script exited with 3:\n.*no model here"):
        script.start(timeout=10)


def test_a_child_never_ready_is_stopped_and_says_so() -> None:
    script = _Script("import time; print('loading'); time.sleep(60)")
    with pytest.raises(_Fails, match=r"not ready after 0.3 s:\n.*loading"):
        script.start(timeout=0.3)
    assert not script.running


def test_kill_then_restart() -> None:
    script = _Script(_SERVE)
    script.start(timeout=10)
    first = script.pid
    script.kill()
    assert not script.running
    script.ready_file.unlink()
    script.restart(timeout=10)
    assert script.running
    assert script.pid != first
    script.close()
    assert not script.running


def test_wait_ready_before_spawn_is_refused() -> None:
    script = _Script(_SERVE)
    with pytest.raises(RuntimeError, match="spawn"):
        script.wait_ready(1)
    script.close()
