"""Prompt token counts: the built-in estimate against real tokenizers, and
``--tokenizer`` for exact counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch_server.cli import main
from llmbatch_server.sim.counting import EstimateCounter, load_counter
from llmbatch_server.testing import run_simulator

# Texts with their counts by two real tokenizers; see the file's "about".
SAMPLES = json.loads((Path(__file__).parent / "data" / "token_samples.json").read_text("utf-8"))
MEASURED = [(m["kind"], m["text"], m["tekken"], m["sp32k"]) for m in SAMPLES["samples"]]


@pytest.mark.parametrize(
    ("kind", "text", "tekken", "sp32k"), MEASURED, ids=[m[0] for m in MEASURED]
)
def test_estimate_tracks_real_tokenizers(kind: str, text: str, tekken: int, sp32k: int) -> None:
    estimate = EstimateCounter().count(text)
    low, high = min(tekken, sp32k), max(tekken, sp32k)
    assert 0.85 * low <= estimate <= 1.15 * high, (kind, estimate, tekken, sp32k)


def test_estimate_counts_random_token_text_like_tokens() -> None:
    # Each was built from 63 token ids; the old word-count estimate saw a few
    # long "words" in such text (1,775 tokens where vLLM counted 12,600).
    garbage = [text for kind, text, _, _ in MEASURED if kind.startswith("random")]
    for text in garbage:
        assert EstimateCounter().count(text) >= 60


_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs", "Cc"]),
    max_size=200,
)


@given(_TEXT)
def test_encode_length_is_the_count(text: str) -> None:
    counter = EstimateCounter()
    ids = counter.encode(text)
    assert len(ids) == counter.count(text)
    assert ids[0] == 1  # BOS
    assert all(1 <= i < 32000 for i in ids)


@given(_TEXT.filter(lambda t: t and not t[-1].isspace()), _TEXT.filter(lambda t: t[:1] != " "))
def test_a_prefix_keeps_its_ids(head: str, tail: str) -> None:
    # The prefix cache hashes these ids: a shared prefix must give shared ids.
    counter = EstimateCounter()
    prefix = counter.encode(head)
    assert counter.encode(head + "\n" + tail)[: len(prefix)] == prefix


def test_usage_and_tokenize_use_the_same_counter() -> None:
    prompt = MEASURED[0][1]
    with (
        run_simulator("--speed", "200") as sim,
        httpx.Client(base_url=sim.url, timeout=30) as http,
    ):
        usage = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
        tokenized = http.post("/tokenize", json={"prompt": prompt}).json()
    assert usage["usage"]["prompt_tokens"] == tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["count"] == EstimateCounter().count(prompt)


def _tokenizer_file(directory: Path) -> Path:
    """A small byte-level BPE tokenizer.json with a BOS, trained on the spot."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text for _, text, _, _ in MEASURED] * 3, trainer=trainer)
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    path = directory / "tokenizer.json"
    tok.save(str(path))
    return path


def test_tokenizer_file_gives_exact_counts(tmp_path: Path) -> None:
    path = _tokenizer_file(tmp_path)
    import tokenizers

    exact = tokenizers.Tokenizer.from_file(str(path))
    prompts = [text for _, text, _, _ in MEASURED[:3]]
    with (
        run_simulator("--speed", "200", "--tokenizer", str(tmp_path)) as sim,  # a directory works
        httpx.Client(base_url=sim.url, timeout=30) as http,
    ):
        body = http.post("/v1/completions", json={"prompt": prompts, "max_tokens": 1}).json()
        tokenized = http.post("/tokenize", json={"prompt": prompts[1]}).json()
    assert body["usage"]["prompt_tokens"] == sum(len(exact.encode(p).ids) for p in prompts)
    assert tokenized["tokens"] == exact.encode(prompts[1]).ids


def test_missing_tokenizers_package_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    with pytest.raises(ValueError, match="pip install 'llmbatch-server\\[tokenizer\\]'"):
        load_counter(tmp_path / "tokenizer.json")
    assert main(["sim", "--port", "0", "--tokenizer", str(tmp_path / "tokenizer.json")]) == 2
    assert "needs the tokenizers package" in capsys.readouterr().err


def test_unreadable_tokenizer_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tokenizers")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    assert main(["sim", "--port", "0", "--tokenizer", str(bad)]) == 2
    assert "cannot load tokenizer" in capsys.readouterr().err
