"""Every public name, and every public method of Client, has a docstring."""

from __future__ import annotations

import inspect

import pytest

import llmbatch
import llmbatch.transports

PUBLIC = [("llmbatch", n) for n in llmbatch.__all__ if n != "__version__"] + [
    ("llmbatch.transports", n) for n in llmbatch.transports.__all__
]


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_public_name_has_a_docstring(module: str, name: str) -> None:
    obj = getattr(llmbatch if module == "llmbatch" else llmbatch.transports, name)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return  # constants are documented where they are defined
    assert (obj.__doc__ or "").strip(), f"{module}.{name} has no docstring"


@pytest.mark.parametrize("method", [m for m in vars(llmbatch.Client) if not m.startswith("_")])
def test_client_method_has_a_docstring(method: str) -> None:
    assert (getattr(llmbatch.Client, method).__doc__ or "").strip()
