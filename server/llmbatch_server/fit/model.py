"""What a fit is: the measured points, the step model fitted to them, the JSON file.

Pure: no I/O beyond reading and writing the file, so the arithmetic is tested on
numbers. The step model has the simulator's shape (``StepModel``): a decode step
costs ``base + per_sequence * running``, each prompt token prefilled in a step adds
``per_prefill_token``, and the API server spends ``per_request + per_prompt * n``
on each HTTP request before the engine sees it.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: Bumped when a field changes meaning; readers refuse other versions.
FORMAT = 1


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """Time per output token with ``sequences`` decoding at once (median over them)."""

    sequences: int
    tpot_s: float
    #: The most sequences the server reported running meanwhile (None: no /metrics).
    peak_running: int | None = None


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """Latency of one prompt of ``prompt_tokens`` tokens answered with one token."""

    prompt_tokens: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class BurstPoint:
    """Seconds from sending ``requests`` one-prompt requests at once (one output
    token each) to the last answer: the API server works through them one by one."""

    requests: int
    seconds: float


@dataclass(frozen=True, slots=True)
class FittedStep:
    """The simulator's step model, in seconds (the field names of ``StepModel``)."""

    base: float
    per_sequence: float
    per_prefill_token: float
    per_request: float
    per_prompt: float
    #: The steps' spread, as the half-width of a uniform spread around the model
    #: (``StepModel.jitter``), from the inter-token gaps of streams; 0 if not measured.
    jitter: float = 0.0


@dataclass(frozen=True, slots=True)
class FittedLimits:
    """The engine limits seen from outside; None where the server did not show one."""

    max_num_seqs: int | None = None
    max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    block_size: int | None = None


@dataclass(frozen=True, slots=True)
class Fit:
    """One ``llmbatch-server fit`` run: the model, its limits and what they rest on."""

    model: str
    step: FittedStep
    limits: FittedLimits
    idle_ttft_s: float
    idle_tpot_s: float
    decode: tuple[DecodePoint, ...] = ()
    prefill: tuple[PrefillPoint, ...] = ()
    burst: tuple[BurstPoint, ...] = ()
    #: The largest relative gap between a measured point and the fitted line.
    worst_residual: float = 0.0
    url: str = ""
    measured_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = FORMAT
        return out

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def load_fit(path: str | pathlib.Path) -> Fit:
    """Read a fit file; ValueError naming what is wrong with it."""
    try:
        raw = json.loads(pathlib.Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read fit file {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"fit file {path} is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise ValueError(f"fit file {path}: format {found!r}, expected {FORMAT}")
    try:
        step = FittedStep(**{k: float(v) for k, v in raw["step"].items()})
        limits = FittedLimits(**raw.get("limits", {}))
        fit = Fit(
            model=str(raw["model"]),
            step=step,
            limits=limits,
            idle_ttft_s=float(raw["idle_ttft_s"]),
            idle_tpot_s=float(raw["idle_tpot_s"]),
            decode=tuple(DecodePoint(**p) for p in raw.get("decode", ())),
            prefill=tuple(PrefillPoint(**p) for p in raw.get("prefill", ())),
            burst=tuple(BurstPoint(**p) for p in raw.get("burst", ())),
            worst_residual=float(raw.get("worst_residual", 0.0)),
            url=str(raw.get("url", "")),
            measured_at=str(raw.get("measured_at", "")),
            extra=dict(raw.get("extra", {})),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"fit file {path}: {exc!r}") from exc
    for name, value in asdict(step).items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"fit file {path}: step.{name} must be a finite number >= 0")
    return fit


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b * x`` over the points; (a, b)."""
    if len(xs) != len(ys) or not xs:
        raise ValueError("need as many x as y, at least one")
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return mean_y - slope * mean_x, slope


def step_spread(gaps: Sequence[float]) -> float:
    """The ``StepModel.jitter`` that a stream's inter-token ``gaps`` imply: the
    half-width of a uniform spread around their median, read from their 10th and 90th
    percentiles (which sit at 0.8 of it), so a few stalls (a scheduler hiccup, a
    collection) do not count as spread. Tokens delivered together (an API server that
    falls behind sends several at once: gaps near zero) count as one wait shared by
    the tokens it brought, so the spread is the steps', not the delivery's. 0 with
    fewer than 10 gaps; below 1 always."""
    if len(gaps) < 10:
        return 0.0
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return 0.0
    per_token: list[float] = []
    waited, tokens = 0.0, 0
    for gap in gaps:
        waited += gap
        tokens += 1
        if waited >= BUNCHED * mean:
            per_token.extend([waited / tokens] * tokens)
            waited, tokens = 0.0, 0
    if len(per_token) < 10:
        return 0.0
    ordered = sorted(per_token)
    n = len(ordered)
    median = ordered[n // 2]
    low, high = ordered[n // 10], ordered[(9 * n) // 10]
    return min((high - low) / (1.6 * median), 0.95)


#: A gap shorter than this share of the mean is a token delivered with the next.
BUNCHED = 0.25


def fit_step(
    decode: Sequence[DecodePoint],
    prefill: Sequence[PrefillPoint],
    *,
    batch_prompts: int = 0,
    batch_latency_s: float = 0.0,
    batch_prompt_tokens: int = 0,
    burst: Sequence[BurstPoint] = (),
    gaps: Sequence[float] = (),
) -> tuple[FittedStep, float]:
    """The step model the points imply, and the worst relative residual.

    Decode: TPOT against running sequences is the line ``base + per_sequence * k``.
    Prefill: one prompt answered with one token takes the API server's
    ``per_request + per_prompt``, then one step of one sequence with all its prompt
    tokens, so the slope is ``per_prefill_token``. A batch of ``batch_prompts``
    short prompts in one HTTP request takes ``batch_prompts - 1`` more prompts'
    API-server work than one such prompt alone, plus its larger step: that gives
    ``per_prompt``. A burst of one-prompt requests sent at once is served one after
    another by the API server, so the slope of its time against the number of
    requests is ``per_request + per_prompt``: free of the fixed latency of one
    request (the client's and the network's), which the prefill line's intercept
    carries and would count as the API server's. Without a burst, what the decode
    line does not explain of that intercept is ``per_request``.
    """
    if not decode or not prefill:
        raise ValueError("a fit needs decode and prefill points")
    base, per_sequence = line([p.sequences for p in decode], [p.tpot_s for p in decode])
    if per_sequence < 0:  # flat within noise: a step costs the same at any batch
        base, per_sequence = sum(p.tpot_s for p in decode) / len(decode), 0.0
    base = max(base, 0.0)
    intercept, per_token = line([p.prompt_tokens for p in prefill], [p.latency_s for p in prefill])
    per_token = max(per_token, 0.0)
    per_prompt = 0.0
    if batch_prompts > 1:
        alone_tokens = batch_prompt_tokens / batch_prompts
        alone = intercept + per_token * alone_tokens  # one such prompt in its own request
        more_step = per_sequence * (batch_prompts - 1) + per_token * (
            batch_prompt_tokens - alone_tokens
        )
        per_prompt = max((batch_latency_s - alone - more_step) / (batch_prompts - 1), 0.0)
    if len({p.requests for p in burst}) > 1:
        _, per_burst_request = line([p.requests for p in burst], [p.seconds for p in burst])
        per_request = max(per_burst_request - per_prompt, 0.0)
    else:
        per_request = max(intercept - base - per_sequence - per_prompt, 0.0)
    residuals = [abs(p.tpot_s - (base + per_sequence * p.sequences)) / p.tpot_s for p in decode] + [
        abs(p.latency_s - (intercept + per_token * p.prompt_tokens)) / p.latency_s for p in prefill
    ]
    fitted = FittedStep(
        base=base,
        per_sequence=per_sequence,
        per_prefill_token=per_token,
        per_request=per_request,
        per_prompt=per_prompt,
        jitter=step_spread(gaps),
    )
    return fitted, max(residuals)
