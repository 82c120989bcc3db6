"""One version, read from one place per package: the package's ``__version__``, which
its build backend reads too (pyproject's ``dynamic = ["version"]``), so the installed
metadata, ``--version`` and the code agree, and the bench requires this release."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

import llmbatch
import llmbatch_bench
import llmbatch_server

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    pytest.param(llmbatch, ROOT, "llmbatch/_version.py", id="llmbatch"),
    pytest.param(llmbatch_server, ROOT / "server", "llmbatch_server/__init__.py", id="server"),
    pytest.param(llmbatch_bench, ROOT / "bench", "llmbatch_bench/__init__.py", id="bench"),
]


@pytest.mark.parametrize(("module", "folder", "source"), PACKAGES)
def test_the_version_has_one_source(module: object, folder: Path, source: str) -> None:
    project = tomllib.loads((folder / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == source
    name = project["project"]["name"]
    assert importlib.metadata.version(name) == module.__version__  # type: ignore[attr-defined]
    assert module.__version__ == llmbatch.__version__  # type: ignore[attr-defined]


def test_the_bench_requires_this_minor_release() -> None:
    major, minor, _ = llmbatch.__version__.split(".")
    project = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())
    assert f"llmbatch>={major}.{minor}" in project["project"]["dependencies"]


def test_the_changelog_has_a_section_for_this_version() -> None:
    assert f"## [{llmbatch.__version__}] - " in (ROOT / "CHANGELOG.md").read_text()
