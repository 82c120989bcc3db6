#!/usr/bin/env bash
# CI stage: llama.cpp's own server as a second real engine. Builds llama-server from
# the sources the llama-cpp-python sdist vendors (~5 min on 2 cores), converts the
# tiny model to GGUF (~1 min), runs tests/real_llamacpp, then the bench's slo
# scenario against it in its short form (printed, not judged).
# Usage: server/llama-cpp/ci-stage.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${1:-.venv/bin/python}"
DIR="${LLMBATCH_LLAMA_DIR:-/work/llama-cpp}"
start=$(date +%s)
binary=$(server/llama-cpp/build.sh "$DIR")
model=$(server/llama-cpp/model.sh "$DIR")
echo "llama-server: $binary; model: $model ($(($(date +%s) - start)) s to build both)"

LLMBATCH_LLAMA_SERVER="$binary" LLMBATCH_LLAMA_MODEL="$model" \
    timeout --kill-after=30 600 "$PYTHON" -m pytest tests/real_llamacpp -p no:cacheprovider -q

# The slo scenario on llama.cpp (16 slots): realtime streams beside saturating bulk.
"$PYTHON" - "$binary" "$model" <<'PY'
import subprocess, sys
from llmbatch_server.llama_process import LlamaServerProcess
with LlamaServerProcess(sys.argv[1], sys.argv[2], parallel=16) as server:
    subprocess.run(
        [sys.executable, "-m", "llmbatch_bench", "--url", server.base_url, "--scenario", "slo",
         "--slo-baselines", "", "--realtime-rate", "2", "--realtime-max-tokens", "16",
         "--slo-warmup", "3", "--slo-duration", "10"],
        check=True, timeout=600,
    )
PY
echo "llama.cpp stage took $(($(date +%s) - start)) s"
