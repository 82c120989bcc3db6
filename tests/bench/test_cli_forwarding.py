"""``llmbatch bench`` hands its arguments to the separate ``llmbatch_bench`` package,
and says how to install it when it is missing."""

from __future__ import annotations

import pytest

from llmbatch import _cli


def test_bench_arguments_reach_the_bench_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["bench", "--scenario", "nope"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # The bench's own parser rejected it, under the name the user typed.
    assert err.startswith("usage: llmbatch bench")
    assert "--scenario: expected a comma list" in err


def test_bench_help_is_the_bench_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--overhead-n" in capsys.readouterr().out


def test_missing_bench_package_gives_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not installed: no package registers the `bench` command.
    monkeypatch.setattr(_cli, "entry_points", lambda group: ())
    assert _cli.main(["bench", "--n", "5"]) == 2
    err = capsys.readouterr().err
    assert "pip install -e ./bench" in err
    # Only what works: the package is on no registry yet.
    assert "pip install llmbatch-bench" not in err


def test_the_bench_package_registers_the_command() -> None:
    # `llmbatch bench` names no package: it runs what registers as `bench`.
    from importlib.metadata import entry_points

    [command] = [e for e in entry_points(group=_cli.COMMANDS_GROUP) if e.name == "bench"]
    assert command.value == "llmbatch_bench.cli:main"
    assert command.dist is not None
    assert command.dist.name == "llmbatch-bench"


def test_other_subcommands_still_reject_unknown_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["run", "in.jsonl", "-o", "out.jsonl", "--no-such-flag"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def _config(argv: list[str]) -> object:
    from llmbatch_bench import cli

    split = argv.index("--") if "--" in argv else len(argv)
    args = cli.build_parser("llmbatch bench").parse_args(argv[:split])
    args.vllm_args = argv[split + 1 :]
    return cli.config_from_args(args)


def test_vllm_takes_its_own_arguments_after_the_double_dash() -> None:
    config = _config(
        ["--vllm", "/models/tiny", "--vllm-profile", "balanced", "--", "--enforce-eager"]
    )
    assert config.vllm_model == "/models/tiny"  # type: ignore[attr-defined]
    assert config.vllm_args == ("--enforce-eager",)  # type: ignore[attr-defined]
    assert config.vllm_profile == "balanced"  # type: ignore[attr-defined]


def test_the_frontier_may_give_the_controller_a_per_token_slo_alone() -> None:
    assert _config(["--scenario", "frontier"]).frontier_slo == "both"  # type: ignore[attr-defined]
    tpot = _config(["--scenario", "frontier", "--frontier-slo", "tpot"])
    assert tpot.frontier_slo == "tpot"  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        _config(["--scenario", "frontier", "--frontier-slo", "ttft"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vllm", "m", "--url", "http://127.0.0.1:1/v1"], "exclude each other"),
        (["--vllm", "m", "--sim"], "exclude each other"),
        (["--n", "5", "--", "--enforce-eager"], "need --vllm MODEL"),
        (["--scenario", "ceiling"], "it needs --vllm MODEL"),
    ],
)
def test_vllm_refuses_what_it_cannot_mean(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_short_prompts_are_short(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmbatch_bench import jobs

    standard = jobs.prompt(7)
    monkeypatch.setenv(jobs.PROMPTS_ENV, "short")
    assert jobs.prompt(7) == "Request 7: hi."
    assert len(standard) > 5 * len(jobs.prompt(7))


def test_prompt_shapes_have_their_lengths_and_realtime_stays_standard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmbatch_bench import jobs
    from llmbatch_server.sim.counting import EstimateCounter

    count = EstimateCounter().count
    standard = count(jobs.prompt(7))
    monkeypatch.setenv(jobs.PROMPTS_ENV, "long")
    assert 20 * standard < count(jobs.prompt(7)) < 30 * standard
    assert count(jobs.realtime_prompt(7)) < 2 * standard  # (its number is longer)
    monkeypatch.setenv(jobs.PROMPTS_ENV, "mixed")
    lengths = sorted(count(jobs.prompt(i)) for i in range(10))
    assert lengths[6] < 2 * standard  # seven standard ...
    assert 4 * standard < lengths[7] <= lengths[8] < 8 * standard  # ... two of ~250 ...
    assert lengths[9] > 20 * standard  # ... and one long
    with pytest.raises(ValueError, match="unknown prompt shape"):
        jobs.use_prompts("huge")


def test_the_hosted_scenario_takes_its_limiter_and_a_short_form() -> None:
    full = _config(["--scenario", "hosted"])
    assert (full.hosted_conversations, full.hosted_rpm, full.hosted_tpm) == (3000, 6000, 90000)  # type: ignore[attr-defined]
    short = _config(["--scenario", "hosted", "--smoke", "--hosted-headers", "together"])
    assert short.hosted_conversations == 300  # type: ignore[attr-defined]
    assert short.hosted_headers == "together"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="--hosted-tpm must be >= 1"):
        _config(["--scenario", "hosted", "--hosted-tpm", "0"])
