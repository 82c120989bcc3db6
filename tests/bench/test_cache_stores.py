"""The cache stores' comparison, short: each store takes the writes, answers every
read right, is read by several processes while one writes, and opens again after
a writer's kill -9 with nothing wrong in it (only whole transactions survive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmbatch_bench.experiments import cache_stores

pytestmark = pytest.mark.slow


def test_each_store_is_measured_and_survives_a_kill(tmp_path: Path) -> None:
    out = tmp_path / "stores.json"
    argv = ["--entries", "600", "--seconds", "0.5", "--readers", "2", "--json", str(out)]
    assert cache_stores.main(argv) == 0
    results = {r["store"]: r for r in json.loads(out.read_text())}
    assert "sqlite" in results
    for result in results.values():
        assert result["wrong_reads"] == 0
        assert result["shared_wrong_reads"] == 0
        assert result["reopened_after_kill"]
        assert result["wrong_after_kill"] == 0
        assert result["entries_after_kill"] >= 600
        assert result["writes_per_s"] > 0
