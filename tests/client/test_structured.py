"""``response_model=``: answers validated into the caller's type, sent back to be
corrected when they are not, each call and each map item alone; against the real
simulator, which answers schemas (and a share of them wrongly when asked)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

import llmbatch
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Label(BaseModel):
    mood: Mood
    urgent: bool
    score: Annotated[int, Field(ge=0, le=9)]


def _sim(*args: str) -> Iterator[SimulatorProcess]:
    with run_simulator("--zero-latency", "--max-model-len", "4096", *args) as sim:
        yield sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    yield from _sim()


@pytest.fixture(scope="module")
def flaky() -> Iterator[SimulatorProcess]:
    yield from _sim("--invalid-json", "0.3")


@pytest.fixture(scope="module")
def broken() -> Iterator[SimulatorProcess]:
    yield from _sim("--invalid-json", "1")


async def test_a_call_returns_the_validated_object(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        answer = await client.complete(
            "Label: I lost my keys", response_model=Label, max_tokens=200
        )
        chat = await client.chat(
            [{"role": "user", "content": "Label: a sunny day"}],
            response_model=Label,
            max_tokens=200,
        )
        assert isinstance(answer.parsed, Label)
        assert Label.model_validate_json(answer.text) == answer.parsed
        assert isinstance(chat.parsed, Label)
        plain = await client.complete("no schema", max_tokens=5)
        assert plain.parsed is None
        assert client.stats().structured.validated == 2


async def test_openai_parse_style_response_format_class(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        chat = await client.chat(
            [{"role": "user", "content": "Label it"}], response_format=Label, max_tokens=200
        )
        assert isinstance(chat.parsed, Label)


async def test_a_map_validates_every_item_and_reasks_the_failures_alone(
    flaky: SimulatorProcess,
) -> None:
    prompts = [f"Label message {i}" for i in range(300)]
    async with llmbatch.Client(flaky.base_url) as client:
        results = await client.map(prompts, response_model=Label, max_tokens=200)
        stats = client.stats().structured
    assert [r.index for r in results] == list(range(300))
    for result in results:
        if result.ok:
            assert isinstance(result.value, Label)
            assert result.parsed is result.value
            assert isinstance(result.response, llmbatch.Completion)
            assert result.text == result.response.text
        else:
            assert isinstance(result.error, llmbatch.StructuredOutputError)
    ok = sum(r.ok for r in results)
    # 30 % invalid, two re-asks each: about 0.3**3 = 2.7 % fail.
    assert ok >= 270
    assert stats.validated == ok
    assert stats.failed == 300 - ok
    assert 50 <= stats.reasked <= 200


async def test_failures_are_typed_errors_with_the_text_and_pydantics_errors(
    broken: SimulatorProcess,
) -> None:
    async with llmbatch.Client(broken.base_url) as client:
        with pytest.raises(llmbatch.StructuredOutputError) as caught:
            await client.complete("Label it", response_model=Label, max_tokens=200, max_reasks=1)
        error = caught.value
        assert error.reasks == 1
        # The call's HTTP attempts: its first ask and its re-ask, one each.
        assert error.attempts == 2
        assert str(error).endswith(", attempts=2)")
        assert error.text
        assert error.errors
        assert error.errors[0]["type"] == "json_invalid"
        results = await client.map(["a", "b", "c"], response_model=Label, max_tokens=200)
        assert all(isinstance(r.error, llmbatch.StructuredOutputError) for r in results)
        assert all(r.error.reasks == 2 for r in results)  # type: ignore[union-attr]
        assert all(r.error.attempts == 3 for r in results)  # type: ignore[union-attr]
        assert client.stats().structured.reasked == 1 + 3 * 2


async def test_an_answer_cut_by_max_tokens_is_not_reasked(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        with pytest.raises(llmbatch.OutputTruncatedError, match="max_tokens"):
            await client.complete("Label it", response_model=Label, max_tokens=3)
        assert client.stats().structured.reasked == 0


async def test_guided_json_reaches_a_current_vllm_as_structured_outputs(
    sim: SimulatorProcess,
) -> None:
    schema = Label.model_json_schema()
    async with llmbatch.Client(sim.base_url) as client:
        # vLLM >= 0.12 (the simulator is 0.32) would ignore guided_json: it is
        # translated, so the answer is constrained rather than free text.
        answer = await client.complete("Label it", guided_json=schema, max_tokens=200)
        Label.model_validate_json(answer.text)
        inside = await client.complete(
            "Label it", extra_body={"guided_json": schema}, max_tokens=200
        )
        Label.model_validate_json(inside.text)
        with pytest.raises(llmbatch.InvalidRequestError, match="structured-outputs-config"):
            await client.complete("x", guided_decoding_backend="xgrammar")


async def test_bad_response_models_fail_at_the_call(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        with pytest.raises(llmbatch.InvalidTypeError, match="response_model"):
            await client.complete("x", response_model=object())
        with pytest.raises(llmbatch.InvalidRequestError, match="response_format"):
            await client.chat(
                [{"role": "user", "content": "x"}],
                response_model=Label,
                response_format={"type": "json_object"},
            )
        with pytest.raises(llmbatch.InvalidRequestError, match="max_reasks"):
            await client.complete("x", response_model=Label, max_reasks=-1)
        with pytest.raises(llmbatch.InvalidTypeError, match="response_model"):
            await client.map(["x"], response_model=3)


def test_the_sync_client_takes_it_too(sim: SimulatorProcess) -> None:
    with llmbatch.SyncClient(sim.base_url) as client:
        label = client.complete("Label it", response_model=Label, max_tokens=200).parsed
        assert isinstance(label, Label)
        results: list[llmbatch.Result[Label]] = client.map(
            ["a", "b"], response_model=Label, max_tokens=200
        )
        assert all(isinstance(r.unwrap(), Label) for r in results)


def test_results_dump_the_validated_object_and_the_answer() -> None:
    answer: Any = None
    result = llmbatch.Result(index=0, value=Label(mood=Mood.SAD, urgent=True, score=3))
    assert result.to_dict()["value"] == {"mood": "sad", "urgent": True, "score": 3}
    assert result.response is answer


def test_ray_rows_get_a_parsed_column(sim: SimulatorProcess) -> None:
    import llmbatch.ray

    rows = llmbatch.ray.Completions(sim.base_url, response_model=Label, max_tokens=200)
    try:
        out = rows({"prompt": ["label a", 7, "label b"]})
    finally:
        rows.close()
    assert out["error"][1].startswith("InvalidTypeError")
    assert out["parsed"][1] is None
    for i in (0, 2):
        assert out["error"][i] is None
        assert Label.model_validate_json(out["parsed"][i]) == Label.model_validate_json(
            out["completion"][i]
        )


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the drop-in opens its own client
async def test_openais_parse_through_the_drop_in(sim: SimulatorProcess) -> None:
    from llmbatch.openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=sim.base_url, api_key="unused")
    try:
        beta = getattr(client.beta.chat.completions, "parse", None)
        parse = beta if beta is not None else client.chat.completions.parse
        completion = await parse(
            model="llmbatch-sim",
            messages=[{"role": "user", "content": "Label it"}],
            response_format=Label,
            max_tokens=200,
        )
        assert isinstance(completion.choices[0].message.parsed, Label)
        assert client.stats().batches_sent >= 1
    finally:
        await client.close()
