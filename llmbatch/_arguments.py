"""Constructor mistakes in llmbatch's words: ``Client(max_retry=3)`` raises
:class:`ConfigTypeError` naming the nearest parameter, as a misspelt call keyword
raises :class:`InvalidTypeError`, instead of Python's bare ``TypeError``.

The signatures stay explicit, so type checkers and editors still flag the mistake
before it runs; the translation happens only once Python has refused the binding,
so a constructor that succeeds pays nothing for it.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from llmbatch._exceptions import ConfigTypeError, LLMBatchError

__all__ = ["checked_arguments", "config_class"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)


def checked_arguments(init: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``__init__`` so an argument it cannot take raises :class:`ConfigTypeError`
    (also a ``TypeError``) with a suggestion; ``inspect.signature`` and ``help()``
    still show the original parameters."""
    signature = inspect.signature(init)
    owner = init.__qualname__.rsplit(".", 1)[0]

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return init(*args, **kwargs)
        except TypeError as exc:
            if isinstance(exc, LLMBatchError):
                raise
            try:
                signature.bind(*args, **kwargs)
            except TypeError as refused:
                raise _config_error(owner, signature, kwargs, refused) from None
            raise  # a TypeError from the body itself, not from the arguments

    return checked


def config_class(cls: C) -> C:
    """:func:`checked_arguments` for a class's ``__init__`` (a dataclass's too)."""
    cls.__init__ = checked_arguments(cls.__init__)  # type: ignore[misc]
    return cls


def _config_error(
    owner: str,
    signature: inspect.Signature,
    kwargs: dict[str, object],
    refused: TypeError,
) -> ConfigTypeError:
    parameters = [name for name in signature.parameters if name != "self"]
    for name in kwargs:
        if name not in signature.parameters:
            close = difflib.get_close_matches(name, parameters, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return ConfigTypeError(
                f"{owner}() got an unexpected keyword argument {name!r}{hint}", field=name
            )
    keywords = [
        name
        for name, parameter in signature.parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    if "too many positional" in str(refused) and keywords:
        return ConfigTypeError(
            f"{owner}() takes its options as keywords, as in {owner}({keywords[0]}=...)"
        )
    return ConfigTypeError(f"{owner}(): {refused}")
