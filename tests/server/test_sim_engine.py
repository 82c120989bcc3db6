"""The simulator's engine model on a virtual clock: calibration, limits, policies."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from llmbatch_server.sim.config import REFERENCE_TABLE, EngineLimits, StepModel
from llmbatch_server.sim.engine import Engine, Group, Overloaded, Sequence

pytestmark = pytest.mark.asyncio_only("the simulator's engine is asyncio code (asyncio.Event)")


class VirtualTime:
    """A clock whose sleep advances time instantly (and yields to the loop)."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def _seqs(group: Group, count: int, *, prompt: int = 16, target: int = 64) -> list[Sequence]:
    return [
        Sequence(
            group=group,
            index=i,
            prompt_tokens=prompt,
            target=target,
            visible=target,
            finish_reason="length",
            stop_reason=None,
            seed=i,
        )
        for i in range(count)
    ]


async def _run_until(engine: Engine, done: Callable[[], bool], limit: int = 1_000_000) -> None:
    task = asyncio.ensure_future(engine.run())
    try:
        for _ in range(limit):
            if done():
                return
            await asyncio.sleep(0)
        raise AssertionError("engine did not finish")
    finally:
        task.cancel()


async def _until_step(engine: Engine, step: int) -> None:
    """Let the running engine (on virtual time) start its ``step``-th step."""
    for _ in range(100_000):
        if engine.steps >= step:
            return
        await asyncio.sleep(0)
    raise AssertionError("the engine stopped stepping")


def _engine(vt: VirtualTime, **limits: object) -> Engine:
    return Engine(EngineLimits(**limits), StepModel(), clock=vt.clock, sleep=vt.sleep)  # type: ignore[arg-type]


async def _decode_throughput(batch: int, tokens: int = 256) -> float:
    vt = VirtualTime()
    engine = _engine(vt, max_num_seqs=256)
    group = Group()
    engine.add(group, _seqs(group, batch, prompt=32, target=tokens))
    await _run_until(engine, lambda: group.pending == 0)
    return batch * tokens / vt.now


def test_throughput_matches_published_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = []
    for batch, published in REFERENCE_TABLE.items():
        measured = asyncio.run(_decode_throughput(batch))
        rows.append((batch, published, measured, measured / published - 1))
    with capsys.disabled():
        print("\nbatch  published tok/s  simulated tok/s  error")
        for batch, published, measured, error in rows:
            print(f"{batch:5d}  {published:15.0f}  {measured:15.1f}  {error:+6.1%}")
    for batch, _, _, error in rows:
        assert abs(error) < 0.10, f"batch {batch} off by {error:+.1%}"


@pytest.mark.anyio
async def test_max_num_seqs_caps_the_running_batch() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_num_seqs=4)
    group = Group()
    peak = 0

    def on_tokens(seq: Sequence, generated: int) -> None:
        nonlocal peak
        peak = max(peak, engine.num_running)

    group.on_tokens = on_tokens
    engine.add(group, _seqs(group, 10, target=3))
    await _run_until(engine, lambda: group.pending == 0)
    assert peak == 4
    # 10 sequences of 3 tokens, 4 at a time: ceil(10/4) waves of 3 steps, overlapping.
    assert engine.steps >= 3 * 3


@pytest.mark.anyio
async def test_chunked_prefill_respects_the_token_budget() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_num_batched_tokens=100, max_model_len=1000)
    group = Group()
    seqs = _seqs(group, 1, prompt=250, target=1)
    engine.add(group, seqs)
    await _run_until(engine, lambda: group.pending == 0)
    # 250 prompt tokens at 100 per step: 3 steps of prefill; the token comes with the last.
    assert engine.steps == 3
    assert seqs[0].generated == 1


@pytest.mark.anyio
async def test_kv_cache_capacity_limits_admission() -> None:
    vt = VirtualTime()
    # 14 blocks of 16 tokens; each sequence needs ceil(100 / 16) = 7 of them.
    engine = _engine(vt, max_model_len=100, kv_cache_tokens=224)
    group = Group()
    seen: set[int] = set()
    group.on_tokens = lambda seq, n: seen.add(engine.num_running)
    engine.add(group, _seqs(group, 4, prompt=40, target=60))  # 100 KV tokens each
    await _run_until(engine, lambda: group.pending == 0)
    assert max(seen) == 2


@pytest.mark.anyio
async def test_priority_policy_runs_lower_values_first() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_num_seqs=1, scheduling_policy="priority")
    order: list[str] = []
    groups = {}
    for name, priority in (("bulk", 10), ("urgent", -5), ("normal", 0)):
        group = Group(on_done=lambda g, name=name: order.append(name))
        groups[name] = group
        engine.add(group, _seqs(group, 1, target=2), priority=priority)
    await _run_until(engine, lambda: len(order) == 3)
    assert order == ["urgent", "normal", "bulk"]


@pytest.mark.anyio
async def test_fcfs_ignores_priority() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_num_seqs=1, scheduling_policy="fcfs")
    order: list[str] = []
    for name, priority in (("first", 10), ("second", -5)):
        group = Group(on_done=lambda g, name=name: order.append(name))
        engine.add(group, _seqs(group, 1, target=2), priority=priority)
    await _run_until(engine, lambda: len(order) == 2)
    assert order == ["first", "second"]


@pytest.mark.anyio
async def test_abort_frees_the_kv_cache_and_skips_waiting_sequences() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_num_seqs=2)
    doomed, other = Group(), Group()
    engine.add(doomed, _seqs(doomed, 3, target=1000))
    engine.add(other, _seqs(other, 1, target=5))
    task = asyncio.ensure_future(engine.run())
    for _ in range(5):
        await asyncio.sleep(0)
    assert engine.num_running == 2
    engine.abort(doomed)
    await _run_until(engine, lambda: other.pending == 0)
    task.cancel()
    assert engine.num_running == 0
    assert engine.num_waiting == 0
    assert engine.kv_usage == 0
    assert engine.metrics.aborted == 1


def test_queue_cap_raises_overloaded() -> None:
    engine = Engine(EngineLimits(max_num_queued_reqs=3), StepModel())
    group = Group()
    engine.add(group, _seqs(group, 3))
    with pytest.raises(Overloaded):
        engine.add(Group(), _seqs(Group(), 1))


def test_fewer_larger_requests_cost_the_front_end_less() -> None:
    step = StepModel()
    assert 64 * step.frontend_seconds(1) > 3 * step.frontend_seconds(64)


@pytest.mark.anyio
async def test_inter_token_latency_is_the_step_time_of_the_running_batch() -> None:
    """vllm:inter_token_latency_seconds (and its older name) measure what a client's
    admission controller needs: the step time at the running batch size."""
    vt = VirtualTime()
    engine = _engine(vt, max_num_seqs=256)
    group = Group()
    engine.add(group, _seqs(group, 32, prompt=16, target=20))
    await _run_until(engine, lambda: group.pending == 0)
    histogram = engine.metrics.inter_token
    assert histogram.count == 32 * 19  # every token after each sequence's first
    decode_step = StepModel().step_seconds(32, 0)
    assert histogram.total / histogram.count == pytest.approx(decode_step, rel=1e-6)


def _preempting(vt: VirtualTime, **limits: object) -> Engine:
    """Preemption on, in a cache of 14 blocks of 16 tokens (prompts of 100 at most)."""
    return _engine(vt, preemption=True, max_model_len=100, kv_cache_tokens=224, **limits)


def _three_in_order(engine: Engine) -> list[Group]:
    """Three requests of one 40-token prompt and 60 tokens each, in arrival order."""
    groups = [Group() for _ in range(3)]
    for group in groups:
        engine.add(group, _seqs(group, 1, prompt=40, target=60))
    return groups


@pytest.mark.anyio
async def test_preemption_admits_more_than_reservation_would_and_preempts_when_full() -> None:
    vt = VirtualTime()
    # 14 blocks of 16 tokens: reserving 100 tokens a sequence admits 2 (the test
    # above); growing block by block admits all 4, and their outputs then need more
    # blocks than there are, so some are preempted, recomputed, and all finish.
    engine = _preempting(vt)
    group = Group()
    seen: set[int] = set()
    group.on_tokens = lambda seq, n: seen.add(engine.num_running)
    sequences = _seqs(group, 4, prompt=40, target=60)
    engine.add(group, sequences)
    await _run_until(engine, lambda: group.pending == 0)
    assert max(seen) == 4
    assert engine.metrics.preemptions > 0
    assert all(s.generated == 60 for s in sequences)
    assert engine.kv.used == 0  # every block came back
    assert any(s.recompute for s in sequences)


@pytest.mark.anyio
async def test_preemption_picks_the_lowest_priority_latest_arrival_under_priority() -> None:
    vt = VirtualTime()
    engine = _preempting(vt, scheduling_policy="priority")
    urgent, bulk_early, bulk_late = Group(), Group(), Group()
    engine.add(urgent, _seqs(urgent, 1, prompt=40, target=60), priority=-1)
    engine.add(bulk_early, _seqs(bulk_early, 1, prompt=40, target=60), priority=5)
    vt.now += 0.001
    engine.add(bulk_late, _seqs(bulk_late, 1, prompt=40, target=60), priority=5)
    await _run_until(engine, lambda: urgent.pending == bulk_early.pending == bulk_late.pending == 0)
    assert urgent.sequences[0].recompute == 0
    assert bulk_late.sequences[0].recompute > 0  # the first chosen: latest of the lowest
    assert engine.metrics.preemptions >= 1


@pytest.mark.anyio
async def test_preemption_under_fcfs_takes_the_last_admitted() -> None:
    vt = VirtualTime()
    engine = _preempting(vt, scheduling_policy="fcfs")
    groups = _three_in_order(engine)
    await _run_until(engine, lambda: all(g.pending == 0 for g in groups))
    first, _, last = (g.sequences[0] for g in groups)
    assert first.recompute == 0
    assert last.recompute > 0


@pytest.mark.anyio
async def test_a_preempted_sequence_recomputes_its_output_as_prefill() -> None:
    vt = VirtualTime()
    engine = _preempting(vt, scheduling_policy="fcfs")
    groups = _three_in_order(engine)
    prefills: list[int] = []
    schedule = engine._schedule

    def recording(now: float) -> tuple[list[Sequence], int]:
        batch, prefill = schedule(now)
        prefills.append(prefill)
        return batch, prefill

    lost: list[int] = []
    preempt = engine._preempt

    def preempting(seq: Sequence) -> None:
        lost.append(seq.generated)
        preempt(seq)

    engine._schedule = recording  # type: ignore[method-assign]
    engine._preempt = preempting  # type: ignore[method-assign]
    await _run_until(engine, lambda: all(g.pending == 0 for g in groups))
    # Besides the three prompts' 120 tokens, each preempted sequence's prompt and
    # the output it had were prefilled again; no output token was generated twice.
    assert lost
    assert all(n > 0 for n in lost)
    assert sum(prefills) == 3 * 40 + len(lost) * 40 + sum(lost)
    assert engine.metrics.generation_tokens == 3 * 60


def test_jitter_spreads_steps_around_the_model_and_is_seeded() -> None:
    step = StepModel(jitter=0.3)
    plain = StepModel()
    assert step.step_seconds(4, 0, 0.5) == pytest.approx(plain.step_seconds(4, 0))
    assert step.step_seconds(4, 0, 0.0) == pytest.approx(0.7 * plain.step_seconds(4, 0))
    assert step.step_seconds(4, 0, 0.999999) == pytest.approx(1.3 * plain.step_seconds(4, 0))
    with pytest.raises(ValueError, match="jitter"):
        StepModel(jitter=1.5)

    async def gaps(seed: int) -> list[float]:
        vt = VirtualTime()
        engine = Engine(EngineLimits(), step, clock=vt.clock, sleep=vt.sleep, seed=seed)
        group = Group()
        times: list[float] = []
        group.on_tokens = lambda seq, n: times.append(vt.now)
        engine.add(group, _seqs(group, 1, target=200))
        await _run_until(engine, lambda: group.pending == 0)
        return [b - a for a, b in itertools.pairwise(times)]

    first, again, other = (asyncio.run(gaps(s)) for s in (1, 1, 2))
    assert first == again
    assert first != other
    alone = plain.step_seconds(1, 0)
    assert min(first) >= 0.7 * alone * 0.999
    assert max(first) <= 1.3 * alone * 1.001
    assert max(first) - min(first) > 0.4 * alone  # spread, not every step alike


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("queue_gauge", "seats", "after_arrival", "after_next_step"),
    [
        ("step", 8, (1, 0), (2, 0)),  # vLLM v1: the arrival is admitted, never seen waiting
        ("step", 1, (1, 0), (1, 1)),  # no seat: seen waiting once a step has left it there
        ("live", 8, (1, 1), (2, 0)),  # a server counting its HTTP queue shows it at once
    ],
)
async def test_the_gauges_show_the_queue_a_step_left_or_the_live_one(
    queue_gauge: str,
    seats: int,
    after_arrival: tuple[int, int],
    after_next_step: tuple[int, int],
) -> None:
    vt = VirtualTime()
    engine = Engine(
        EngineLimits(max_num_seqs=seats),
        StepModel(),
        clock=vt.clock,
        sleep=vt.sleep,
        queue_gauge=queue_gauge,
    )
    first, second = Group(), Group()
    engine.add(first, _seqs(first, 1, target=1000))
    task = asyncio.ensure_future(engine.run())
    try:
        await _until_step(engine, 3)
        assert engine.gauges == (1, 0)
        engine.add(second, _seqs(second, 1, target=1000))  # arrives during a step
        assert (engine.num_running, engine.num_waiting) == (1, 1)
        assert engine.gauges == after_arrival
        await _until_step(engine, engine.steps + 2)
        assert engine.gauges == after_next_step
    finally:
        task.cancel()
