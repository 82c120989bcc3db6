"""A request inside the client: its input, its place, and its outcome.

A :class:`Request` joins what many requests share (a :class:`CallSpec`: endpoint
kind, tier, model, sampling parameters, timeout; ``_callspec``) to one prompt or
conversation, its token estimate, its place in the scheduler and the slot its
single outcome lands in. It is slotted and built without ``dataclass`` machinery:
a bulk map makes tens of thousands a second.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from llmbatch._calls.spec import CallSpec, Kind
from llmbatch._exceptions import LLMBatchError
from llmbatch._spending.ledger import SpendingLedger

__all__ = ["CallSpec", "Flight", "Kind", "Request", "Sharing", "State"]

_ids = itertools.count(1)


class State:
    """Where a request is; the scheduler moves it along (ints: compared on hot paths)."""

    NEW = 0
    WAITING = 1
    """Waiting for room in its tier's queue (``Limits.max_queued``)."""
    QUEUED = 2
    IN_FLIGHT = 3
    FINISHED = 4
    """Left the scheduler: answered, or removed because its caller went away."""
    HELD = 5
    """Held back by its tenant's limits (``TenantLimits``), before its tier's queue."""
    SPENDING = 6
    """Held until its spending limits (``max_cost``) have room for what it may cost."""


class Request:
    """One prompt or conversation in the client, compared by identity.

    Its outcome is set once (``set_value``/``set_error``, the first wins); a caller
    awaits what :meth:`waiter` returns, and ``map`` registers a callback instead,
    which spares it a task and an event per item.
    """

    __slots__ = (
        "_callback",
        "_waiter",
        "abandoned",
        "attempts",
        "cache_key",
        "caller_left",
        "chunks",
        "created_at",
        "deadline",
        "deltas",
        "dispatched_at",
        "done",
        "enqueued_at",
        "error",
        "est_cost",
        "est_tokens",
        "flight",
        "followers",
        "group_key",
        "index",
        "kept",
        "messages",
        "metadata",
        "might_not_fit",
        "owner",
        "prefix",
        "prior_attempts",
        "priority",
        "prompt",
        "quota",
        "reasks",
        "replica",
        "reserved",
        "retried",
        "seq",
        "sharing",
        "spec",
        "spending",
        "state",
        "stored_as",
        "value",
    )

    @property
    def prefill_tokens(self) -> int:
        """Estimated prompt tokens the server prefills for it (all ``n`` sequences)."""
        spec = self.spec
        return max(1, self.est_tokens - spec.max_tokens * spec.n)

    def __init__(
        self,
        spec: CallSpec,
        prompt: str | None,
        messages: tuple[Mapping[str, Any], ...] | None,
        est_tokens: int,
        created_at: float,
    ) -> None:
        self.spec = spec
        self.priority = spec.priority
        self.group_key = spec.compat_key + spec.tenant_suffix
        """Which queue group it joins: its spec's compatibility key and tenant, or a key
        of its own when it must travel alone (a prompt that may be too long for the
        server). It always ends with the tenant's suffix (see :attr:`family_key`)."""
        self.prompt = prompt
        self.messages = messages
        self.est_tokens = est_tokens
        """Estimated prompt tokens + ``max_tokens`` (times ``n``): the in-flight budget."""
        self.created_at = created_at
        timeout = spec.timeout
        self.deadline = None if timeout is None else created_at + timeout
        self.enqueued_at = created_at
        """When it entered its tier's queue (the batch wait timer starts here)."""
        self.seq = next(_ids)
        self.state = State.NEW
        self.done = False
        self.value: Any = None
        self.error: LLMBatchError | None = None
        self._waiter: asyncio.Future[None] | anyio.Event | None = None
        self._callback: Callable[[Request], None] | None = None
        self.deltas: MemoryObjectSendStream[Any] | None = None
        """A stream's caller: where its text deltas (or chunks) go as they arrive."""
        self.chunks = False
        """The stream's caller reads chunk objects, every event's; else text deltas."""
        self.attempts = 0
        self.retried = False
        """Needed a second HTTP attempt (bisection halves do not count)."""
        self.dispatched_at: float | None = None
        self.abandoned = False
        """The caller stopped waiting (cancelled or deadline); drop its result."""
        self.flight: Flight | None = None
        self.might_not_fit = False
        """Its input has enough bytes that it might exceed the server's context length
        (no tokenizer makes more tokens than bytes): such requests travel alone once
        the server has refused one as too long."""
        self.index = 0
        """A map item's position in the inputs."""
        self.spending: tuple[SpendingLedger, ...] = ()
        """The spending limits it counts against (the client's, its map's)."""
        self.est_cost = 0.0
        """The most it may cost, in dollars (with ``spending``): reserved while it runs."""
        self.reserved = False
        """Its ``est_cost`` is reserved under its spending limits (until it settles)."""
        self.metadata: object = None
        """A map item's metadata, handed back in its Result."""
        self.kept: Any = None
        """What the observers keep for it (a span, say), with the observers that
        started it, while it runs (``_observers.Observers``); None when none."""
        self.replica = 0
        """The server it was last sent to (an index into the scheduler's replicas)."""
        self.prefix: tuple[int, ...] = ()
        """Hashes of its prompt's leading blocks, for prefix affinity (several
        servers only)."""
        self.owner: Any = None
        """Its named tenant's state (a ``tenants.Tenant``) while the scheduler holds it,
        which counts the tenant's queued and in-flight requests; None: no tenant."""
        self.quota: Any = None
        """The tenant whose limits count it (a ``tenants.Tenant``), while it is queued
        or in flight under them."""
        self.reasks = 0
        """How many answers of its call went back to be corrected before it (a
        ``response_model`` call's re-ask is a request of its own)."""
        self.prior_attempts = 0
        """HTTP attempts of its call's earlier requests (the asks its re-ask follows)."""
        self.cache_key: bytes | None = None
        """Its key in the client's response cache, while identical requests may share
        its exchange (None: not shared)."""
        self.stored_as: bytes | None = None
        """The key its call's answer is stored under (a re-ask's: its first ask's)."""
        self.sharing: Sharing | None = None
        """Told when it settles, for the identical requests waiting on it."""
        self.followers: list[Request] | None = None
        """Identical requests that wait for its answer rather than send their own."""
        self.caller_left = False
        """Its own caller went away while followers still wait for its answer."""

    def travel_alone(self) -> None:
        """Join a queue group of its own, so it is sent in a batch of one."""
        spec = self.spec
        self.group_key = f"{spec.compat_key}\x00alone\x00{self.seq}{spec.tenant_suffix}"

    def join_prefix_group(self, group: int) -> None:
        """Batch with the requests that share its hot prefix ``group``."""
        spec = self.spec
        self.group_key = f"{spec.compat_key}\x00prefix\x00{group}{spec.tenant_suffix}"

    @property
    def family_key(self) -> str:
        """Its group's key without the tenant: requests whose only difference is
        their tenant may share a batch."""
        key, suffix = self.group_key, self.spec.tenant_suffix
        return key[: len(key) - len(suffix)] if suffix else key

    @property
    def id(self) -> str:
        """The request id that errors carry (``req-17``)."""
        return f"req-{self.seq}"

    # What an observer reads of it (``llmbatch.ObservedRequest``), from its spec.

    @property
    def kind(self) -> Kind:
        return self.spec.kind

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def tenant(self) -> str | None:
        return self.spec.tenant

    @property
    def max_tokens(self) -> int:
        return self.spec.max_tokens

    @property
    def stream(self) -> bool:
        return self.spec.stream

    def __repr__(self) -> str:
        return f"<Request {self.id} {self.priority.value} state={self.state}>"

    # -- the outcome -----------------------------------------------------------------

    def set_value(self, value: object) -> bool:
        """Settle with a value; False (and nothing changes) if already settled."""
        if self.done:
            return False
        self.value = value
        self._finish()
        return True

    def set_error(self, error: LLMBatchError) -> bool:
        """Settle with an error; False (and nothing changes) if already settled."""
        if self.done:
            return False
        self.error = error
        self._finish()
        return True

    def on_done(self, callback: Callable[[Request], None]) -> None:
        """Call ``callback(self)`` once settled (at once if it is)."""
        if self.done:
            callback(self)
        else:
            self._callback = callback

    def _finish(self) -> None:
        self.done = True
        if self.deltas is not None:
            self.deltas.close()  # a streaming caller stops reading at once
        waiter = self._waiter
        if waiter is not None:
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():  # cancelled with its caller
                    waiter.set_result(None)
            else:
                waiter.set()
        callback = self._callback
        if callback is not None:
            self._callback = None
            callback(self)
        sharing = self.sharing
        if sharing is not None:
            sharing.settled(self)

    def waiter(self, loop: asyncio.AbstractEventLoop | None) -> Awaitable[None] | None:
        """What to await until settled (None: it is). ``loop``: the running asyncio
        loop, whose bare future is the cheapest waiter there; None (trio) uses an
        anyio event. The caller awaits it in its own frame: a gather of 100,000 calls
        holds a frame for each coroutine a call waits in."""
        if self.done:
            return None
        if loop is not None:
            future: asyncio.Future[None] = loop.create_future()
            self._waiter = future
            return future
        event = anyio.Event()
        self._waiter = event
        return event.wait()


class Sharing(Protocol):
    """What shares a request's outcome with identical ones (the response cache)."""

    def settled(self, request: Request) -> None:
        """``request`` has its outcome."""
        ...


class Flight:
    """The requests sharing one HTTP exchange, the scope that can cancel it, and those
    of them the dispatcher hands back to the queue (their server went down)."""

    __slots__ = ("handed_back", "requests", "scope")

    def __init__(self, requests: Sequence[Request], scope: anyio.CancelScope) -> None:
        self.requests = requests
        self.scope = scope
        self.handed_back: list[Request] = []

    def cancel_if_abandoned(self) -> None:
        """Stop the HTTP exchange once every caller it serves has gone away."""
        if all(r.abandoned for r in self.requests):
            self.scope.cancel()
