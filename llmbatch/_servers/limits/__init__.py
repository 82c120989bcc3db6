"""What a server's answer says of this caller's rate limits, read from its headers.

Each provider's family is read in its own module, pure (headers in, a
:class:`ProviderLimits` out): ``openai`` (OpenAI, Groq, LiteLLM's proxy),
``anthropic``, ``together`` and ``fireworks``. :func:`read_limits` reads every family
present (a proxy may send two), the first one read giving each field it has. A value
that cannot be read is ignored and counted (``ProviderLimits.malformed``), never
raised. vLLM, llama.cpp, Ollama and DeepSeek send none of them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from llmbatch._servers.limits import anthropic, fireworks, openai, together
from llmbatch._servers.limits.values import Values
from llmbatch._stats import ProviderLimits

__all__ = ["FAMILIES", "read_limits"]

#: Each family's reader, tried in this order.
FAMILIES: tuple[Callable[[Values], ProviderLimits | None], ...] = (
    anthropic.read,
    openai.read,
    together.read,
    fireworks.read,
)


def read_limits(headers: Mapping[str, str], now: float | None = None) -> ProviderLimits | None:
    """The limits an answer's (lower-cased) ``headers`` state, as of ``now`` (wall
    clock, ``time.time()``; resets given as times are read from then); None where no
    family is there."""
    values = Values(headers, time.time() if now is None else now)
    found = [limits for read in FAMILIES if (limits := read(values)) is not None]
    if not found:
        return None
    merged = found[0]
    for more in found[1:]:
        merged = dataclasses.replace(
            merged,
            **{
                field.name: getattr(more, field.name)
                for field in dataclasses.fields(ProviderLimits)
                if getattr(merged, field.name) is None and getattr(more, field.name) is not None
            },
            family=f"{merged.family}+{more.family}",
        )
    return dataclasses.replace(merged, malformed=values.malformed)
