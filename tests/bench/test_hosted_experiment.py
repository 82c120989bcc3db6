"""The hosted experiment, small: a real simulator playing a provider's limiter, and
for several processes real worker processes sharing a key through a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmbatch_bench import hosted
from llmbatch_server.redis_process import redis_server_path


def test_one_process_learns_the_limit_and_reports_every_conversation(tmp_path: Path) -> None:
    out = tmp_path / "hosted.json"
    assert hosted.main(["--conversations", "40", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["answered"], report["failed"], report["processes"]) == (40, 0, 1)
    assert report["http_requests"] >= 40
    assert report["rates"][0]["source"] == "learnt"
    assert report["provider_limits"]["family"] == "openai"


@pytest.mark.slow
@pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")
def test_two_processes_share_what_one_learnt_and_a_third_party_is_reported(
    tmp_path: Path,
) -> None:
    out = tmp_path / "hosted.json"
    argv = ["--conversations", "60", "--processes", "2", "--third-party", "0.3"]
    assert hosted.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["answered"], report["failed"], report["processes"]) == (60, 0, 2)
    assert {rate["source"] for rate in report["rates"]} <= {"learnt", "shared"}
    assert report["third_party"]["answered"] > 0
    assert report["third_party"]["share"] == pytest.approx(0.3)
    assert len(report["per_process_ok_429"]) == 2
