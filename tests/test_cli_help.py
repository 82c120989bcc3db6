"""Every option of every command says what it does and what it defaults to.

Walks the parsers of ``llmbatch`` (``run``; ``bench`` hands its arguments to the
separate benchmark package) and ``llmbatch-server`` (``sim``, ``vllm``,
``tiny-model``): each option has help text, each optional one that is not required
shows ``(default: ...)``, each help renders, and no help shows a secret that came
from the environment. ``--version`` answers on both commands.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import llmbatch
import llmbatch_server
from llmbatch._cli import build_parser as llmbatch_parser
from llmbatch_server.cli import build_parser as server_parser

SECRET = "sk-help-must-not-show-this-123"


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from walk(sub)


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The arguments a user types, without -h/--version and the subcommand slot."""
    skipped = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    for action in parser._actions:
        if not isinstance(action, skipped):
            yield action


def all_parsers() -> list[argparse.ArgumentParser]:
    return [*walk(llmbatch_parser()), *walk(server_parser())]


PARSERS = {p.prog: p for p in all_parsers()}


def test_every_command_is_walked() -> None:
    assert set(PARSERS) == {
        "llmbatch",
        "llmbatch run",
        "llmbatch cache",
        "llmbatch cache show",
        "llmbatch cache prune",
        "llmbatch cache clear",
        "llmbatch bench",
        "llmbatch-server",
        "llmbatch-server sim",
        "llmbatch-server vllm",
        "llmbatch-server tiny-model",
        "llmbatch-server fit",
    }


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_option_has_help_and_shows_its_default(prog: str) -> None:
    parser = PARSERS[prog]
    for action in options(parser):
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{prog} {name}: no help"
        assert action.help is not argparse.SUPPRESS, f"{prog} {name}: help suppressed"
        if action.option_strings and not action.required:
            assert "(default: " in action.help, f"{prog} {name}: no shown default"
    parser.format_help()  # every %(default)s renders


@pytest.mark.parametrize("prog", ["llmbatch", "llmbatch-server"])
def test_every_subcommand_is_described(prog: str) -> None:
    for action in PARSERS[prog]._actions:
        if isinstance(action, argparse._SubParsersAction):
            described = {choice.dest: choice.help for choice in action._choices_actions}
            assert set(described) == set(action.choices)
            assert all(described.values()), described


def test_base_url_is_shown_with_its_scheme() -> None:
    text = PARSERS["llmbatch run"].format_help()
    assert "http://127.0.0.1:8000/v1" in " ".join(text.split())


def test_help_shows_no_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_API_KEY", "LLMBATCH_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(name, SECRET)
    for parser in all_parsers():  # built again: defaults are read when parsers are made
        assert SECRET not in parser.format_help(), parser.prog


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("llmbatch", f"llmbatch {llmbatch.__version__}"),
        ("llmbatch_server", f"llmbatch-server {llmbatch_server.__version__}"),
    ],
)
def test_version(module: str, expected: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ),
    )
    assert (result.returncode, result.stdout.strip()) == (0, expected), result.stderr


def test_bench_help_is_the_bench_packages() -> None:
    # `llmbatch bench` forwards everything, --help included, to llmbatch-bench.
    result = subprocess.run(
        [sys.executable, "-m", "llmbatch", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: llmbatch bench ")
