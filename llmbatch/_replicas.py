"""Which servers a client talks to: ``base_url`` as one URL, a list of them, or
:class:`Replica` objects with keys of their own; and the checks that turn a slip in
any of them into a :class:`ConfigError` at the call site."""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import urlsplit

from llmbatch._arguments import checked_arguments
from llmbatch._config import _check_number
from llmbatch._exceptions import ConfigError, ConfigTypeError

__all__ = [
    "DEFAULT_BASE_URL",
    "Replica",
    "check_api_key",
    "check_base_url",
    "env",
    "resolve",
    "with_default_key",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class Replica:
    """One server of several that serve the same models (a vLLM replica).

    ``Client(base_url=[...])`` takes URLs, ``Replica`` objects, or both; a replica
    without an ``api_key`` of its own uses the client's. Replicas compare by URL; the
    key is never shown (``repr`` says only whether one is set)::

        llmbatch.Client(base_url=[
            "http://10.0.0.1:8000/v1",
            llmbatch.Replica("http://10.0.0.2:8000/v1", api_key=os.environ["KEY_2"]),
        ])
    """

    __slots__ = (
        "_api_key",
        "base_url",
        "max_num_batched_tokens",
        "max_num_seqs",
        "prefill_seconds_per_token",
    )

    @checked_arguments
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        prefill_seconds_per_token: float | None = None,
    ) -> None:
        self.base_url = check_base_url(base_url)
        """The replica's OpenAI-style base URL (``http://host:port/v1``), no trailing slash."""
        self._api_key = check_api_key(api_key)
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        """How many sequences the server runs at once (vLLM's ``--max-num-seqs``, as
        ``llmbatch-server fit`` finds it), if you know it: bulk then stays below it
        by the realtime reserve, instead of the client learning it from a queue that
        lasts (None: learnt; llama.cpp's server states its own slots)."""
        self.max_num_batched_tokens = _positive("max_num_batched_tokens", max_num_batched_tokens)
        """The prompt tokens one engine step takes (vLLM's ``--max-num-batched-tokens``,
        llama.cpp's ``--batch-size``), if you know it: a bulk batch then carries at
        most one step of prompts less the running decodes (None: the kind's default,
        docs/concepts.md "Batches sized by the engine's step")."""
        _check_number(
            "Replica", "prefill_seconds_per_token", prefill_seconds_per_token, optional=True
        )
        self.prefill_seconds_per_token = (
            None if prefill_seconds_per_token is None else float(prefill_seconds_per_token)
        )
        """How much longer an engine step takes per prompt token it prefills, if you
        know it (``llmbatch-server fit`` prints it: ``step.per_prefill_token`` in its
        JSON): with ``SLO(pace=True)``, bulk is then paced so that each step's prefill
        stays within the room the SLO leaves beside the decodes (docs/concepts.md,
        "Pacing")."""

    @property
    def api_key(self) -> str | None:
        """Its own API key (None: the client's)."""
        return self._api_key

    def __repr__(self) -> str:
        key = ", api_key=<set>" if self._api_key else ""
        stated = "".join(
            f", {name}={value}"
            for name, value in (
                ("max_num_seqs", self.max_num_seqs),
                ("max_num_batched_tokens", self.max_num_batched_tokens),
                ("prefill_seconds_per_token", self.prefill_seconds_per_token),
            )
            if value is not None
        )
        return f"Replica({self.base_url!r}{key}{stated})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Replica) and other.base_url == self.base_url

    def __hash__(self) -> int:
        return hash(self.base_url)


def resolve(base_url: object, api_key: str | None) -> list[Replica]:
    """The replicas ``base_url`` names (or, if None, ``LLMBATCH_BASE_URL`` /
    ``OPENAI_BASE_URL``, comma-separated, or the default), each with its key: its own,
    else ``api_key``."""
    if base_url is None:
        from_env = env("LLMBATCH_BASE_URL", "OPENAI_BASE_URL") or DEFAULT_BASE_URL
        base_url = [url.strip() for url in from_env.split(",") if url.strip()]
    items: Sequence[object]
    if isinstance(base_url, str | Replica):
        items = [base_url]
    elif isinstance(base_url, Sequence) and not isinstance(base_url, bytes):
        items = base_url
    else:
        raise ConfigTypeError(
            f"base_url must be a str like {DEFAULT_BASE_URL!r}, a Replica, or a list of "
            f"them, got {type(base_url).__name__}",
            field="base_url",
        )
    if not items:
        raise ConfigError("base_url lists no servers", field="base_url")
    replicas: list[Replica] = []
    for item in items:
        replica = item if isinstance(item, Replica) else Replica(check_base_url(item))
        if replica in replicas:
            raise ConfigError(f"base_url lists {replica.base_url!r} twice", field="base_url")
        replicas.append(with_default_key(replica, api_key))
    return replicas


def with_default_key(replica: Replica, api_key: str | None) -> Replica:
    """``replica`` as it is if it has a key of its own, else with ``api_key``."""
    if replica.api_key is None and api_key is not None:
        return Replica(
            replica.base_url,
            api_key=api_key,
            max_num_seqs=replica.max_num_seqs,
            max_num_batched_tokens=replica.max_num_batched_tokens,
            prefill_seconds_per_token=replica.prefill_seconds_per_token,
        )
    return replica


def env(*names: str) -> str | None:
    """The first of these environment variables that is set and not empty."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def check_base_url(url: object) -> str:
    """``url`` without its trailing slash; a :class:`ConfigError` unless http(s)."""
    if not isinstance(url, str):
        raise ConfigTypeError(
            f"base_url must be a str like {DEFAULT_BASE_URL!r}, got {type(url).__name__}",
            field="base_url",
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"base_url must be an http(s) URL like {DEFAULT_BASE_URL!r}, got {url!r}",
            field="base_url",
        )
    return url.rstrip("/")


def check_api_key(key: object) -> str | None:
    """``key`` if it can go in a header; a :class:`ConfigError` (never quoting it)."""
    # A key read from a file often keeps its newline. Sent as a header it would fail
    # in the HTTP library, whose error message (and our retry log) quotes the header,
    # key included; refuse it here, without echoing it.
    if key is None:
        return None
    if not (isinstance(key, str) and key.isascii() and key.isprintable()) or any(
        c.isspace() for c in key
    ):
        raise ConfigError(
            "api_key must be a str of printable ASCII without spaces or newlines "
            "(read from a file? strip it); the key itself is not shown",
            field="api_key",
        )
    return key


def _positive(name: str, value: object) -> int | None:
    """``value`` if it is None or a positive int; else a typed error naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(
            f"{name} must be a positive int, got {type(value).__name__}", field=name
        )
    if value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value}", field=name)
    return value
