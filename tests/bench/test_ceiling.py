"""The ceiling's offline run gets the engine flags ``vllm serve`` gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbatch_bench.ceiling import offline_argv
from llmbatch_bench.jobs import prompt, use_prompts
from llmbatch_bench.server import check_prompts_fit


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


def test_a_shape_longer_than_the_servers_context_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    bytewise = tokenizers.Tokenizer(tokenizers.models.BPE())
    bytewise.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bytewise.train_from_iterator(
        [],
        trainer=tokenizers.trainers.BpeTrainer(
            vocab_size=300,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bytewise.save(str(tmp_path / "tokenizer.json"))  # a token a byte
    try:
        use_prompts("long")
        longest = max(len(prompt(99_999_990 + i).encode()) for i in range(10))
        check_prompts_fit(str(tmp_path), "latency", ["--max-model-len", "100000"], "long", 64)
        with pytest.raises(ValueError, match=r"--prompts long: .* --max-model-len 2048"):
            check_prompts_fit(str(tmp_path), "latency", ["--max-model-len", "2048"], "long", 64)
        # The profile's own context counts where no flag overrides it (4,096 tokens).
        assert longest + 64 > 4096
        with pytest.raises(ValueError, match="--max-model-len 4096"):
            check_prompts_fit(str(tmp_path), "latency", [], "mixed", 64)
        check_prompts_fit(str(tmp_path), "latency", [], "standard", 64)
    finally:
        use_prompts("standard")
