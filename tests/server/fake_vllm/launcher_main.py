"""Run only the launcher's subcommand, the way ``llmbatch-server`` wires it.

Lets launcher tests run the CLI without depending on sibling subcommands.
Usage: python launcher_main.py vllm --model M [...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmbatch_server.launcher import cli as launcher_cli


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmbatch-server")
    launcher_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args, extra = parser.parse_known_args(argv)
    return int(args.handler(args, extra, parser) or 0)


if __name__ == "__main__":
    sys.exit(main())
