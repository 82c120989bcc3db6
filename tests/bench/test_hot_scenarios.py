"""The hot-path scenarios, short, against a real zero-latency simulator on 127.0.0.1:
every job kind runs, every label reports, every target gets a value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmbatch_bench.hotpath import plan as hotplan

pytest.importorskip("llmbatch_server.testing")


def bench(tmp_path: Path, *argv: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "llmbatch_bench", "--quiet", "--json", str(out), *argv],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report, done.stdout


@pytest.mark.slow  # ~15 s; CI's slow stage runs it
def test_overhead_chat_single_burst_in_worker_processes(tmp_path: Path) -> None:
    report, text = bench(
        tmp_path,
        "--scenario", "overhead,chat,single,burst",
        "--repeat", "1", "--overhead-n", "300", "--chat-n", "200", "--single-n", "40",
        "--burst-n", "500", "--burst-baselines", "", "--burst-time-limit", "60",
    )  # fmt: skip
    assert report["server"] is None  # no server scenario asked for
    assert report["hot_server"]["simulator_args"] == ["--zero-latency"]
    assert report["notes"] == []
    summaries = {(s["scenario"], s["label"]): s for s in report["summaries"]}
    expected = {
        ("overhead", hotplan.MAP): 300,
        ("overhead", hotplan.MAP_UNORDERED): 300,
        ("overhead", hotplan.IMAP): 300,
        ("overhead", hotplan.PROBE): 300,
        ("overhead", hotplan.OPENAI): 100,
        ("chat", hotplan.COMPLETIONS): 200,
        ("chat", hotplan.CHAT): 200,
        ("single", hotplan.RAW): 40,
        ("single", hotplan.SINGLE_REALTIME): 40,
        ("single", hotplan.SINGLE_NORMAL): 40,
        ("burst", hotplan.BARE): 500,
        ("burst", hotplan.GATHER): 500,
        ("burst", hotplan.MAP): 500,
    }
    assert {k: (s["ok"], s["failed"]) for k, s in summaries.items()} == {
        k: (n, 0) for k, n in expected.items()
    }
    for s in summaries.values():
        assert s["rounds"] == 1
        assert s["cpu_us_per_prompt"] > 0
        assert s["peak_rss_mb"] > 5
    for label in (hotplan.RAW, hotplan.SINGLE_REALTIME):
        single = summaries[("single", label)]
        assert 0 < single["p50_s"] <= single["p99_s"] < 1
    # llmbatch really sent 64-prompt batches in the overhead runs.
    ours = [r for r in report["runs"] if r["label"] == hotplan.MAP]
    assert all(r["extra"]["max_batch_size"] == 64 for r in ours)
    # The collector was timed around each measured run, as part of its CPU.
    for r in report["runs"]:
        assert 0 <= r["extra"]["gc_s"] <= r["cpu_s"] + 0.01
        assert r["extra"]["gc_collections"] >= 0
    assert summaries[("overhead", hotplan.MAP)]["gc_us_per_prompt"] is not None
    # Every target has a value from this run and a verdict (met or not).
    others = ("bulk", "realtime", "dropin")
    hot_targets = [t for t in report["targets"] if not t["id"].startswith(others)]
    assert len(hot_targets) == 9
    assert all(t["value"] is not None and t["met"] is not None for t in hot_targets)
    for title in ("Overhead", "Chat", "Single", "Burst", "Targets"):
        assert f"### {title}" in text


@pytest.mark.slow  # ~6 s; CI's slow stage runs it (and its hot-path smoke the scenarios)
def test_dropin_and_embed_count_what_the_server_received(tmp_path: Path) -> None:
    report, text = bench(
        tmp_path, "--in-process", "--scenario", "dropin,embed", "--repeat", "1",
        "--dropin-n", "200", "--embed-n", "300",
    )  # fmt: skip
    assert report["notes"] == []
    summaries = {(s["scenario"], s["label"]): s for s in report["summaries"]}
    assert {k: (s["ok"], s["failed"]) for k, s in summaries.items()} == {
        ("embed", hotplan.COMPLETIONS): (300, 0),
        ("embed", hotplan.EMBED): (300, 0),
        ("embed", hotplan.EMBED_BASE64): (300, 0),
        ("embed", hotplan.OPENAI_EMBED): (100, 0),
        ("dropin", hotplan.DROPIN_OPENAI): (200, 0),
        ("dropin", hotplan.DROPIN): (200, 0),
    }
    sent = {k: s["server_requests"] for k, s in summaries.items()}
    # openai sends one request per call, warm-up excluded; the drop-in batches them.
    assert sent[("dropin", hotplan.DROPIN_OPENAI)] == 200
    assert sent[("embed", hotplan.OPENAI_EMBED)] == 100
    assert 0 < sent[("dropin", hotplan.DROPIN)] <= 200 / 5
    assert 0 < sent[("embed", hotplan.EMBED)] < 300 / 10
    targets = {t["id"]: t for t in report["targets"]}
    assert targets["dropin_requests"]["met"] is True
    assert targets["dropin_cpu"]["value"] > 1  # the verdict is for the full run
    assert "### Embed: map over embeddings vs completions" in text
    assert "### Drop-in: 200 concurrent completions.create calls" in text


@pytest.mark.slow  # ~5 s; CI's slow stage runs it
def test_transport_and_scale_in_process(tmp_path: Path) -> None:
    report, text = bench(
        tmp_path, "--in-process", "--scenario", "transport", "--scale", "1000",
        "--repeat", "1", "--overhead-n", "200",
    )  # fmt: skip
    runs = {(r["scenario"], r["label"]): r for r in report["runs"]}
    assert {k: r["ok"] for k, r in runs.items()} == {
        ("transport", "aiohttp, 1/request"): 100,
        ("transport", "aiohttp, 64/request"): 200,
        ("transport", "httpx, 1/request"): 100,
        ("transport", "httpx, 64/request"): 200,
        ("scale", hotplan.MAP_UNORDERED): 1000,
    }
    assert runs[("transport", "httpx, 1/request")]["extra"]["max_batch_size"] == 1
    assert "### Transport" in text
    assert "### Scale: 1,000 prompts through map_unordered" in text
