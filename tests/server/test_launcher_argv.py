"""The pure parts of the launcher: argv per profile, overrides, masking, CLI dry-run."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from llmbatch_server.launcher import PROFILES, build_argv, suggested_client_settings
from llmbatch_server.launcher.profiles import display_command, flag_value


def main(argv: list[str]) -> int:
    """Run the launcher subcommand in-process (see fake_vllm/launcher_main.py)."""
    path = pathlib.Path(__file__).parent / "fake_vllm" / "launcher_main.py"
    spec = importlib.util.spec_from_file_location("launcher_main", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(argv))


@pytest.mark.parametrize(
    ("profile", "seqs", "tokens", "util"),
    [
        ("throughput", "512", "65536", "0.92"),
        ("balanced", "256", "16384", "0.90"),
        ("latency", "64", "8192", "0.85"),
    ],
)
def test_argv_per_profile(profile: str, seqs: str, tokens: str, util: str) -> None:
    argv = build_argv(model="m", profile=profile, port=9000)
    assert argv[:3] == ["vllm", "serve", "m"]
    assert flag_value(argv, "--max-num-seqs") == seqs
    assert flag_value(argv, "--max-num-batched-tokens") == tokens
    assert flag_value(argv, "--gpu-memory-utilization") == util
    assert flag_value(argv, "--max-model-len") == "4096"
    assert flag_value(argv, "--scheduling-policy") == "priority"
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "9000"
    assert ("--enable-prefix-caching" in argv) == (profile != "latency")


def test_unknown_profile() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        build_argv(model="m", profile="fast")


def test_extra_args_override_without_duplicates() -> None:
    argv = build_argv(
        model="m",
        profile="throughput",
        extra=["--max-num-seqs", "8", "--max-model-len=512", "--no-enable-prefix-caching"],
    )
    assert argv.count("--max-num-seqs") == 1
    assert flag_value(argv, "--max-num-seqs") == "8"
    assert flag_value(argv, "--max-model-len") == "512"
    assert not any(a.startswith("--max-model-len") for a in argv[: argv.index("--max-num-seqs")])
    assert "--enable-prefix-caching" not in argv
    assert "--no-enable-prefix-caching" in argv


def test_every_profile_flag_is_overridable() -> None:
    for profile, flags in PROFILES.items():
        extra = [f"{flag}=x" for flag, value in flags.items() if value is not True]
        argv = build_argv(model="m", profile=profile, extra=extra)
        for flag in extra:
            assert argv.count(flag) == 1
            assert flag.split("=")[0] not in argv


def test_suggested_client_settings() -> None:
    settings = suggested_client_settings(build_argv(model="m", profile="latency"))
    assert settings["limits"] == {
        "max_in_flight": 64,
        "max_in_flight_tokens": 64 * 4096,
        "reserved_realtime": 4,
    }
    assert settings["priority_scheduling"] is True
    fcfs = build_argv(model="m", extra=["--scheduling-policy", "fcfs"])
    assert suggested_client_settings(fcfs)["priority_scheduling"] is False


def test_display_masks_secrets() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "s3cret", "--x=a b"]
    shown = display_command(argv, {"VLLM_API_KEY": "s3cret"})
    assert "s3cret" not in shown
    assert shown.startswith("VLLM_API_KEY=*** ")
    assert "'--x=a b'" in shown
    assert "--api-key=***" in display_command(["vllm", "--api-key=s3cret"])


def test_cli_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    launcher_args = ["vllm", "--model", "m", "--profile", "latency", "--api-key", "s3cret"]
    rc = main([*launcher_args, "--dry-run", "--", "--max-num-seqs", "16", "--enforce-eager"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "s3cret" not in out
    assert "VLLM_API_KEY=***" in out
    assert "--max-num-seqs 16" in out
    assert "--max-num-seqs 64" not in out
    assert "--enforce-eager" in out
    assert "limits=llmbatch.Limits(max_in_flight=16," in out
    assert "priority_scheduling=True" in out
    assert 'base_url="http://127.0.0.1:8000/v1"' in out


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com", "::"])
def test_cli_refuses_non_loopback_without_key(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["vllm", "--model", "m", "--host", host, "--dry-run"])
    assert rc == 2
    assert "non-loopback" in capsys.readouterr().err


def test_cli_non_loopback_with_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vllm", "--model", "m", "--host", "0.0.0.0", "--api-key", "k", "--dry-run"]) == 0
    assert "--host 0.0.0.0" in capsys.readouterr().out


def test_cli_missing_vllm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["vllm", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "no `vllm` executable on PATH" in err
    assert "docs/vllm-cpu.md" in err


def test_the_launcher_page_quotes_what_the_launcher_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = (pathlib.Path(__file__).parents[2] / "docs" / "launcher.md").read_text()
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert main(["vllm", "--model", model, "--profile", "throughput", "--dry-run"]) == 0
    settings_line = capsys.readouterr().out.splitlines()[-1]
    assert "reserved_realtime=" in settings_line
    assert f"\n{settings_line}\n" in page
    latency = suggested_client_settings(build_argv(model="m", profile="latency"))
    assert f"\n# {latency!r}\n" in page
