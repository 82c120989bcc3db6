"""``llmbatch-server tiny-model DIR``: a random-weight Llama for CPU tests.

Everything is made locally: a byte-level BPE tokenizer trained on a small
built-in corpus and a few-million-parameter Llama with random weights, saved
in the Hugging Face layout vLLM loads (config, generation config,
safetensors, fast tokenizer with a chat template). Nothing is downloaded.
Heavy imports stay inside the functions so ``llmbatch-server`` starts fast.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

#: Shape chosen for vLLM's CPU backend: head size 64 is a supported size.
TINY_SHAPE: dict[str, int] = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
}
VOCAB_SIZE = 2048
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
INSTALL_HINT = (
    "tiny-model needs torch and transformers: pip install torch==2.13.0 "
    "'llmbatch-server[tiny-model]' (CPU torch, see docs/vllm-cpu.md)"
)

# Enough varied English to give BPE real merges; repeated with variations below.
_CORPUS_SEED = """\
The quick brown fox jumps over the lazy dog. A batch of prompts is sent to the server.
Large language models generate text one token at a time. Scheduling keeps the queue short.
Realtime requests should never wait behind bulk work. Throughput and latency trade off.
Hello, world! How are you today? I am fine, thank you. What is the capital of France?
Paris is the capital of France. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 42.
def main(): return 0  # code also appears in prompts, with {braces} and [brackets].
Once upon a time there was a small model that answered every question with random words.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``tiny-model`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "tiny-model",
        help="write a tiny random-weight Llama (for CPU vLLM tests)",
        description="Write a random-weight Llama with a locally trained tokenizer to DIR.",
    )
    p.add_argument("dir", help="output directory (created)")
    p.add_argument(
        "--seed", type=int, default=0, help="seeds the random weights (default: %(default)s)"
    )
    p.set_defaults(handler=run, passes_extra=False)
    return p


def run(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    """Entry point for ``llmbatch-server tiny-model``."""
    try:
        path = make_tiny_model(args.dir, seed=args.seed)
    except ImportError as exc:
        print(f"llmbatch-server tiny-model: error: {INSTALL_HINT} ({exc})", file=sys.stderr)
        return 2
    print(path)
    return 0


def make_tiny_model(directory: str | pathlib.Path, *, seed: int = 0) -> pathlib.Path:
    """Write the tiny model to ``directory`` and return its path."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(out)

    # Optional heavy deps: may be absent where mypy runs.
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
        **TINY_SHAPE,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out)
    return out


def _train_tokenizer() -> Any:
    """Train a byte-level BPE tokenizer and wrap it as a HF fast tokenizer."""
    from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found,unused-ignore]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=TINY_SHAPE["max_position_embeddings"],
    )


def _corpus() -> list[str]:
    # Case and punctuation variants so merges cover more than one spelling.
    lines = _CORPUS_SEED.splitlines()
    return [v for line in lines for v in (line, line.lower(), line.upper(), " " + line)] * 4
