"""``llmbatch``: the library's command line (``run`` JSONL jobs, ``bench``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmbatch",
        description="Batch LLM work against an OpenAI-compatible server.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # Subcommands import their own (possibly heavy) modules only when they run.
    from llmbatch._bench import cli as bench_cli
    from llmbatch._jobs import cli as jobs_cli

    jobs_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
