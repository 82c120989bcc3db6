"""What a server says about itself at open: ``GET {base_url}/models``, with errors
that say what to do for the answers no retry can fix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from llmbatch._exceptions import (
    APIStatusError,
    AuthenticationError,
    PermissionDeniedError,
    RequestError,
    ServerInfoError,
)
from llmbatch._servers.wire import error_from_response
from llmbatch._transports.base import HTTPRequest, Transport

__all__ = ["ModelList", "fetch", "read_models"]

#: The entries of a server's model list (each a mapping with at least ``id``).
ModelList = list[Mapping[str, Any]]


async def read_models(
    transport: Transport, base_url: str, headers: Mapping[str, str], api_key: str | None
) -> tuple[ModelList, int, Mapping[str, str]]:
    """The entries of ``GET {base_url}/models``, with the response's status and headers.

    Raises :class:`ServerInfoError` for a base URL missing its ``/v1`` (probed once,
    only after a 404), :class:`AuthenticationError` / :class:`PermissionDeniedError`
    saying what to do for 401/403 (the key never shown, and masked if the server
    quotes it), the status error for other 4xx/5xx, and ``TypeError`` /
    ``ValueError`` / ``KeyError`` for a body that is not a model list.
    """
    status, response_headers, content = await fetch(transport, base_url + "/models", headers)
    if status == 404:
        # The commonest slip is a base URL without /v1: probe that once, and only
        # after a 404, so a right URL costs nothing.
        v1 = base_url + "/v1"
        if not urlsplit(base_url).path.endswith("/v1") and await _lists_models(
            transport, v1, headers
        ):
            raise ServerInfoError(
                f"{base_url}/models answered 404, but {v1}/models lists models: did you mean {v1}?"
            )
    if api_key:  # a server that echoes the key must not get it into our errors
        content = content.replace(api_key.encode(), b"***")
    error = error_from_response(status, response_headers, content) if status >= 400 else None
    if isinstance(error, AuthenticationError | PermissionDeniedError):
        raise refused(error, base_url, has_key=bool(api_key))
    if error is not None:
        raise error
    models = json.loads(content)["data"]
    if not isinstance(models, list) or not all(
        isinstance(m, Mapping) and isinstance(m.get("id"), str) for m in models
    ):
        raise TypeError("'data' is not a list of models with ids")
    return models, status, response_headers


async def fetch(
    transport: Transport, url: str, headers: Mapping[str, str]
) -> tuple[int, Mapping[str, str], bytes]:
    """``GET url``: its status, headers and whole body (the response closed)."""
    response = await transport.send(HTTPRequest("GET", url, dict(headers)))
    try:
        content = await response.read()
    finally:
        await response.aclose()
    return response.status, response.headers, content


async def _lists_models(transport: Transport, base_url: str, headers: Mapping[str, str]) -> bool:
    try:
        status, _, content = await fetch(transport, base_url + "/models", headers)
        return status == 200 and isinstance(json.loads(content)["data"], list)
    except (RequestError, ValueError, KeyError, TypeError):
        return False


def refused(error: APIStatusError, base_url: str, *, has_key: bool) -> APIStatusError:
    """A 401/403 on the model list, retyped with what to do (the key never shown)."""
    status = f"{error.status_code}: {error.message}"
    if not has_key:
        advice = (
            f"the server at {base_url} wants an API key ({status}) and none was "
            "given; set LLMBATCH_API_KEY (or OPENAI_API_KEY)"
        )
    elif error.status_code == 401:
        advice = (
            f"the server at {base_url} refused the API key ({status}); "
            "check the key (it is not shown here)"
        )
    else:
        advice = (
            f"the server at {base_url} does not let this API key list its "
            f"models ({status}); check the key's permissions (it is not shown here)"
        )
    return type(error)(
        advice, status_code=error.status_code, body=error.body, retry_after=error.retry_after
    )
