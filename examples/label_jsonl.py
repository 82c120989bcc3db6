"""Label a JSONL dataset in bulk, with progress, resumable after any interruption.

    python examples/label_jsonl.py reviews.jsonl labels.jsonl

Each input line is ``{"id": ..., "text": ...}``. Each output line is
``{"id": ..., "label": ...}`` or ``{"id": ..., "error": ...}``, appended and
flushed as results arrive. Rerun the same command after a crash or Ctrl-C and it
skips the ids already in the output. (For OpenAI Batch API files, use
``llmbatch run`` instead: same idea, standard format.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import llmbatch

LABELS = ("positive", "negative", "neutral")


def done_ids(output: Path) -> set[str]:
    """Ids already labelled; a torn last line (killed mid-write) is ignored."""
    if not output.exists():
        return set()
    ids = set()
    for line in output.read_text().splitlines():
        try:
            ids.add(json.loads(line)["id"])
        except (ValueError, KeyError):
            continue
    return ids


def todo(source: Path, skip: set[str]) -> Iterator[dict[str, object]]:
    """Map inputs for the lines still to do, read lazily."""
    with source.open() as f:
        for line in f:
            row = json.loads(line)
            if row["id"] in skip:
                continue
            prompt = f"Label the sentiment ({', '.join(LABELS)}) of: {row['text']}\nLabel:"
            yield {"prompt": prompt, "metadata": row["id"]}


def to_label(text: str) -> str:
    """The model's answer mapped onto a known label (first match, else 'neutral')."""
    words = text.lower().split()
    return next((w for w in words if w in LABELS), "neutral")


def drop_torn_tail(output: Path) -> None:
    """Cut a partial last line (the process was killed mid-write) before appending."""
    if not output.exists():
        return
    data = output.read_bytes()
    if data and not data.endswith(b"\n"):
        with output.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


async def main(source: Path, output: Path, progress: bool) -> None:
    drop_torn_tail(output)
    skip = done_ids(output)
    if skip:
        print(f"resuming: {len(skip)} already labelled")
    async with llmbatch.Client() as client:
        with output.open("a") as out:
            async for _, result in client.map_unordered(
                todo(source, skip), priority="batch", max_tokens=4, progress=progress
            ):
                if result.ok:
                    row = {"id": result.metadata, "label": to_label(result.unwrap().text)}
                else:
                    row = {"id": result.metadata, "error": str(result.error)}
                out.write(json.dumps(row) + "\n")
                out.flush()
    print(f"done: {len(done_ids(output))} labelled in {output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Label a JSONL dataset with an LLM.")
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.source, args.output, not args.no_progress))
