"""Cache keys: what makes two requests the same request (pure; no I/O).

A key is a 16-byte BLAKE2b digest of everything that shapes an answer: the key's
version, the endpoint, the server's identity of the model, the kind of call, every
body field as it is sent (in the server's dialect, a ``response_model``'s schema
included), the query string, the schema, the user's namespace, the prompt or
conversation, and a sample index for answers that are not deterministic. What
does not shape the answer stays out: the API key, HTTP headers (tracing ones
among them), the tier, the timeout, retries, the tenant (sent as ``user``) and
the order of a dict's keys.

A field left unset is keyed as unset, not as its default: a server fills in its
own defaults (vLLM reads the model's ``generation_config.json``), which need not
be OpenAI's, so an explicit ``temperature=1.0`` and none at all are two keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["KEY_VERSION", "LEFT_OUT", "KeyMaker", "deterministic"]

KEY_VERSION = 1
"""Part of every key: a change to what a key holds, or to how answers are stored,
raises it, so entries made before are never read as the new kind (they are
dropped as the cache fills)."""

LEFT_OUT = frozenset({"user", "session_id", "stream_options"})
"""Body fields that do not shape the answer: who it is for (a tenant is sent as
``user``, and vLLM's ``session_id``), and how a stream reports usage."""

_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def deterministic(kind: str, params: Mapping[str, Any], n: int) -> bool:
    """Whether asking again gives the same answer, as far as a request can say:
    embeddings always; text with one choice at ``temperature=0`` or with a ``seed``.
    Anything else (``temperature`` above 0, or unset: the server's default) is a
    sample, and a key holds its sample index."""
    if kind == "embedding":
        return True
    if n > 1:
        return False
    if params.get("seed") is not None:
        return True
    temperature = params.get("temperature")
    return temperature is not None and temperature == 0


class KeyMaker:
    """The keys of one set of call options (a ``CallSpec``): the options hashed once,
    each request's input added to a copy."""

    __slots__ = ("_base", "deterministic")

    def __init__(
        self,
        *,
        kind: str,
        model_identity: object,
        endpoint: str,
        params: Mapping[str, Any],
        n: int,
        query: str = "",
        schema: Mapping[str, Any] | None = None,
        namespace: str = "",
    ) -> None:
        fields = {name: value for name, value in params.items() if name not in LEFT_OUT}
        material = _JSON.encode(
            [KEY_VERSION, endpoint, model_identity, kind, fields, query, schema, namespace]
        ).encode()
        self._base = hashlib.blake2b(material, digest_size=16, person=b"llmbatch-cache")
        self.deterministic = deterministic(kind, params, n)
        """False: each answer is a sample, and the key holds its index."""

    def key(self, payload: object, sample: int = 0) -> bytes | None:
        """The key of ``payload`` (a prompt, a conversation, an embedding's input) as
        the ``sample``-th ask; None when the payload has no JSON form (not cached,
        rather than risk two payloads sharing a key)."""
        if isinstance(payload, str):
            data = payload.encode("utf-8", "surrogatepass")
            tag = b"s"
        else:
            try:
                data = _JSON.encode(payload).encode("utf-8", "surrogatepass")
            except (TypeError, ValueError):
                return None
            tag = b"j"
        digest = self._base.copy()
        # The length first, so that no input and sample index run into each other.
        digest.update(tag + len(data).to_bytes(8, "little"))
        digest.update(data)
        if sample:
            digest.update(b"#" + sample.to_bytes(8, "little"))
        return digest.digest()
