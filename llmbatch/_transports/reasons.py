"""Why a connection failed, in llmbatch's words on every transport: aiohttp says
``Cannot connect to host 127.0.0.1:8000 ssl:default [Connect call failed ...]``,
httpx on trio ``all attempts to connect to 127.0.0.1:8000 failed``; a user should
read the same thing, where and why, whichever one ran."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator

from llmbatch._exceptions import ConnectError

__all__ = ["cannot_connect"]


def cannot_connect(where: str, exc: BaseException, fallback: str) -> ConnectError:
    """The :class:`ConnectError` for a connection to ``where`` (``host:port``) that
    ``exc`` ended (``fallback``: the library's words, when no cause says more)."""
    return ConnectError(f"cannot connect to {where}: {_why(exc) or fallback}")


def _why(exc: BaseException) -> str | None:
    for seen in _causes(exc):
        if isinstance(seen, ssl.SSLCertVerificationError):
            # aiohttp's subclass keeps ssl's error as certificate_error instead.
            detail = getattr(seen, "certificate_error", seen)
            reason = getattr(detail, "verify_message", None) or detail
            return (
                f"the server's TLS certificate was refused ({reason}); "
                "verify=False turns the check off, for a server you trust"
            )
        if isinstance(seen, ssl.SSLError):
            return f"the TLS handshake failed ({seen.reason or seen})"
        if isinstance(seen, OSError) and seen.errno:
            # getaddrinfo's codes are negative (aiohttp passes them on as OSError).
            if isinstance(seen, socket.gaierror) or seen.errno < 0:
                return f"the host name did not resolve ({seen.strerror})"
            return os.strerror(seen.errno).lower()
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it came from: causes, contexts and the members of groups
    (trio reports each address it tried in a group)."""
    pending, seen = [exc], set[int]()
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
