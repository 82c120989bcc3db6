"""Results built on the hot path (lazily, from the server's dicts) are the same values
as results built through their constructors, and behave as immutable values."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
from typing import Any

import pytest

import llmbatch
from llmbatch import ChatCompletion, ChatMessage, Choice, Completion, Result, Timings, Usage
from llmbatch._models import BareChoices, Delivery, make_answer, make_result

RAW_CHOICES = (
    {"index": 0, "text": "hello", "finish_reason": "stop", "logprobs": None},
    {"index": 1, "text": "world", "finish_reason": "length"},
)


def delivery(*, batch_size: int = 8, estimated: bool = True) -> Delivery:
    """A response answered at t=11.5, sent at t=10.5; its requests asked at t=10."""
    return Delivery(
        "cmpl-1",
        "m",
        1700000000,
        batch_size=batch_size,
        dispatched_at=10.5,
        finished_at=11.5,
        estimated=estimated,
        total_tokens=None,
    )


def lazy_completion() -> Completion:
    value: Completion = make_answer(Completion, delivery(), 10.0, 3, 9, 2, RAW_CHOICES)
    return value


def eager_completion() -> Completion:
    return Completion(
        id="cmpl-1",
        model="m",
        created=1700000000,
        choices=(
            Choice(text="hello", finish_reason="stop"),
            Choice(text="world", finish_reason="length", index=1),
        ),
        usage=Usage(prompt_tokens=3, completion_tokens=9, total_tokens=12, estimated=True),
        timings=Timings(queued=0.5, latency=1.5, batch_size=8, attempts=2),
    )


def test_lazy_completion_equals_the_constructed_one() -> None:
    lazy, eager = lazy_completion(), eager_completion()
    assert lazy.text == "hello"
    assert lazy.finish_reason == "stop"
    assert lazy == eager
    assert hash(lazy) == hash(eager)
    assert lazy.choices[1] == Choice(text="world", finish_reason="length", index=1)
    assert lazy.usage == Usage(
        prompt_tokens=3, completion_tokens=9, total_tokens=12, estimated=True
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.usage.total_tokens = 1  # type: ignore[misc]
    assert lazy.timings == Timings(queued=0.5, latency=1.5, batch_size=8, attempts=2)
    assert lazy.timings.attempts == 2
    assert repr(lazy) == repr(eager)
    assert lazy.to_dict() == eager.to_dict() == lazy.model_dump()
    assert lazy.to_dict()["choices"][0] == {
        "text": "hello",
        "finish_reason": "stop",
        "index": 0,
        "logprobs": None,
    }


def test_fields_read_before_and_after_building_agree() -> None:
    value = lazy_completion()
    before = (value.text, value.finish_reason)
    assert value.choices[0].text == "hello"  # builds the Choice objects
    assert (value.text, value.finish_reason) == before


def test_a_server_sending_odd_types_yields_safe_values() -> None:
    odd = ({"index": 0, "text": None, "finish_reason": 5},)
    value = make_answer(Completion, delivery(), 10.0, 0, 0, 1, odd)
    assert value.text == ""
    assert value.finish_reason is None
    assert value.choices == (Choice(text="", finish_reason=None),)


def test_chat_completion_lazy_equals_constructed() -> None:
    raw = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    alone = delivery(batch_size=1, estimated=False)
    lazy = make_answer(ChatCompletion, alone, 10.0, 1, 2, 1, (raw,))
    eager = ChatCompletion(
        id="cmpl-1",
        model="m",
        created=1700000000,
        message=ChatMessage(role="assistant", content="hi"),
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
        timings=Timings(queued=0.5, latency=1.5, batch_size=1, attempts=1),
    )
    assert lazy == eager
    assert lazy.text == "hi"
    no_content = make_answer(
        ChatCompletion, alone, 10.0, 0, 0, 1, ({"message": {"role": "assistant", "content": None}},)
    )
    assert no_content.text == ""
    assert no_content.finish_reason is None


def test_a_lone_request_keeps_the_servers_total() -> None:
    alone = Delivery(
        "c",
        "m",
        0,
        batch_size=1,
        dispatched_at=0.0,
        finished_at=0.0,
        estimated=False,
        total_tokens=15,
    )
    value = make_answer(Completion, alone, 0.0, 3, 9, 1, RAW_CHOICES[:1])
    assert value.usage == Usage(prompt_tokens=3, completion_tokens=9, total_tokens=15)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (lazy_completion(), "id"),
        (lazy_completion(), "text"),
        (Usage(), "prompt_tokens"),
        (Choice(text="x"), "text"),
        (make_result(0, lazy_completion(), None, {"k": 1}), "value"),
    ],
)
def test_results_are_immutable(value: object, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, "changed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(value, field)


def test_results_pickle_and_compare_by_value() -> None:
    value = lazy_completion()
    result = make_result(3, value, None, {"row": 7})
    again = pickle.loads(pickle.dumps(result))
    assert again == result
    assert again.value == value
    assert again.metadata == {"row": 7}
    assert Result(index=3, value=value, metadata={"row": 7}) == result
    assert result.ok
    assert result.unwrap() is value


def test_failed_result_unwrap_raises_its_error() -> None:
    error = llmbatch.BadRequestError("too long", status_code=400)
    result = make_result(0, None, error, None)
    assert not result.ok
    with pytest.raises(llmbatch.BadRequestError, match="too long"):
        result.unwrap()
    assert result.to_dict() == {"index": 0, "value": None, "error": "too long", "metadata": None}


#: What vLLM sends for each prompt of a list-prompt request (this one the fourth).
VLLM_CHOICE = {
    "index": 3,
    "text": " the river",
    "logprobs": None,
    "finish_reason": "length",
    "stop_reason": None,
    "prompt_logprobs": None,
}


def answer_from(raw: dict[str, Any], *, bare: bool, kind: type[Any] = Completion) -> Any:
    """The answer (of ``kind``) the server's choice ``raw`` makes, made as the
    dispatcher makes it: with the response's layout when its first choice is bare
    (``bare``), else without, so that it keeps the server's dicts."""
    response = delivery()
    if bare:
        response.bare = BareChoices.of(kind, raw)
        assert response.bare is not None
    return make_answer(kind, response, 10.0, 3, 2, 1, (raw,))


def test_a_bare_choice_answers_as_the_servers_dict_would() -> None:
    """An answer that kept only its text and finish reason is the same value in every
    way as one that kept the server's dict, and hands the dict back as it was."""
    bare, kept = answer_from(dict(VLLM_CHOICE), bare=True), answer_from(VLLM_CHOICE, bare=False)
    assert (bare.text, bare.finish_reason) == (" the river", "length")
    assert bare == kept
    assert hash(bare) == hash(kept)
    assert repr(bare) == repr(kept)
    assert bare.to_dict() == kept.to_dict()
    assert pickle.loads(pickle.dumps(bare)) == kept
    # The openai drop-in's view, of answers fresh from the server (reading ``choices``
    # builds Choice objects, which stand for the dict from then on in either form).
    fresh_bare, fresh_kept = (
        answer_from(dict(VLLM_CHOICE), bare=True),
        answer_from(VLLM_CHOICE, bare=False),
    )
    server = [{**VLLM_CHOICE, "index": 0}]
    assert fresh_bare._raw_choices() == fresh_kept._raw_choices() == server
    assert list(fresh_bare._raw_choices()[0]) == list(VLLM_CHOICE)  # the server's key order
    assert bare.choices == kept.choices == (Choice(text=" the river", finish_reason="length"),)
    # What it is for: the answer no longer holds a dict (memory, and the collector's
    # work, for a map's many results).
    assert not any(
        isinstance(ref, dict) for ref in gc.get_referents(answer_from(dict(VLLM_CHOICE), bare=True))
    )


@pytest.mark.parametrize(
    "extra",
    [{"stop_reason": "###"}, {"logprobs": {"tokens": [" the"]}}, {"finish_reason": None}],
)
def test_a_choice_that_says_more_is_kept_whole(extra: dict[str, object]) -> None:
    """A stop reason, log-probabilities, or anything else the server set stays
    readable as it sent it."""
    raw = {**VLLM_CHOICE, **extra}
    assert BareChoices.of(Completion, raw) is None  # a response whose first says more
    value = answer_from(raw, bare=False)
    assert value._raw_choices() == [{**raw, "index": 0}]
    # ... and beside bare ones in one response, it keeps its dict.
    response = delivery()
    response.bare = BareChoices.of(Completion, VLLM_CHOICE)
    assert response.bare is not None
    mixed = make_answer(Completion, response, 10.0, 3, 2, 1, (raw,))
    assert mixed._raw_choices() == [{**raw, "index": 0}]


def test_a_layout_is_read_once_and_a_choice_that_says_more_still_is_not_bare() -> None:
    """Every response of a server is laid out alike: the layout read from one serves
    the next (``BareChoices.of`` returns it again), but only for a choice that fits
    it; the same keys with something set are read afresh, and are not bare."""
    from llmbatch import _models

    first = BareChoices.of(Completion, dict(VLLM_CHOICE))
    assert first is not None
    assert BareChoices.of(Completion, {**VLLM_CHOICE, "text": "other"}) is first
    assert BareChoices.of(Completion, {**VLLM_CHOICE, "stop_reason": "###"}) is None
    assert BareChoices.of(ChatCompletion, dict(VLLM_CHOICE)) is None  # another kind
    # A server that varies its keys starts the cache again rather than growing it.
    for i in range(3 * _models._LAYOUTS_KEPT):
        BareChoices.of(Completion, {**VLLM_CHOICE, f"extra_{i}": None})
    assert len(_models._LAYOUTS) <= _models._LAYOUTS_KEPT


def test_a_batched_answer_numbers_its_choices_from_zero() -> None:
    """The server numbers a list request's choices through all its prompts; each
    prompt's answer numbers its own, as a request of its own would have them."""
    for bare in (True, False):
        value = answer_from(dict(VLLM_CHOICE), bare=bare)
        assert value.choices[0].index == 0
        assert value.to_dict()["choices"][0]["index"] == 0


#: What vLLM 0.32 sends for each conversation of a chat batch (this one the third).
VLLM_CHAT_CHOICE: dict[str, Any] = {
    "index": 2,
    "message": {
        "role": "assistant",
        "content": "The river.",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning_content": None,
    },
    "logprobs": None,
    "finish_reason": "stop",
    "stop_reason": None,
}


def chat_answer_from(raw: dict[str, Any], *, bare: bool) -> ChatCompletion:
    value: ChatCompletion = answer_from(raw, bare=bare, kind=ChatCompletion)
    return value


def test_a_bare_chat_choice_answers_as_the_servers_dicts_would() -> None:
    bare = chat_answer_from(copy.deepcopy(VLLM_CHAT_CHOICE), bare=True)
    kept = chat_answer_from(copy.deepcopy(VLLM_CHAT_CHOICE), bare=False)
    assert (bare.text, bare.finish_reason) == ("The river.", "stop")
    fresh = chat_answer_from(copy.deepcopy(VLLM_CHAT_CHOICE), bare=True)
    server = [{**VLLM_CHAT_CHOICE, "index": 0}]
    assert fresh._raw_choices() == server
    assert list(fresh._raw_choices()[0]["message"]) == list(VLLM_CHAT_CHOICE["message"])
    assert bare == kept
    assert hash(bare) == hash(kept)
    assert repr(bare) == repr(kept)
    assert bare.to_dict() == kept.to_dict()
    assert pickle.loads(pickle.dumps(bare)) == kept
    assert bare.message == ChatMessage(role="assistant", content="The river.")
    assert bare.choices[0].index == 0
    refs = gc.get_referents(chat_answer_from(copy.deepcopy(VLLM_CHAT_CHOICE), bare=True))
    assert not any(isinstance(ref, dict | list) for ref in refs)


@pytest.mark.parametrize(
    "change",
    [
        {"stop_reason": 42},
        {"logprobs": {"content": []}},
        {"message": {**VLLM_CHAT_CHOICE["message"], "tool_calls": [{"id": "c1"}]}},
        {"message": {**VLLM_CHAT_CHOICE["message"], "reasoning_content": "hmm"}},
        {"message": {**VLLM_CHAT_CHOICE["message"], "content": None}},
        {"message": {**VLLM_CHAT_CHOICE["message"], "role": "tool"}},
    ],
)
def test_a_chat_choice_that_says_more_is_kept_whole(change: dict[str, Any]) -> None:
    raw = {**copy.deepcopy(VLLM_CHAT_CHOICE), **change}
    assert BareChoices.of(ChatCompletion, raw) is None
    response = delivery()
    response.bare = BareChoices.of(ChatCompletion, copy.deepcopy(VLLM_CHAT_CHOICE))
    value = make_answer(ChatCompletion, response, 10.0, 3, 2, 1, (raw,))
    assert value._raw_choices() == [{**raw, "index": 0}]
