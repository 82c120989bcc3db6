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
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch._config import Limits, PriorityLike, parse_priority
from llmbatch._exceptions import ConfigTypeError, InvalidTypeError, LLMBatchError
from llmbatch._map import MapInput
from llmbatch._sync import SyncClient

__all__ = ["Chat", "Completions"]

COMPLETION_COLUMN = "completion"
"""The column a row's answer goes to: its text, or None if the row failed."""
ERROR_COLUMN = "error"
"""The column a row's failure goes to: ``"ErrorClass: message"``, or None."""


class _Rows:
    """What ``Completions`` and ``Chat`` share: the client's lifetime, one ``map`` per
    batch, and writing the two result columns in the batch's own format."""

    _column: str

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
    ) -> None:
        if not isinstance(column, str):
            raise ConfigTypeError("the column name must be a str", field="column")
        self._column = column
        options: dict[str, Any] = dict(client_options or {})
        if limits is not None:
            options["limits"] = limits
        # Build the client now so a bad option fails in the constructor (Ray reports
        # it as the actor's start-up error), but open it only on the first batch.
        self._client = SyncClient(base_url, api_key=api_key, model=model, **options)
        self._open = False
        self._priority = parse_priority(priority)
        self._params = params
        atexit.register(_close_at_exit, weakref.ref(self))

    def __call__(self, batch: Any) -> Any:
        """Answer every row of ``batch``; returns the batch with ``completion`` and
        ``error`` columns added (one bad row gets an ``error``, the others still run)."""
        values = _column(batch, self._column)
        inputs: list[MapInput] = []
        sent: list[int] = []
        completions: list[str | None] = [None] * len(values)
        errors: list[str | None] = [None] * len(values)
        for row, value in enumerate(values):
            try:
                inputs.append(self._input(value))
            except LLMBatchError as exc:
                errors[row] = _message(exc)
            else:
                sent.append(row)
        if inputs:
            client = self._client_for_call()
            results = client.map(inputs, priority=self._priority, **self._params)
            for row, result in zip(sent, results, strict=True):
                if result.value is not None:
                    completions[row] = result.value.text
                else:
                    errors[row] = _message(result.error)
        return _with_columns(batch, {COMPLETION_COLUMN: completions, ERROR_COLUMN: errors})

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
    ``client_options`` (any other :class:`~llmbatch.SyncClient` argument), and
    sampling parameters such as ``max_tokens`` or ``temperature``, passed to every
    request. A row whose prompt is not a string gets an ``error`` and is not sent.
    """

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


def _is_data_frame(batch: Any) -> bool:
    # Checked by name: llmbatch does not import pandas (a pyarrow Table also has
    # columns, but is not supported).
    return any(
        klass.__name__ == "DataFrame" and klass.__module__.startswith("pandas")
        for klass in type(batch).__mro__
    )


def _with_columns(batch: Any, columns: dict[str, list[str | None]]) -> Any:
    if isinstance(batch, Mapping):
        return {**batch, **columns}
    batch = batch.copy(deep=False)
    for name, values in columns.items():
        # An object column keeps None as None (a str dtype would make it NaN).
        batch[name] = _object_series(batch, values)
    return batch


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
