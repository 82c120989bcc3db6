"""``client.endpoints``: the replicas a client sends to, added and removed while it
runs (``llmbatch.Endpoints``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from llmbatch._replicas import Replica, with_default_key

__all__ = ["Endpoints"]


class Endpoints:
    """A client's replicas: iterate for the current ones (:class:`Replica`), ``add``
    and ``remove`` them while the client is open.

    Adding reads the replica's model list; it takes work as soon as it answers (or,
    if it does not answer yet, once a health probe finds it up). Removing sends it
    nothing more; requests in flight there finish there.
    """

    def __init__(
        self,
        *,
        current: Callable[[], list[Replica]],
        add: Callable[[Replica], Awaitable[None]],
        remove: Callable[[Replica], None],
        api_key: str | None,
    ) -> None:
        self._current = current
        self._add = add
        self._remove = remove
        self._api_key = api_key

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return f"<llmbatch.Endpoints {list(self)!r}>"

    async def add(self, replica: str | Replica, *, api_key: str | None = None) -> Replica:
        """Send to another replica (a URL or a :class:`Replica`); returns it.

        ``api_key`` (or the replica's own) defaults to the client's. Raises
        :class:`ConfigError` if it is already one, and what opening would raise for
        what no retry fixes (a refused key, a URL missing ``/v1``, a model it does
        not serve).
        """
        if not isinstance(replica, Replica) or api_key is not None:
            url = replica.base_url if isinstance(replica, Replica) else replica
            replica = Replica(url, api_key=api_key)
        replica = with_default_key(replica, self._api_key)
        await self._add(replica)
        return replica

    async def remove(self, replica: str | Replica) -> None:
        """Send nothing more to ``replica`` (its URL, or the :class:`Replica`).

        Its in-flight requests finish there. Raises :class:`ConfigError` for a
        replica the client does not have, or for its last one.
        """
        self._remove(replica if isinstance(replica, Replica) else Replica(replica))
