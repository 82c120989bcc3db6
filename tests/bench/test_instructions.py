"""The instruction counter: its arithmetic, its arguments, and a real count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import llmbatch
from llmbatch_bench.hotpath.instructions import (
    Count,
    client_timeout,
    instructions_of,
    main,
    per_unit,
    render,
)

CACHEGRIND_TAIL = """\
==6032== Collected : 2238816869
==6032== I   refs:      2,238,816,869
"""


def test_the_total_is_read_from_cachegrinds_summary() -> None:
    assert instructions_of(CACHEGRIND_TAIL) == 2_238_816_869
    with pytest.raises(ValueError, match="no 'I refs' line"):
        instructions_of("==1== ERROR SUMMARY: 0 errors")


def test_what_runs_once_cancels_out() -> None:
    # 1,000 instructions of start-up, then 700 a call.
    assert per_unit(1_000 + 700 * 20, 1_000 + 700 * 60, 20, 60) == 700
    with pytest.raises(ValueError, match="larger than"):
        per_unit(1, 2, 60, 20)


def test_each_pair_shows_its_ratio_and_what_llmbatch_adds() -> None:
    counts = [
        Count("single", 20, 60, 0, 0, 900_000.0),
        Count("raw", 20, 60, 0, 0, 450_000.0),
        Count("map", 500, 1500, 0, 0, 120_000.0),
    ]  # the probe was not counted
    text = render(counts)
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines()]
    assert ["single vs raw", "call", "900,000", "450,000", "2.00x", "450,000"] in rows
    assert ["map vs probe", "prompt", "120,000", "-", "-", "-"] in rows
    assert render(counts[:1]).count("vs") == 1  # a pair neither side of which ran: no row


def test_the_read_timeout_to_count_with() -> None:
    assert client_timeout("default") == llmbatch.DEFAULT_TIMEOUT
    assert client_timeout("none").read is None
    assert client_timeout("2.5").read == 2.5
    with pytest.raises(ValueError, match="'default', 'none' or seconds"):
        client_timeout("soon")


@pytest.mark.parametrize(
    "flags",
    [
        ["--single-n", "60"],
        ["--single-n", "60,20"],
        ["--map-n", "0,10"],
        ["--programs", "nope"],
        ["--read-timeout", "soon"],
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    assert exit_info.value.code == 2


@pytest.mark.slow  # four processes under valgrind, ~1 min; CI's slow stage runs it
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_llmbatch_and_raw_aiohttp_counted_against_a_real_simulator(tmp_path: Path) -> None:
    out = tmp_path / "counts.json"
    assert main(["--programs", "single,raw", "--single-n", "5,15", "--json", str(out)]) == 0
    counts = {c["program"]: c for c in json.loads(out.read_text())["counts"]}
    assert set(counts) == {"single", "raw"}
    for count in counts.values():
        assert count["instructions_n2"] > count["instructions_n1"] > 0
    # A raw request is a few hundred thousand instructions; llmbatch does its work
    # on top of one.
    assert 100_000 < counts["raw"]["per_unit"] < counts["single"]["per_unit"]
