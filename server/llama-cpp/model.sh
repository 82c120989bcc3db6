#!/usr/bin/env bash
# The tiny random-weight Llama (llmbatch-server tiny-model) as GGUF, for llama.cpp's
# server: made by a venv of its own (CPU torch, transformers) and converted with the
# llama.cpp sources' own convert_hf_to_gguf.py. Idempotent. Prints the GGUF's path.
# Usage: server/llama-cpp/model.sh [DIR]   (default /work/llama-cpp; build.sh fills src/)
# The converter's pre-tokenizer table does not know the tiny tokenizer: it falls
# back to llama.cpp's "default" pre-tokenizer (LLAMA_CPP_DEFAULT_PRE=1 below).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DIR="${1:-${LLMBATCH_LLAMA_DIR:-/work/llama-cpp}}"
GGUF="$DIR/tiny.gguf"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -f "$GGUF" ]; then echo "$GGUF"; exit 0; fi
[ -f "$DIR/src/convert_hf_to_gguf.py" ] || { echo "run build.sh first" >&2; exit 1; }
VENV="$DIR/venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# torch pinned: an unpinned resolve would pull the multi-GB CUDA build.
"$VENV/bin/pip" install -q "torch==2.13.0" "transformers>=4.45" "tokenizers>=0.19" numpy \
    sentencepiece safetensors "$DIR/src/gguf-py" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
"$VENV/bin/pip" install -q --no-deps "$ROOT/server" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
"$VENV/bin/python" -c \
    "import sys; from llmbatch_server.tiny_model import make_tiny_model; make_tiny_model(sys.argv[1])" \
    "$DIR/tiny-hf" >&2
"$VENV/bin/python" "$HERE/convert.py" "$DIR/src" "$DIR/tiny-hf" "$GGUF" >&2
echo "$GGUF"
