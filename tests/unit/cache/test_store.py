"""The cache file: entries written off the caller's path and found meanwhile, a file
others cannot read, an unreadable file set aside, a size cap, a network file system
refused, and the CLI's commands (prune, clear, summary)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from llmbatch import ConfigError
from llmbatch._cache.files import check_local, file_system_of
from llmbatch._cache.store import CacheStore


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def put(store: CacheStore, i: int, value: str = "v", namespace: str = "") -> None:
    store.put(key(i), value, namespace=namespace, prompt_tokens=3, completion_tokens=4)


def test_a_value_is_found_before_and_after_the_writer_commits_it(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c.db", max_size=1 << 30)
    put(store, 1, "one")
    assert store.get(key(1)) == "one"  # queued, not yet written: still found
    store.flush()
    assert store.get(key(1)) == "one"
    assert store.get_many([key(1), key(2)]) == {key(1): "one"}
    store.close()
    reopened = CacheStore(tmp_path / "c.db", max_size=1 << 30)
    assert reopened.get(key(1)) == "one"
    assert reopened.summary().entries == 1
    reopened.close()


def _hold_a_write_lock(path: Path) -> sqlite3.Connection:
    """Another process's connection in the middle of a write to a new file."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (a)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other VALUES (1)")
    return holder


def test_a_file_another_process_is_writing_is_opened_once_it_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite answers "locked" at once to the switch to WAL here, busy timeout or not:
    # four processes opening one new file together failed this way.
    path = tmp_path / "c.db"
    holder = _hold_a_write_lock(path)
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            holder.execute("COMMIT")

    monkeypatch.setattr("llmbatch._cache.store.time.sleep", sleep)
    store = CacheStore(path, max_size=1 << 30)
    assert len(pauses) == 3
    put(store, 1, "one")
    store.flush()
    assert store.get(key(1)) == "one"
    store.close()
    holder.close()


def test_a_file_locked_for_longer_than_the_wait_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.db"
    holder = _hold_a_write_lock(path)
    monkeypatch.setattr("llmbatch._cache.store._LOCK_WAIT", 0.2)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        CacheStore(path, max_size=1 << 30)
    holder.close()


def test_many_keys_are_read_in_chunks(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c.db", max_size=1 << 30)
    for i in range(1_200):
        put(store, i, str(i))
    store.flush()
    found = store.get_many([key(i) for i in range(0, 2_400, 2)])
    assert found == {key(i): str(i) for i in range(0, 1_200, 2)}
    store.close()


def test_the_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "c.db"
    store = CacheStore(path, max_size=1 << 30)
    put(store, 1)
    store.flush()
    for name in os.listdir(path.parent):
        mode = stat.S_IMODE(os.stat(path.parent / name).st_mode)
        assert mode & 0o077 == 0, (name, oct(mode))
    store.close()
    # A file made readable by others is narrowed again when opened.
    os.chmod(path, 0o644)
    CacheStore(path, max_size=1 << 30).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_an_unreadable_file_is_set_aside_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    path.write_bytes(b"not a database " * 1000)
    with pytest.warns(RuntimeWarning, match="could not be read"):
        store = CacheStore(path, max_size=1 << 30)
    assert store.set_aside is not None
    assert Path(store.set_aside).read_bytes().startswith(b"not a database")
    put(store, 1, "fresh")
    store.flush()
    assert store.get(key(1)) == "fresh"
    store.close()


def test_a_file_cut_short_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = CacheStore(path, max_size=1 << 30)
    for i in range(2_000):
        put(store, i, "x" * 200)
    store.close()
    data = path.read_bytes()
    path.write_bytes(data[:4096] + b"\x00" * 100)  # the header survives, the tree does not
    with pytest.warns(RuntimeWarning, match="could not be read"):
        reopened = CacheStore(path, max_size=1 << 30)
    assert reopened.get(key(5)) is None
    reopened.close()


def test_a_file_of_another_layout_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    CacheStore(path, max_size=1 << 30).close()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE meta SET value = '0' WHERE name = 'layout'")
    with pytest.warns(RuntimeWarning, match="layout"):
        CacheStore(path, max_size=1 << 30).close()


def test_the_entries_used_longest_ago_go_past_the_size_cap(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c.db", max_size=1 << 20)
    for i in range(6_000):
        put(store, i, "x" * 1000)  # 6 MB into a 1 MB cap
        if i == 100:
            store.flush()
    store.flush()
    summary = store.summary()
    assert 0 < summary.entries < 2_500  # checked every 2,000 writes: it may pass the cap between
    assert store.get(key(5_999)) is not None  # the newest stay
    assert store.get(key(0)) is None  # the oldest went
    store.close()


def test_prune_by_namespace_and_age_and_clear(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c.db", max_size=1 << 30)
    for i in range(10):
        put(store, i, namespace="a" if i < 4 else "b")
    store.flush()
    assert {n.namespace: n.entries for n in store.summary().namespaces} == {"a": 4, "b": 6}
    assert store.prune(namespace="a") == 4
    assert store.prune(older_than=3600) == 0
    assert store.prune(older_than=0) == 6
    put(store, 20)
    store.flush()
    assert store.clear() == 1
    assert store.summary().entries == 0
    with pytest.raises(ValueError, match="older_than or namespace"):
        store.prune()
    store.close()


def test_hits_count_in_the_file_by_namespace(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c.db", max_size=1 << 30)
    put(store, 1)
    put(store, 2, namespace="b")
    store.count_hits("", 2)
    store.count_hits("", 3)
    store.count_hits("b", 1)
    store.flush()
    assert {n.namespace: n.hits for n in store.summary().namespaces} == {"": 5, "b": 1}
    store.prune(namespace="b")
    assert {n.namespace: n.hits for n in store.summary().namespaces} == {"": 5}
    store.close()


def test_an_entry_is_marked_used_again_once_a_day(tmp_path: Path) -> None:
    """(The size cap drops the entries used longest ago.)"""
    path = tmp_path / "c.db"
    store = CacheStore(path, max_size=1 << 30)
    put(store, 1)
    put(store, 2)
    store.flush()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE answers SET used = 0")
    store.get_many([key(1)])
    store.flush()
    with sqlite3.connect(path) as connection:
        used = dict(connection.execute("SELECT key, used FROM answers").fetchall())
    assert used[key(1)] > 0
    assert used[key(2)] == 0
    store.close()


def test_a_writer_that_fails_never_leaves_a_flush_waiting(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c.db", max_size=1 << 30)
    store.put(key(1), object(), namespace="", prompt_tokens=1, completion_tokens=1)  # type: ignore[arg-type]
    with pytest.warns(RuntimeWarning, match="could not be written"):
        store.flush()
    assert store.write_errors == 1
    put(store, 2, "two")
    store.flush()
    assert store.get(key(2)) == "two"
    store.close()


MOUNTS = """\
/dev/sda1 / ext4 rw 0 0
server:/export /mnt/shared nfs4 rw 0 0
/dev/sdb1 /mnt/shared/local ext4 rw 0 0
//nas/share /mnt/my\\040share cifs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/home/me", "ext4"),
        ("/mnt/shared", "nfs4"),
        ("/mnt/shared/x/y", "nfs4"),
        ("/mnt/shared/local/z", "ext4"),
        ("/mnt/sharedother", "ext4"),
        ("/mnt/my share/c", "cifs"),
    ],
)
def test_the_file_system_of_a_path(path: str, kind: str) -> None:
    assert file_system_of(path, MOUNTS) == kind


def test_a_cache_on_a_network_file_system_is_refused(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nserver:/x {tmp_path} nfs rw 0 0\n")
    with pytest.raises(ConfigError, match=r"network file system \(nfs\)"):
        check_local(str(tmp_path / "c.db"), str(mounts))
    with pytest.raises(ConfigError, match="local disk"):
        CacheStore(tmp_path / "c.db", max_size=1 << 30, mounts_file=str(mounts))
    check_local(str(tmp_path / "c.db"), str(tmp_path / "no-such-table"))  # unknown: allowed


def test_an_entry_past_max_age_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = CacheStore(path, max_size=1 << 30, max_age=3600)
    put(store, 1, "old")
    put(store, 2, "new")
    store.flush()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE answers SET created = created - 7200 WHERE value = 'old'")
    assert store.get_many([key(1), key(2)]) == {key(2): "new"}
    put(store, 1, "again")  # asked again: written anew
    store.flush()
    assert store.get(key(1)) == "again"
    store.close()
