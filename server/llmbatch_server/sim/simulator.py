"""One simulated server's state: engine, fault injector, front-end queue and the
sequences a validated request turns into."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from llmbatch_server.sim import output, schema
from llmbatch_server.sim.config import SimConfig
from llmbatch_server.sim.counting import load_counter
from llmbatch_server.sim.engine import Engine, Group, Sequence
from llmbatch_server.sim.faults import FaultInjector
from llmbatch_server.sim.limiter import RateLimiter
from llmbatch_server.sim.outage import Outage
from llmbatch_server.sim.prefix_cache import block_hashes
from llmbatch_server.sim.requests import Generation
from llmbatch_server.sim.schema import Constraint


class Simulator:
    """Everything one simulated vLLM server holds between requests."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        #: Counts prompt tokens for usage, limits and /tokenize alike.
        self.counter = load_counter(config.tokenizer)
        self.engine = Engine(
            config.limits, config.step, seed=config.seed, queue_gauge=config.queue_gauge
        )
        self.faults = FaultInjector(config.faults, seed=config.seed + 7919 * config.replica)
        self.outage = Outage(on_restart=self.restart)
        self.limiter = (
            RateLimiter(
                requests_per_minute=config.rate_limit_rpm,
                tokens_per_minute=config.rate_limit_tpm,
                family=config.rate_limit_headers,  # type: ignore[arg-type]
                clock=time.monotonic,
            )
            if config.rate_limit_rpm is not None or config.rate_limit_tpm is not None
            else None
        )
        self._frontend_free_at = 0.0
        #: HTTP requests by (handler, method, status class), for ``/metrics``.
        self.http_requests: Counter[tuple[str, str, str]] = Counter()
        #: Requests in flight on the generation routes (``GET /load``).
        self.server_load = 0

    async def frontend(self, prompts: int) -> None:
        """Model the API server's serial per-request work (fewer, larger requests win)."""
        cost = self.config.step.frontend_seconds(prompts)
        if cost <= 0:
            return
        now = time.monotonic()
        self._frontend_free_at = max(self._frontend_free_at, now) + cost
        delay = self._frontend_free_at - now
        if delay > 0.0002:  # below this, sleeping costs more than it models
            await asyncio.sleep(delay)

    def sequences(self, gen: Generation, group: Group) -> list[Sequence]:
        """The engine sequences of ``gen``: choice ``prompt_index * n + j`` for each prompt."""
        limits = self.config.limits
        seed = self.config.seed if gen.seed is None else gen.seed
        out = []
        for p, (prompt, count) in enumerate(zip(gen.prompts, gen.prompt_tokens, strict=True)):
            max_tokens = (
                gen.max_tokens if gen.max_tokens is not None else limits.max_model_len - count
            )
            hashes: tuple[int, ...] | None = None
            if limits.enable_prefix_caching:
                ids = gen.prompt_ids[p] if gen.prompt_ids else self.counter.encode(prompt)
                hashes = block_hashes(ids, limits.block_size, gen.cache_salt)
            for j in range(gen.n):
                # The text depends on the prompt and the sample j, not on the
                # prompt's place in the list: vLLM runs each prompt as its own
                # request, so a prompt alone or in a batch gets the same answer.
                out_seed = output.output_seed(prompt, j, seed)
                seq = _sequence(group, p * gen.n + j, out_seed, count, max_tokens, gen)
                if gen.constraint is not None:
                    _constrain(seq, gen.constraint, max_tokens, self.config.invalid_json)
                seq.block_hashes = hashes
                out.append(seq)
        return out

    def cached_tokens(self, gen: Generation, sequences: list[Sequence]) -> int | None:
        """What ``usage.prompt_tokens_details.cached_tokens`` reports for ``gen``'s
        admitted ``sequences``: None unless ``--enable-prompt-tokens-details``.

        Summed over the prompts, each counted once (by its first choice) as
        ``prompt_tokens`` counts it, so the two compare. (vLLM's
        ``/v1/completions`` reports only the last prompt's for a list.)
        """
        if not self.config.enable_prompt_tokens_details:
            return None
        return sum(seq.cached_tokens for seq in sequences[:: gen.n])

    def restart(self) -> None:
        """What a restart loses: every request in flight and the prefix cache."""
        self.engine.abort_all()
        self.engine.reset_prefix_cache()


def _constrain(seq: Sequence, constraint: Constraint, max_tokens: int, invalid: float) -> None:
    """Make ``seq`` answer with an instance of the constraint (cut at ``max_tokens``,
    as a real engine cuts it)."""
    pieces = schema.answer_pieces(constraint, seq.seed, invalid)
    seq.pieces = pieces
    if len(pieces) > max_tokens:
        seq.target = seq.visible = max_tokens
        seq.finish_reason = "length"
    else:
        seq.target = seq.visible = len(pieces)
        seq.finish_reason = "stop"
    seq.stop_reason = None


def _sequence(
    group: Group, index: int, out_seed: int, count: int, max_tokens: int, gen: Generation
) -> Sequence:
    target, visible, reason, stop_reason = max_tokens, max_tokens, "length", None
    if not gen.ignore_eos:
        natural = max(output.natural_length(out_seed), gen.min_tokens)
        if natural < max_tokens:
            target, visible, reason = natural, natural, "stop"
    if gen.stop:
        for position in range(gen.min_tokens, target):
            w = output.word(out_seed, position)
            hit = next((s for s in gen.stop if s and s in w), None)
            if hit is not None:
                target, visible, reason, stop_reason = position + 1, position, "stop", hit
                break
    return Sequence(
        group=group,
        index=index,
        prompt_tokens=count,
        target=target,
        visible=visible,
        finish_reason=reason,
        stop_reason=stop_reason,
        seed=out_seed,
    )
