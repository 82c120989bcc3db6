"""A griffe extension: render llmbatch's reST-flavoured docstrings as Markdown.

The library's docstrings use ``:class:`Name``` roles and ``::`` literal blocks, which
read well in ``help()`` but not in Markdown. At docs build time this turns a role
that names a public object into a cross-reference (so a renamed or removed name
fails ``mkdocs build --strict``), any other role into inline code, and a ``::``
block into a fenced Python block. The library's own docstrings stay as they are.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|exc|attr|mod|data|obj):`~?([^`]+)`")
_PUBLIC_MODULES = ("llmbatch", "llmbatch.transports")


def _public_names() -> dict[str, str]:
    """Canonical path (``llmbatch._client.Client``) -> public path (``llmbatch.Client``)."""
    names: dict[str, str] = {}
    for module_name in _PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            qualname = getattr(obj, "__qualname__", None)
            if isinstance(obj, type) and qualname:
                names[f"{obj.__module__}.{qualname}"] = f"{module_name}.{name}"
            names[f"{module_name}.{name}"] = f"{module_name}.{name}"
    return names


class SphinxRoles(griffe.Extension):
    """Rewrite roles and literal blocks in every docstring of the loaded package."""

    def __init__(self) -> None:
        super().__init__()
        self._public = _public_names()
        # Short names ("Result") resolve to the public object of that name.
        self._short = {path.rsplit(".", 1)[1]: path for path in self._public.values()}

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = _ROLE.sub(lambda m: self._link(m.group(1), obj), obj.docstring.value)
        obj.docstring.value = _fence_literal_blocks(text)

    def _link(self, target: str, context: griffe.Object) -> str:
        label = f"`{target.rsplit('.', 1)[-1] if '.' in target else target}`"
        path = self._resolve(target, context)
        return f"[{label}][{path}]" if path else label

    def _resolve(self, target: str, context: griffe.Object) -> str | None:
        """The public path ``target`` names, seen from ``context``; None if private."""
        if target in self._public:
            return self._public[target]
        head, _, rest = target.partition(".")
        if head in self._short:
            return self._short[head] + (f".{rest}" if rest else "")
        # A bare method name inside a class (``:meth:`map``` in Client's docstrings).
        owner = context if context.is_class else context.parent
        while owner is not None and not owner.is_class:
            owner = owner.parent
        if owner is not None and owner.path in self._public and target in owner.members:
            return f"{self._public[owner.path]}.{target}"
        return None


def _fence_literal_blocks(text: str) -> str:
    """``intro::`` + an indented block -> ``intro:`` + a fenced Python block."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.rstrip().endswith("::"):
            out.append(line)
            i += 1
            continue
        out.append(line.rstrip()[:-1])
        i += 1
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        code = [b[4:] if b.startswith("    ") else b for b in block]
        while code and not code[0].strip():
            code.pop(0)
        out.extend(["", "```python", *code, "```", ""])
    return "\n".join(out)
