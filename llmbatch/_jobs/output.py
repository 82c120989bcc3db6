"""The job's output file: exclusive lock, resume scan, torn-tail repair, appends.

Every record is written with one ``write`` of a whole line (newline included) to a
file opened with ``O_APPEND``, so a process killed at any moment, ``kill -9``
included, leaves complete lines plus at most one partial last line. Opening the
file again drops that partial line; the custom_ids on complete lines are done and
a rerun skips them, so every custom_id ends up in the file exactly once. Lines
reach the OS as they are written and the disk at least every ``fsync_interval``
seconds and at close, which bounds what a power cut (not a crash) can lose.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from llmbatch._exceptions import LLMBatchError

if sys.platform != "win32":
    import fcntl

__all__ = ["DEFAULT_FSYNC_INTERVAL", "OutputError", "OutputFile", "Resumed"]

DEFAULT_FSYNC_INTERVAL = 1.0


class OutputError(LLMBatchError):
    """The output file is locked by another run, unreadable, or corrupt."""


@dataclass(slots=True)
class Resumed:
    """What an existing output file already holds."""

    done: set[str] = field(default_factory=set)
    """custom_ids with a line in the file (answered or failed)."""
    failed: int = 0
    """Lines that record a failure."""
    torn_lines: int = 0
    """Partial last lines (a write cut short) removed: 0 or 1 in one file."""
    removed_failed: int = 0
    """Failed lines removed so that their requests run again (``retry_failed``)."""


def report_resumed(
    output: object, torn_lines: int, removed_failed: int, report: Callable[[str], None]
) -> None:
    """Say what resuming took out of ``output`` (a file or a directory of shards)."""
    if torn_lines:
        report(f"{output}: removed {torn_lines} partial last line(s) left by an interrupted run")
    if removed_failed:
        report(f"{output}: removed {removed_failed} failed line(s) to retry")


class OutputFile:
    """An append-only JSONL output file owned by one run at a time.

    ``with OutputFile(path) as out:`` locks the file (another run on the same file
    gets :class:`OutputError`; ``lock=False`` when a lock the caller holds already
    covers it, as a sharded run's directory lock covers its shards), repairs it and
    reads what is done into ``out.resumed``; :meth:`write` appends one record.
    """

    def __init__(
        self,
        path: Path,
        *,
        retry_failed: bool = False,
        fsync_interval: float = DEFAULT_FSYNC_INTERVAL,
        lock: bool = True,
    ) -> None:
        self.path = path
        self._retry_failed = retry_failed
        self._lock = lock
        self._fsync_interval = fsync_interval
        self._fd = -1
        self._last_sync = 0.0
        self._dirty = False
        self.resumed = Resumed()

    def __enter__(self) -> OutputFile:
        self._fd = self._open_locked()
        try:
            self.resumed = self._scan()
            if self._retry_failed and self.resumed.failed:
                self._drop_failed()
        except BaseException:
            os.close(self._fd)
            raise
        self._last_sync = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._dirty:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = -1

    def write(self, record: dict[str, object]) -> None:
        """Append one record as one line; fsync if the last one is old enough."""
        data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        view = memoryview(data)
        while view:
            # A regular file rarely takes less than asked; loop so it cannot tear a line.
            view = view[os.write(self._fd, view) :]
        self._dirty = True
        now = time.monotonic()
        if now - self._last_sync >= self._fsync_interval:
            os.fsync(self._fd)
            self._last_sync = now
            self._dirty = False

    # -- opening ---------------------------------------------------------------------

    def _open_locked(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot open {self.path}: {exc.strerror}") from exc
        if self._lock and sys.platform != "win32":
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputError(
                    f"{self.path} is in use by another llmbatch run; wait for it or stop it"
                ) from None
        return fd

    def _scan(self) -> Resumed:
        resumed = Resumed()
        good_end = 0
        with open(self.path, "rb") as f:
            for line_no, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    break  # the torn tail of a write that was cut short
                custom_id, failed = _read_record(line, line_no, self.path)
                resumed.done.add(custom_id)
                resumed.failed += failed
                good_end += len(line)
        if os.fstat(self._fd).st_size > good_end:
            os.ftruncate(self._fd, good_end)
            os.fsync(self._fd)
            resumed.torn_lines = 1
        return resumed

    def _drop_failed(self) -> None:
        """Rewrite the file without its failed lines (atomically: temp file + rename)."""
        temp = self.path.with_name(self.path.name + ".retry-tmp")
        kept: set[str] = set()
        try:
            with open(self.path, "rb") as src, open(temp, "wb") as dst:
                for line_no, line in enumerate(src, 1):
                    custom_id, failed = _read_record(line, line_no, self.path)
                    if not failed:
                        dst.write(line)
                        kept.add(custom_id)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(temp, self.path)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = self._open_locked()
        self.resumed.removed_failed = self.resumed.failed
        self.resumed.failed = 0
        self.resumed.done = kept


def _read_record(line: bytes, line_no: int, path: Path) -> tuple[str, bool]:
    """(custom_id, failed) of one complete output line."""
    try:
        record = json.loads(line)
        custom_id = record["custom_id"]
        if not isinstance(custom_id, str):
            raise TypeError("custom_id is not a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise OutputError(
            f"{path}:{line_no}: not an output record ({exc}); "
            "is this the output of another program?"
        ) from None
    response = record.get("response")
    failed = record.get("error") is not None or not (
        isinstance(response, dict) and response.get("status_code") == 200
    )
    return custom_id, failed


def _fsync_dir(directory: Path) -> None:
    if sys.platform == "win32":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
