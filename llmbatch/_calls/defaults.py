"""Per-call defaults: what ``Client(timeout=30)`` and ``client.with_options(...)`` set
for every call that does not say otherwise.

A view made by ``with_options`` shares its client's engine, queues and limits; only
these defaults differ. They are applied in the client's methods, before validation,
so a view's call is validated (and its options cached) like any other.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict

from llmbatch._calls.params import check_extra
from llmbatch._calls.spec import check_cache_mode
from llmbatch._calls.validate import check_max_retries, check_tenant, check_timeout
from llmbatch._config import PriorityLike, parse_priority
from llmbatch._exceptions import (
    ConfigError,
    ConfigTypeError,
    InvalidTypeError,
    LLMBatchError,
)

__all__ = ["CallDefaults", "ViewOptions", "check_default_headers"]


class ViewOptions(TypedDict, total=False):
    """What ``client.with_options(...)`` (and ``SyncClient.with_options``) may set for
    every call of the view: each is the call keyword of the same name, checked the
    same way, and a call's own keyword still wins. A new option that a view can
    default is one key here and one check in :data:`_CHECKS`."""

    priority: PriorityLike | None
    """The tier of every method (where each otherwise has its own default)."""
    model: str | None
    timeout: float | None
    """Each call's deadline in seconds (None: none)."""
    max_retries: int | None
    """Retries after the first attempt."""
    default_headers: Mapping[str, str]
    """HTTP headers added to every request (a call's ``extra_headers`` override them;
    a view of a view keeps both)."""
    tenant: str | None
    """Who its calls are for (see :meth:`Client.complete`)."""
    cache: bool | Literal["refresh"] | None
    """Whether its calls use the client's response cache (``"refresh"``: write only)."""


def _model(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidTypeError("model must be a non-empty str or None", field="model")
    return value


def _cache(value: object) -> object:
    check_cache_mode(value)
    return value


#: How each option a default may stand in for is checked (the headers apart: they
#: merge rather than replace).
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "priority": lambda value: None if value is None else parse_priority(value),
    "model": _model,
    "timeout": check_timeout,
    "max_retries": check_max_retries,
    "tenant": check_tenant,
    "cache": _cache,
}


class CallDefaults:
    """The options a call gets when it leaves them out: ``values`` by keyword (only
    those set), and the default headers."""

    __slots__ = ("headers", "values")

    def __init__(
        self, values: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        self.values = {name: value for name, value in (values or {}).items() if value is not None}
        self.headers = dict(headers) if headers else None

    def get(self, name: str) -> Any:
        """The default for keyword ``name`` (None: not set)."""
        return self.values.get(name)

    @classmethod
    def checked(
        cls,
        base: CallDefaults | None,
        options: Mapping[str, Any],
        *,
        config: bool,
    ) -> CallDefaults | None:
        """``base`` with ``options`` applied, each checked; None when nothing is set.

        ``config=True`` raises :class:`ConfigError` (a constructor argument), else
        :class:`InvalidRequestError` (a call's argument), typed errors for wrong types.
        """
        try:
            return cls._checked(base, options)
        except LLMBatchError as exc:
            if not config:
                raise
            error = ConfigTypeError if isinstance(exc, TypeError) else ConfigError
            raise error(str(exc), field=getattr(exc, "field", None)) from None

    @classmethod
    def _checked(cls, base: CallDefaults | None, options: Mapping[str, Any]) -> CallDefaults | None:
        values = {} if base is None else dict(base.values)
        headers = None if base is None else base.headers
        for name, value in options.items():
            if name == "default_headers":
                # Headers add to the base's (a view of a view keeps both).
                headers = {**(headers or {}), **check_default_headers(value)} or None
                continue
            check = _CHECKS.get(name)
            if check is None:
                close = difflib.get_close_matches(name, [*_CHECKS, "default_headers"], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InvalidTypeError(
                    f"with_options() got an unexpected keyword argument {name!r}{hint}",
                    field=name,
                )
            values[name] = check(value)
        defaults = cls(values, headers)
        return defaults if defaults.values or defaults.headers else None

    def fill(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A call's keywords with these defaults filled in where it left them out
        (a map's items may still override them one by one)."""
        filled = dict(params)
        for name, value in self.values.items():
            if filled.get(name) is None:
                filled[name] = value
        if self.headers is not None:
            filled["extra_headers"] = self.merge_headers(filled.get("extra_headers"))
        return filled

    def merge_headers(self, extra_headers: object) -> object:
        """A call's ``extra_headers`` over these default headers (the call's win)."""
        if self.headers is None:
            return extra_headers
        if extra_headers is None:
            return self.headers
        if not isinstance(extra_headers, Mapping):
            return extra_headers  # validation reports the wrong type
        return {**self.headers, **extra_headers}

    def __repr__(self) -> str:
        # Header values may hold credentials: show only their names.
        shown = [f"{name}={value!r}" for name, value in self.values.items()]
        if self.headers:
            shown.append(f"headers={sorted(self.headers)!r}")
        return f"CallDefaults({', '.join(shown)})"


def check_default_headers(value: object) -> dict[str, str]:
    """``default_headers``: str names and values without line breaks."""
    return check_extra("default_headers", value, strings=True)
