"""Convert a Hugging Face model to GGUF with the llama.cpp sources' own converter,
falling back to llama.cpp's ``default`` pre-tokenizer when the converter's table
does not know the model's tokenizer (the tiny test model's is trained locally, so
no table names it).

Usage: python convert.py LLAMA_CPP_SRC HF_DIR OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(src: str, hf_dir: str, out: str) -> None:
    sys.path[:0] = [src, str(Path(src) / "gguf-py")]
    import convert_hf_to_gguf
    from conversion import base

    known = base.TextModel.get_vocab_base_pre

    def pre_or_default(self: object, tokenizer: object) -> str:
        try:
            return str(known(self, tokenizer))  # type: ignore[arg-type]
        except NotImplementedError:
            return "default"

    base.TextModel.get_vocab_base_pre = pre_or_default  # type: ignore[method-assign]
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", "f32"]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(*sys.argv[1:4])
