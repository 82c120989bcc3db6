"""Prompt token counts: a built-in estimate, or a real tokenizer file.

vLLM counts prompt tokens with the model's tokenizer; the simulator has no model,
so by default it estimates what a byte-level BPE tokenizer would count, from the
characters alone. ``--tokenizer PATH`` loads a Hugging Face ``tokenizer.json``
through the ``tokenizers`` package instead (the ``tokenizer`` extra) for exact
counts. Usage, context-length checks, ``/tokenize`` and the prefix cache all use
the same counter, so they always agree.

The estimate splits text the way BPE pre-tokenizers do (letters, digits, other
symbols, whitespace; a space joins the word after it) and prices each piece from
what tokenizers measurably do with it: a short word is one token and a long one
about one more per six letters; a case change or an underscore starts a new
token; every digit is a token (as in Llama 2, Mistral and Qwen); runs of ASCII
symbols merge a little; letters of other scripts cost a fraction of a token each
(Cyrillic, Greek, Arabic and accented Latin about a third, CJK nearly one).
docs/simulator.md reports its error against two real tokenizers.
"""

from __future__ import annotations

import functools
import re
import zlib
from pathlib import Path
from typing import Any, Protocol

#: Ids the estimate reports, like a 32k Llama vocabulary; 1 is BOS.
VOCAB_SIZE = 32000
BOS_ID = 1

INSTALL_HINT = "--tokenizer needs the tokenizers package: pip install 'llmbatch-server[tokenizer]'"


class TokenCounter(Protocol):
    """What the simulator needs of a tokenizer."""

    #: Shown in the startup line and ``/tokenize`` answers' provenance.
    name: str

    def count(self, text: str) -> int:
        """Tokens in ``text`` as a prompt (BOS included)."""

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` as a prompt; ``len(encode(t)) == count(t)``."""


def load_counter(path: str | Path | None) -> TokenCounter:
    """The estimate for ``None``, else the tokenizer in ``path`` (a ``tokenizer.json``).

    Raises ValueError (with the install hint when the ``tokenizers`` package
    is missing) so the CLI can answer with one clear line.
    """
    if path is None:
        return EstimateCounter()
    return HFTokenizerCounter(path)


# A piece is an English contraction, a letter run (underscores inside it kept),
# a digit run or a run of other symbols, each with the one space before it (BPE
# vocabularies hold " word" as one token); or a whitespace run, less the space
# that joins the next piece.
_PIECE = re.compile(
    r"'(?:[sdmt]|ll|ve|re)(?![^\W\d_])"
    r"| ?_*[^\W\d_]+(?:_+[^\W\d_]+)*| ?\d+| ?[^\w\s]+|\s+(?!\S)|\s+|_+",
    re.IGNORECASE,
)
# Sub-words of an ASCII letter run: BPE merges rarely cross a case change.
_CASE_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")


class EstimateCounter:
    """Estimates a byte-level BPE tokenizer's count from character classes."""

    name = "estimate"

    def count(self, text: str) -> int:
        return 1 + _tokens(sum(map(_cost, _PIECE.findall(text))))

    def encode(self, text: str) -> list[int]:
        # Pseudo-ids, stable across processes: each piece gets its share of the
        # running total, rounded cumulatively, so the length equals count() and
        # a text's prefix gets the same ids as the text (the prefix cache needs it).
        ids = [BOS_ID]
        total = 0
        emitted = 0
        for piece in _PIECE.findall(text):
            total += _cost(piece)
            n = (2 * total + UNIT) // (2 * UNIT) - emitted  # _tokens(), inlined: hot
            if n == 1:
                ids.append(_base_id(piece))
            elif n > 1:
                base = _base_id(piece)
                ids.extend([2 + (base + 7919 * j) % (VOCAB_SIZE - 2) for j in range(n)])
            emitted += n
        return ids


class HFTokenizerCounter:
    """Exact counts from a Hugging Face ``tokenizer.json`` (the model's own tokenizer)."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ValueError(INSTALL_HINT) from None
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        try:
            self._tokenizer: Any = Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises plain Exceptions
            raise ValueError(f"cannot load tokenizer {str(file)!r}: {exc}") from None
        self.name = str(file)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text).ids)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text).ids
        return ids


# Costs are in sixtieths of a token, so sums are exact integers and count()
# and encode() round the very same total.
UNIT = 60


def _tokens(units: int) -> int:
    """Whole tokens for ``units`` sixtieths, rounding half up."""
    return (2 * units + UNIT) // (2 * UNIT)


@functools.lru_cache(maxsize=1 << 16)  # words repeat: most lookups hit
def _base_id(piece: str) -> int:
    return 2 + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % (VOCAB_SIZE - 2)


@functools.lru_cache(maxsize=1 << 16)
def _cost(piece: str) -> int:
    if piece[0] == " " and len(piece) > 1 and not piece[1].isspace():
        piece = piece[1:]  # the space joins the piece: no token of its own
    first = piece[0]
    if first.isspace():
        # Newlines, indentation and spaces no piece took: one token, or two when long.
        return UNIT if len(piece) <= 2 else 2 * UNIT
    if first.isdigit():
        return UNIT * len(piece)
    if first.isalpha() or (first == "_" and piece.strip("_")):
        return _letters(piece)
    if first == "'" and len(piece) <= 3 and piece[1:].isalpha():
        return UNIT  # 's, 'll, ...
    return _symbols(piece)


def _letters(run: str) -> int:
    if "_" in run:
        parts = [part for part in run.split("_") if part]
        return sum(_letters(part) for part in parts) + (18 if run[0] == "_" else 0)
    if run.isascii():
        total = 0
        for part in _CASE_PART.findall(run):
            length = len(part)
            if length > 1 and part.isupper():
                total += max(UNIT, 20 * length)  # few merges for ALL-CAPS: 3 letters a token
            else:
                total += UNIT + 10 * max(0, length - 6)  # one more token per 6 letters past 6
        return total
    return max(UNIT, sum(_letter_rate(c) for c in run))


def _letter_rate(char: str) -> int:
    """Sixtieths of a token per letter of a script (measured on a 131k BPE vocabulary)."""
    code = ord(char)
    if code < 0x250:
        return 15  # ASCII inside a non-ASCII word, accented Latin
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF:
        return 54  # CJK ideographs
    if 0x3040 <= code <= 0x30FF:
        return 42  # kana
    if 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF:
        return 36  # Hangul
    if 0x0900 <= code <= 0x0EFF:
        return 39  # Indic scripts, Thai, Lao
    return 21  # Cyrillic, Greek, Arabic, Hebrew and other alphabets


def _symbols(run: str) -> int:
    ascii_run = 0
    other = 0
    for char in run:
        if char.isascii() and char.isprintable():
            ascii_run += 1
        else:
            other += 1  # control characters, emoji, U+FFFD: about a token each
    total = UNIT * other
    if ascii_run:
        total += UNIT + 27 * max(0, ascii_run - 2)  # a token per two, merging a little
    return total
