"""What the simulator's step model says is possible: the idle per-token time, the
step time at a running batch, and the best throughput under a per-token SLO.

vLLM (and the simulator) give every running sequence one token per engine step, and
a step takes longer the more sequences run. A realtime stream's time per output
token is the step time, so a per-token SLO caps the running batch: the best any
client can do under it is to keep exactly the largest batch whose step still meets
the SLO, which makes ``N / step_seconds(N)`` tokens per second. That bound is what
the ``slo`` scenario's bulk throughput is judged against.

:func:`best_under_slo` is pure (a step function in, a :class:`Bound` out);
:func:`sim_model` reads the step model and engine limits out of the simulator's
own argument parser, so the bound follows whatever ``--speed``, ``--profile`` or
``--max-num-seqs`` the simulator was started with.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Bound", "SimModel", "best_under_slo", "sim_model"]

#: Tokens of a benchmark prompt when the simulator's counter is not at hand.
DEFAULT_PROMPT_TOKENS = 40


@dataclass(frozen=True, slots=True)
class Bound:
    """The largest running batch whose step meets the SLO, and what it produces."""

    sequences: int
    step_s: float
    tokens_per_s: float
    prompts_per_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def best_under_slo(
    step_seconds: Callable[[int], float], tpot: float, max_seqs: int, max_tokens: int
) -> Bound | None:
    """The best steady state under a per-token SLO of ``tpot`` seconds.

    ``step_seconds(n)`` is the step time with ``n`` sequences running (non-decreasing
    in ``n``); ``max_seqs`` the server's ``max_num_seqs``. None when even one sequence
    misses the SLO.
    """
    best = None
    for n in range(1, max_seqs + 1):
        if step_seconds(n) > tpot:
            break
        best = n
    if best is None:
        return None
    step = step_seconds(best)
    tokens = best / step
    return Bound(
        sequences=best, step_s=step, tokens_per_s=tokens, prompts_per_s=tokens / max_tokens
    )


@dataclass(frozen=True, slots=True)
class SimModel:
    """The simulator's calibrated step model as one benchmark workload sees it."""

    base: float
    per_sequence: float
    per_prefill_token: float
    speed: float
    max_num_seqs: int
    #: Prompt tokens of a benchmark prompt and tokens generated for it: each sequence
    #: is prefilled once in ``max_tokens`` steps, so a step of ``n`` carries
    #: ``n * prompt_tokens / max_tokens`` prefill tokens on average.
    prompt_tokens: int
    max_tokens: int

    def step_seconds(self, running: float) -> float:
        """Mean step time with ``running`` sequences in steady state (prefill amortised)."""
        if running <= 0:
            return 0.0
        prefill = running * self.prompt_tokens / self.max_tokens
        modelled = self.base + self.per_sequence * running + self.per_prefill_token * prefill
        return modelled / self.speed

    @property
    def idle_token_seconds(self) -> float:
        """A lone stream's time per output token: a step of one sequence, no prefill."""
        return (self.base + self.per_sequence) / self.speed

    def bound(self, tpot: float) -> Bound | None:
        """:func:`best_under_slo` for this model."""
        return best_under_slo(self.step_seconds, tpot, self.max_num_seqs, self.max_tokens)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sim_model(sim_args: Sequence[str], max_tokens: int, prompts: Sequence[str] = ()) -> SimModel:
    """The model ``llmbatch-server sim *sim_args`` runs (its own parser and defaults).

    ``prompts`` (benchmark prompts) are counted with the simulator's token counter,
    their mean taken as a prompt's tokens;
    raises ``RuntimeError`` if the server package is missing or the arguments are not
    the simulator's, and ``ValueError`` for ``--zero-latency`` (no step model).
    """
    try:
        from llmbatch_server.sim import options
        from llmbatch_server.sim.counting import EstimateCounter
    except ImportError as exc:  # pragma: no cover - the bench depends on the server
        raise RuntimeError("the step model needs the llmbatch-server package") from exc
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    options.add_parser(parser.add_subparsers(dest="command"))
    try:
        args, unknown = parser.parse_known_args(["sim", *sim_args])
    except (argparse.ArgumentError, SystemExit) as exc:
        raise RuntimeError(f"not simulator arguments: {list(sim_args)}") from exc
    if unknown:
        raise RuntimeError(f"not simulator arguments: {unknown}")
    if args.zero_latency:
        raise ValueError("a --zero-latency simulator has no step model")
    config = options.config_from_args(args)
    step = config.step
    counter = EstimateCounter()
    tokens = (
        round(sum(counter.count(p) for p in prompts) / len(prompts))
        if prompts
        else DEFAULT_PROMPT_TOKENS
    )
    if not math.isfinite(step.speed) or step.speed <= 0:
        raise ValueError(f"bad simulator speed {step.speed}")
    return SimModel(
        base=step.base,
        per_sequence=step.per_sequence,
        per_prefill_token=step.per_prefill_token,
        speed=step.speed,
        max_num_seqs=config.limits.max_num_seqs,
        prompt_tokens=tokens,
        max_tokens=max_tokens,
    )
