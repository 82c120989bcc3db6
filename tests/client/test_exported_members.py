"""The public namespace is exactly ``__all__``, and importing it pulls no server code."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import pytest

import llmbatch


def test_all_is_exactly_the_public_names() -> None:
    public = {name for name in dir(llmbatch) if not name.startswith("_")}
    public -= {name for name in public if isinstance(getattr(llmbatch, name), types.ModuleType)}
    assert public | {"__version__"} == set(llmbatch.__all__)
    for name in llmbatch.__all__:
        value = getattr(llmbatch, name)
        if isinstance(value, type):
            assert value.__module__.startswith("llmbatch"), name
            assert value.__doc__, f"{name} has no docstring"


def test_the_lazy_exports_are_the_type_checkers_imports() -> None:
    # __init__ lists each public name three times: imported under TYPE_CHECKING (for
    # type checkers and editors), in _EXPORTS (loaded on first use) and in __all__.
    tree = ast.parse(Path(llmbatch.__file__).read_text())
    checked = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "typing.TYPE_CHECKING"
    )
    imported = {
        alias.name: node.module
        for node in checked.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == llmbatch._EXPORTS
    assert set(llmbatch.__all__) == {*llmbatch._EXPORTS, "__version__"}
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        llmbatch.Clinet  # type: ignore[attr-defined]  # noqa: B018


def test_import_is_light() -> None:
    # The client's modules, anyio and asyncio load with the first public name used.
    code = (
        "import sys, llmbatch; print(llmbatch.__version__); "
        "heavy = [m for m in ('asyncio', 'anyio', 'llmbatch._client', 'aiohttp', 'httpx') "
        "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pydantic_is_imported_only_when_a_schema_is_used() -> None:
    code = (
        "import sys; from llmbatch import Client, SyncClient; "
        "Client('http://127.0.0.1:1/v1', model='m'); "
        "print('pydantic' in sys.modules); sys.exit(1 if 'pydantic' in sys.modules else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_pulls_no_server_code() -> None:
    code = (
        "import sys, llmbatch; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('llmbatch_server', 'uvicorn', 'starlette', 'vllm', 'torch')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
