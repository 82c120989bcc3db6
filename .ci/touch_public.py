"""Import a package and every public module in it, and touch every public name.

Run from an installed package's venv (not the checkout): a module that imports
something its package does not declare fails here. A module behind an optional extra
may refuse to import, but only with an ImportError that says what to install.
Usage: python touch_public.py PACKAGE
"""

from __future__ import annotations

import importlib
import pkgutil
import sys


def main(package_name: str) -> None:
    package = importlib.import_module(package_name)
    assert "site-packages" in (package.__file__ or ""), package.__file__
    touched = 0
    refused: list[str] = []
    names = [package_name]
    names += [
        info.name
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}.")
        if not any(part.startswith("_") for part in info.name.split(".")[1:])
    ]
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            # An optional extra's module: its error must say how to install it.
            if "pip install" not in str(exc):
                raise SystemExit(f"{name}: {exc!r} (an undeclared dependency?)") from exc
            refused.append(name)
            continue
        for attribute in getattr(module, "__all__", ()):
            getattr(module, attribute)
            touched += 1
    print(
        f"{package_name} {package.__version__}: {len(names) - len(refused)} modules, "
        f"{touched} public names; needing an extra: {', '.join(refused) or 'none'}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main(sys.argv[1])
