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
import sqlite3
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from llmbatch._cache.files import check_local, make_private
from llmbatch._cache.writer import Batch, QueuedStore

__all__ = ["LAYOUT", "CacheStore", "NamespaceSummary", "StoreSummary"]

LAYOUT = "1"
"""The tables' layout (stored in ``meta``); another layout's file is set aside."""

#: Keys per lookup query (SQLite allows 32,766 parameters; fewer keeps each query short).
_CHUNK = 500
#: How often (in puts) the writer checks the file's size against its cap.
_SIZE_CHECK_EVERY = 2000
#: Eviction brings the entries down to this share of the cap.
_EVICT_TO = 0.9
#: Seconds a connection waits for another process's lock before it gives up.
_LOCK_WAIT = 30.0

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


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock (busy or locked)."""
    return exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class CacheStore(QueuedStore):
    """One cache file, opened by one process (others may open it too)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_size: int,
        max_age: float | None = None,
        mounts_file: str = "/proc/mounts",
    ) -> None:
        super().__init__()
        self.path = os.path.abspath(os.fspath(path))
        self.where = f"the cache file {self.path}"
        self.location = self.path
        check_local(self.path, mounts_file)
        self.max_size = max_size
        self.max_age = max_age
        """Seconds an entry is read after it was written (None: no limit)."""
        self._since_check = 0
        self.set_aside: str | None = None
        """Where an unreadable file was moved at opening (None: none was)."""
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._reader = self._open()

    # -- opening ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=_LOCK_WAIT, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute("PRAGMA cache_size = -32768")
        connection.execute("PRAGMA mmap_size = 268435456")
        return connection

    def _open(self) -> sqlite3.Connection:
        """A connection to a readable file of this layout, setting aside one that is
        not (once)."""
        make_private(self.path)
        try:
            return self._prepare_when_unlocked()
        except sqlite3.OperationalError:
            raise  # locked for longer than the timeout, or not permitted: say so
        except sqlite3.DatabaseError as exc:
            reason = str(exc)
        except _OtherLayout as exc:
            reason = str(exc)
        self._set_aside(reason)
        make_private(self.path)
        return self._prepare_when_unlocked()

    def _prepare_when_unlocked(self) -> sqlite3.Connection:
        """``_prepare``, tried again while another process holds the file.

        Switching a new file to WAL upgrades a read lock to a write lock, and SQLite
        answers "locked" at once there, without its busy timeout, when another
        connection holds a write lock: processes opening one new file together
        would fail. So the wait is done here, up to the same timeout.
        """
        deadline = time.monotonic() + _LOCK_WAIT
        pause = 0.005
        while True:
            try:
                return self._prepare()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

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

    def _read(self, keys: Sequence[bytes], found: dict[bytes, str]) -> None:
        """A chunk of keys per query; entries not marked used for a day are marked
        again, and entries past ``max_age`` are not read."""
        execute = self._reader.execute
        now = time.time()
        stale_before = now - _USED_RESOLUTION
        written_after = -1.0 if self.max_age is None else now - self.max_age
        stale: list[bytes] = []
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, created, used, value in execute(
                "SELECT key, created, COALESCE(used, created), value FROM answers "
                f"WHERE key IN ({marks})",
                chunk,
            ):
                if created <= written_after:
                    continue
                if key not in found:
                    found[key] = value
                if used < stale_before:
                    stale.append(key)
        self.touch(stale)

    # -- writing (the writer thread) ----------------------------------------------------

    def _open_writer(self) -> sqlite3.Connection:
        return self._connect()

    def _close_writer(self, connection: sqlite3.Connection) -> None:
        connection.close()

    def _close_reader(self) -> None:
        self._reader.close()

    def _commit(self, connection: sqlite3.Connection, batch: Batch) -> None:
        now = time.time()
        connection.execute("BEGIN IMMEDIATE")
        try:
            if batch.puts:
                connection.executemany(_PUT, batch.puts)
            if batch.touches:
                connection.executemany(_TOUCH, [(now, key) for key in batch.touches])
            if batch.forgets:
                connection.executemany(_FORGET, [(key,) for key in batch.forgets])
            if batch.hits:
                connection.executemany(_HITS, list(batch.hits.items()))
            connection.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            raise

    def _after_commit(self, connection: sqlite3.Connection, puts: int) -> None:
        self._since_check += puts
        if self._since_check >= _SIZE_CHECK_EVERY:
            self._since_check = 0
            self._keep_under_cap(connection)

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
        except sqlite3.Error as exc:
            self._failed(0, exc)

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
