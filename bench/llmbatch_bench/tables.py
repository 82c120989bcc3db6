"""Markdown pipe tables and number formatting shared by the report's sections.

Tables are padded for the terminal and paste as they are into docs/benchmarks.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["num", "section", "table"]

#: Columns holding prose, left-aligned like the first column; numbers align right.
_TEXT_COLUMNS = frozenset({"detail", "errors", "verdict", "target", "threshold", "server"})


def num(value: float | None, digits: int = 0, scale: float = 1.0, suffix: str = "") -> str:
    """``value * scale`` with thousands separators, or ``-`` when not measured."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:,.{digits}f}{suffix}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown pipe table, padded for the terminal; text columns left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    left = [i == 0 or h in _TEXT_COLUMNS for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.ljust(w) if flush else c.rjust(w)
            for c, w, flush in zip(cells, widths, left, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = "".join(
        f"|{'-' * (w + 1)}{'-' if flush else ':'}" for w, flush in zip(widths, left, strict=True)
    )
    return "\n".join([line(headers), rule + "|", *(line(r) for r in rows)])


def section(title: str, body: str, note: str = "") -> str:
    """A ``###`` section: title, table, and an optional line under it."""
    return f"### {title}\n\n{body}" + (f"\n\n{note}" if note else "")


def server_cpu_per_prompt(run: Mapping[str, Any], key: str = "") -> str:
    """A run's server CPU per answered prompt, in µs: ``key`` of its ``extra``
    (``engine_cpu_s``), else the server's own (the simulator's process, or vLLM's API
    server: ``server_cpu_s``, then ``api_server_cpu_s``); "-" where not measured."""
    extra = run["extra"]
    seconds = extra.get(key) if key else extra.get("server_cpu_s", extra.get("api_server_cpu_s"))
    if seconds is None or not run["ok"]:
        return "-"
    return num(seconds / run["ok"] * 1e6, 0)
