"""The public namespace is exactly ``__all__``, and importing it pulls no server code."""

from __future__ import annotations

import subprocess
import sys
import types

import llmbatch


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(llmbatch).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public | {"__version__"} == set(llmbatch.__all__)
    for name in llmbatch.__all__:
        value = getattr(llmbatch, name)
        if isinstance(value, type):
            assert value.__module__.startswith("llmbatch"), name
            assert value.__doc__, f"{name} has no docstring"


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
