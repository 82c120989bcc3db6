"""Models built on the fast path equal validated ones, and behave as documented."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbatch import Choice, Completion, Result, Timings, Usage
from llmbatch._models import trusted


def test_trusted_construction_equals_validated_construction() -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7, estimated=True)
    assert (
        trusted(Usage, prompt_tokens=3, completion_tokens=4, total_tokens=7, estimated=True)
        == usage
    )
    timings = Timings(queued=0.1, latency=0.5, batch_size=8, attempts=1)
    assert trusted(Timings, queued=0.1, latency=0.5, batch_size=8, attempts=1) == timings
    choices = (Choice(text="hi", finish_reason="stop"),)
    fast = trusted(Completion, id="c", model="m", choices=choices, usage=usage, timings=timings)
    slow = Completion(id="c", model="m", choices=choices, usage=usage, timings=timings)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.text == "hi"
    with pytest.raises(ValidationError):
        fast.id = "changed"  # type: ignore[misc]


def test_result_unwrap() -> None:
    ok: Result[str] = Result(index=0, value="v")
    assert ok.ok
    assert ok.unwrap() == "v"
    error = ValueError("x")
    from llmbatch import InvalidRequestError

    bad: Result[str] = Result(index=1, error=InvalidRequestError("nope"))
    assert not bad.ok
    with pytest.raises(InvalidRequestError):
        bad.unwrap()
    del error
