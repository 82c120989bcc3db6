"""``llmbatch cache``: what a cache file holds, and pruning or clearing it.

``show`` prints its entries, size and hits by namespace; ``prune`` drops entries
older than an age and/or of a namespace; ``clear`` drops every entry and gives the
space back. None of them creates a file that is not there.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

from llmbatch._cache.store import CacheStore, StoreSummary
from llmbatch._config import DEFAULT_CACHE_SIZE
from llmbatch._exceptions import LLMBatchError

__all__ = ["add_parser", "parse_age"]

_PATH = "the cache file (as given to Client(cache=...) or llmbatch run --cache)"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age: a number of seconds, or with a unit (30m, 12h, 7d, 2w)"
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "cache",
        help="show, prune or clear a response cache file (docs/caching.md)",
        description="Show, prune or clear a response cache file (Client(cache=...), "
        "llmbatch run --cache).",
    )
    commands = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    show = commands.add_parser("show", help="entries, size and hits by namespace")
    show.add_argument("path", type=Path, metavar="PATH", help=_PATH)
    show.add_argument("--json", action="store_true", help="print it as JSON (default: text)")
    prune = commands.add_parser("prune", help="drop entries by age and/or namespace")
    prune.add_argument("path", type=Path, metavar="PATH", help=_PATH)
    prune.add_argument(
        "--older-than",
        type=parse_age,
        metavar="AGE",
        help="entries written longer ago than AGE (seconds, or 30m, 12h, 7d, 2w) "
        "(default: any age)",
    )
    prune.add_argument(
        "--namespace",
        metavar="NAME",
        help='entries of this namespace ("": those with none) (default: any namespace)',
    )
    clear = commands.add_parser("clear", help="drop every entry and shrink the file")
    clear.add_argument("path", type=Path, metavar="PATH", help=_PATH)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    path: Path = args.path
    if str(args.path).startswith(("redis:", "rediss:", "unix:")):  # Path folds the //
        print(
            "llmbatch cache: these commands read a cache file; a cache in Redis expires by "
            "itself (its keys are llmbatch:cache:*: redis-cli --scan --pattern "
            "'llmbatch:cache:*' lists them)",
            file=sys.stderr,
        )
        return 2
    if not path.is_file():
        print(f"llmbatch cache: no cache file at {path}", file=sys.stderr)
        return 2
    if args.cache_command == "prune" and args.older_than is None and args.namespace is None:
        print("llmbatch cache prune: give --older-than and/or --namespace", file=sys.stderr)
        return 2
    try:
        store = CacheStore(path, max_size=DEFAULT_CACHE_SIZE)
    except LLMBatchError as exc:
        print(f"llmbatch cache: {exc}", file=sys.stderr)
        return 2
    try:
        if args.cache_command == "show":
            summary = store.summary()
            print(json.dumps(_json(summary), indent=2) if args.json else _text(summary))
        elif args.cache_command == "prune":
            dropped = store.prune(older_than=args.older_than, namespace=args.namespace)
            print(f"llmbatch cache: {dropped:,} entries dropped from {path}")
        else:
            dropped = store.clear()
            print(f"llmbatch cache: {dropped:,} entries dropped; {path} is empty")
    finally:
        store.close()
    return 0


def _json(summary: StoreSummary) -> dict[str, object]:
    data = asdict(summary)
    data["entries"] = summary.entries
    return data


def _text(summary: StoreSummary) -> str:
    lines = [
        f"{summary.path}: {summary.entries:,} entries, {_size(summary.file_bytes)} on disk",
    ]
    for n in summary.namespaces:
        name = repr(n.namespace) if n.namespace else "(no namespace)"
        lines.append(
            f"  {name}: {n.entries:,} entries ({_size(n.bytes)}), {n.hits:,} hits; "
            f"{n.prompt_tokens:,} prompt + {n.completion_tokens:,} completion tokens "
            f"stored; written {_when(n.oldest)} to {_when(n.newest)}"
        )
    return "\n".join(lines)


def _size(count: int) -> str:
    if count < 1024:
        return f"{count:,} B"
    size, unit = float(count), "B"
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - the last one is the answer
        size /= 1024
        if size < 1024:
            break
    return f"{size:,.1f} {unit}"


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
