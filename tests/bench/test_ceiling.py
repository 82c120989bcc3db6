"""The ceiling's offline run gets the engine flags ``vllm serve`` gets."""

from __future__ import annotations

from llmbatch_bench.ceiling import offline_argv


def test_the_offline_engine_gets_the_servers_engine_flags_and_no_serving_ones() -> None:
    argv = offline_argv("/models/m", "latency", ["--enforce-eager", "--max-model-len", "1024"])
    assert argv[:2] == ["--model", "/models/m"]
    assert "--host" not in argv
    assert "--port" not in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "64"  # the launcher's profile
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert "--enforce-eager" in argv
    assert argv[argv.index("--max-model-len") + 1] == "1024"  # extra flags win
    assert argv.count("--max-model-len") == 1
