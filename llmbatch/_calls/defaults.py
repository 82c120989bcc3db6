"""Per-call defaults: what ``Client(timeout=30)`` and ``client.with_options(...)`` set
for every call that does not say otherwise.

A view made by ``with_options`` shares its client's engine, queues and limits; only
these defaults differ. They are applied in the client's methods, before validation,
so a view's call is validated (and its options cached) like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmbatch._calls.params import check_extra
from llmbatch._calls.validate import check_max_retries, check_tenant, check_timeout
from llmbatch._config import Priority, parse_priority
from llmbatch._exceptions import (
    ConfigError,
    ConfigTypeError,
    InvalidTypeError,
    LLMBatchError,
)

__all__ = ["NOT_GIVEN", "CallDefaults", "NotGiven", "check_default_headers"]


class NotGiven:
    """The type of :data:`NOT_GIVEN`: an option left out, where None means "none"."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __bool__(self) -> bool:
        return False


NOT_GIVEN = NotGiven()


#: The call options a default may stand in for, besides the headers.
_DEFAULTED = ("priority", "model", "timeout", "max_retries", "tenant")


class CallDefaults:
    """The options a call gets when it leaves them out (None: not set)."""

    __slots__ = ("headers", "max_retries", "model", "priority", "tenant", "timeout")

    def __init__(
        self,
        *,
        priority: Priority | None = None,
        model: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        headers: Mapping[str, str] | None = None,
        tenant: str | None = None,
    ) -> None:
        self.priority = priority
        self.tenant = tenant
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.headers = dict(headers) if headers else None

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
        values: dict[str, Any] = (
            {}
            if base is None
            else {
                "priority": base.priority,
                "model": base.model,
                "timeout": base.timeout,
                "max_retries": base.max_retries,
                "headers": base.headers,
                "tenant": base.tenant,
            }
        )
        for name, value in options.items():
            if name == "priority":
                values[name] = None if value is None else parse_priority(value)
            elif name == "model":
                if value is not None and (not isinstance(value, str) or not value):
                    raise InvalidTypeError("model must be a non-empty str or None", field="model")
                values[name] = value
            elif name == "timeout":
                values[name] = check_timeout(value)
            elif name == "max_retries":
                values[name] = check_max_retries(value)
            elif name == "tenant":
                values[name] = check_tenant(value)
            elif name == "default_headers":
                # Headers add to the base's (a view of a view keeps both).
                merged = {**(values.get("headers") or {}), **check_default_headers(value)}
                values["headers"] = merged or None
            else:  # pragma: no cover - the public signatures name every option
                raise AssertionError(name)
        if all(v is None for v in values.values()):
            return None
        return cls(**values)

    def fill(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A call's keywords with these defaults filled in where it left them out
        (a map's items may still override them one by one)."""
        filled = dict(params)
        for name in _DEFAULTED:
            if filled.get(name) is None and getattr(self, name) is not None:
                filled[name] = getattr(self, name)
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
        shown = [
            f"{name}={getattr(self, name)!r}"
            for name in ("priority", "model", "timeout", "max_retries", "tenant")
            if getattr(self, name) is not None
        ]
        if self.headers:
            shown.append(f"headers={sorted(self.headers)!r}")
        return f"CallDefaults({', '.join(shown)})"


def check_default_headers(value: object) -> dict[str, str]:
    """``default_headers``: str names and values without line breaks."""
    return check_extra("default_headers", value, strings=True)
