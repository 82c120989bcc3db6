"""``llmbatch``: the library's command line (``run`` JSONL jobs, ``cache``, ``bench``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from llmbatch._version import __version__

#: Shown when ``llmbatch bench`` runs without the separate benchmark package.
BENCH_MISSING = (
    "llmbatch bench: the benchmark harness is a separate package, llmbatch-bench, not "
    "yet published: install it from a checkout of llmbatch with `pip install -e ./bench`."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmbatch",
        description="Batch LLM work against an OpenAI-compatible server.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="show the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Subcommands import their own (possibly heavy) modules only when they run.
    from llmbatch._jobs import cli as jobs_cli

    jobs_cli.add_parser(sub)
    from llmbatch._cache import commands as cache_commands

    cache_commands.add_parser(sub)
    # The bench lives in its own package; its options are its own, so everything
    # after `bench` is handed over unparsed (add_help=False: `bench --help` too).
    bench = sub.add_parser(
        "bench",
        add_help=False,
        help="benchmark llmbatch against common clients (needs llmbatch-bench; "
        "`llmbatch bench --help` lists its options)",
    )
    bench.set_defaults(handler=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return run_bench(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.handler(args) or 0)


#: Where packages put commands of their own under ``llmbatch`` (the bench: ``bench``).
COMMANDS_GROUP = "llmbatch.commands"


def run_bench(argv: Sequence[str]) -> int:
    """Run the command the bench package registers as ``bench`` (an entry point in
    :data:`COMMANDS_GROUP`), loaded only now: it is optional."""
    found = [e for e in entry_points(group=COMMANDS_GROUP) if e.name == "bench"]
    if not found:
        print(BENCH_MISSING, file=sys.stderr)
        return 2
    main = found[0].load()
    return int(main(list(argv), prog="llmbatch bench"))


if __name__ == "__main__":
    sys.exit(main())
