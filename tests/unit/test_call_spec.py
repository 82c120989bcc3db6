"""A call's keywords checked into its spec (``_calls/spec.py``), without a client:
what each keyword becomes, the errors a bad one gets (with its field), and the
cache that checks one set of keywords once."""

from __future__ import annotations

from typing import Any

import pytest

from llmbatch import InvalidRequestError, Priority
from llmbatch._calls.spec import SpecCache, check_call
from llmbatch._exceptions import InvalidTypeError


def _spec(kind: Any = "completion", **params: Any) -> Any:
    return check_call(kind, "complete", {"model": "m", **params})


def test_own_options_stay_out_of_the_body_and_none_values_are_dropped() -> None:
    spec = _spec(priority="realtime", timeout=5.0, max_retries=2, temperature=None, top_p=0.5)
    assert spec.priority is Priority.REALTIME
    assert spec.attempts == 3
    assert spec.timeout == 5.0
    assert spec.params == {"top_p": 0.5}  # no priority, timeout or temperature=None


def test_max_tokens_budget_is_the_callers_or_the_kinds_default() -> None:
    given = _spec(max_tokens=7)
    assert (given.max_tokens, given.max_tokens_given, given.params["max_tokens"]) == (7, True, 7)
    default = _spec()
    assert default.max_tokens_given is False
    assert "max_tokens" not in default.params
    assert default.max_tokens > 0


def test_chat_max_completion_tokens_is_max_tokens() -> None:
    spec = _spec("chat", max_completion_tokens=9)
    assert spec.params == {"max_tokens": 9}
    assert spec.max_tokens == 9


def test_a_tenant_goes_as_openais_user_unless_the_call_names_one() -> None:
    assert _spec(tenant="team-a").params["user"] == "team-a"
    assert _spec(tenant="team-a", user="alice").params["user"] == "alice"
    quiet = check_call(
        "completion", "complete", {"model": "m", "tenant": "t"}, tenant_as_user=False
    )
    assert "user" not in quiet.params


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": 101.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": 3}, "stop"),
        ({"model": ""}, "model"),
        ({"priority": "urgent"}, "priority"),
    ],
)
def test_a_bad_keyword_is_refused_with_its_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        _spec(**params)
    assert caught.value.field == field


def test_max_tokens_beyond_the_context_names_the_servers_limit() -> None:
    with pytest.raises(InvalidRequestError, match="max_model_len of 100"):
        check_call("completion", "complete", {"model": "m", "max_tokens": 101}, max_model_len=100)


def test_a_body_json_cannot_carry_is_refused_at_the_call() -> None:
    with pytest.raises(InvalidTypeError, match="JSON-serialisable"):
        _spec(extra_body={"logit_bias": {1, 2}})
    with pytest.raises(InvalidRequestError, match="JSON-serialisable"):
        _spec(extra_body={"x": float("nan")})


def test_extra_body_counts_as_keywords_and_headers_are_kept_sorted() -> None:
    spec = _spec(extra_body={"n": 2}, extra_headers={"b": "2", "a": "1"})
    assert spec.n == 2
    assert spec.headers == (("a", "1"), ("b", "2"))


def test_the_cache_checks_one_set_of_keywords_once() -> None:
    cache = SpecCache("m", 4096)
    first = cache.get("completion", "complete", "normal", {"temperature": 0.5})
    again = cache.get("completion", "complete", "normal", {"temperature": 0.5})
    other = cache.get("completion", "complete", "normal", {"temperature": 0.7})
    assert first is again
    assert other is not first
    assert first.model == "m"


def test_the_cache_checks_max_tokens_against_the_default_models_context_only() -> None:
    cache = SpecCache("m", 100)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        cache.get("completion", "complete", "normal", {"max_tokens": 500})
    # Another model's context is not known here: not checked.
    cache.get("completion", "complete", "normal", {"max_tokens": 500, "model": "other"})


def test_the_cache_starts_afresh_past_its_size() -> None:
    cache = SpecCache("m", None, size=2)
    first = cache.get("completion", "complete", "normal", {"temperature": 0.1})
    cache.get("completion", "complete", "normal", {"temperature": 0.2})
    cache.get("completion", "complete", "normal", {"temperature": 0.3})
    assert cache.get("completion", "complete", "normal", {"temperature": 0.1}) is not first
