"""The files of a sharded job (``llmbatch run --ray``): its input shards and its
output directory.

The input is one file, a directory (its ``*.jsonl`` files) or a glob. The output
is a directory of ``part-*.jsonl`` shards, one per actor and run, each an
:class:`~llmbatch._jobs.output.OutputFile` (whole-line appends, so a killed actor
leaves complete lines and at most one partial last line). A run locks the
directory; a rerun repairs the shards already there and reads their custom_ids,
which it then skips.
"""

from __future__ import annotations

import glob
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from llmbatch._exceptions import LLMBatchError
from llmbatch._jobs.output import OutputError, OutputFile

if sys.platform != "win32":
    import fcntl

__all__ = ["InputError", "OutputDir", "ShardsResumed", "input_files", "shard_name"]

#: How a directory's input shards are named, and how output shards are found.
INPUT_PATTERN = "*.jsonl"
OUTPUT_PATTERN = "part-*.jsonl"
LOCK_NAME = ".llmbatch-run.lock"


class InputError(LLMBatchError):
    """The input names no file (an empty directory, a glob that matches nothing)."""


def input_files(spec: str) -> list[Path]:
    """The input shards ``spec`` names, sorted: a file, a directory's ``*.jsonl``
    files (not its subdirectories), or a glob pattern."""
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.glob(INPUT_PATTERN) if p.is_file())
        where = f"{spec} has no {INPUT_PATTERN} files"
    elif path.is_file():
        files = [path]
        where = ""
    elif glob.has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(spec) if Path(p).is_file())
        where = f"{spec} matches no file"
    else:
        raise InputError(f"{spec}: no such file or directory")
    if not files:
        raise InputError(where)
    return files


def shard_name() -> str:
    """A new output shard's name: unique per actor and run, never reused."""
    return f"part-{uuid.uuid4().hex[:16]}.jsonl"


@dataclass(slots=True)
class ShardsResumed:
    """What an output directory already holds, over all its shards."""

    done: set[str] = field(default_factory=set)
    failed: int = 0
    shards: int = 0
    torn_lines: int = 0
    removed_failed: int = 0


class OutputDir:
    """``with OutputDir(path) as out:`` creates and locks the directory (a second
    run on it gets :class:`OutputError`), repairs its shards and reads what is done
    into ``out.resumed``; with ``retry_failed`` the failed lines are removed first.
    The lock is held until the ``with`` ends, while the actors write new shards."""

    def __init__(self, path: Path, *, retry_failed: bool = False) -> None:
        self.path = path
        self._retry_failed = retry_failed
        self._fd = -1
        self.resumed = ShardsResumed()

    def __enter__(self) -> OutputDir:
        if self.path.exists() and not self.path.is_dir():
            raise OutputError(f"{self.path} is a file; --ray writes a directory of shards")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot create {self.path}: {exc.strerror}") from exc
        try:
            self._lock()
            self.resumed = self._scan()
        except BaseException:
            os.close(self._fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing the descriptor releases the lock
        self._fd = -1

    def _lock(self) -> None:
        if sys.platform == "win32":
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(
                f"{self.path} is in use by another llmbatch run; wait for it or stop it"
            ) from None

    def _scan(self) -> ShardsResumed:
        resumed = ShardsResumed()
        for shard in sorted(self.path.glob(OUTPUT_PATTERN)):
            # The shard's own repair and resume scan, as for a single output file.
            with OutputFile(shard, retry_failed=self._retry_failed) as out:
                found = out.resumed
            repeated = resumed.done & found.done
            if repeated:
                raise OutputError(
                    f"{shard}: custom_id {min(repeated)!r} is also in another shard of "
                    f"{self.path}; was a shard copied or a run's input changed?"
                )
            resumed.done |= found.done
            resumed.failed += found.failed
            resumed.shards += 1
            resumed.torn_lines += found.torn_lines
            resumed.removed_failed += found.removed_failed
        return resumed
