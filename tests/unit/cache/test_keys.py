"""Cache keys (pure): two requests that differ in anything that shapes an answer
never share a key; two that differ only in what is left out always do."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch._cache.key import KeyMaker, deterministic
from llmbatch._calls.spec import check_call

#: What a key is made of, each with values to pick from (every value distinct).
KEYED: dict[str, list[Any]] = {
    "endpoint": ["http://a:8000/v1", "http://b:8000/v1", "https://api.example.com/v1"],
    "model": ["m1", "m2", "org/m1"],
    "root": [None, "/weights/m1", "/weights/m1-rev2"],
    "namespace": ["", "v2", "experiment-7"],
    "max_tokens": [None, 16, 64],
    "top_p": [None, 0.5, 0.9],
    "stop": [None, "\n", ["\n", "END"]],
    "seed": [None, 1, 2],
    "logprobs": [None, 1, 3],
    "schema": [None, {"type": "object"}, {"type": "array"}],
    "query": [None, {"api-version": "1"}, {"api-version": "2"}],
    "prompt": ["hello", "hello ", "Hello", "hello\x00"],
    "sample": [0, 1, 2],
    "kind": ["completion", "chat"],
}


def key_of(request: dict[str, Any]) -> bytes:
    """The key of a request described by ``request`` (a value per KEYED name), made as
    the client makes it: through the call's checked spec."""
    params: dict[str, Any] = {
        name: request[name]
        for name in ("max_tokens", "top_p", "stop", "seed", "logprobs")
        if request[name] is not None
    }
    params["temperature"] = 0
    for name, value in request.get("extra", {}).items():
        params[name] = value
    kind = request["kind"]
    if kind == "chat" and "logprobs" in params:
        params["logprobs"] = True
        params["top_logprobs"] = request["logprobs"]
    if request["query"] is not None:
        params["extra_query"] = request["query"]
    spec = check_call(
        kind,
        "complete" if kind == "completion" else "chat",
        {"model": request["model"], **params},
        tenant_as_user=True,
    )
    identity = {"id": request["model"]}
    if request["root"] is not None:
        identity["root"] = request["root"]
    maker = KeyMaker(
        kind=spec.kind,
        model_identity=identity,
        endpoint=request["endpoint"],
        params=spec.params,
        n=spec.n,
        query=spec.query,
        schema=request["schema"],
        namespace=request["namespace"],
    )
    payload: object = request["prompt"]
    if kind == "chat":
        payload = [{"role": "user", "content": request["prompt"]}]
    key = maker.key(payload, request["sample"])
    assert key is not None
    return key


requests = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in KEYED.items()})


@settings(max_examples=400, deadline=None)
@given(requests, st.sampled_from(sorted(KEYED)), st.data())
def test_requests_that_differ_in_any_keyed_field_never_share_a_key(
    request: dict[str, Any], field: str, data: st.DataObject
) -> None:
    other_value = data.draw(st.sampled_from([v for v in KEYED[field] if v != request[field]]))
    other = {**request, field: other_value}
    assert key_of(request) != key_of(other)


@settings(max_examples=200, deadline=None)
@given(
    requests,
    st.dictionaries(
        st.sampled_from(["x-trace", "traceparent", "x-request-id"]),
        st.text(alphabet="abcdef0123456789-", max_size=20),
    ),
    st.sampled_from([None, "agent-1", "team b"]),
    st.booleans(),
)
def test_requests_that_differ_only_in_what_is_left_out_share_a_key(
    request: dict[str, Any], headers: dict[str, str], tenant: str | None, reverse: bool
) -> None:
    """Headers (tracing ones), the tenant (sent as ``user``), the tier, the timeout,
    retries and the order of the keywords make no difference."""
    base = key_of(request)
    spec_a = check_call(
        "completion",
        "complete",
        {"model": "m", "temperature": 0, "max_tokens": 5, "top_p": 0.5},
    )
    options: dict[str, Any] = {
        "extra_headers": headers,
        "tenant": tenant,
        "priority": "realtime",
        "timeout": 3.0,
        "max_retries": 1,
        "top_p": 0.5,
        "max_tokens": 5,
        "temperature": 0,
        "model": "m",
    }
    if reverse:
        options = dict(reversed(options.items()))
    spec_b = check_call("completion", "complete", options)

    def made(spec: Any) -> bytes | None:
        return KeyMaker(
            kind=spec.kind,
            model_identity={"id": "m"},
            endpoint="http://a/v1",
            params=spec.params,
            n=spec.n,
            query=spec.query,
        ).key("p")

    assert made(spec_a) == made(spec_b)
    assert key_of({**request}) == base  # made the same way twice: the same key


def test_a_dict_inside_the_parameters_is_keyed_whatever_its_order() -> None:
    def key(schema: dict[str, Any]) -> bytes | None:
        return KeyMaker(
            kind="chat",
            model_identity={"id": "m"},
            endpoint="e",
            params={"response_format": schema, "temperature": 0},
            n=1,
        ).key([{"role": "user", "content": "hi"}])

    assert key({"type": "json_object", "strict": True}) == key(
        {"strict": True, "type": "json_object"}
    )
    assert key({"type": "json_object"}) != key({"type": "text"})


def test_unset_and_an_explicit_default_are_two_keys() -> None:
    """The server fills in its own default (vLLM's from generation_config.json)."""

    def key(params: dict[str, Any]) -> bytes | None:
        return KeyMaker(
            kind="completion", model_identity={"id": "m"}, endpoint="e", params=params, n=1
        ).key("p")

    assert key({"temperature": 1.0}) != key({})


def test_a_payload_with_no_json_form_has_no_key() -> None:
    maker = KeyMaker(
        kind="chat", model_identity={"id": "m"}, endpoint="e", params={"temperature": 0}, n=1
    )
    assert maker.key([{"role": "user", "content": object()}]) is None
    assert maker.key([{"role": "user", "content": float("nan")}]) is None


def test_a_prompt_and_a_sample_index_never_run_into_each_other() -> None:
    maker = KeyMaker(kind="completion", model_identity={"id": "m"}, endpoint="e", params={}, n=1)
    keys = {
        maker.key("a", 1),
        maker.key("a#", 0),
        maker.key("a", 0),
        maker.key("a\x01", 0),
        maker.key(["a"], 0),
    }
    assert len(keys) == 5


@pytest.mark.parametrize(
    ("kind", "params", "n", "expected"),
    [
        ("completion", {"temperature": 0}, 1, True),
        ("completion", {"temperature": 0.0}, 1, True),
        ("completion", {"temperature": 0.7, "seed": 3}, 1, True),
        ("completion", {}, 1, False),  # the server's default temperature
        ("completion", {"temperature": 0.7}, 1, False),
        ("completion", {"temperature": 0}, 2, False),  # n > 1: samples
        ("chat", {"seed": 0}, 1, True),
        ("embedding", {}, 1, True),
    ],
)
def test_which_requests_are_samples(
    kind: str, params: dict[str, Any], n: int, expected: bool
) -> None:
    assert deterministic(kind, params, n) is expected
