"""A discrete-time model of vLLM's continuous-batching engine.

Each step: every running sequence whose prompt is prefilled gets one token;
waiting sequences join while ``max_num_seqs``, the per-step token budget
(chunked prefill) and KV-cache capacity (in blocks, with prefix caching: see
:mod:`llmbatch_server.sim.prefix_cache`) allow; the step lasts
``StepModel.step_seconds`` (spread by its jitter, drawn from a seeded generator).

With ``EngineLimits.preemption`` the KV cache fills as vLLM's v1 scheduler fills
it: a running sequence takes one more block when its output fills the last, and
when none is free the scheduler preempts a running sequence (under the priority
policy the lowest priority, latest arrival first; under fcfs the last admitted)
by recomputation: its blocks are freed, and it waits at its old place in the queue
to prefill its prompt and the tokens it had generated again. No new sequence is
admitted in a step that preempted. Time comes from injectable ``clock``/``sleep``
callables, so tests can run hours of modelled time instantly.

Sequences belong to a ``Group`` (one HTTP request); the group learns about new
tokens and completion through plain callbacks, which keeps a step cheap.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmbatch_server.sim import output
from llmbatch_server.sim.config import EngineLimits, StepModel
from llmbatch_server.sim.metrics import EngineMetrics
from llmbatch_server.sim.prefix_cache import BlockTable, KVCache


class Overloaded(Exception):
    """The waiting queue is at ``max_num_queued_reqs``."""


@dataclass(eq=False, slots=True)
class Sequence:
    """One prompt's one choice inside the engine."""

    group: Group
    index: int  # choice index within the group
    prompt_tokens: int
    #: Tokens this sequence will generate (a matched stop word included); 0 for
    #: a pooling (embedding) request, which ends with its prefill.
    target: int
    visible: int  # tokens that appear in the text (a matched stop word is not shown)
    finish_reason: str
    stop_reason: str | None
    seed: int
    #: Chained hashes of the prompt's full KV blocks; None for a sequence that
    #: does not use the prefix cache (caching off, or an embedding).
    block_hashes: tuple[int, ...] | None = None
    priority: int = 0
    arrival: float = 0.0
    #: Its place in the waiting queue's order (kept for a return after preemption).
    order: int = 0
    #: Output tokens to prefill again after a preemption (recomputation).
    recompute: int = 0
    prefilled: int = 0
    #: Prompt tokens found in the prefix cache when admitted, so not prefilled
    #: (vLLM's ``num_cached_tokens``, shown in ``usage.prompt_tokens_details``).
    cached_tokens: int = 0
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished: bool = False
    table: BlockTable | None = None  # its KV blocks, once admitted
    #: A constrained answer's tokens (structured outputs); None: generated words.
    pieces: tuple[str, ...] | None = None

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.target

    @property
    def prefill_target(self) -> int:
        """Tokens to prefill before it generates: its prompt, and after a preemption
        the output it had generated too."""
        return self.prompt_tokens + self.recompute

    def text(self, start: int = 0, stop: int | None = None) -> str:
        end = min(self.generated if stop is None else stop, self.visible)
        if end <= start:
            return ""
        if self.pieces is not None:
            return "".join(self.pieces[start:end])
        return output.text(self.seed, start, end)


@dataclass(eq=False)
class Group:
    """The sequences of one HTTP request and how it wants to hear about them."""

    on_tokens: Callable[[Sequence, int], None] | None = None
    on_done: Callable[[Group], None] | None = None
    sequences: list[Sequence] = field(default_factory=list)
    pending: int = 0
    aborted: bool = False
    #: The request's OpenAI ``user``, if it named one.
    user: str | None = None


class Engine:
    """The scheduler loop. ``run()`` forever in a task; ``add()`` groups to it."""

    def __init__(
        self,
        limits: EngineLimits,
        step: StepModel,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        seed: int = 0,
        queue_gauge: str = "step",
    ) -> None:
        self.limits = limits
        self._live_gauges = queue_gauge == "live"
        self._shown = (0, 0)
        """Running and waiting as the last step left them (vLLM v1's gauges)."""
        self.step_model = step
        self.metrics = EngineMetrics()
        self._clock = clock
        self._sleep = sleep
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._running: list[Sequence] = []
        self.kv = KVCache(
            -(-limits.kv_cache_tokens // limits.block_size),
            limits.block_size,
            caching=limits.enable_prefix_caching,
        )
        self._counter = itertools.count()
        self._jitter = random.Random(seed)
        self._wake = asyncio.Event()
        self.steps = 0
        self.busy_seconds = 0.0
        self.in_system = 0
        #: Whether any request has named a ``user`` (then steps count them).
        self._users = False
        """Sequences added and not yet finished or aborted (running or waiting)."""

    # -- public ----------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def gauges(self) -> tuple[int, int]:
        """Running and waiting as ``/metrics`` and the load report show them: after
        the last step (``queue_gauge="step"``, vLLM v1: a request that arrived during
        a step is in neither until a step schedules it), or now (``"live"``)."""
        if self._live_gauges:
            return len(self._running), len(self._waiting)
        return self._shown

    @property
    def kv_usage(self) -> float:
        return self.kv.usage

    def add(self, group: Group, sequences: list[Sequence], priority: int = 0) -> None:
        """Queue ``sequences`` for ``group``; raises Overloaded past the queue cap."""
        cap = self.limits.max_num_queued_reqs
        if cap is not None and len(self._waiting) + len(sequences) > cap:
            raise Overloaded
        now = self._clock()
        use_priority = self.limits.scheduling_policy == "priority"
        group.sequences = sequences
        group.pending = len(sequences)
        if group.user is not None:
            self._users = True
        self.in_system += len(sequences)
        self.metrics.peak_sequences = max(self.metrics.peak_sequences, self.in_system)
        for seq in sequences:
            seq.arrival = now
            seq.priority = priority
            key = priority if use_priority else 0
            seq.order = next(self._counter)
            heapq.heappush(self._waiting, (key, seq.order, seq))
        self._wake.set()

    def abort(self, group: Group) -> None:
        """Stop generating for ``group`` (its client went away); frees its KV at once."""
        if group.aborted:
            return
        group.aborted = True
        for seq in group.sequences:
            if not seq.finished:
                seq.finished = True
                self.in_system -= 1
                if seq.table is not None:
                    self.kv.release(seq.table)
        self._running = [s for s in self._running if not s.finished]
        self.metrics.aborted += 1
        # Waiting entries are dropped lazily when they reach the head of the queue.

    def abort_all(self) -> None:
        """Abort every request, running or waiting (a restarting server loses them)."""
        groups = {seq.group for seq in self._running}
        groups.update(entry[2].group for entry in self._waiting)
        for group in groups:
            self.abort(group)
        self._waiting.clear()
        self._shown = (0, 0)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block no sequence holds."""
        self.kv.reset()

    async def run(self) -> None:
        """Step while there is work; sleep on an event while idle."""
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            started = self._clock()
            batch, prefill = self._schedule(started)
            step = self.step_model
            draw = self._jitter.random() if step.jitter else 0.5
            seconds = step.step_seconds(len(batch), prefill, draw)
            self.steps += 1
            self.busy_seconds += seconds
            remaining = started + seconds - self._clock()
            # Yield even for a zero-cost step so HTTP handlers keep running.
            await self._sleep(max(remaining, 0.0))
            self._advance(batch)
            self._shown = (len(self._running), len(self._waiting))

    # -- one step --------------------------------------------------------------

    def _schedule(self, now: float) -> tuple[list[Sequence], int]:
        """Admit and prefill; return the step's batch and its prefill tokens."""
        budget = self.limits.max_num_batched_tokens
        prefill = 0
        batch: list[Sequence] = []
        preempted = self.limits.preemption and self._grow_or_preempt()
        for seq in self._running:
            if seq.prefilled < seq.prefill_target:
                chunk = min(seq.prefill_target - seq.prefilled, budget)
                if chunk == 0:
                    continue
                seq.prefilled += chunk
                prefill += chunk
                budget -= chunk
                assert seq.table is not None
                self.kv.computed(seq.table, seq.prefilled)
            else:
                budget -= 1
            batch.append(seq)
        limits = self.limits
        while (
            self._waiting
            and len(self._running) < limits.max_num_seqs
            and budget > 0
            and not preempted
        ):
            seq = self._waiting[0][2]
            if seq.finished:  # aborted while waiting
                heapq.heappop(self._waiting)
                continue
            # Incremental: the blocks its prefill fills and the one its first token
            # starts (an embedding needs its prompt's alone); else all it may use.
            kv_tokens = (
                seq.prefill_target + (seq.target > 0) if limits.preemption else seq.kv_tokens
            )
            table = self.kv.admit(seq.block_hashes, seq.prompt_tokens, kv_tokens)
            if table is None:
                break
            heapq.heappop(self._waiting)
            seq.table = table
            seq.scheduled_at = now
            self.metrics.queue_time.observe(now - seq.arrival)
            # Cached prefix blocks need no prefill: only the rest is computed.
            seq.cached_tokens = len(table.cached) * self.kv.block_size
            seq.prefilled = seq.cached_tokens
            chunk = min(seq.prefill_target - seq.prefilled, budget)
            seq.prefilled += chunk
            self.kv.computed(table, seq.prefilled)
            prefill += chunk
            budget -= chunk
            self._running.append(seq)
            batch.append(seq)
        self.metrics.peak_running = max(self.metrics.peak_running, len(batch))
        if self._users:
            self._count_users(batch)
        return batch, prefill

    def _grow_or_preempt(self) -> bool:
        """Give each decoding sequence the block its next token needs, preempting
        others (or itself) when none is free; returns whether any was preempted."""
        kv = self.kv
        preempted = False
        for seq in list(self._running):
            table = seq.table
            if table is None or seq.prefilled < seq.prefill_target or not seq.target:
                continue  # preempted this step already, or not decoding
            need = seq.prompt_tokens + seq.generated + 1
            while kv.held(table) < need and not kv.grow(table):
                victim = self._victim()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
        return preempted

    def _victim(self) -> Sequence:
        """The running sequence vLLM's scheduler preempts first."""
        if self.limits.scheduling_policy == "priority":
            return max(self._running, key=lambda s: (s.priority, s.arrival, s.order))
        return self._running[-1]

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and queue it again at its old place, to recompute."""
        assert seq.table is not None
        self.kv.release(seq.table)
        seq.table = None
        seq.recompute = seq.generated
        seq.prefilled = 0
        self._running.remove(seq)
        key = seq.priority if self.limits.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (key, seq.order, seq))
        self.metrics.preemptions += 1

    def _count_users(self, batch: list[Sequence]) -> None:
        """The most sequences each ``user`` has had in one step (only once a request
        has named a user: the common case pays nothing)."""
        running: dict[str, int] = {}
        for seq in batch:
            user = seq.group.user
            if user is not None:
                running[user] = running.get(user, 0) + 1
        peaks = self.metrics.peak_running_by_user
        for user, count in running.items():
            if count > peaks.get(user, 0):
                peaks[user] = count

    def _advance(self, batch: list[Sequence]) -> None:
        now = self._clock()
        done = False
        metrics = self.metrics
        # Inter-token latencies of this step, grouped: sequences decoding together
        # mostly share one, and a histogram update per token would cost a bisect each.
        gaps: dict[float, int] = {}
        for seq in batch:
            if seq.finished or seq.prefilled < seq.prefill_target:
                continue
            group = seq.group
            if seq.target == 0:
                # A pooling (embedding) request is done once its prompt is in.
                metrics.prompt_tokens += seq.prompt_tokens
                self._finish(seq, now)
                done = True
            else:
                if seq.generated == 0:
                    seq.first_token_at = now
                    metrics.ttft.observe(now - seq.arrival)
                    metrics.prompt_tokens += seq.prompt_tokens
                elif seq.last_token_at is not None:
                    gap = now - seq.last_token_at
                    gaps[gap] = gaps.get(gap, 0) + 1
                seq.last_token_at = now
                seq.generated += 1
                metrics.generation_tokens += 1
                if seq.generated >= seq.target:
                    self._finish(seq, now)
                    done = True
                if group.on_tokens is not None:
                    group.on_tokens(seq, seq.generated)
            if group.pending == 0 and group.on_done is not None and not group.aborted:
                group.on_done(group)
        for gap, count in gaps.items():
            metrics.inter_token.observe(gap, count)
        if done:
            self._running = [s for s in self._running if not s.finished]

    def _finish(self, seq: Sequence, now: float) -> None:
        seq.finished = True
        self.in_system -= 1
        assert seq.table is not None
        self.kv.release(seq.table)
        self.metrics.finish(seq.finish_reason, now - seq.arrival)
        seq.group.pending -= 1
