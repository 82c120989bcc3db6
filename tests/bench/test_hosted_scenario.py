"""The hosted scenario end to end, short: llmbatch and AsyncOpenAI (with openai's
retries under a semaphore) each against a fresh simulator playing OpenAI's limiter;
the report's table shows both. Whatever the numbers, llmbatch answers every
conversation; AsyncOpenAI meets the limiter's 429s (what the issue measured)."""

from __future__ import annotations

import pytest

from llmbatch_bench import hosted
from llmbatch_bench.report import render

pytestmark = pytest.mark.slow


def test_both_contenders_run_against_a_fresh_limiter_and_the_table_shows_them() -> None:
    args = hosted.defaults(conversations=200, speed="100")
    results = hosted.compare(args, hosted.CONTENDERS, command="test")
    ours, theirs = results["llmbatch"], results["asyncopenai"]
    assert ours["answered"] == 200
    assert ours["failed"] == 0
    assert ours["http_429"] <= theirs["http_429"]
    assert theirs["http_429"] > 0  # 64 calls at once meet the per-second limit
    assert theirs["answered"] + theirs["failed"] == 200
    text = render({"hosted": results, "runs": [], "targets": []})
    assert "llmbatch (no RateLimit)" in text
    assert "AsyncOpenAI (8 retries, 64)" in text
