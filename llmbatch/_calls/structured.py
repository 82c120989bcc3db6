"""Structured outputs: an answer checked against its call's ``response_model``, and
sent back to be corrected when it does not validate.

Pure: an answer and its call's spec in, a :class:`Verdict` out (the validated
object, a re-ask to submit, or the error the item ends in), so the lone call and
the map share every rule and the rules are tested without a server. The server
was asked to constrain the answer to the schema in its own dialect
(``_servers``); this is what holds where it did not (a server without
constrained decoding, a field it ignored, a model that wandered).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmbatch._calls.spec import CallSpec
from llmbatch._exceptions import OutputTruncatedError, StructuredOutputError

__all__ = ["Reask", "Verdict", "check_answer", "reask_payload"]

#: Pydantic errors quoted back to the model (the rest are counted).
_QUOTED_ERRORS = 5


class Reask:
    """Send the answer back: ``payload`` is the prompt or conversation that shows
    the model its answer and what was wrong with it."""

    __slots__ = ("payload",)

    def __init__(self, payload: str | tuple[Mapping[str, Any], ...]) -> None:
        self.payload = payload


class Verdict:
    """What became of one answer: ``parsed`` (when ``ok``), a ``reask`` to send,
    or the ``error`` the call ends in."""

    __slots__ = ("error", "ok", "parsed", "reask")

    def __init__(
        self,
        *,
        parsed: object = None,
        ok: bool = False,
        reask: Reask | None = None,
        error: StructuredOutputError | None = None,
    ) -> None:
        self.ok = ok
        self.parsed = parsed
        self.reask = reask
        self.error = error


def check_answer(
    answer: Any,
    spec: CallSpec,
    payload: str | Sequence[Mapping[str, Any]],
    *,
    reasks: int,
    request_id: str,
    attempts: int,
) -> Verdict:
    """Validate ``answer`` (a Completion or ChatCompletion) against ``spec``'s
    response model. ``payload`` is the prompt or conversation it answered,
    ``reasks`` how many times this call was already sent back, and ``attempts`` the
    HTTP attempts of the whole call so far (its first ask and every re-ask)."""
    model = spec.response_model
    assert model is not None
    text: str = answer.text
    if answer.finish_reason == "length":
        # Sending it back with the same budget would be cut at the same place.
        return Verdict(
            error=OutputTruncatedError(
                f"the answer reached max_tokens={spec.max_tokens} before its JSON was "
                "complete; give the call more max_tokens",
                text=text,
                reasks=reasks,
                request_id=request_id,
                attempts=attempts,
            )
        )
    try:
        parsed = model.validate_json(text)
    except _validation_error() as exc:  # (evaluated only when something was raised)
        errors = [
            dict(error)
            for error in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
        summary = _summary(errors)
        if reasks < spec.max_reasks:
            return Verdict(reask=Reask(reask_payload(payload, text, summary)))
        return Verdict(
            error=StructuredOutputError(
                f"the answer is not a valid {model.name} after {reasks} re-ask"
                f"{'' if reasks == 1 else 's'}: {summary}",
                text=text,
                errors=errors,
                reasks=reasks,
                request_id=request_id,
                attempts=attempts,
            )
        )
    return Verdict(parsed=parsed, ok=True)


def _validation_error() -> type[Any]:
    """pydantic's ``ValidationError`` (pydantic is imported only where a schema is used)."""
    from pydantic import ValidationError

    return ValidationError


def _summary(errors: Sequence[Mapping[str, Any]]) -> str:
    """Pydantic's errors in one line: ``age: Input should be a valid integer; ...``."""
    shown = []
    for error in errors[:_QUOTED_ERRORS]:
        where = ".".join(str(part) for part in error.get("loc", ())) or "answer"
        shown.append(f"{where}: {error.get('msg', 'invalid')}")
    more = len(errors) - _QUOTED_ERRORS
    if more > 0:
        shown.append(f"and {more} more")
    return "; ".join(shown)


def reask_payload(
    payload: str | Sequence[Mapping[str, Any]], text: str, summary: str
) -> str | tuple[Mapping[str, Any], ...]:
    """The prompt or conversation that sends ``text`` back with what was wrong:
    for chat, the answer as the assistant's turn and the errors as the user's; for
    a completion, both appended to the prompt."""
    feedback = (
        f"That answer is not valid: {summary}. "
        "Answer again with only the corrected JSON, nothing else."
    )
    if isinstance(payload, str):
        return f"{payload}{text}\n\n{feedback}\n"
    return (
        *payload,
        {"role": "assistant", "content": text},
        {"role": "user", "content": feedback},
    )
