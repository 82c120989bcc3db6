"""``python -m llmbatch_bench.experiments.structured``: plain and structured maps side by side
against a simulator it starts itself, every item accounted for."""

from __future__ import annotations

import json
from pathlib import Path

from llmbatch_bench.experiments import structured


def test_the_structured_bench_accounts_for_every_item(tmp_path: Path) -> None:
    out = tmp_path / "structured.json"
    code = structured.main(
        ["--prompts", "300", "--rounds", "1", "--invalid", "0.2", "--json", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    plain, schema = result["runs"]
    assert plain["validated"] == 300
    assert plain["reasked"] == 0
    assert schema["validated"] + schema["structured_errors"] == 300
    assert schema["other_errors"] == 0
    assert schema["reasked"] > 0  # a fifth was invalid and went back
    assert result["validated_share"] >= 0.95
    assert result["cpu_ratio"] > 0
