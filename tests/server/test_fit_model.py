"""The fit's arithmetic and its file, on numbers (no server)."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch_server.fit.cli import describe, describe_limits
from llmbatch_server.fit.model import (
    BurstPoint,
    DecodePoint,
    Fit,
    FittedLimits,
    PrefillPoint,
    fit_step,
    line,
    load_fit,
    step_spread,
)
from llmbatch_server.sim.options import describe_fitted


def _points(
    base: float, per_seq: float, per_token: float, per_request: float, per_prompt: float = 0.0
) -> tuple[list[DecodePoint], list[PrefillPoint]]:
    """What the simulator's model gives: a one-prompt request costs the API server
    ``per_request + per_prompt``, then one step."""
    decode = [DecodePoint(k, base + per_seq * k) for k in (1, 2, 4, 8, 16, 32, 64)]
    prefill = [
        PrefillPoint(t, per_request + per_prompt + base + per_seq + per_token * t)
        for t in (16, 256, 1024)
    ]
    return decode, prefill


@given(
    base=st.floats(1e-3, 0.1),
    per_seq=st.floats(0, 5e-3),
    per_token=st.floats(0, 1e-3),
    per_request=st.floats(0, 0.01),
)
def test_exact_points_give_back_the_model_they_came_from(
    base: float, per_seq: float, per_token: float, per_request: float
) -> None:
    decode, prefill = _points(base, per_seq, per_token, per_request)
    step, worst = fit_step(decode, prefill)
    assert step.base == pytest.approx(base, rel=1e-6, abs=1e-9)
    assert step.per_sequence == pytest.approx(per_seq, rel=1e-6, abs=1e-9)
    assert step.per_prefill_token == pytest.approx(per_token, rel=1e-6, abs=1e-9)
    assert step.per_request == pytest.approx(per_request, rel=1e-5, abs=1e-8)
    assert worst < 1e-6


def test_a_batch_request_gives_the_api_servers_cost_per_prompt() -> None:
    decode, prefill = _points(0.02, 0.001, 0.0002, 0.002, per_prompt=0.0001)
    # 16 prompts of 20 tokens in one request: the request's cost, one step of 16
    # sequences prefilling 320 tokens, and 100 µs per prompt.
    latency = 0.002 + (0.02 + 0.001 * 16 + 0.0002 * 320) + 16 * 0.0001
    step, _ = fit_step(
        decode, prefill, batch_prompts=16, batch_latency_s=latency, batch_prompt_tokens=320
    )
    assert step.per_prompt == pytest.approx(0.0001)
    assert step.per_request == pytest.approx(0.002)


@given(
    per_request=st.floats(1e-4, 0.01),
    per_prompt=st.floats(0, 2e-3),
    overhead=st.floats(0, 5e-3),
)
def test_a_burst_gives_the_api_servers_cost_free_of_a_requests_fixed_latency(
    per_request: float, per_prompt: float, overhead: float
) -> None:
    """Every request also carries a fixed latency (the client's, the network's) that
    is not the API server's: the burst's slope leaves it out, the intercept cannot."""
    base, per_seq, per_token = 0.005, 0.0002, 0.0001
    decode, prefill = _points(base, per_seq, per_token, per_request + overhead, per_prompt)
    latency = overhead + per_request + 16 * per_prompt + base + per_seq * 16 + per_token * 320
    burst = [
        BurstPoint(n, overhead + n * (per_request + per_prompt) + base + per_seq) for n in (8, 40)
    ]
    step, _ = fit_step(
        decode,
        prefill,
        batch_prompts=16,
        batch_latency_s=latency,
        batch_prompt_tokens=320,
        burst=burst,
    )
    assert step.per_prompt == pytest.approx(per_prompt, rel=1e-6, abs=1e-9)
    assert step.per_request == pytest.approx(per_request, rel=1e-6, abs=1e-9)


def test_noise_never_gives_a_negative_cost() -> None:
    decode = [DecodePoint(1, 0.010), DecodePoint(4, 0.009), DecodePoint(16, 0.008)]
    prefill = [PrefillPoint(16, 0.005), PrefillPoint(1024, 0.004)]
    step, worst = fit_step(decode, prefill)
    assert (step.per_sequence, step.per_prefill_token, step.per_request) == (0.0, 0.0, 0.0)
    assert step.base == pytest.approx(0.009)
    assert worst > 0


def test_line_needs_points_and_fits_a_flat_one() -> None:
    with pytest.raises(ValueError, match="at least one"):
        line([], [])
    assert line([3, 3], [1.0, 2.0]) == (1.5, 0.0)
    with pytest.raises(ValueError, match="decode and prefill"):
        fit_step([], [PrefillPoint(1, 0.1)])


def _fit() -> Fit:
    decode, prefill = _points(0.02, 0.001, 0.0002, 0.002)
    step, worst = fit_step(decode, prefill)
    return Fit(
        model="m",
        step=step,
        limits=FittedLimits(max_num_seqs=16, max_model_len=1024),
        idle_ttft_s=0.03,
        idle_tpot_s=0.021,
        decode=tuple(decode),
        prefill=tuple(prefill),
        burst=(BurstPoint(8, 0.05), BurstPoint(40, 0.2)),
        worst_residual=worst,
    )


def test_the_file_round_trips(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "fit.json"
    fit = _fit()
    fit.save(path)
    assert json.loads(path.read_text())["format"] == 1
    assert load_fit(path) == fit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw | {"format": 2}, "format 2, expected 1"),
        (lambda raw: {k: v for k, v in raw.items() if k != "step"}, "KeyError"),
        (lambda raw: raw | {"step": raw["step"] | {"base": -1}}, "step.base must be"),
        (lambda raw: raw | {"limits": {"max_num_seq": 3}}, "max_num_seq"),
    ],
)
def test_a_bad_file_is_refused_saying_why(
    tmp_path: pathlib.Path, edit: object, message: str
) -> None:
    path = tmp_path / "fit.json"
    raw = _fit().to_json()
    path.write_text(json.dumps(edit(raw)))  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        load_fit(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_fit(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_fit(tmp_path / "bad.json")


def test_the_summary_says_the_limits_in_words() -> None:
    text = describe(_fit())
    assert "FittedLimits(" not in text
    assert text.splitlines()[-1] == (
        "limits: runs at most 16 sequences at once; context 1,024 tokens "
        "(no KV-cache size (no vLLM cache_config_info in /metrics))"
    )
    assert "bursts of requests: 8: 50.0 ms, 40: 200.0 ms" in text
    assert describe_limits(FittedLimits()) == (
        "limits: none shown (no sequence limit up to the largest probe; no KV-cache size "
        "(no vLLM cache_config_info in /metrics))"
    )


def test_the_simulators_start_line_names_the_fit() -> None:
    fit = _fit()
    assert describe_fitted("vllm-fit.json", fit) == (
        "fitted to vllm-fit.json (model 'm'): step 20.00 ms + 1000 µs a running sequence, "
        "API server 2.00 ms a request"
    )


@given(width=st.floats(0.0, 0.6), seed=st.integers(0, 1000))
def test_the_spread_of_uniform_gaps_is_their_half_width(width: float, seed: int) -> None:
    import random

    rng = random.Random(seed)
    gaps = [0.01 * (1 + width * (2 * rng.random() - 1)) for _ in range(2000)]
    assert step_spread(gaps) == pytest.approx(width, abs=0.03)


def test_a_few_stalls_are_not_spread_and_few_gaps_say_nothing() -> None:
    gaps = [0.01] * 95 + [0.5] * 5
    assert step_spread(gaps) == 0.0
    assert step_spread([0.01, 0.02] * 4) == 0.0


def test_tokens_delivered_in_bunches_count_as_the_steps_they_took() -> None:
    import random

    rng = random.Random(3)
    steps = [0.01 * (1 + 0.1 * (2 * rng.random() - 1)) for _ in range(2000)]
    # The server sends each two tokens together: a wait of two steps, then nothing.
    bunched = [g for a, b in zip(steps[::2], steps[1::2], strict=True) for g in (0.0, a + b)]
    assert step_spread(bunched) < 0.15  # the steps' +-10 %, not +-95 %
