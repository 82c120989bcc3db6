"""Serving profiles and the pure ``vllm serve`` argv builder.

A profile is a set of engine flags from published vLLM configs; explicit
options and extra args override profile values so each flag appears once.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

#: Engine flags per profile. ``True`` means a bare switch.
PROFILES: Mapping[str, Mapping[str, str | bool]] = {
    "throughput": {
        "--max-num-seqs": "512",
        "--max-num-batched-tokens": "65536",
        "--gpu-memory-utilization": "0.92",
        "--max-model-len": "4096",
        "--enable-prefix-caching": True,
        "--scheduling-policy": "priority",
    },
    "balanced": {
        "--max-num-seqs": "256",
        "--max-num-batched-tokens": "16384",
        "--gpu-memory-utilization": "0.90",
        "--max-model-len": "4096",
        "--enable-prefix-caching": True,
        "--scheduling-policy": "priority",
    },
    "latency": {
        "--max-num-seqs": "64",
        "--max-num-batched-tokens": "8192",
        "--gpu-memory-utilization": "0.85",
        "--max-model-len": "4096",
        "--scheduling-policy": "priority",
    },
}

# Flags whose value a "--no-X" twin negates (vLLM uses BooleanOptionalAction).
_NEGATIONS = {"--no-enable-prefix-caching": "--enable-prefix-caching"}


def build_argv(
    *,
    model: str,
    profile: str = "balanced",
    host: str = "127.0.0.1",
    port: int = 8000,
    vllm_bin: str = "vllm",
    extra: Sequence[str] = (),
) -> list[str]:
    """Return the ``vllm serve`` argv for ``profile``; ``extra`` flags win.

    The API key is deliberately absent: it travels in ``VLLM_API_KEY``.

    >>> build_argv(model="m", profile="latency")[:3]
    ['vllm', 'serve', 'm']
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    overridden = {_flag_name(a) for a in extra if a.startswith("--")}
    overridden |= {_NEGATIONS[f] for f in list(overridden) if f in _NEGATIONS}
    argv = [vllm_bin, "serve", model]
    for flag, value in {"--host": host, "--port": str(port), **PROFILES[profile]}.items():
        if flag in overridden:
            continue
        argv.append(flag)
        if value is not True:
            argv.append(str(value))
    argv.extend(extra)
    return argv


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--f v`` or ``--f=v``), else None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def suggested_client_settings(argv: Sequence[str]) -> dict[str, Any]:
    """Keyword arguments for ``llmbatch`` that keep this server just full.

    ``limits`` holds ``llmbatch.Limits`` fields: ``max_in_flight`` matches
    ``--max-num-seqs`` so the rest of the work waits in the client, where
    priorities still apply; ``max_in_flight_tokens`` bounds what those
    sequences may hold. ``priority_scheduling`` is true only when vLLM runs
    ``--scheduling-policy priority`` (on fcfs vLLM silently ignores priority).
    """
    seqs = int(flag_value(argv, "--max-num-seqs") or 256)
    max_len = int(flag_value(argv, "--max-model-len") or 4096)
    return {
        "limits": {
            "max_in_flight": seqs,
            "max_in_flight_tokens": seqs * max_len,
            # ~6% of the slots keep realtime admission instant; the client's fixed
            # default of 16 is a quarter of the latency profile and cost bulk 17%.
            "reserved_realtime": max(1, seqs // 16),
        },
        "priority_scheduling": flag_value(argv, "--scheduling-policy") == "priority",
    }


def format_client_settings(settings: Mapping[str, Any], base_url: str = "...") -> str:
    """Render the suggested settings as the Python a user would paste."""
    limits = ", ".join(f"{k}={v}" for k, v in settings["limits"].items())
    return (
        f'llmbatch.Client(base_url="{base_url}", '
        f"limits=llmbatch.Limits({limits}), "
        f"priority_scheduling={settings['priority_scheduling']})"
    )


def display_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Shell-quoted command for display only; secrets are masked."""
    masked = list(argv)
    for i, arg in enumerate(masked):
        if arg == "--api-key" and i + 1 < len(masked):
            masked[i + 1] = "***"
        elif arg.startswith("--api-key="):
            masked[i] = "--api-key=***"
    prefix = "VLLM_API_KEY=*** " if env and env.get("VLLM_API_KEY") else ""
    return prefix + shlex.join(masked)


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]
