"""Where a cache file may live, and who may read it.

SQLite's locks need a local file system: on NFS, SMB and their kind two processes
may both believe they hold the write lock, and the file is corrupted. A cache on
one of those is refused at opening, naming the file system (share a cache across
machines through one machine's disk, or not at all). The files hold prompts and
answers: they are made readable by their owner only.
"""

from __future__ import annotations

import contextlib
import os
import stat

from llmbatch._exceptions import ConfigError

__all__ = ["NETWORK_FILE_SYSTEMS", "check_local", "file_system_of", "make_private"]

NETWORK_FILE_SYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "davfs",
        "fuse.davfs2",
    }
)
"""File systems whose locking SQLite cannot rely on."""


def file_system_of(path: str, mounts: str) -> str | None:
    """The type of the file system ``path`` (absolute) is on, read from a
    ``/proc/mounts`` table (None: not found there)."""
    best, kind = "", None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        # /proc/mounts escapes spaces in mount points as \040.
        point = parts[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/") or point == "/"
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def check_local(path: str, mounts_file: str = "/proc/mounts") -> None:
    """Raise :class:`ConfigError` if ``path``'s directory is on a network file
    system (where no mount table can be read, nothing is refused)."""
    directory = os.path.dirname(os.path.realpath(path))
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as table:
            mounts = table.read()
    except OSError:
        return
    kind = file_system_of(directory, mounts)
    if kind in NETWORK_FILE_SYSTEMS:
        raise ConfigError(
            f"the cache file {path} is on a network file system ({kind}), where SQLite's "
            "locks cannot be relied on and processes sharing it would corrupt it: put "
            "it on a local disk",
            field="cache",
        )


def make_private(path: str) -> None:
    """Create ``path`` readable and writable by its owner only, or narrow an existing
    file that others could read (when it is ours to change)."""
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            # Another user's file stays as it is: SQLite says if it cannot use it.
            with contextlib.suppress(PermissionError):
                os.chmod(path, 0o600)
        return
    os.close(descriptor)
