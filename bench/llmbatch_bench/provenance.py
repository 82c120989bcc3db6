"""Which ``llmbatch`` a measurement ran: where the package was imported from and a
digest of its source, recorded in every report so that two results compared as two
codes can be seen to be two codes.

``python -m`` puts the directory it starts in first on ``sys.path``: a bench started
in one checkout, with another checkout on ``PYTHONPATH``, runs the first one's
``llmbatch`` (docs/benchmarks.md, "Side by side again": comparisons that ran one code
on both sides that way).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import llmbatch

__all__ = ["code", "describe", "source_digest"]


def source_digest(package: Path) -> str:
    """A digest of the package's Python source: each file's path within it and its
    bytes, in path order (not its modification times: a copy digests the same)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def code() -> dict[str, str]:
    """The ``llmbatch`` this process imported: its version, directory and source
    digest."""
    package = Path(llmbatch.__file__).resolve().parent
    return {"version": llmbatch.__version__, "path": str(package), "source": source_digest(package)}


def describe(record: dict[str, str]) -> str:
    """``llmbatch 0.3.0 from /path/llmbatch (source 1a2b...)``: a report's first line."""
    return f"llmbatch {record['version']} from {record['path']} (source {record['source']})"
