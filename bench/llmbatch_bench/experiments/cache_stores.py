"""Stores for a response cache, compared on this machine (#48: "storage chosen by
measurement"): the standard library's sqlite3 in WAL mode with one writer, and LMDB
(``pip install lmdb``, where installed).

    python -m llmbatch_bench.experiments.cache_stores --json out.json

Each store gets the same work, in a temporary directory:

- **write**: ``--entries`` answers of ``--value-bytes`` each under 32-byte keys, in
  transactions of ``--batch`` (a writer taking a map's answers off the hot path);
- **read**: as many point reads of random stored keys from one process (a rerun's
  lookups: every key a hit), with their p50 and p99;
- **shared**: ``--readers`` processes reading random keys while one writes as many
  again, for ``--seconds``: reads a second, writes a second, and errors (sqlite's
  "database is locked" is what users of several processes meet);
- **kill -9**: a writer killed mid-run; the store opened again: whether it opens,
  how many entries survive (only whole transactions may), and whether any is wrong;
- the store's size on disk.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["main"]


def key_of(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(8, "big")).digest()


def value_of(i: int, size: int) -> bytes:
    """A value that says which entry it is (so a wrong answer is seen)."""
    head = i.to_bytes(8, "big")
    return head + bytes((i + j) & 0xFF for j in range(size - len(head)))


def is_right(i: int, value: bytes | None, size: int) -> bool:
    return value == value_of(i, size)


class Store(Protocol):
    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None: ...
    def get(self, key: bytes) -> bytes | None: ...
    def count(self) -> int: ...
    def close(self) -> None: ...


class SqliteStore:
    """One table, WAL, ``synchronous=NORMAL`` (a commit survives a process's crash,
    not a power cut), a busy timeout for writers and readers of other processes."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path / "cache.sqlite3", timeout=10.0, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS answers (key BLOB PRIMARY KEY, value BLOB) WITHOUT ROWID"
        )

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?)", items)
        self.db.execute("COMMIT")

    def get(self, key: bytes) -> bytes | None:
        row = self.db.execute("SELECT value FROM answers WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM answers").fetchone()[0])

    def close(self) -> None:
        self.db.close()


class LmdbStore:
    """One environment, a 2 GiB map, default durability (sync on commit)."""

    def __init__(self, path: Path) -> None:
        import lmdb

        self.env = lmdb.open(str(path / "cache.lmdb"), map_size=2 << 30, max_readers=64)

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            for key, value in items:
                txn.put(key, value)

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            value = txn.get(key)
        return None if value is None else bytes(value)

    def count(self) -> int:
        return int(self.env.stat()["entries"])

    def close(self) -> None:
        self.env.close()


STORES: dict[str, Callable[[Path], Store]] = {"sqlite": SqliteStore, "lmdb": LmdbStore}


def available(name: str) -> bool:
    if name != "lmdb":
        return True
    try:
        import lmdb  # noqa: F401
    except ImportError:
        return False
    return True


def _fill(store: Store, first: int, count: int, size: int, batch: int) -> None:
    for start in range(first, first + count, batch):
        stop = min(first + count, start + batch)
        store.put_many([(key_of(i), value_of(i, size)) for i in range(start, stop)])


def _reader(name: str, path: str, known: int, seconds: float, out: Any) -> None:
    store = STORES[name](Path(path))
    rng = random.Random(os.getpid())
    reads = errors = wrong = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        i = rng.randrange(known)
        try:
            value = store.get(key_of(i))
        except Exception:
            errors += 1
            continue
        reads += 1
        wrong += not is_right(i, value, len(value) if value else 0)
    store.close()
    out.put((reads, errors, wrong))


def _writer(
    name: str, path: str, first: int, size: int, batch: int, seconds: float, out: Any
) -> None:
    store = STORES[name](Path(path))
    written = errors = 0
    end = time.monotonic() + seconds
    i = first
    while time.monotonic() < end:
        try:
            store.put_many([(key_of(j), value_of(j, size)) for j in range(i, i + batch)])
        except Exception:
            errors += 1
            continue
        i += batch
        written += batch
    store.close()
    out.put((written, errors))


def _killed_writer(name: str, path: str, first: int, size: int, batch: int) -> None:
    store = STORES[name](Path(path))
    i = first
    while True:
        store.put_many([(key_of(j), value_of(j, size)) for j in range(i, i + batch)])
        i += batch


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    size, batch, entries = args.value_bytes, args.batch, args.entries
    with tempfile.TemporaryDirectory(prefix=f"cache-{name}-") as tmp:
        path = Path(tmp)
        store = STORES[name](path)
        started = time.perf_counter()
        _fill(store, 0, entries, size, batch)
        write_s = time.perf_counter() - started
        rng = random.Random(1)
        latencies = []
        wrong = 0
        for _ in range(entries):
            i = rng.randrange(entries)
            at = time.perf_counter()
            value = store.get(key_of(i))
            latencies.append(time.perf_counter() - at)
            wrong += not is_right(i, value, size)
        store.close()
        latencies.sort()
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        workers = [
            context.Process(target=_reader, args=(name, tmp, entries, args.seconds, out))
            for _ in range(args.readers)
        ]
        workers.append(
            context.Process(
                target=_writer, args=(name, tmp, entries, size, batch, args.seconds, out)
            )
        )
        for worker in workers:
            worker.start()
        results = [out.get(timeout=args.seconds + 60) for _ in workers]
        for worker in workers:
            worker.join()
        reads = [r for r in results if len(r) == 3]
        writes = [r for r in results if len(r) == 2]
        # kill -9 a writer mid-run, then open the store again.
        killed = context.Process(target=_killed_writer, args=(name, tmp, 10**9, size, batch))
        killed.start()
        time.sleep(1.0)
        assert killed.pid is not None
        os.kill(killed.pid, signal.SIGKILL)
        killed.join()
        try:
            again = STORES[name](path)
            after_kill = again.count()
            sample = [10**9 + k for k in range(0, 200)]
            bad = sum(
                1
                for i in sample
                if (v := again.get(key_of(i))) is not None and not is_right(i, v, size)
            )
            again.close()
            reopened = True
        except Exception as exc:  # what a user would meet
            reopened, after_kill, bad = False, 0, 0
            print(f"{name}: reopening after kill -9 failed: {exc!r}")
        disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return {
        "store": name,
        "entries": entries,
        "value_bytes": size,
        "batch": batch,
        "writes_per_s": round(entries / write_s),
        "reads_per_s": round(len(latencies) / sum(latencies)),
        "read_p50_us": round(latencies[len(latencies) // 2] * 1e6, 1),
        "read_p99_us": round(latencies[int(len(latencies) * 0.99)] * 1e6, 1),
        "wrong_reads": wrong,
        "shared_readers": args.readers,
        "shared_reads_per_s": round(sum(r[0] for r in reads) / args.seconds),
        "shared_read_errors": sum(r[1] for r in reads),
        "shared_wrong_reads": sum(r[2] for r in reads),
        "shared_writes_per_s": round(sum(w[0] for w in writes) / args.seconds),
        "shared_write_errors": sum(w[1] for w in writes),
        "reopened_after_kill": reopened,
        "entries_after_kill": after_kill,
        "wrong_after_kill": bad,
        "disk_mib": round(disk / 2**20, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llmbatch_bench.experiments.cache_stores", description=__doc__
    )
    p.add_argument("--entries", type=int, default=50_000, help="default: 50,000")
    p.add_argument("--value-bytes", type=int, default=1_500, help="default: 1,500")
    p.add_argument("--batch", type=int, default=64, help="entries a transaction (default: 64)")
    p.add_argument("--readers", type=int, default=4, help="reading processes (default: 4)")
    p.add_argument("--seconds", type=float, default=5.0, help="of the shared phase (default: 5)")
    p.add_argument("--stores", default="sqlite,lmdb", help="default: sqlite,lmdb")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    results = []
    for name in args.stores.split(","):
        if not available(name):
            print(f"{name}: not installed, skipped")
            continue
        results.append(measure(name, args))
        print(json.dumps(results[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
