"""vLLM's error answer, ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self._type = error_type
        #: Response headers, such as ``Retry-After`` on a 429.
        self.headers = headers

    @classmethod
    def validation(cls, message: str, *, param: str, value: object = None) -> ApiError:
        """A 400 from vLLM's request-model validation (pydantic), worded as vLLM words it.

        vLLM answers these through FastAPI's validation handler: type ``"Bad
        Request"``, ``param`` from its ``VLLMValidationError``, and a message that
        lists the validation errors.
        """
        extras = f"parameter={param}" + ("" if value is None else f", value={value}")
        return cls(
            400,
            f"1 validation error:\n  Value error, {message} ({extras})",
            param=param,
            error_type="Bad Request",
        )

    @property
    def type(self) -> str:
        if self._type is not None:
            return self._type
        return {
            400: "BadRequestError",
            401: "AuthenticationError",
            404: "NotFoundError",
            429: "RateLimitError",
            503: "ServiceUnavailableError",
        }.get(self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }
