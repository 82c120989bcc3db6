"""Prefix keys for affinity: which prompts share a beginning, without a tokenizer.

vLLM's automatic prefix caching reuses the KV blocks of a prompt's leading tokens
that an earlier request on the same server computed. A client routing among replicas
keeps that cache useful by sending prompts that share a beginning to the same one.
It cannot tokenize, so it hashes the text in blocks of ``BLOCK_CHARS`` characters,
each hash covering every block before it (a chain): two prompts share a key exactly
when they share every character up to the end of that block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]

__all__ = ["BLOCK_CHARS", "HotPrefixes", "prefix_keys"]

#: Characters per block: about 16 tokens of English, vLLM's default KV block.
BLOCK_CHARS = 64
#: Blocks hashed at most (8,192 characters): past that, a shared beginning is long
#: enough to tell where it was cached.
MAX_BLOCKS = 128
#: The block whose key groups a hot prefix's prompts into batches of their own (the
#: first 256 characters: a system prompt's opening is distinctive by then).
GROUP_BLOCK = 4
#: Group keys remembered to tell a hot prefix from a one-off.
HOT_MEMORY = 4_096


def prefix_keys(prompt: object, messages: Sequence[Message] | None) -> tuple[int, ...]:
    """The hash chain of the input's leading full blocks (empty if it has none, or is
    not text: token ids go without affinity)."""
    if isinstance(prompt, str):
        text = prompt
    elif messages:
        text = _flatten(messages)
    else:
        return ()
    blocks = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    keys: list[int] = []
    chain = 0
    for start in range(0, blocks * BLOCK_CHARS, BLOCK_CHARS):
        chain = hash((chain, text[start : start + BLOCK_CHARS]))
        keys.append(chain)
    return tuple(keys)


def _flatten(messages: Sequence[Message]) -> str:
    # Role and text content in order, as a chat template lays them out; other
    # content parts (images) only end the shared text.
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        parts.append(f"<{message.get('role')}>")
        if not isinstance(content, str):
            break
        parts.append(content)
    return "".join(parts)


class HotPrefixes:
    """Which group keys have been seen before: prompts with a recurring beginning
    batch together (and so reach the replica that holds it), while one-off
    beginnings stay in the common batches."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: OrderedDict[int, None] = OrderedDict()

    def group_of(self, keys: tuple[int, ...]) -> int | None:
        """The group key for an input with these prefix keys: its ``GROUP_BLOCK``-th
        key once that key has been seen before, else None (the common group)."""
        if len(keys) < GROUP_BLOCK:
            return None
        key = keys[GROUP_BLOCK - 1]
        seen = self._seen
        if key in seen:
            seen.move_to_end(key)
            return key
        seen[key] = None
        if len(seen) > HOT_MEMORY:
            seen.popitem(last=False)
        return None
