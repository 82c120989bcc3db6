"""What every answer store shares: writes queued and committed by one thread of its
own in batches, off the caller's path, and values queued but not yet written found
by lookups meanwhile.

A store subclasses :class:`QueuedStore` and says how to read a chunk of keys, how to
open its writer's connection, and how to commit one batch: the answers to write,
the entries to mark used or to drop, and the hits to count. A batch it cannot write
is counted and warned about (its answers are asked again next time), never raised:
a cache that fails makes requests go to the server, nothing more.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Batch", "Put", "QueuedStore"]

Put = tuple[bytes, str, float, int, int, str]
"""A write: key, namespace, time written (epoch seconds), prompt and completion
tokens, stored text."""

#: The writer gathers what is queued for this long before it commits (fewer, larger
#: transactions), unless asked to flush.
_GATHER_SECONDS = 0.01
#: Items per batch at most.
_BATCH = 5000
_STOP = object()


@dataclass(slots=True)
class Batch:
    """One commit's work."""

    puts: list[Put] = field(default_factory=list)
    touches: list[bytes] = field(default_factory=list)
    """Entries read after a while: marked used again (for a size cap's eviction)."""
    forgets: list[bytes] = field(default_factory=list)
    """Entries that could not be read back: dropped."""
    hits: dict[str, int] = field(default_factory=dict)
    """Hits by namespace, to add to the store's tally."""

    def __bool__(self) -> bool:
        return bool(self.puts or self.touches or self.forgets or self.hits)


class QueuedStore:
    """A store's queue, writer thread and values not yet written."""

    #: What the writer warns about: "the cache file /x" or "the cache at redis://...".
    where = "the cache"
    #: The file, or the Redis URL without its password (for ``stats()``).
    location = ""

    def __init__(self) -> None:
        self.write_errors = 0
        """Batches the writer could not commit (their entries are lost, not wrong)."""
        self._pending: dict[bytes, str] = {}
        """Values queued and not yet committed, found by lookups meanwhile."""
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._closed = False

    # -- what a store says --------------------------------------------------------------

    def _read(self, keys: Sequence[bytes], found: dict[bytes, str]) -> None:
        """Add the values stored under ``keys`` to ``found`` (where not there yet)."""
        raise NotImplementedError

    def _open_writer(self) -> Any:
        """The writer thread's connection."""
        raise NotImplementedError

    def _commit(self, connection: Any, batch: Batch) -> None:
        """Write one batch (raise what fails: it is counted and warned about)."""
        raise NotImplementedError

    def _after_commit(self, connection: Any, puts: int) -> None:
        """Upkeep after a batch of ``puts`` writes (a size cap's eviction)."""

    def _close_writer(self, connection: Any) -> None:
        """Release the writer's connection."""

    def _close_reader(self) -> None:
        """Release the caller's side."""

    # -- reading ----------------------------------------------------------------------

    def get(self, key: bytes) -> str | None:
        """The value stored under ``key`` (None: none)."""
        return self.get_many((key,)).get(key)

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, str]:
        """The values stored under ``keys`` (those found), queued ones included."""
        found: dict[bytes, str] = {}
        pending = self._pending
        if pending:
            for key in keys:
                value = pending.get(key)
                if value is not None:
                    found[key] = value
        self._read(keys, found)
        return found

    # -- writing (queued) -------------------------------------------------------------

    def put(
        self,
        key: bytes,
        value: str,
        *,
        namespace: str,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """Store ``value`` under ``key`` (committed by the writer, soon)."""
        if self._closed:
            return
        self._pending[key] = value
        self._send((key, namespace, time.time(), prompt_tokens, completion_tokens, value))

    def count_hits(self, namespace: str, hits: int) -> None:
        """Count ``hits`` read from ``namespace`` (``llmbatch cache show`` says them)."""
        if hits and not self._closed:
            self._send(("hits", namespace, hits))

    def touch(self, keys: list[bytes]) -> None:
        """Mark ``keys`` used now (for a size cap's eviction)."""
        if keys and not self._closed:
            self._send(("touch", keys))

    def forget(self, key: bytes) -> None:
        """Delete the entry under ``key`` (its value could not be read)."""
        self._pending.pop(key, None)
        if not self._closed:
            self._send(("forget", key))

    def _send(self, item: object) -> None:
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="llmbatch cache writer", daemon=True
            )
            self._writer.start()
        self._queue.put(item)

    def flush(self) -> None:
        """Wait until everything queued so far is committed (blocking)."""
        if self._writer is None or not self._writer.is_alive():
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        """Commit what is queued, stop the writer and release the store (blocking)."""
        if self._closed:
            return
        self._closed = True
        writer = self._writer
        if writer is not None and writer.is_alive():
            self._queue.put(_STOP)
            writer.join()
        self._close_reader()

    # -- the writer thread ------------------------------------------------------------

    def _write_loop(self) -> None:
        try:
            connection = self._open_writer()
        except Exception as exc:  # nothing can be written: say so, and keep draining
            self._failed(0, exc)
            connection = None
        try:
            while True:
                items = [self._queue.get()]
                if items[0] is not _STOP and not isinstance(items[0], threading.Event):
                    time.sleep(_GATHER_SECONDS)
                while len(items) < _BATCH:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                batch = _batch_of(items)
                try:
                    if batch and connection is not None:
                        self._commit(connection, batch)
                        self._after_commit(connection, len(batch.puts))
                    elif batch.puts:
                        raise ConnectionError("the writer has no connection")
                except Exception as exc:  # a failure must not leave flush() waiting
                    self._failed(len(batch.puts), exc)
                finally:
                    pending = self._pending
                    for key, _, _, _, _, value in batch.puts:
                        if pending.get(key) is value:
                            del pending[key]
                    for item in items:
                        if isinstance(item, threading.Event):
                            item.set()
                if any(item is _STOP for item in items):
                    return
        finally:
            if connection is not None:
                self._close_writer(connection)

    def _failed(self, count: int, error: BaseException) -> None:
        self.write_errors += 1
        warnings.warn(
            f"llmbatch: {count} answer(s) could not be written to {self.where} "
            f"({type(error).__name__}: {error}); they will be asked again",
            RuntimeWarning,
            stacklevel=1,
        )


def _batch_of(items: list[object]) -> Batch:
    batch = Batch()
    for item in items:
        if type(item) is not tuple:
            continue
        tag = item[0]
        if type(tag) is bytes:
            batch.puts.append(item)
        elif tag == "touch":
            batch.touches += item[1]
        elif tag == "forget":
            batch.forgets.append(item[1])
        elif tag == "hits":
            batch.hits[item[1]] = batch.hits.get(item[1], 0) + item[2]
    return batch
