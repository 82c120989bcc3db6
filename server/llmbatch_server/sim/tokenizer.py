"""The simulator's tokenizer and its deterministic "model output".

A token is a run of word characters or one punctuation mark, plus one BOS token
per prompt, so counts are exact and cheap. Generated text is a sequence of words
drawn deterministically from the prompt, the choice index and the seed: each
generated word is exactly one token, so ``usage`` always matches the text.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

_TOKEN = re.compile(r"\w+|[^\w\s]")

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
VOCAB_SIZE = 32000  # ids reported by /tokenize, like a Llama vocabulary
_BOS_ID = 1


def count_tokens(text: str) -> int:
    """Tokens in ``text`` as a prompt: one BOS plus one per word or punctuation mark."""
    return 1 + len(_TOKEN.findall(text))


def token_ids(text: str) -> list[int]:
    """Stable ids for ``/tokenize`` (BOS first)."""
    return [_BOS_ID] + [2 + zlib.crc32(t.encode()) % (VOCAB_SIZE - 2) for t in _TOKEN.findall(text)]


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
