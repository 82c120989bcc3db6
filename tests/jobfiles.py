"""Helpers to write job input files, run ``llmbatch run`` and read job output files
in tests."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from llmbatch._jobs import cli


def completion_line(custom_id: str, prompt: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "fake-model", "prompt": prompt, **body},
    }


def chat_line(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "fake-model",
            "messages": [{"role": "user", "content": content}],
            **body,
        },
    }


def write_jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    with path.open("w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_output(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def id_counts(path: Path) -> Counter[str]:
    return Counter(record["custom_id"] for record in read_output(path))


def llmbatch_run(*argv: str) -> int:
    """``llmbatch run ARGV...`` in this process; its exit code. (The jobs subcommand
    alone: ``llmbatch`` itself also loads the bench subcommand.)"""
    parser = argparse.ArgumentParser(prog="llmbatch")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *argv])
    code: int = args.handler(args)
    return code
