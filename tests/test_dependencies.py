"""Every third-party module a package imports when it loads is one it declares.

CI installs each wheel alone and imports it (.ci/alone.sh); this is the quick form of
that check for the README's test command: an import at a module's top level (not in a
function, not guarded by ``except ImportError``) must come from a distribution named in
that package's ``dependencies``, because the dev venv brings everything and would hide
the gap (sniffio was missing so).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "llmbatch": (ROOT / "pyproject.toml", ROOT / "llmbatch"),
    "llmbatch_server": (ROOT / "server" / "pyproject.toml", ROOT / "server" / "llmbatch_server"),
    "llmbatch_bench": (ROOT / "bench" / "pyproject.toml", ROOT / "bench" / "llmbatch_bench"),
}
FIRST_PARTY = {"llmbatch", "llmbatch_server", "llmbatch_bench"}


def _declared(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return {
        _normalise(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0])
        for spec in project["dependencies"]
    }


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _guarded(node: ast.Try) -> bool:
    return any(
        isinstance(handler.type, ast.Name)
        and handler.type.id in {"ImportError", "ModuleNotFoundError"}
        for handler in node.handlers
    )


def _load_time_imports(source: str) -> set[str]:
    """Top-level module names imported when the module loads (its body, its `if`
    blocks, its unguarded `try` blocks; not functions, classes or TYPE_CHECKING)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try) and not _guarded(node):
                visit(node.body)

    visit(ast.parse(source).body)
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_load_time_imports_are_declared(package: str) -> None:
    pyproject, folder = PACKAGES[package]
    declared = _declared(pyproject)
    distributions = importlib.metadata.packages_distributions()
    missing: list[str] = []
    for path in sorted(folder.rglob("*.py")):
        for name in sorted(_load_time_imports(path.read_text())):
            if name in sys.stdlib_module_names or name in FIRST_PARTY or name == "__future__":
                continue
            owners = {_normalise(d) for d in distributions.get(name, [name])}
            if not owners & declared:
                missing.append(
                    f"{path.relative_to(ROOT)} imports {name} ({', '.join(sorted(owners))})"
                )
    assert not missing, f"{pyproject.relative_to(ROOT)} does not declare:\n" + "\n".join(missing)


def test_the_check_sees_an_undeclared_import() -> None:
    source = "import sniffio\ntry:\n    import openai\nexcept ImportError:\n    pass\n"
    assert _load_time_imports(source) == {"sniffio"}
