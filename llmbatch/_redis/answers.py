"""The response cache kept in Redis: one store for processes on several machines (a
Ray job's actors), where a file cannot be shared.

Each answer is a string under ``llmbatch:cache:<key in hex>``, set to expire
``max_age`` after it was written (30 days by default): Redis's own ``maxmemory``
policy bounds its size. Lookups are ``MGET`` of a chunk of keys on the caller's
thread, with a timeout of a second; writes are pipelined by the writer thread.
Hits are counted in ``llmbatch:cache:hits:<namespace>``. Redis that cannot be
reached at opening fails the opening; one that fails later makes lookups misses and
writes lost (counted and warned about), never a failed request.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from llmbatch._cache.writer import Batch, QueuedStore
from llmbatch._config import redact_url
from llmbatch._exceptions import ConfigError
from llmbatch._redis.link import SOCKET_TIMEOUT, require_redis

__all__ = ["DEFAULT_MAX_AGE", "PREFIX", "RedisAnswers"]

PREFIX = "llmbatch:cache:"
#: How long an entry is kept where ``Cache(max_age=)`` does not say: 30 days.
DEFAULT_MAX_AGE = 30 * 86400.0
#: Keys per ``MGET``.
_CHUNK = 500


class RedisAnswers(QueuedStore):
    """The answers in one Redis database."""

    def __init__(self, url: str, *, max_age: float | None = None) -> None:
        super().__init__()
        self._redis = require_redis()
        self._url = url
        self.location = redact_url(url)
        self.where = f"the cache at {self.location}"
        self.max_age = DEFAULT_MAX_AGE if max_age is None else max_age
        self.read_errors = 0
        """Lookups Redis failed (answered as misses)."""
        self._errors: tuple[type[BaseException], ...] = (self._redis.RedisError, OSError)
        self._reader = self._connect()
        try:
            self._reader.ping()
        except self._errors as exc:
            self._reader.close()
            raise ConfigError(
                f"the cache at {self.location} cannot be reached ({type(exc).__name__}: {exc})",
                field="cache",
            ) from None

    def _connect(self) -> Any:
        return self._redis.Redis.from_url(
            self._url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )

    def _read(self, keys: Sequence[bytes], found: dict[bytes, str]) -> None:
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            try:
                values = self._reader.mget([PREFIX + key.hex() for key in chunk])
            except self._errors as exc:
                self._read_failed(exc)
                return
            for key, value in zip(chunk, values, strict=True):
                if value is not None and key not in found:
                    found[key] = value.decode()

    def _read_failed(self, error: BaseException) -> None:
        self.read_errors += 1
        if self.read_errors == 1:
            warnings.warn(
                f"llmbatch: {self.where} could not be read ({type(error).__name__}: {error}); "
                "its lookups are misses until it answers again",
                RuntimeWarning,
                stacklevel=4,
            )

    def _open_writer(self) -> Any:
        return self._connect()

    def _commit(self, connection: Any, batch: Batch) -> None:
        pipeline = connection.pipeline(transaction=False)
        expire = max(1, round(self.max_age))
        for key, _namespace, _written, _prompt, _completion, value in batch.puts:
            pipeline.set(PREFIX + key.hex(), value, ex=expire)
        for key in batch.forgets:
            pipeline.delete(PREFIX + key.hex())
        for namespace, hits in batch.hits.items():
            pipeline.incrby(f"{PREFIX}hits:{namespace}", hits)
        pipeline.execute()

    def _close_writer(self, connection: Any) -> None:
        connection.close()

    def _close_reader(self) -> None:
        self._reader.close()
