"""Which jobs the hot-path scenarios run, in which order, and the options behind them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from llmbatch_bench.cli import build_parser, config_from_args
from llmbatch_bench.config import BenchConfig
from llmbatch_bench.hotpath import plan as hotplan
from llmbatch_bench.jobs import Job


def factory(**fields: Any) -> Job:
    return Job(base_url="http://127.0.0.1:1/v1", model="m", **fields)


def plan(scenario: str, **config: Any) -> list[Job]:
    return hotplan.jobs_for(scenario, BenchConfig(**config), factory)


def test_interleave_runs_round_by_round() -> None:
    a, b = (
        factory(kind="raw", scenario="s", contender="a"),
        factory(kind="raw", scenario="s", contender="b"),
    )
    out = hotplan.interleave([a, b], 3)
    assert [(j.contender, j.repeat) for j in out] == [
        ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2),
    ]  # fmt: skip


def test_per_request_clients_get_a_tenth_of_the_prompts() -> None:
    assert hotplan.per_request_n(20_000) == 2_000
    assert hotplan.per_request_n(300) == 100
    assert hotplan.per_request_n(40) == 40


def test_overhead_compares_like_with_like() -> None:
    jobs = plan("overhead", repeat=3, overhead_n=5000)
    labels = [j.label for j in jobs]
    assert labels[:5] == [
        hotplan.MAP, hotplan.MAP_UNORDERED, hotplan.IMAP, hotplan.PROBE, hotplan.OPENAI,
    ]  # fmt: skip
    assert Counter(labels) == dict.fromkeys(labels[:5], 3)
    by_label = {j.label: j for j in jobs}
    probe, ours = by_label[hotplan.PROBE], by_label[hotplan.MAP]
    # The same batches, the same prompts in flight, the same prompts.
    assert (ours.batch, ours.max_in_flight, ours.n) == (64, 256, 5000)
    assert (probe.batch, probe.concurrency, probe.n) == (64, 256, 5000)
    assert ours.warmup == probe.warmup > 0
    assert [by_label[x].api for x in (hotplan.MAP, hotplan.MAP_UNORDERED, hotplan.IMAP)] == [
        "map", "map_unordered", "imap",
    ]  # fmt: skip
    openai = by_label[hotplan.OPENAI]
    assert (openai.kind, openai.n, openai.concurrency) == ("per_prompt", 500, 64)
    without = plan("overhead", repeat=1, contenders=("llmbatch", "httpx"))
    assert hotplan.OPENAI not in {j.label for j in without}


def test_burst_runs_the_baseline_first_and_once_each() -> None:
    jobs = plan("burst", burst_n=1000, burst_time_limit=5.0)
    assert [(j.label, j.kind, j.api) for j in jobs] == [
        (hotplan.BARE, "bare", "gather"),
        (hotplan.GATHER, "llmbatch", "gather"),
        (hotplan.MAP, "llmbatch", "map"),
        ("aiohttp (unbounded)", "bulk", "map"),
    ]
    assert all(j.n == 1000 and j.time_limit == 5.0 for j in jobs)
    assert jobs[-1].concurrency is None
    only_map = plan("burst", burst_modes=("map",), burst_baselines=())
    assert [j.label for j in only_map] == [hotplan.MAP]


def test_single_chat_transport_and_scale() -> None:
    single = plan("single", repeat=2, single_n=10)
    assert [(j.label, j.priority, j.max_tokens) for j in single[:3]] == [
        (hotplan.RAW, "batch", 1),
        (hotplan.SINGLE_REALTIME, "realtime", 1),
        (hotplan.SINGLE_NORMAL, "normal", 1),
    ]
    assert len(single) == 6
    chat = plan("chat", repeat=1)
    assert [(j.label, j.inputs) for j in chat] == [
        (hotplan.COMPLETIONS, "prompt"),
        (hotplan.CHAT, "chat"),
    ]
    transport = plan("transport", repeat=1, overhead_n=2000)
    assert [(j.transport, j.batch, j.n) for j in transport] == [
        ("aiohttp", 1, 200), ("aiohttp", 64, 2000), ("httpx", 1, 200), ("httpx", 64, 2000),
    ]  # fmt: skip
    (scale,) = plan("scale", scale_n=1_000_000)
    assert (scale.api, scale.n, scale.time_limit) == ("map_unordered", 1_000_000, 900.0)


def test_embed_compares_embeddings_with_completions_of_the_same_texts() -> None:
    jobs = plan("embed", repeat=2, embed_n=3000)
    assert [(j.label, j.kind, j.inputs, j.n) for j in jobs[:4]] == [
        (hotplan.COMPLETIONS, "llmbatch", "prompt", 3000),
        (hotplan.EMBED, "llmbatch", "input", 3000),
        (hotplan.EMBED_BASE64, "llmbatch", "input", 3000),
        (hotplan.OPENAI_EMBED, "program", "input", 300),
    ]
    assert len(jobs) == 8
    completions, floats, base64 = jobs[:3]
    # The same batches and the same items in flight; embeddings get no generation
    # parameters, only the encoding.
    for ours in (floats, base64):
        assert (ours.batch, ours.max_in_flight) == (completions.batch, completions.max_in_flight)
    assert (floats.batch, floats.max_in_flight) == (64, 256)
    assert (floats.params, base64.params) == ({}, {"encoding_format": "base64"})
    assert (jobs[3].sdk, jobs[3].concurrency) == ("openai", 64)
    without = plan("embed", repeat=1, contenders=("llmbatch",))
    assert hotplan.OPENAI_EMBED not in {j.label for j in without}


def test_dropin_runs_one_program_with_each_import() -> None:
    jobs = plan("dropin", repeat=3, dropin_n=2000)
    assert [(j.label, j.sdk) for j in jobs[:2]] == [
        (hotplan.DROPIN_OPENAI, "openai"),
        (hotplan.DROPIN, "llmbatch.openai"),
    ]
    assert Counter(j.label for j in jobs) == {hotplan.DROPIN_OPENAI: 3, hotplan.DROPIN: 3}
    assert [j.repeat for j in jobs] == [0, 0, 1, 1, 2, 2]
    # Everything else is the same: the program, its calls, all of them at once.
    assert len({(j.kind, j.n, j.max_tokens, j.concurrency, j.warmup) for j in jobs}) == 1
    assert (jobs[0].kind, jobs[0].n, jobs[0].concurrency) == ("program", 2000, None)
    assert plan("dropin", dropin_n=50)[0].warmup == 50
    # Both runs are the openai SDK's client: nothing to run without it.
    assert plan("dropin", contenders=("llmbatch", "httpx")) == []


def config(*argv: str) -> BenchConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


def test_all_leaves_out_transport_and_scale_unless_asked() -> None:
    assert config().scenarios == (
        "sweep", "bulk", "mixed", "slo", "saturate", "outage", "control",
        "overhead", "chat", "single", "burst", "dropin",
    )  # fmt: skip
    assert config("--scenario", "dropin,embed", "--dropin-n", "500").scenarios == (
        "embed", "dropin",
    )  # fmt: skip
    assert (config("--dropin-n", "500").dropin_n, config("--embed-n", "7").embed_n) == (500, 7)
    assert "scale" in config("--scale").scenarios
    assert config("--scale").scale_n == 1_000_000
    assert config("--scenario", "overhead", "--scale", "5000").scenarios == ("overhead", "scale")
    assert config("--scenario", "overhead", "--scale", "5000").scale_n == 5000
    assert config("--scenario", "transport,single").scenarios == ("single", "transport")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeat", "0"], "--repeat must be >= 1"),
        (["--single-n", "0"], "--single-n must be >= 1"),
        (["--dropin-n", "0"], "--dropin-n must be >= 1"),
        (["--embed-n", "0"], "--embed-n must be >= 1"),
        (["--overhead-batch", "2000"], "--overhead-batch must be <= 1024"),
        (["--scale", "0"], "--scale must be >= 1"),
    ],
)
def test_bad_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(*argv)
