#!/usr/bin/env bash
# This project's GPU run: the third device call of ../shared/gpu (its prepare.sh builds
# the payload; copy this file over .gpu/b/run.sh, rebuild llmbatch's wheels into .gpu/b).
# One `llmbatch bench --vllm` on one vLLM 0.26 server (a Llama-3-8B-shaped model with
# dummy weights, the launcher's balanced profile): vLLM's offline LLM.generate first
# (the ceiling), then llmbatch and raw aiohttp on standard prompts, then the slo
# scenario with bulk paced for its prefill (the cost measured on the server by fit's
# prefill probe). JSON, the bench's log and vLLM's log land in $OUT.
# The repository has outgrown the 64 MiB a call carries beside .gpu/a as prepare.sh
# splits it: move its last 8,000,000 bytes of vllm.part00 to .gpu/c/vllm.part00b and
# mistral_common's wheel from .gpu/b to .gpu/a (this script joins the three parts).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; B=$(cd "$(dirname "$0")" && pwd); S=/tmp/site; mkdir -p $S
if [ ! -f $S/.done ]; then
  cat /tmp/gpu/vllm.part00 /tmp/gpu/vllm.part00b "$B/vllm.part01" | LD_LIBRARY_PATH="$B/bin" "$B/bin/zstd" -d -q | tar x -C $S || { el "untar failed"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S "$B"/*.whl /tmp/gpu/*.whl 2>&1 | tail -3
  touch $S/.done
fi
export PYTHONPATH=$S PATH=$S/bin:$PATH PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# The untarred package has no console script; the launcher runs `vllm serve`.
mkdir -p $S/bin; printf '#!/usr/bin/env python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\nif __name__ == "__main__":\n    sys.exit(main())\n' > $S/bin/vllm
chmod +x $S/bin/vllm
M=/tmp/model8b; mkdir -p $M; cp "$B"/model/* $M/
python3 -c "import vllm, llmbatch; print('vllm', vllm.__version__, 'llmbatch', llmbatch.__version__)"
el "installed"
# SCENARIOS, SHAPE, N and MAXLEN choose another run (SCENARIOS=ceiling SHAPE=mixed N=2000
# MAXLEN=4096: the long prompts are ~2,460 tokens on the tiny tokenizer; the bench
# refuses a shape that does not fit before any engine starts).
timeout "${BENCH_TIMEOUT:-470}" llmbatch bench --vllm $M --vllm-bin $S/bin/vllm --vllm-profile balanced \
  --scenario "${SCENARIOS:-ceiling,slo}" --prompts "${SHAPE:-standard}" --n "${N:-4000}" --max-tokens 64 \
  --clients llmbatch,aiohttp --concurrency 256 \
  --slo-pace --slo-prefill-cost fit --slo-baselines '' --realtime-rate 2 --realtime-max-tokens 16 \
  --slo-duration 20 --slo-warmup 8 --json "$OUT/gpu-${SHAPE:-standard}.json" \
  -- --load-format dummy --max-model-len "${MAXLEN:-2048}" --gpu-memory-utilization 0.85 >"$OUT/bench.log" 2>&1
el "bench exited $?"
grep -E '^\| |ceiling:|prefill cost|server:' "$OUT/bench.log" | head -60; tail -5 "$OUT/bench.log"
for d in /tmp/llmbatch-vllm-*; do [ -f "$d/vllm.log" ] && tail -c 2000000 "$d/vllm.log" > "$OUT/vllm-$(basename "$d").log"; done
el done
