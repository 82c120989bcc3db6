"""The simulator's deterministic "model output".

Generated text is a sequence of words drawn deterministically from the prompt,
the sample number and the seed: each generated word counts as exactly one
token, so ``usage`` always matches the text. (Prompt tokens are counted in
:mod:`llmbatch_server.sim.counting`.)
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

VOCAB: Sequence[str] = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "for",
        "that",
        "on",
        "with",
        "as",
        "by",
        "at",
        "from",
        "it",
        "an",
        "be",
        "this",
        "which",
        "or",
        "are",
        "model",
        "token",
        "batch",
        "queue",
        "server",
        "client",
        "request",
        "prompt",
        "answer",
        "latency",
        "throughput",
        "data",
        "value",
        "result",
        "system",
        "memory",
        "cache",
        "engine",
        "step",
        "sequence",
        "sample",
        "output",
        "input",
        "river",
        "mountain",
        "forest",
        "ocean",
        "desert",
        "valley",
        "island",
        "city",
        "village",
        "garden",
        "bridge",
        "road",
        "red",
        "green",
        "blue",
        "yellow",
        "silver",
        "golden",
        "quiet",
        "bright",
        "small",
        "large",
        "early",
        "late",
        "fast",
        "slow",
        "think",
        "write",
        "read",
        "build",
        "learn",
        "test",
        "measure",
        "move",
        "carry",
        "hold",
        "open",
        "close",
        "begin",
        "finish",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "hundred",
        "thousand",
        "many",
        "few",
        "some",
    ]
)


def output_seed(prompt_key: str, choice: int, seed: int) -> int:
    """The seed of one choice's output: same prompt, choice and seed give the same text."""
    return zlib.crc32(f"{seed}\x00{choice}\x00{prompt_key}".encode("utf-8", "surrogatepass"))


def word(seed: int, position: int) -> str:
    """The ``position``-th generated word of the output with ``seed``."""
    return VOCAB[(seed + position * 7919) % len(VOCAB)]


def text(seed: int, start: int, stop: int) -> str:
    """Generated words ``start..stop-1`` as they appear in the output (space-led)."""
    return "".join(" " + word(seed, i) for i in range(start, stop))


def natural_length(seed: int) -> int:
    """How many tokens this output has before its EOS when EOS is not ignored."""
    return 8 + (seed >> 8) % 120
