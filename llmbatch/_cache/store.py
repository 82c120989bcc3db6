"""The cache file: SQLite in WAL mode, which several processes may share.

Chosen by measurement (docs/benchmarks.md, "The cache's store"): the standard
library's ``sqlite3`` survives ``kill -9`` and is shared safely by processes on one
machine, with no dependency; LMDB reads faster but adds one. Reads are point
lookups (or one query for a chunk of keys) on the caller's thread; WAL lets them
run beside a writer. Writes are queued and committed by one writer thread in
batches, off the caller's path; a value queued but not yet written is still found.

A file SQLite cannot read (cut short, overwritten, not a database) is set aside as
``PATH.corrupt-<time>`` with a warning and a new one started: entries not yet
written are sent again, and no wrong answer is read. A file from another layout of
this module is set aside the same way.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmbatch._cache.files import check_local, make_private

__all__ = ["LAYOUT", "CacheStore", "NamespaceSummary", "StoreSummary"]

LAYOUT = "1"
"""The tables' layout (stored in ``meta``); another layout's file is set aside."""

#: Keys per lookup query (SQLite allows 32,766 parameters; fewer keeps each query short).
_CHUNK = 500
#: The writer gathers what is queued for this long before it commits (fewer, larger
#: transactions), unless asked to flush.
_GATHER_SECONDS = 0.01
#: Writes per transaction at most.
_BATCH = 5000
#: How often (in puts) the writer checks the file's size against its cap.
_SIZE_CHECK_EVERY = 2000
#: Eviction brings the entries down to this share of the cap.
_EVICT_TO = 0.9

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # A rowid table with the key in an index of its own: with answers of hundreds of
    # bytes in the rows, an insert costs a third of what it does in a table ordered
    # by its random keys (WITHOUT ROWID), which splits pages of whole answers.
    "CREATE TABLE IF NOT EXISTS answers ("
    " key BLOB NOT NULL UNIQUE,"
    " namespace TEXT NOT NULL,"
    " created REAL NOT NULL,"
    # When it was last read (None: not since it was written): the size cap drops
    # the entries used longest ago.
    " used REAL,"
    " prompt_tokens INTEGER NOT NULL,"
    " completion_tokens INTEGER NOT NULL,"
    " value TEXT NOT NULL"
    ")",
    "CREATE TABLE IF NOT EXISTS hits (namespace TEXT PRIMARY KEY, hits INTEGER NOT NULL)",
)
_PUT = (
    "INSERT OR REPLACE INTO answers (key, namespace, created, prompt_tokens, "
    "completion_tokens, value) VALUES (?, ?, ?, ?, ?, ?)"
)
_TOUCH = "UPDATE answers SET used = ? WHERE key = ?"
_HITS = (
    "INSERT INTO hits (namespace, hits) VALUES (?, ?) "
    "ON CONFLICT (namespace) DO UPDATE SET hits = hits + excluded.hits"
)
#: An entry read is marked used again (for the size cap's eviction) once its mark is
#: this old: a day's resolution spares the writer an update per hit.
_USED_RESOLUTION = 86400.0
_FORGET = "DELETE FROM answers WHERE key = ?"


@dataclass(frozen=True, slots=True)
class NamespaceSummary:
    """One namespace's entries in a cache file."""

    namespace: str
    entries: int
    bytes: int
    """The stored answers' size (the file holds a little more: keys, pages)."""
    hits: int
    """Times its entries were read (by every process, since the namespace began or
    was last pruned)."""
    prompt_tokens: int
    completion_tokens: int
    oldest: float | None
    newest: float | None


@dataclass(frozen=True, slots=True)
class StoreSummary:
    """What ``llmbatch cache show`` prints."""

    path: str
    file_bytes: int
    """The file and its write-ahead log on disk."""
    max_size: int
    namespaces: tuple[NamespaceSummary, ...]

    @property
    def entries(self) -> int:
        return sum(n.entries for n in self.namespaces)


#: A write, as the row the writer inserts: key, namespace, time written, prompt and
#: completion tokens, answer (a tuple whose first item is bytes; the writer's other
#: items are tuples tagged with a str, events, and the stop sentinel).
_Put = tuple[bytes, str, float, int, int, str]


_STOP = object()


class CacheStore:
    """One cache file, opened by one process (others may open it too)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_size: int,
        mounts_file: str = "/proc/mounts",
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        check_local(self.path, mounts_file)
        self.max_size = max_size
        self.write_errors = 0
        """Batches the writer could not commit (their entries are lost, not wrong)."""
        self.set_aside: str | None = None
        """Where an unreadable file was moved at opening (None: none was)."""
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._reader = self._open()
        self._pending: dict[bytes, str] = {}
        """Values queued and not yet committed, found by lookups meanwhile."""
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._closed = False

    # -- opening ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA busy_timeout = 30000")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute("PRAGMA cache_size = -32768")
        connection.execute("PRAGMA mmap_size = 268435456")
        return connection

    def _open(self) -> sqlite3.Connection:
        """A connection to a readable file of this layout, setting aside one that is
        not (once)."""
        make_private(self.path)
        try:
            return self._prepare()
        except sqlite3.OperationalError:
            raise  # locked for longer than the timeout, or not permitted: say so
        except sqlite3.DatabaseError as exc:
            reason = str(exc)
        except _OtherLayout as exc:
            reason = str(exc)
        self._set_aside(reason)
        make_private(self.path)
        return self._prepare()

    def _prepare(self) -> sqlite3.Connection:
        connection = self._connect()
        try:
            connection.execute("PRAGMA journal_mode = WAL").fetchone()
            connection.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    connection.execute(statement)
                connection.execute(
                    "INSERT OR IGNORE INTO meta (name, value) VALUES ('layout', ?)", (LAYOUT,)
                )
                (layout,) = connection.execute(
                    "SELECT value FROM meta WHERE name = 'layout'"
                ).fetchone()
                # Reads the table's first page: a file cut short fails here.
                connection.execute("SELECT key FROM answers LIMIT 1").fetchall()
                connection.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                raise
            if layout != LAYOUT:
                raise _OtherLayout(f"its layout is {layout!r}, this llmbatch reads {LAYOUT!r}")
        except BaseException:
            connection.close()
            raise
        for suffix in ("-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                make_private(self.path + suffix)
        return connection

    def _set_aside(self, reason: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = f"{self.path}.corrupt-{stamp}"
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path + suffix, aside + suffix)
        self.set_aside = aside
        warnings.warn(
            f"llmbatch: the cache file {self.path} could not be read ({reason}); it was "
            f"moved to {aside} and a new one started (its answers will be asked again)",
            RuntimeWarning,
            stacklevel=3,
        )

    # -- reading ----------------------------------------------------------------------

    def get(self, key: bytes) -> str | None:
        """The value stored under ``key`` (None: none)."""
        return self.get_many((key,)).get(key)

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, str]:
        """The values stored under ``keys`` (those found), in as few queries as the
        number of keys allows; entries not marked used for a day are marked again."""
        found: dict[bytes, str] = {}
        pending = self._pending
        if pending:
            for key in keys:
                value = pending.get(key)
                if value is not None:
                    found[key] = value
        execute = self._reader.execute
        stale_before = time.time() - _USED_RESOLUTION
        stale: list[bytes] = []
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, used, value in execute(
                f"SELECT key, COALESCE(used, created), value FROM answers WHERE key IN ({marks})",
                chunk,
            ):
                if key not in found:
                    found[key] = value
                if used < stale_before:
                    stale.append(key)
        if stale and not self._closed:
            self._send(("touch", stale))
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
        """Commit what is queued, stop the writer and close the file (blocking)."""
        if self._closed:
            return
        self._closed = True
        writer = self._writer
        if writer is not None and writer.is_alive():
            self._queue.put(_STOP)
            writer.join()
        self._reader.close()

    def _write_loop(self) -> None:
        connection = self._connect()
        since_check = 0
        try:
            while True:
                batch = [self._queue.get()]
                if batch[0] is not _STOP and not isinstance(batch[0], threading.Event):
                    time.sleep(_GATHER_SECONDS)
                while len(batch) < _BATCH:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                puts: list[_Put] = [
                    item for item in batch if type(item) is tuple and type(item[0]) is bytes
                ]
                since_check += len(puts)
                try:
                    self._commit(connection, puts, batch)
                    if since_check >= _SIZE_CHECK_EVERY:
                        since_check = 0
                        self._keep_under_cap(connection)
                except Exception as exc:  # a bug here must not leave flush() waiting
                    self._failed(len(puts), exc)
                finally:
                    for item in batch:
                        if isinstance(item, threading.Event):
                            item.set()
                if any(item is _STOP for item in batch):
                    return
        finally:
            connection.close()

    def _commit(
        self, connection: sqlite3.Connection, puts: list[_Put], batch: Iterable[object]
    ) -> None:
        touches: list[bytes] = []
        forgets: list[bytes] = []
        hits: dict[str, int] = {}
        for item in batch:
            if type(item) is tuple and type(item[0]) is str:
                if item[0] == "touch":
                    touches += item[1]
                elif item[0] == "forget":
                    forgets.append(item[1])
                elif item[0] == "hits":
                    hits[item[1]] = hits.get(item[1], 0) + item[2]
        if not puts and not touches and not forgets and not hits:
            return
        now = time.time()
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                if puts:
                    connection.executemany(_PUT, puts)
                if touches:
                    connection.executemany(_TOUCH, [(now, key) for key in touches])
                if forgets:
                    connection.executemany(_FORGET, [(key,) for key in forgets])
                if hits:
                    connection.executemany(_HITS, list(hits.items()))
                connection.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._failed(len(puts), exc)
        finally:
            pending = self._pending
            for key, _, _, _, _, value in puts:
                if pending.get(key) is value:
                    del pending[key]

    def _failed(self, count: int, error: BaseException) -> None:
        self.write_errors += 1
        warnings.warn(
            f"llmbatch: {count} answer(s) could not be written to the cache file "
            f"{self.path} ({error}); they will be asked again",
            RuntimeWarning,
            stacklevel=1,
        )

    def _keep_under_cap(self, connection: sqlite3.Connection) -> None:
        """Drop the entries used longest ago while the file's live pages pass the cap."""
        try:
            used = _live_bytes(connection)
            if used <= self.max_size:
                return
            (entries,) = connection.execute("SELECT COUNT(*) FROM answers").fetchone()
            drop = max(1, int(entries * (1 - _EVICT_TO * self.max_size / used)))
            connection.execute(
                "DELETE FROM answers WHERE key IN "
                "(SELECT key FROM answers ORDER BY COALESCE(used, created) LIMIT ?)",
                (drop,),
            )
        except sqlite3.Error:
            self.write_errors += 1

    # -- the CLI's commands -----------------------------------------------------------

    def summary(self) -> StoreSummary:
        """Entries, sizes and hits by namespace."""
        rows = self._reader.execute(
            "SELECT namespace, COUNT(*), SUM(length(CAST(value AS BLOB))), 0, "
            "SUM(prompt_tokens), SUM(completion_tokens), MIN(created), MAX(created) "
            "FROM answers "
            "GROUP BY namespace ORDER BY namespace"
        ).fetchall()
        hits = dict(self._reader.execute("SELECT namespace, hits FROM hits").fetchall())
        size = sum(
            os.path.getsize(self.path + suffix)
            for suffix in ("", "-wal")
            if os.path.exists(self.path + suffix)
        )
        return StoreSummary(
            path=self.path,
            file_bytes=size,
            max_size=self.max_size,
            namespaces=tuple(
                NamespaceSummary(
                    namespace=row[0],
                    entries=row[1],
                    bytes=row[2] or 0,
                    hits=hits.get(row[0], 0),
                    prompt_tokens=row[4] or 0,
                    completion_tokens=row[5] or 0,
                    oldest=row[6],
                    newest=row[7],
                )
                for row in rows
            ),
        )

    def prune(self, *, older_than: float | None = None, namespace: str | None = None) -> int:
        """Delete the entries written more than ``older_than`` seconds ago and/or in
        ``namespace`` (both: those that are both); the number deleted."""
        if older_than is None and namespace is None:
            raise ValueError("prune needs older_than or namespace")
        clauses: list[str] = []
        values: list[object] = []
        if older_than is not None:
            clauses.append("created < ?")
            values.append(time.time() - older_than)
        if namespace is not None:
            clauses.append("namespace = ?")
            values.append(namespace)
        cursor = self._reader.execute(
            f"DELETE FROM answers WHERE {' AND '.join(clauses)}",
            values,
        )
        if namespace is not None and older_than is None:
            self._reader.execute("DELETE FROM hits WHERE namespace = ?", (namespace,))
        return cursor.rowcount

    def clear(self) -> int:
        """Delete every entry and give the space back to the file system."""
        cursor = self._reader.execute("DELETE FROM answers")
        self._reader.execute("DELETE FROM hits")
        self._reader.execute("VACUUM")
        return cursor.rowcount


class _OtherLayout(Exception):
    """The file holds this module's tables in another layout."""


def _live_bytes(connection: sqlite3.Connection) -> int:
    (pages,) = connection.execute("PRAGMA page_count").fetchone()
    (free,) = connection.execute("PRAGMA freelist_count").fetchone()
    (size,) = connection.execute("PRAGMA page_size").fetchone()
    return int((pages - free) * size)
