"""``llmbatch-server``: one command, one subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmbatch_server import __version__, tiny_model
from llmbatch_server.fit import cli as fit_cli
from llmbatch_server.launcher import cli as launcher_cli
from llmbatch_server.sim import cli as sim_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmbatch-server",
        description="Start an LLM server for llmbatch: a real vLLM or the simulator.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="show the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim_cli.add_parser(sub)
    launcher_cli.add_parser(sub)
    tiny_model.add_parser(sub)
    fit_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Only a subcommand that passes arguments on (``vllm ... -- ARGS``) takes extras.
    if extra and not args.passes_extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    handler = args.handler
    return int(handler(args, extra, parser) or 0)


if __name__ == "__main__":
    sys.exit(main())
