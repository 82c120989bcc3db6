"""Reading a job's input: a checking pass, then a lazy pass that feeds the client.

The first pass finds every malformed line and duplicate custom_id before anything
is sent, so a bad file is rejected whole rather than half-run. The second pass
re-reads the file and yields only the lines still to do, so memory does not grow
with the input (beyond the custom_ids kept for duplicate and resume checks).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmbatch._jobs.format import MalformedLine, parse_line, to_map_input

__all__ = ["InputScan", "PendingInputs", "scan_input"]


@dataclass(slots=True)
class InputScan:
    """What the checking pass found."""

    model: str | None = None
    """The job's model: ``--model``, else the first line's ``body.model``."""
    ids: dict[str, int] = field(default_factory=dict)
    """custom_id -> line number of every valid line."""
    malformed: list[MalformedLine] = field(default_factory=list)
    duplicates: list[MalformedLine] = field(default_factory=list)
    """Each repeat of a custom_id, naming the line it first appeared on."""

    @property
    def bad_lines(self) -> set[int]:
        return {m.line_no for m in self.malformed}


def scan_input(path: Path, *, model: str | None) -> InputScan:
    """Check every line of ``path``; ``model`` (``--model``) overrides the lines'."""
    scan = InputScan(model=model)
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = parse_line(raw, line_no)
                if line is None:
                    continue
                if model is None and line.model is not None:
                    if scan.model is None:
                        scan.model = line.model
                    elif line.model != scan.model:
                        raise MalformedLine(
                            line_no,
                            f"body.model {line.model!r} differs from the job's model "
                            f"{scan.model!r}; pass --model to run every line with one model",
                        )
            except MalformedLine as exc:
                scan.malformed.append(exc)
                continue
            first = scan.ids.setdefault(line.custom_id, line_no)
            if first != line_no:
                scan.duplicates.append(
                    MalformedLine(
                        line_no, f"duplicate custom_id {line.custom_id!r} (first on line {first})"
                    )
                )
    return scan


class PendingInputs:
    """The ``Client.map`` items of the lines still to do, read lazily; ``len()`` is
    known, so progress can show an ETA."""

    def __init__(
        self, path: Path, *, skip_lines: Collection[int], done: Collection[str], count: int
    ) -> None:
        self._path = path
        self._skip_lines = skip_lines
        self._done = done
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with open(self._path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                if line_no in self._skip_lines:
                    continue
                try:
                    line = parse_line(raw, line_no)
                except MalformedLine:
                    continue  # the file changed since the checking pass; never guess
                if line is not None and line.custom_id not in self._done:
                    yield to_map_input(line)
