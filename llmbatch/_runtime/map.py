"""``map``/``map_unordered``/``imap``: many inputs through the client with bounded memory.

Inputs are pulled lazily, at most ``window`` ahead of the results the caller has
taken, so a generator of millions of prompts runs in constant memory. Each item
ends in its own :class:`Result`; one item's failure never touches another. In
ordered mode (``imap``) a result counts as taken only once it has been yielded in
input order, so finished results waiting behind a slow one hold window places and
the feeder stalls when ``window`` items are ahead.

Per-item client CPU is what bounds bulk throughput on a small machine, so an item
costs no task, no timer and no event: the feeder submits it with a completion
callback, refills in chunks (one wake-up per chunk, not per item), and a deadline is
kept by the scheduler like any other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any

import anyio
from anyio.abc import TaskGroup

from llmbatch._calls.request import Request
from llmbatch._calls.spec import CallSpec, Kind, SpecCache
from llmbatch._config import Priority
from llmbatch._exceptions import (
    InvalidRequestError,
    InvalidTypeError,
    LLMBatchError,
    RequestCancelled,
)
from llmbatch._models import Result, make_result
from llmbatch._progress import PROGRESS_INTERVAL, ProgressTracker
from llmbatch._runtime.submitter import Submitter
from llmbatch._spending.ledger import SpendingLedger

__all__ = ["MapInput", "MapRunner", "check_map_options", "kinds_of", "map_spec"]

MapInput = str | list[Mapping[str, Any]] | Mapping[str, Any]
"""A prompt, a chat conversation, or a dict with ``prompt``, ``messages`` or (for an
embedding) ``input``, per-item options (``max_tokens``, sampling parameters,
``priority``, ``timeout``, ``model``) and ``metadata``."""

_Item = tuple[int, Result[Any]]
#: An item ready to send: its index, options, prompt (or conversation, or input) and
#: metadata.
_Prepared = tuple[int, CallSpec, object, object]
#: Items looked up in the response cache per query.
_LOOKUP_CHUNK = 256
#: The feeder refills once this share of the window is free (but at least one place).
_REFILL_FRACTION = 8
_MAX_REFILL = 256


def check_inputs(inputs: object, window: object) -> None:
    """Refuse what cannot be mapped, at the call site."""
    if isinstance(inputs, (str, bytes, Mapping)):
        raise InvalidTypeError(
            "map() takes an iterable of inputs, not a single str or dict", field="inputs"
        )
    if not isinstance(inputs, (Iterable, AsyncIterable)):
        raise InvalidTypeError(
            f"map() takes an iterable of inputs, got {type(inputs).__name__}", field="inputs"
        )
    if isinstance(window, bool) or not isinstance(window, int):
        raise InvalidTypeError("window must be a positive int", field="window")
    if window < 1:
        raise InvalidRequestError("window must be a positive int", field="window")


class _Run:
    """One map call: the window, the items in flight and the results not yet taken."""

    def __init__(
        self,
        window: int,
        tracker: ProgressTracker | None,
        *,
        collect: bool,
        structured: Callable[[_Run, Request], Result[Any] | None],
    ) -> None:
        self.free = window
        self.refill = max(1, min(_MAX_REFILL, window // _REFILL_FRACTION))
        self.tracker = tracker
        self.outstanding: set[Request] = set()
        self.feeding = True
        self.closed = False
        """The caller left: the feeder must submit nothing more, even if it was
        already woken (a cancellation reaches it only at its next checkpoint)."""
        self.failure: BaseException | None = None
        # map(): results land in ``collected`` by index and free their place at once;
        # otherwise they queue in ``ready`` and free it when the caller takes them.
        self.collect = collect
        self.collected: list[Result[Any] | None] = []
        self.pending = 0
        """Items submitted whose result is not yet in (map() mode)."""
        self.ready: deque[_Item] = deque()
        self.specs: dict[Kind, CallSpec] = {}
        """The map's own options validated once, per kind of plain input."""
        self.on_done = self.finished  # one bound method for every item
        self.structured = structured
        """Turns a ``response_model`` item's answer into its result, or sends it
        back to be corrected (None)."""
        self.trace_parent: object = None
        """The caller's trace context, for the items' spans (when tracing is on)."""
        self.spending: tuple[SpendingLedger, ...] = ()
        """The map's own spending limit (``max_cost``), if it has one."""
        self.samples: dict[bytes, int] = {}
        """With a response cache: how often each sampled request came so far (its next
        sample index)."""
        self._room = anyio.Event()
        self._feeder_waiting = False
        self._news = anyio.Event()
        self._consumer_waiting = False

    # -- the feeder's side -----------------------------------------------------------

    async def wait_for_room(self) -> None:
        while self.free < self.refill:
            self._feeder_waiting = True
            self._room = anyio.Event()
            await self._room.wait()

    def release(self, places: int = 1) -> None:
        """Places came free (results were taken)."""
        self.free += places
        if self._feeder_waiting and self.free >= self.refill:
            self._feeder_waiting = False
            self._room.set()

    def done_feeding(self) -> None:
        self.feeding = False
        self._notify()

    # -- results ---------------------------------------------------------------------

    def emit(self, index: int, result: Result[Any]) -> None:
        if self.tracker is not None:
            self.tracker.finished(result)
        if self.collect:
            self.collected[index] = result
            self.pending -= 1
            self.release()
            if not self.pending:
                self._notify()
        else:
            self.ready.append((index, result))
            self._notify()

    def finished(self, request: Request) -> None:
        """A submitted item's outcome is in (called by the request itself)."""
        self.outstanding.discard(request)
        index = request.index
        if request.spec.response_model is not None and request.error is None:
            result = self.structured(self, request)
            if result is not None:  # else it went back to be corrected
                self.emit(index, result)
            return
        self.emit(index, make_result(index, request.value, request.error, request.metadata))

    def _notify(self) -> None:
        if self._consumer_waiting:
            self._consumer_waiting = False
            self._news.set()

    async def wait_for_news(self) -> None:
        self._consumer_waiting = True
        self._news = anyio.Event()
        await self._news.wait()

    @property
    def over(self) -> bool:
        """Every input was pulled and every result is in."""
        if self.feeding:
            return False
        return not self.pending if self.collect else not self.outstanding and not self.ready


class MapRunner:
    """Feeds inputs into the engine from the client's task group; the caller only
    reads results."""

    def __init__(self, submitter: Submitter, task_group: TaskGroup) -> None:
        self._submitter = submitter
        self._tg = task_group

    def _run(
        self,
        window: int,
        tracker: ProgressTracker | None,
        spending: tuple[SpendingLedger, ...],
        *,
        collect: bool,
    ) -> _Run:
        run = _Run(window, tracker, collect=collect, structured=self._structured)
        run.spending = spending
        observers = self._submitter.observers
        if observers.on:
            run.trace_parent = observers.capture()
        return run

    def _structured(self, run: _Run, request: Request) -> Result[Any] | None:
        """A ``response_model`` item's result: its validated object, or its error;
        None when its answer went back to be corrected (batched like any item)."""
        submitter = self._submitter
        answer = request.value
        verdict = submitter.check(request, answer)
        index, metadata = request.index, request.metadata
        if verdict.ok:
            return Result(index=index, value=verdict.parsed, metadata=metadata, response=answer)
        if verdict.error is not None or run.closed:
            error = verdict.error or RequestCancelled("the map was left", request_id=request.id)
            return Result(index=index, error=error, metadata=metadata, response=answer)
        assert verdict.reask is not None
        try:
            follow = submitter.follow_up(request, verdict.reask)
        except LLMBatchError as exc:
            return Result(index=index, error=exc, metadata=metadata, response=answer)
        run.outstanding.add(follow)
        follow.on_done(run.on_done)
        submitter.enter(follow)
        return None

    async def collect(
        self,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        window: int,
        params: Mapping[str, Any],
        tracker: ProgressTracker | None,
        spending: tuple[SpendingLedger, ...] = (),
    ) -> list[Result[Any]]:
        """Every input's result, in input order (``map``)."""
        run = self._run(window, tracker, spending, collect=True)
        scope = anyio.CancelScope()
        self._tg.start_soon(self._feed, scope, run, inputs, priority, params)
        try:
            if tracker is not None:
                tracker.start()
            while not run.over:
                if tracker is None:
                    await run.wait_for_news()
                    continue
                with anyio.move_on_after(PROGRESS_INTERVAL):
                    await run.wait_for_news()
                tracker.maybe_emit()
        finally:
            run.closed = True
            scope.cancel()
            self._abandon(run)
            if tracker is not None:
                tracker.close(stopped=not run.over)
        if run.failure is not None:
            raise run.failure
        # Every place is filled once the run is over.
        return run.collected  # type: ignore[return-value]

    async def iterate(
        self,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        window: int,
        params: Mapping[str, Any],
        *,
        ordered: bool,
        tracker: ProgressTracker | None,
        spending: tuple[SpendingLedger, ...] = (),
    ) -> AsyncGenerator[_Item, None]:
        """Yield ``(index, result)`` as items finish, or in input order if ``ordered``."""
        run = self._run(window, tracker, spending, collect=False)
        # The feeder lives in the client's task group, not in this generator, so no
        # task group ever spans a yield; leaving the loop early cancels the feeder.
        scope = anyio.CancelScope()
        self._tg.start_soon(self._feed, scope, run, inputs, priority, params)
        # Ordered mode: finished items waiting for an earlier one, by index.
        buffered: dict[int, Result[Any]] = {}
        expected = 0
        ready = run.ready
        try:
            if tracker is not None:
                tracker.start()
            while True:
                if not ready:
                    if run.over:
                        break
                    await run.wait_for_news()
                    if tracker is not None:
                        tracker.maybe_emit()
                    continue
                # Drain without a checkpoint per result: yielding to the caller is a
                # plain generator switch, not an event-loop iteration.
                index, result = ready.popleft()
                if not ordered:
                    run.release()
                    yield index, result
                    continue
                # A place frees only when its item is yielded, so items submitted plus
                # items buffered here never exceed the window.
                buffered[index] = result
                while expected in buffered:
                    run.release()
                    yield expected, buffered.pop(expected)
                    expected += 1
        finally:
            run.closed = True
            scope.cancel()
            self._abandon(run)
            if tracker is not None:
                left_behind = (*ready, *buffered.items())
                for _index, left in left_behind:
                    tracker.undelivered(left)
                tracker.close(stopped=not run.over or bool(left_behind))
        if run.failure is not None:
            raise run.failure

    def _abandon(self, run: _Run) -> None:
        submitter = self._submitter
        for request in list(run.outstanding):
            submitter.abandon(request)

    async def _feed(
        self,
        scope: anyio.CancelScope,
        run: _Run,
        inputs: Iterable[Any] | AsyncIterable[Any],
        priority: Priority,
        params: Mapping[str, Any],
    ) -> None:
        with scope:
            try:
                if isinstance(inputs, AsyncIterable):
                    index = 0
                    async for item in inputs:
                        if run.free <= 0:
                            await run.wait_for_room()
                        if run.closed:
                            return
                        self._start(run, index, item, priority, params)
                        index += 1
                else:
                    await self._feed_sync(run, iter(inputs), priority, params)
            except Exception as exc:  # the caller's iterable failed: report it at the end
                run.failure = exc
            finally:
                run.done_feeding()

    async def _feed_sync(
        self, run: _Run, iterator: Iterator[Any], priority: Priority, params: Mapping[str, Any]
    ) -> None:
        if self._submitter.cache is not None:
            await self._feed_chunks(run, iterator, priority, params)
            return
        index = 0
        start = self._start
        while True:
            if run.free <= 0:
                await run.wait_for_room()
            if run.closed:
                return
            # No checkpoint per item: a chunk of items is queued in one go and the
            # scheduler sees them together.
            for item in iterator:
                start(run, index, item, priority, params)
                index += 1
                if run.free <= 0:
                    break
            else:
                return

    async def _feed_chunks(
        self, run: _Run, iterator: Iterator[Any], priority: Priority, params: Mapping[str, Any]
    ) -> None:
        """The feeder with a response cache: items are looked up a chunk at a time."""
        index = 0
        prepare = self._prepare
        while True:
            if run.free <= 0:
                await run.wait_for_room()
            if run.closed:
                return
            chunk: list[_Prepared] = []
            exhausted = True
            for item in iterator:
                prepared = prepare(run, index, item, priority, params)
                index += 1
                if prepared is not None:
                    chunk.append(prepared)
                if run.free <= 0 or len(chunk) >= _LOOKUP_CHUNK:
                    exhausted = False
                    break
            if chunk:
                self._start_cached(run, chunk)
            if exhausted:
                return

    def _start(
        self, run: _Run, index: int, item: object, priority: Priority, params: Mapping[str, Any]
    ) -> None:
        prepared = self._prepare(run, index, item, priority, params)
        if prepared is not None:
            if self._submitter.cache is None:
                self._send(run, *prepared)
            else:
                self._start_cached(run, [prepared])

    def _prepare(
        self, run: _Run, index: int, item: object, priority: Priority, params: Mapping[str, Any]
    ) -> _Prepared | None:
        """An item's options checked and its place taken: what :meth:`_send` needs, or
        None when the item failed (its result is in)."""
        metadata: object = None
        error: LLMBatchError | None = None
        # Plain prompts and conversations take the fast path: no dict to parse.
        options: dict[str, Any] | None = None
        if isinstance(item, str):
            kind: Kind = "completion"
            payload: object = item
        elif isinstance(item, list):
            kind, payload = "chat", item
        else:
            try:
                kind, payload, options, metadata = _parse_item(item)
            except LLMBatchError as exc:
                error = exc
        spec: CallSpec | None = None
        if error is None:
            try:
                spec = self._spec(run, kind, priority, params)
            except LLMBatchError as exc:
                if not run.specs:
                    # The map's own options suit no item seen so far, so nothing has
                    # been sent: the whole call fails, rather than every item alone.
                    raise
                error = exc  # wrong only for this kind of item, in a mixed map
        run.free -= 1
        if run.collect:
            run.collected.append(None)
            run.pending += 1
        if run.tracker is not None:
            run.tracker.submitted()
        try:
            if error is not None:
                raise error
            assert spec is not None
            if options:
                spec = map_spec(
                    self._submitter.specs,
                    kind,
                    options.pop("priority", priority),
                    {**params, **options},
                )
        except LLMBatchError as exc:
            run.emit(index, make_result(index, None, exc, metadata))
            return None
        return index, spec, payload, metadata

    def _send(
        self,
        run: _Run,
        index: int,
        spec: CallSpec,
        payload: object,
        metadata: object,
        key: bytes | None = None,
    ) -> None:
        submitter = self._submitter
        try:
            request = submitter.request(
                spec, payload, run.trace_parent, run.spending, key=key, look_up=False
            )
        except LLMBatchError as exc:
            run.emit(index, make_result(index, None, exc, metadata))
            return
        request.index = index
        request.metadata = metadata
        run.outstanding.add(request)
        request.on_done(run.on_done)
        try:
            submitter.enter(request)
        except LLMBatchError as exc:  # pragma: no cover - submit only raises with nowait
            request.set_error(exc)

    def _start_cached(self, run: _Run, items: Sequence[_Prepared]) -> None:
        """Look a chunk of items up in the response cache in one query: hits are
        answered at once (before anything is sent), the rest sent with their keys.
        An item that is a sample (``temperature`` above 0 or unset, no ``seed``)
        is keyed by how many times its request came before it in this map."""
        submitter = self._submitter
        cache = submitter.cache
        assert cache is not None
        keys: list[bytes | None] = []
        wanted: list[bytes] = []
        samples = run.samples
        for _index, spec, payload, _metadata in items:
            key = None
            if spec.cache != "off":
                maker = cache.maker(spec)
                key = maker.key(payload)
                if key is not None and not maker.deterministic:
                    sample = samples.get(key, 0)
                    samples[key] = sample + 1
                    if sample:
                        key = maker.key(payload, sample)
                if key is not None and spec.cache == "use":
                    wanted.append(key)
            keys.append(key)
        found = cache.lookup_many(wanted) if wanted else {}
        now = submitter.now()
        hits = cache.hits
        for (index, spec, payload, metadata), key in zip(items, keys, strict=True):
            if key is not None and spec.cache == "use":
                data = found.get(key)
                answer = None if data is None else cache.answer(spec, key, data, now)
                if isinstance(answer, LLMBatchError):  # a failure kept for it
                    run.emit(index, make_result(index, None, answer, metadata))
                    continue
                if answer is not None:
                    if spec.response_model is not None:
                        result: Result[Any] = Result(
                            index=index, value=answer.parsed, metadata=metadata, response=answer
                        )
                    else:
                        result = make_result(index, answer, None, metadata)
                    run.emit(index, result)
                    continue
                cache.misses += 1
            self._send(run, index, spec, payload, metadata, key)
        cache.report_hits(cache.hits - hits)

    def _spec(
        self, run: _Run, kind: Kind, priority: Priority, params: Mapping[str, Any]
    ) -> CallSpec:
        """The map's shared spec for this kind of item (validated once per map)."""
        spec = run.specs.get(kind)
        if spec is None:
            spec = run.specs[kind] = map_spec(self._submitter.specs, kind, priority, params)
        return spec


def map_spec(specs: SpecCache, kind: Kind, priority: object, params: Mapping[str, Any]) -> CallSpec:
    """The spec for a map's options (or one dict item's, merged over them), in the
    tier ``priority``. Raises if they are invalid."""
    return specs.get(kind, "map", "batch", {**params, "priority": priority})


def check_map_options(
    specs: SpecCache,
    priority: object,
    params: Mapping[str, Any],
    kinds: Sequence[Kind],
) -> None:
    """Raise, at the call, what is wrong with a map's own options for every kind of
    item it may hold (a misspelt keyword, a bad ``max_tokens``): such a mistake would
    otherwise fail each item alone, a million failures for one typo. Options that
    suit some kind pass here; the feeder raises if they do not suit the first item."""
    first: LLMBatchError | None = None
    for kind in kinds:
        try:
            map_spec(specs, kind, priority, params)
        except LLMBatchError as exc:
            first = first or exc
        else:
            return
    assert first is not None
    raise first


def kinds_of(inputs: object) -> tuple[Kind, ...]:
    """Every kind of item a map may hold, the first item's kind first when it can be
    seen without pulling from ``inputs`` (its errors are the ones to report)."""
    first: Kind | None = None
    if isinstance(inputs, Sequence) and not isinstance(inputs, str) and inputs:
        item = inputs[0]
        if isinstance(item, str):
            first = "completion"
        elif isinstance(item, list):
            first = "chat"
        elif isinstance(item, Mapping):
            first = next((kind for key, kind in _KINDS.items() if key in item), None)
    kinds: tuple[Kind, ...] = tuple(_KINDS.values())
    return kinds if first is None else (first, *(k for k in kinds if k != first))


_KINDS: dict[str, Kind] = {"prompt": "completion", "messages": "chat", "input": "embedding"}


def _parse_item(item: object) -> tuple[Kind, object, dict[str, Any], object]:
    """(kind, prompt or messages, per-item options, metadata) for a dict input."""
    if isinstance(item, Mapping):
        options = dict(item)
        metadata = options.pop("metadata", None)
        found = [key for key in ("prompt", "messages", "input") if key in options]
        if len(found) == 1:
            kind: Kind = _KINDS[found[0]]
            return kind, options.pop(found[0]), options, metadata
        raise InvalidRequestError(
            "a map item dict needs exactly one of 'prompt', 'messages' or 'input'",
            field="inputs",
        )
    raise InvalidTypeError(
        f"a map item must be a str, a list of messages or a dict, got {type(item).__name__}",
        field="inputs",
    )
