"""llama-server's command line as LlamaServerProcess builds it (the server itself
runs in the llama.cpp stage: tests/real_llamacpp)."""

from __future__ import annotations

from llmbatch_server.llama_process import LlamaServerProcess


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_prompt_cache_is_off_unless_asked_for() -> None:
    # Distinct prompts only grow llama-server's host-memory cache, which slows it
    # as it fills: a measurement's rounds would not meet the same server.
    argv = LlamaServerProcess("llama-server", "m.gguf").argv()
    assert _flag(argv, "--cache-ram") == "0"
    assert _flag(argv, "--host") == "127.0.0.1"
    sized = LlamaServerProcess("llama-server", "m.gguf", prompt_cache_mib=1024).argv()
    assert _flag(sized, "--cache-ram") == "1024"
    default = LlamaServerProcess("llama-server", "m.gguf", prompt_cache_mib=None).argv()
    assert "--cache-ram" not in default
