"""The tenants bench's table and verdicts (the run itself is CI's tenants stage)."""

from __future__ import annotations

from typing import Any

from llmbatch_bench.experiments.tenants import _rate, _table, _verdicts


def results(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "alone": {"b_seconds": 0.3, "a_seconds": 50.0, "a_steady_per_s": 400.0},
        "no-tenants": {"b_seconds": 0.8, "a_after_b_per_s": 400.0, "every_result_once": True},
        "tenants": {"b_seconds": 0.7, "a_after_b_per_s": 390.0, "every_result_once": True},
        "tenants-gathered": {
            "b_seconds": 0.6,
            "a_after_b_per_s": 395.0,
            "every_result_once": True,
        },
        "cap": {"server_peak_running": 4},
        "cpu": {"ratio_of_medians": 1.04, "ratio_of_minima": 1.02},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return base


def test_all_targets_met_reads_as_nothing_missed() -> None:
    assert _verdicts(results()) == []
    table = _table(results())
    assert table[2].startswith("| alone | 0.30 | 1.00x | 400 |")
    assert "| tenants | 0.70 | 2.33x | 390 | 0.97x | yes |" in table


def test_each_missed_target_is_named() -> None:
    missed = _verdicts(
        results(
            tenants={"b_seconds": 1.2, "a_after_b_per_s": 300.0},
            **{"no-tenants": {"every_result_once": False}},
            cap={"server_peak_running": 5},
            cpu={"ratio_of_minima": 1.2},
        )
    )
    assert any(m.startswith("tenants: B took 4.00x") for m in missed)
    assert any(m.startswith("tenants: A after B at 75.0%") for m in missed)
    assert any("lost or seen twice" in m for m in missed)
    assert any(m.startswith("cap: the server ran 5") for m in missed)
    assert any(m.startswith("cpu: a map with a tenant costs 1.20x") for m in missed)


def test_rate_counts_answers_in_the_window() -> None:
    assert _rate([0.5, 1.0, 1.5, 2.0, 3.5], 1.0, 3.0) == 1.5
    assert _rate([1.0], 2.0, 2.0) == 0.0
