"""Response and result models returned to callers (pydantic, immutable)."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from llmbatch._exceptions import LLMBatchError

__all__ = [
    "ChatCompletion",
    "ChatMessage",
    "Choice",
    "Completion",
    "Result",
    "Timings",
    "Usage",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


M = TypeVar("M", bound=BaseModel)


def trusted(cls: type[M], **fields: Any) -> M:
    """Build a model from values llmbatch made itself, skipping validation.

    Every field must be given. This is what ``model_construct`` does, minus its
    per-field bookkeeping: a response path builds five models per prompt, and at
    bulk rates that bookkeeping was a measurable share of client CPU.
    tests/client/test_models.py checks it against validated construction.
    """
    model = cls.__new__(cls)
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(model, "__pydantic_fields_set__", set(fields))
    object.__setattr__(model, "__pydantic_extra__", None)
    object.__setattr__(model, "__pydantic_private__", None)
    return model


class Usage(_Frozen):
    """Token counts for one request.

    vLLM reports one ``usage`` for a whole list-prompt request; llmbatch apportions it
    over the prompts of a batch (by prompt and output length) and sets
    ``estimated=True`` when it had to. Sums over a batch are exact.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = False
    """True when these counts are this prompt's share of a batch's usage."""


class Timings(_Frozen):
    """Where the time went for one request, in seconds."""

    queued: float
    """From the call until its batch was sent."""
    latency: float
    """From the call until the answer was complete."""
    batch_size: int
    """How many prompts shared the HTTP request that answered it."""
    attempts: int
    """HTTP attempts made (1 = no retry)."""


class Choice(_Frozen):
    """One generated alternative (there are ``n`` per prompt)."""

    text: str
    finish_reason: str | None = None
    """Why generation stopped: ``"stop"`` (end of text or a stop string), ``"length"``
    (``max_tokens`` reached), or None if the server did not say."""


class Completion(_Frozen):
    """The answer to :meth:`Client.complete` (one prompt)."""

    id: str
    """The server's response id (shared by the prompts of one batch)."""
    model: str
    choices: tuple[Choice, ...]
    """``n`` choices (one unless the call passed ``n=``)."""
    usage: Usage
    timings: Timings

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason (``"stop"``, ``"length"``, ...)."""
        return self.choices[0].finish_reason


class ChatMessage(_Frozen):
    """One message of a chat conversation as returned by the server."""

    role: Literal["system", "user", "assistant", "tool", "developer"] | str
    content: str | None = None


class ChatCompletion(_Frozen):
    """The answer to :meth:`Client.chat`."""

    id: str
    model: str
    message: ChatMessage
    finish_reason: str | None
    usage: Usage
    timings: Timings

    @property
    def text(self) -> str:
        """The assistant message's text (empty if the server sent none)."""
        return self.message.content or ""


T = TypeVar("T")


class Result(_Frozen, Generic[T]):
    """The outcome of one item of :meth:`Client.map`: a value or that item's error.

    ``metadata`` is whatever rode along with the item's input.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    index: int
    """The item's position in the inputs."""
    value: T | None = None
    """A :class:`Completion` or :class:`ChatCompletion`; None if the item failed."""
    error: LLMBatchError | None = None
    """The item's error (:class:`InvalidRequestError` for bad input); None on success."""
    metadata: object = None

    @property
    def ok(self) -> bool:
        """True if the item succeeded."""
        return self.error is None

    def unwrap(self) -> T:
        """The value, or raise the item's error."""
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value
