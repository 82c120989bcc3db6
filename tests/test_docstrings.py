"""Every public name has a docstring: the API reference (docs/reference.md) is built
from them, so a name without one would be an empty entry on the site.

Public means ``llmbatch.__all__``, ``llmbatch.transports.__all__``, and the public
methods and properties those classes define themselves (Client's above all).
Constants need an attribute docstring: a string literal right after the assignment,
which is what the docs generator reads.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import llmbatch
import llmbatch.transports

PACKAGE_DIR = Path(llmbatch.__file__).parent
PUBLIC_MODULES = (llmbatch, llmbatch.transports)


def _public_names() -> Iterator[tuple[ModuleType, str]]:
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            yield module, name


def _own_doc(obj: object) -> str:
    """The object's own docstring, not one inherited or generated for it."""
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__") or ""
        # A dataclass without a docstring gets its signature as __doc__.
        if dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""
        return str(doc)
    return inspect.getdoc(obj) or ""


def _attribute_docstrings() -> dict[str, str]:
    """Module-level ``NAME = ...`` followed by a string literal, across the package."""
    found: dict[str, str] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for stmt, following in itertools.pairwise(body):
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign)
                else []
            )
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = following.value.value
    return found


@pytest.mark.parametrize(
    ("module", "name"), list(_public_names()), ids=lambda v: getattr(v, "__name__", v)
)
def test_public_name_has_docstring(module: ModuleType, name: str) -> None:
    obj = getattr(module, name)
    if isinstance(obj, type) or inspect.isroutine(obj):
        assert _own_doc(obj).strip(), f"{module.__name__}.{name} has no docstring"
    else:
        docs = _attribute_docstrings()
        assert docs.get(name, "").strip(), (
            f"{module.__name__}.{name} needs an attribute docstring "
            '(a """string""" on the line after its assignment)'
        )


def _public_members() -> Iterator[tuple[str, object]]:
    for module, name in _public_names():
        cls = getattr(module, name)
        if not isinstance(cls, type):
            continue
        for attr, value in vars(cls).items():
            if attr.startswith("_"):
                continue
            func = value.fget if isinstance(value, property) else value
            if isinstance(func, (staticmethod, classmethod)):
                func = func.__func__
            if inspect.isfunction(func):
                yield f"{module.__name__}.{name}.{attr}", func


@pytest.mark.parametrize(("qualname", "member"), list(_public_members()), ids=str)
def test_public_method_has_docstring(qualname: str, member: object) -> None:
    assert (inspect.getdoc(member) or "").strip(), f"{qualname} has no docstring"


def test_client_methods_are_all_checked() -> None:
    checked = {q.rsplit(".", 1)[1] for q, _ in _public_members() if ".Client." in q}
    assert {
        "complete",
        "chat",
        "stream",
        "stream_chunks",
        "map",
        "map_unordered",
        "imap",
        "stats",
    } <= checked
