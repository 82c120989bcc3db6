"""Ray Data integration (``pip install 'llmbatch[ray]'``): callable classes for
``Dataset.map_batches`` that send each row to an LLM server.

::

    import ray
    import llmbatch.ray

    ds = ray.data.from_items([{"prompt": p} for p in prompts])
    ds = ds.map_batches(
        llmbatch.ray.Completions,
        fn_constructor_kwargs={"base_url": "http://127.0.0.1:8000/v1", "max_tokens": 64},
        concurrency=2,
        num_cpus=0.25,
    )

Each actor holds one :class:`~llmbatch.SyncClient`, made on its first batch and
closed when the actor exits. A batch comes back with two more columns:
``completion`` (the text, or None) and ``error`` (the error's message, or None).
One bad row never fails the batch, and rows keep their order. Batches may be a
``dict`` of columns (Ray's default ``batch_format="numpy"``) or a pandas
``DataFrame`` (``batch_format="pandas"``). docs/ray.md has more.

This module needs nothing from Ray itself, so a batch can be tested by calling the
class directly.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch._calls.request import Kind
from llmbatch._calls.spec import SpecCache
from llmbatch._config import Limits, PriorityLike, parse_priority
from llmbatch._exceptions import ConfigError, ConfigTypeError, InvalidTypeError, LLMBatchError
from llmbatch._runtime.map import MapInput, check_map_options
from llmbatch._sync import SyncClient

__all__ = ["Chat", "Completions", "actor_options"]

COMPLETION_COLUMN = "completion"
"""The column a row's answer goes to: its text, or None if the row failed."""
ERROR_COLUMN = "error"
"""The column a row's failure goes to: ``"ErrorClass: message"``, or None."""
PARSED_COLUMN = "parsed"
"""With a ``response_model``: the column a row's validated object goes to, as JSON
text (``Model.model_validate_json`` reads it back), or None if the row failed."""
DEFAULT_NUM_CPUS = 0.25
"""The CPU an actor asks for: it mostly waits on the server (see docs/ray.md)."""
DEFAULT_BATCH_SIZE = 1000
"""Rows per batch that docs/ray.md advises: one ``map`` per batch, big enough that
Ray's per-batch cost is small beside the batch's requests."""
DEFAULT_CALLS_PER_ACTOR = 2
"""Batches one actor answers at once (see :func:`actor_options`)."""


def actor_options(
    actors: int,
    *,
    num_cpus: float = DEFAULT_NUM_CPUS,
    calls_per_actor: int = DEFAULT_CALLS_PER_ACTOR,
) -> dict[str, Any]:
    """``map_batches`` keywords for a pool of ``actors`` llmbatch actors::

        ds.map_batches(llmbatch.ray.Completions, fn_constructor_kwargs={...},
                       batch_size=1000, **llmbatch.ray.actor_options(2))

    Each actor asks for ``num_cpus`` and answers up to ``calls_per_actor`` batches
    at once, on as many threads sharing its one client: a batch ends with a wait
    for its slowest row, and the next batch's requests fill the server meanwhile.
    Needs Ray (imported here, not when this module is).
    """
    if actors < 1 or calls_per_actor < 1:
        raise ConfigError("actors and calls_per_actor must be at least 1")
    data = importlib.import_module("ray.data")
    compute = data.ActorPoolStrategy(
        size=actors,
        max_concurrent_calls_per_actor=calls_per_actor,
        # Without it Ray runs one call of an actor at a time, whatever the above says.
        enable_true_multi_threading=calls_per_actor > 1,
    )
    return {"compute": compute, "num_cpus": num_cpus}


class _Rows:
    """What ``Completions`` and ``Chat`` share: the client's lifetime, one ``map`` per
    batch, and writing the two result columns in the batch's own format."""

    _column: str
    _kinds: tuple[Kind, ...]
    """What rows are sent as: the map options are checked against these up front."""
    _item_key: str
    """A row's input under this key when it goes as a dict item (with its tenant)."""

    def __init__(
        self,
        base_url: str | Sequence[str] | None,
        *,
        column: str,
        api_key: str | None,
        model: str | None,
        priority: PriorityLike,
        limits: Limits | None,
        client_options: Mapping[str, Any] | None,
        params: dict[str, Any],
        tenant_column: str | None = None,
    ) -> None:
        if not isinstance(column, str):
            raise ConfigTypeError("the column name must be a str", field="column")
        if tenant_column is not None and not isinstance(tenant_column, str):
            raise ConfigTypeError(
                "tenant_column must be a column name (a str) or None", field="tenant_column"
            )
        self._column = column
        self._tenant_column = tenant_column
        options: dict[str, Any] = dict(client_options or {})
        if limits is not None:
            options["limits"] = limits
        # Build the client now so a bad option fails in the constructor (Ray reports
        # it as the actor's start-up error), but open it only on the first batch.
        self._client = SyncClient(base_url, api_key=api_key, model=model, **options)
        self._open = False
        self._opening = threading.Lock()
        self._priority = parse_priority(priority)
        # Options wrong for every row (a misspelt keyword, a bad max_tokens) fail
        # here, at the actor's start, not as an error on each row.
        check_map_options(SpecCache("model", None), self._priority, params, self._kinds)
        self._params = params
        atexit.register(_close_at_exit, weakref.ref(self))

    def __call__(self, batch: Any) -> Any:
        """Answer every row of ``batch``; returns the batch with ``completion`` and
        ``error`` columns added (one bad row gets an ``error``, the others still run)."""
        completions: list[str | None] = []
        errors: list[str | None] = []
        parsed: list[str | None] = []
        tenants = None if self._tenant_column is None else _column(batch, self._tenant_column)
        for result, error in self._answer(_column(batch, self._column), tenants):
            completions.append(None if result is None else result.text)
            errors.append(None if error is None else _message(error))
            ok = result is not None and error is None and result.parsed is not None
            parsed.append(json.dumps(result.to_dict()["value"]) if ok else None)
        columns = {COMPLETION_COLUMN: completions, ERROR_COLUMN: errors}
        if self._params.get("response_model") is not None:
            columns[PARSED_COLUMN] = parsed
        return _with_columns(batch, columns)

    def _answer(
        self, values: list[Any], tenants: list[Any] | None = None
    ) -> list[tuple[Any, LLMBatchError | None]]:
        """Each row's ``(result, None)`` or ``(result or None, error)``, in row order: a row
        ``_input`` refuses is not sent, the others go out in one ``map`` (a row with a
        tenant as a dict item naming it; a bad tenant fails that row alone)."""
        answers: list[tuple[Any, LLMBatchError | None]] = []
        inputs: list[MapInput] = []
        sent: list[int] = []
        for row, value in enumerate(values):
            try:
                item = self._input(value)
                tenant = None if tenants is None else _plain(tenants[row])
                if tenant is not None:
                    item = {self._item_key: item, "tenant": tenant}
                inputs.append(item)
            except LLMBatchError as exc:
                answers.append((None, exc))
            else:
                answers.append((None, None))
                sent.append(row)
        if inputs:
            client = self._client_for_call()
            results = client.map(inputs, priority=self._priority, **self._params)
            for row, result in zip(sent, results, strict=True):
                answers[row] = (result, result.error)
        return answers

    def close(self) -> None:
        """Close the client (draining what it still runs). Safe to call twice; the
        actor's exit calls it."""
        if self._open:
            self._open = False
            self._client.close()

    def __del__(self) -> None:
        # Nothing to report to while being collected.
        with contextlib.suppress(Exception):
            self.close()

    def _client_for_call(self) -> SyncClient:
        # Ray may call one actor from several threads at once (calls_per_actor > 1):
        # the first call opens the client, the others wait for it.
        with self._opening:
            if not self._open:
                self._client.open()
                self._open = True
        return self._client

    def _input(self, value: Any) -> MapInput:
        raise NotImplementedError


class Completions(_Rows):
    """Completions for a ``prompt`` column, for ``Dataset.map_batches``.

    ``fn_constructor_kwargs`` are this constructor's arguments: ``base_url`` (one
    server or a list of replicas), ``api_key``, ``model``, ``prompt_column``,
    ``priority``, ``limits`` (this actor's own :class:`~llmbatch.Limits`),
    ``client_options`` (any other :class:`~llmbatch.SyncClient` argument, such as
    ``tenants=``), ``tenant`` (every row's tenant) or ``tenant_column`` (a column
    naming each row's; None in it: the ``tenant``), and sampling parameters such as
    ``max_tokens`` or ``temperature``, passed to every request. A row whose prompt
    is not a string gets an ``error`` and is not sent; options wrong for every row (a
    misspelt keyword) raise here.
    """

    _kinds = ("completion",)
    _item_key = "prompt"

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        *,
        api_key: str | None = None,
        model: str | None = None,
        prompt_column: str = "prompt",
        priority: PriorityLike = "batch",
        limits: Limits | None = None,
        client_options: Mapping[str, Any] | None = None,
        tenant_column: str | None = None,
        **params: Any,
    ) -> None:
        super().__init__(
            base_url,
            column=prompt_column,
            api_key=api_key,
            model=model,
            priority=priority,
            limits=limits,
            client_options=client_options,
            params=params,
            tenant_column=tenant_column,
        )

    def _input(self, value: Any) -> MapInput:
        # numpy's str_ is a str, so a numpy batch's prompts pass as they are.
        if not isinstance(value, str):
            raise InvalidTypeError(
                f"prompt must be a str, got {type(value).__name__}", field="prompt"
            )
        return str(value)


class Chat(_Rows):
    """Chat completions for a ``messages`` column, for ``Dataset.map_batches``.

    Takes :class:`Completions`' arguments, with ``messages_column`` in place of
    ``prompt_column``. A row's messages are a list of ``{"role", "content"}``
    mappings; Ray may hand them over as a numpy array of dicts, with None for the
    keys only some messages have, and both are accepted.
    """

    _kinds = ("chat",)
    _item_key = "messages"

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        *,
        api_key: str | None = None,
        model: str | None = None,
        messages_column: str = "messages",
        priority: PriorityLike = "batch",
        limits: Limits | None = None,
        client_options: Mapping[str, Any] | None = None,
        tenant_column: str | None = None,
        **params: Any,
    ) -> None:
        super().__init__(
            base_url,
            column=messages_column,
            api_key=api_key,
            model=model,
            priority=priority,
            limits=limits,
            client_options=client_options,
            params=params,
            tenant_column=tenant_column,
        )

    def _input(self, value: Any) -> MapInput:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise InvalidTypeError(
                f"messages must be a list of messages, got {type(value).__name__}",
                field="messages",
            )
        messages: list[Mapping[str, Any]] = []
        for message in value:
            if not isinstance(message, Mapping):
                raise InvalidTypeError(
                    f"each message must be a mapping, got {type(message).__name__}",
                    field="messages",
                )
            # Arrow stores a list of dicts as structs: a key one message has and
            # another lacks comes back as None, which the server would refuse.
            messages.append({key: item for key, item in message.items() if item is not None})
        return messages


def _column(batch: Any, name: str) -> list[Any]:
    """The named column of a dict-of-columns or pandas batch, as a list."""
    if isinstance(batch, Mapping) or _is_data_frame(batch):
        try:
            column = batch[name]
        except KeyError:
            raise InvalidTypeError(f"the batch has no {name!r} column", field="column") from None
        return list(column)
    raise InvalidTypeError(
        "a batch must be a dict of columns or a pandas DataFrame "
        f"(batch_format='numpy' or 'pandas'), got {type(batch).__name__}",
        field="batch",
    )


def _plain(value: Any) -> Any:
    """A tenant cell as the map takes it: a plain str (numpy's str_ is one), and
    None for a missing value (pandas and Arrow may give NaN)."""
    if isinstance(value, float) and value != value:
        return None
    return str(value) if isinstance(value, str) else value


def _is_data_frame(batch: Any) -> bool:
    # Checked by name: llmbatch does not import pandas (a pyarrow Table also has
    # columns, but is not supported).
    return any(
        klass.__name__ == "DataFrame" and klass.__module__.startswith("pandas")
        for klass in type(batch).__mro__
    )


def _with_columns(batch: Any, columns: dict[str, list[str | None]]) -> Any:
    if isinstance(batch, Mapping):
        if any(_is_numpy(values) for values in batch.values()):
            return {**batch, **{name: _string_array(values) for name, values in columns.items()}}
        return {**batch, **columns}
    batch = batch.copy(deep=False)
    for name, values in columns.items():
        # An object column keeps None as None (a str dtype would make it NaN).
        batch[name] = _object_series(batch, values)
    return batch


def _is_numpy(values: Any) -> bool:
    return type(values).__module__ == "numpy"


def _string_array(values: list[str | None]) -> Any:
    # A numpy batch comes from Ray, which turns a list of nothing but None into an
    # Arrow column of type null, read back as NaN (numpy) on the way out; a typed
    # string column keeps None as None whatever the other blocks hold.
    pyarrow = importlib.import_module("pyarrow")
    return pyarrow.array(values, type=pyarrow.string())


def _object_series(frame: Any, values: list[str | None]) -> Any:
    # A DataFrame came in, so pandas is importable; llmbatch itself does not need it.
    pandas = importlib.import_module("pandas")
    return pandas.Series(values, index=frame.index, dtype=object)


def _message(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {error}"


def _close_at_exit(ref: weakref.ref[_Rows]) -> None:
    rows = ref()
    if rows is not None:
        rows.close()
