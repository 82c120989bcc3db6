"""The closed-loop targets, judged from one bench run's runs in their
JSON form, so the report computes its columns with the same functions.

- ``slo_realtime_tpot_p99``: with ``SLO(tpot=...)``, realtime p99 time per output
  token within the SLO while bulk saturates the rest;
- ``slo_bulk_vs_bound``: bulk tokens/s under the SLO ≥ 85 % of the best any client
  can get under it (the step model's bound, :mod:`.closedloop.stepmodel`);
- ``saturate_vs_probe``: bulk with the library's defaults ≥ 97 % of the best the lean
  probe reaches in the same run (medians over rounds);
- ``frontier_controller``: the controller against the best static setting that met
  the SLO (:mod:`.closedloop.frontier`): where one did, realtime p99 <= 1.1x the
  bound with bulk >= 0.9x the oracle's; where none did, the SLO said unreachable
  and p99 <= 1.1x the best static setting's;
- per outage (``503`` for 15 s, kill and restart 20 s later): every input exactly
  one result and none failed; while the breaker holds, about one request a second;
  work sent again within 2 s of the server being back.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from llmbatch_bench.closedloop import frontier as sweep
from llmbatch_bench.closedloop import plan as closedplan
from llmbatch_bench.targets import Target, judge

__all__ = [
    "OUTAGE_RATE",
    "OUTAGE_RESUME_S",
    "SATURATE_RATIO",
    "SLO_BULK_RATIO",
    "bulk_vs_bound",
    "evaluate_closed",
    "frontier_target",
    "lost",
    "saturate_medians",
    "tpot_p99",
]

#: Bulk kept under the SLO, as a share of the step model's bound. 0.70 (issue "One
#: model of each server"): the bound assumes every step exactly at the SLO, while a
#: p99 target must leave headroom for steps that run prefills; and the same share is
#: asked of servers that report less than vLLM (gauges only, or nothing).
SLO_BULK_RATIO = 0.70
SATURATE_RATIO = 0.97
#: Requests a second the server may see while the breaker holds requests: one
#: ``/health`` probe a second, give or take the trial batch when one succeeds.
OUTAGE_RATE = 1.5
#: Seconds from the server being back to work being sent again: the probe interval
#: (1 s) plus room for the probe and the trial batch.
OUTAGE_RESUME_S = 2.0

Run = Mapping[str, Any]


def _find(runs: Sequence[Run], scenario: str, label: str) -> Run | None:
    return next((r for r in runs if r["scenario"] == scenario and r["label"] == label), None)


def tpot_p99(run: Run | None) -> float:
    """A run's realtime p99 time per output token (seconds), ``nan`` if none."""
    p = (run or {}).get("tpot", {}).get("realtime") if run else None
    value = p.get("p99") if p else None
    return float(value) if value is not None else math.nan


def bulk_vs_bound(run: Run | None) -> float:
    """Bulk tokens/s in the realtime window / the step model's bound under the SLO."""
    if run is None:
        return math.nan
    bound = run["extra"].get("bound")
    tokens = run.get("output_tokens_per_s")
    if not bound or tokens is None or not bound.get("tokens_per_s"):
        return math.nan
    return float(tokens) / float(bound["tokens_per_s"])


def saturate_medians(runs: Sequence[Run]) -> dict[str, float]:
    """Median prompts/s per label of the saturate scenario, over its rounds."""
    groups: dict[str, list[float]] = {}
    for r in runs:
        if r["scenario"] == "saturate" and r["ok"] and r.get("prompts_per_s") is not None:
            groups.setdefault(r["label"], []).append(float(r["prompts_per_s"]))
    return {label: statistics.median(values) for label, values in groups.items()}


def lost(run: Run) -> int:
    """Inputs without exactly one successful result: failed, unanswered, missing or
    answered twice."""
    extra = run["extra"]
    return int(
        run["failed"]
        + run["unfinished"]
        + (extra.get("missing") or 0)
        + (extra.get("duplicates") or 0)
    )


def evaluate_closed(runs: Sequence[Run], scenarios: Collection[str] | None = None) -> list[Target]:
    """The closed-loop targets a scenario of ``scenarios`` measures (None: every one,
    with ``met=None`` for a scenario that did not run)."""
    groups: list[tuple[str, Callable[[], list[Target]]]] = [
        ("slo", lambda: [*_slo(runs), *_slo_both(runs)]),
        ("saturate", lambda: [_saturate(runs)]),
        ("frontier", lambda: [frontier_target(runs)]),
        ("outage", lambda: _outages(runs)),
    ]
    return [
        target
        for scenario, judged in groups
        if scenarios is None or scenario in scenarios
        for target in judged()
    ]


def _slo_both(runs: Sequence[Run]) -> list[Target]:
    """With ``SLO(ttft, tpot)``: streamed realtime keeps both p99s within it."""
    run = _find(runs, "slo", closedplan.SLO_BOTH)
    extra = run["extra"] if run else {}
    out = []
    for name, key, what in (
        ("ttft", "slo_ttft_s", "time to first token"),
        ("tpot", "slo_tpot_s", "time per output token"),
    ):
        slo = extra.get(key)
        measured = run.get(name, {}).get("realtime") if run else None
        p99 = float(measured["p99"]) if measured and measured.get("p99") is not None else math.nan
        out.append(
            _t(
                f"slo_both_{name}_p99",
                f"with SLO(ttft, tpot), streamed realtime p99 {what} under saturating bulk",
                p99 * 1e3 if math.isfinite(p99) else None,
                "<=",
                slo * 1e3 if slo else math.nan,
                "ms",
                f"p99 {p99 * 1e3:.2f} ms vs SLO {slo * 1e3:.2f} ms"
                if slo and math.isfinite(p99)
                else "needs the slo scenario (with a measured idle TTFT)",
            )
        )
    return out


def _t(
    id: str, description: str, value: float | None, op: str, threshold: float, unit: str,
    detail: str,
) -> Target:  # fmt: skip
    return Target(id, description, value, op, threshold, unit, judge(value, op, threshold), detail)


def _slo(runs: Sequence[Run]) -> list[Target]:
    ours = _find(runs, "slo", closedplan.SLO_ON)
    missing = "needs the slo scenario"
    slo = ours["extra"].get("slo_tpot_s") if ours else None
    p99 = tpot_p99(ours)
    bound = ours["extra"].get("bound") if ours else None
    ratio = bulk_vs_bound(ours)
    detail_bound = missing
    if ours and bound:
        detail_bound = (
            f"bulk {ours['output_tokens_per_s']:,.0f} tokens/s vs best under the SLO "
            f"{bound['tokens_per_s']:,.0f} tokens/s ({bound['sequences']} running, "
            f"step {bound['step_s'] * 1e3:.2f} ms)"
        )
    elif ours:
        detail_bound = "no step model (not the simulator): bound unknown"
    return [
        _t(
            "slo_realtime_tpot_p99",
            "with SLO(tpot), realtime p99 time per output token under saturating bulk",
            p99 * 1e3 if math.isfinite(p99) else None,
            "<=",
            slo * 1e3 if slo else math.nan,
            "ms",
            f"p99 {p99 * 1e3:.2f} ms vs SLO {slo * 1e3:.2f} ms (p50 "
            f"{ours['tpot']['realtime']['p50'] * 1e3:.2f} ms)"
            if ours and slo and math.isfinite(p99)
            else missing,
        ),
        _t(
            "slo_bulk_vs_bound",
            "bulk throughput under the SLO / the step model's best under it",
            ratio,
            ">=",
            SLO_BULK_RATIO,
            "x",
            detail_bound,
        ),
    ]


def _saturate(runs: Sequence[Run]) -> Target:
    medians = saturate_medians(runs)
    ours = medians.get(closedplan.SATURATE)
    probes = {k: v for k, v in medians.items() if k != closedplan.SATURATE}
    best = max(probes.items(), key=lambda kv: kv[1], default=None)
    value = ours / best[1] if ours is not None and best and best[1] else math.nan
    rounds = sum(1 for r in runs if r["label"] == closedplan.SATURATE)
    detail = (
        f"llmbatch {ours:,.1f} prompts/s vs {best[0]} {best[1]:,.1f} prompts/s, medians of {rounds}"
        if ours is not None and best
        else "needs the saturate scenario"
    )
    description = "bulk with default settings / best lean-probe capacity (same run)"
    return _t("saturate_vs_probe", description, value, ">=", SATURATE_RATIO, "x", detail)


def _outages(runs: Sequence[Run]) -> list[Target]:
    out = []
    for key, label in (("503", closedplan.OUTAGE_503), ("restart", closedplan.OUTAGE_RESTART)):
        run = _find(runs, "outage", label)
        extra = run["extra"] if run else {}
        missing = "needs the outage scenario"
        down = extra.get("down_s")
        what = f"{label} ({down:.0f} s)" if down else label
        rate = extra.get("open_rate")
        resumed = (extra.get("resume") or {}).get("work_sent_s")
        out += [
            _t(
                f"outage_{key}_results",
                f"{what}: inputs without exactly one successful result",
                float(lost(run)) if run else None,
                "==",
                0,
                "prompts",
                f"{run['ok']:,} ok of {run['requested']:,}; failed {run['failed']}, "
                f"missing {extra.get('missing')}, duplicated {extra.get('duplicates')}"
                if run
                else missing,
            ),
            _t(
                f"outage_{key}_rate",
                f"{what}: requests a second while the breaker held",
                rate,
                "<=",
                OUTAGE_RATE,
                "/s",
                f"per second of outage {extra.get('per_second')}; "
                f"{extra.get('sent_before_open')} before the breaker opened "
                f"{extra['opened_at'] - extra['down_at']:.1f} s in"
                if run and extra.get("opened_at") is not None
                else ("breaker never seen open" if run else missing),
            ),
            _t(
                f"outage_{key}_resume",
                f"{what}: seconds from the server back to work sent again",
                resumed,
                "<=",
                OUTAGE_RESUME_S,
                "s",
                _resume_detail(extra) if run else missing,
            ),
        ]
    return out


def _resume_detail(extra: Mapping[str, Any]) -> str:
    r = extra.get("resume") or {}

    def s(x: float | None) -> str:
        return "never" if x is None else f"{x:.2f} s"

    return (
        f"first request {s(r.get('first_sent_s'))}, work {s(r.get('work_sent_s'))}, "
        f"first answer {s(r.get('first_answer_s'))}, server as full as before "
        f"{s(extra.get('refill_s'))}"
    )


def frontier_target(runs: Sequence[Run]) -> Target:
    """The controller's run at the SLO against the frontier's static settings."""
    description = "the controller against the best static setting under the same SLO"
    found = sweep.from_runs(runs, closedplan.FRONTIER_CONTROLLER)
    verdict = found.verdict() if found else None
    if found is None or verdict is None:
        detail = "needs the frontier scenario (the idle server, the grid and the controller)"
        return Target("frontier_controller", description, None, "<=", sweep.P99_SLACK, "x",
                      None, detail)  # fmt: skip
    detail = f"{verdict.reason}; {found.medians_of}"
    chance = found.chance()
    if chance is not None:
        detail += f"; by chance alone: {chance.describe(found.bound)}"
    return Target(
        "frontier_controller",
        description,
        verdict.p99_vs_bound,
        "<=",
        sweep.P99_SLACK,
        "x bound",
        verdict.met,
        detail,
    )
