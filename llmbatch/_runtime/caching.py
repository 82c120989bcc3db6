"""The client's side of the response cache: keys for its requests, hits answered
without the scheduler, answers stored as they come, and identical requests in
flight at once sharing one exchange.

A hit touches nothing else of the client: no queue, no tier or tenant budget, no
rate limit, no spending limit, no latency signal. An identical request that arrives
while the first is in flight (a *follower*) waits for that answer and is charged
nothing; when the first's caller goes away its request keeps going for the
followers, and when every caller waiting on it has gone it is cancelled. A first
ask that fails for a reason of its own (a 400 for this prompt) fails its followers
alike; one that fails for any other reason (a timeout, its caller's cancellation,
an outage) sends each follower on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from llmbatch._cache.codec import (
    KINDS,
    Expired,
    decode,
    encode,
    encode_failure,
    keeps,
    tokens_of,
)
from llmbatch._cache.key import KeyMaker
from llmbatch._cache.store import CacheStore
from llmbatch._cache.writer import QueuedStore
from llmbatch._calls.request import Request
from llmbatch._calls.spec import CallSpec
from llmbatch._clock import Clock
from llmbatch._config import Cache, Price
from llmbatch._exceptions import (
    APIStatusError,
    InvalidRequestError,
    LLMBatchError,
    RequestCancelled,
)
from llmbatch._observers import Observers
from llmbatch._spending.prices import PriceBook
from llmbatch._stats import CacheStats, Cost

__all__ = ["AnswerCache", "open_store"]

#: Key makers kept per client: past this many distinct call options it starts afresh.
_MAKERS_KEPT = 512


def open_store(settings: Cache) -> QueuedStore:
    """The store ``settings`` names: a file, or Redis (blocking: opens it)."""
    url = settings.redis_url
    if url is not None:
        from llmbatch._redis.answers import RedisAnswers

        return RedisAnswers(url, max_age=settings.max_age)
    return CacheStore(settings.location, max_size=settings.max_size, max_age=settings.max_age)


class _Saved:
    """Tokens and dollars the hits saved (a mutable tally behind ``CacheStats.saved``)."""

    __slots__ = ("answers", "completion", "dollars", "prompt", "unpriced")

    def __init__(self) -> None:
        self.answers = self.prompt = self.completion = self.unpriced = 0
        self.dollars = 0.0


class AnswerCache:
    """One client's response cache over one store."""

    def __init__(
        self,
        settings: Cache,
        store: QueuedStore,
        *,
        endpoint: str,
        identity: Callable[[str], object],
        prices: PriceBook | None,
        observers: Observers,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.store = store
        self.namespace = settings.namespace
        self._endpoint = endpoint
        self._identity = identity
        self._prices = prices
        self._observers = observers
        self.now = clock
        self._makers: dict[CallSpec, KeyMaker] = {}
        self._flying: dict[bytes, Request] = {}
        """The request in flight for each key that identical ones may follow."""
        self.resubmit: Callable[[Request], None] = _unset
        """Sends a follower on its own (set by the submitter)."""
        self.hits = self.misses = self.shared = self.stored = self.unreadable = 0
        self._saved = _Saved()
        self._price_of: dict[str, Price | None] = {}
        """Each model's price, looked up once (a hit counts what it saved)."""

    # -- keys -------------------------------------------------------------------------

    def maker(self, spec: CallSpec) -> KeyMaker:
        """The key maker for ``spec``'s options (made once per spec)."""
        maker = self._makers.get(spec)
        if maker is None:
            if len(self._makers) >= _MAKERS_KEPT:
                self._makers.clear()
            model = spec.response_model
            maker = self._makers[spec] = KeyMaker(
                kind=spec.kind,
                model_identity=self._identity(spec.model),
                endpoint=self._endpoint,
                params=spec.params,
                n=spec.n,
                query=spec.query,
                schema=None if model is None else model.schema,
                namespace=self.namespace,
            )
        return maker

    # -- reading ----------------------------------------------------------------------

    def lookup(self, spec: CallSpec, key: bytes, created_at: float) -> Any:
        """The stored answer under ``key`` for a call of ``spec`` (None: a miss)."""
        data = self.store.get(key)
        answer = None if data is None else self.answer(spec, key, data, created_at)
        if answer is None:
            self.misses += 1
        else:
            self.store.count_hits(self.namespace, 1)
        return answer

    def lookup_many(self, keys: Sequence[bytes]) -> dict[bytes, str]:
        """The stored values of ``keys`` that are found (answers decoded by
        :meth:`answer`; the misses counted by the caller)."""
        return self.store.get_many(keys)

    def answer(self, spec: CallSpec, key: bytes, data: str, created_at: float) -> Any:
        """The answer stored as ``data`` for a call of ``spec`` (or the failure kept
        for it, an :class:`LLMBatchError` to raise), counted as a hit (the caller
        reports it to the file: :meth:`report_hits`); None (not counted) when it
        cannot be read back, is a failure past its time, or no longer validates
        against the call's ``response_model``: the entry is dropped and the request
        sent again."""
        try:
            answer = decode(data, created_at, self.now(), time.time)
        except Expired:
            self.store.forget(key)
            return None
        except (ValueError, KeyError, TypeError):
            self.unreadable += 1
            self.store.forget(key)
            return None
        if isinstance(answer, LLMBatchError):  # a failure kept (keep_failures)
            if self.settings.keep_failures is None:
                return None  # another client's choice: this one asks again
            self.hits += 1
            return answer
        if KINDS.get(type(answer)) != spec.kind:
            return None
        model = spec.response_model
        if model is not None:
            try:
                parsed = model.validate_json(answer.text)
            except ValueError:  # pydantic's ValidationError is a ValueError
                return None
            object.__setattr__(answer, "_parsed", parsed)
        self.hits += 1
        self._count_saved(spec, answer)
        return answer

    def report_hits(self, hits: int) -> None:
        """Count ``hits`` in the file's own tally (what ``llmbatch cache show`` says)."""
        self.store.count_hits(self.namespace, hits)

    def _count_saved(self, spec: CallSpec, answer: Any) -> None:
        prompt, completion = tokens_of(answer)
        saved = self._saved
        saved.answers += 1
        saved.prompt += prompt
        saved.completion += completion
        model = spec.model
        if model in self._price_of:
            price = self._price_of[model]
        else:
            price = self._price_of[model] = (
                None if self._prices is None else self._prices.price(model)
            )
        if price is None:
            saved.unpriced += 1
        else:
            saved.dollars += price.cost(prompt, completion)

    # -- writing ----------------------------------------------------------------------

    def keep(self, key: bytes, spec: CallSpec, answer: Any) -> str | None:
        """Store ``answer`` under ``key``; the stored text (None: not storable)."""
        data = encode(answer)
        if data is not None:
            prompt, completion = tokens_of(answer)
            self.store.put(
                key,
                data,
                namespace=self.namespace,
                prompt_tokens=prompt,
                completion_tokens=completion,
            )
            self.stored += 1
        return data

    def keep_failure(self, key: bytes, error: LLMBatchError) -> None:
        """Store ``error`` under ``key`` for ``keep_failures`` seconds, if the cache
        keeps failures and this one is the request's own."""
        ttl = self.settings.keep_failures
        if ttl is None or not keeps(error):
            return
        data = encode_failure(error, time.time() + ttl)
        if data is not None:
            self.store.put(
                key, data, namespace=self.namespace, prompt_tokens=0, completion_tokens=0
            )
            self.stored += 1

    # -- identical requests in flight --------------------------------------------------

    def follow(self, request: Request) -> bool:
        """Let ``request`` wait for an identical one in flight (True), or make it the
        one others may follow (False: the caller sends it)."""
        key = request.cache_key
        assert key is not None
        first = self._flying.get(key)
        if first is None or first.done:
            self._flying[key] = request
            return False
        if first.followers is None:
            first.followers = []
        first.followers.append(request)
        return True

    def settled(self, request: Request) -> None:
        """``request`` (one identical ones may follow) has its outcome: store it, and
        give its followers theirs."""
        key = request.cache_key
        if key is not None and self._flying.get(key) is request:
            del self._flying[key]
        followers = request.followers
        request.followers = None
        if request.error is None:
            stored_as = request.stored_as
            data = None
            value = request.value
            if (
                stored_as is not None
                and request.spec.response_model is None
                and not getattr(value, "from_cache", True)
            ):
                data = self.keep(stored_as, request.spec, value)
            if followers:
                self._answer_followers(request, followers, data)
        else:
            if request.stored_as is not None:
                self.keep_failure(request.stored_as, request.error)
            if followers:
                self._fail_followers(request.error, followers)

    def _answer_followers(self, first: Request, followers: list[Request], data: str | None) -> None:
        if data is None:
            data = encode(first.value)
        now = self.now()
        for follower in followers:
            if follower.done:
                continue
            if data is None:  # not storable, so not copied: each sends its own
                self.resubmit(follower)
                continue
            self.shared += 1
            answer = decode(data, follower.created_at, now)
            self._count_saved(follower.spec, answer)
            self._settle(follower, answer, None)

    def _fail_followers(self, error: LLMBatchError, followers: list[Request]) -> None:
        own = isinstance(error, InvalidRequestError) or (
            isinstance(error, APIStatusError)
            and 400 <= error.status_code < 500
            and error.status_code not in (408, 409, 429)
        )
        for follower in followers:
            if follower.done:
                continue
            if own:
                self._settle(follower, None, error)
            else:
                self.resubmit(follower)

    def _settle(self, request: Request, value: Any, error: LLMBatchError | None) -> None:
        done = request.set_value(value) if error is None else request.set_error(error)
        if done and request.kept is not None:
            self._observers.request_ended(request)

    def leave(self, request: Request) -> Request | None:
        """``request``'s caller went away before its outcome: the request the engine
        must now abandon (None: none; another caller still waits on its exchange)."""
        key = request.cache_key
        first = None if key is None else self._flying.get(key)
        if first is None:
            return request
        if first is request:
            if _waiting(request.followers):
                request.caller_left = True
                return None
            return request
        followers = first.followers or []
        if request in followers:
            followers.remove(request)
        self._settle(request, None, RequestCancelled("the caller went away", request_id=request.id))
        if first.caller_left and not _waiting(first.followers):
            return first
        return None

    # -- stats ------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        saved = self._saved
        return CacheStats(
            location=self.store.location,
            namespace=self.namespace,
            hits=self.hits,
            misses=self.misses,
            shared=self.shared,
            stored=self.stored,
            unreadable=self.unreadable,
            write_errors=self.store.write_errors,
            saved=Cost(
                answers=saved.answers,
                prompt_tokens=saved.prompt,
                completion_tokens=saved.completion,
                dollars=saved.dollars,
                unpriced=saved.unpriced,
            ),
        )


def _waiting(followers: list[Request] | None) -> bool:
    return bool(followers) and any(not f.done for f in followers or ())


def _unset(request: Request) -> None:  # pragma: no cover - the submitter sets it
    raise RuntimeError("AnswerCache.resubmit was not set")
