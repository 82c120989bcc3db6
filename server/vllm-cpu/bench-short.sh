#!/usr/bin/env bash
# CI: the short form of `llmbatch bench` against a real vLLM (issue #22), so that the
# bench keeps working on the engine itself: the engine's ceiling (#33), bulk and slo;
# then `llmbatch-server fit` on it, and the
# simulator serving that fit. Printed, never judged: the machine is
# shared, and the figures worth reading come from full runs (docs/benchmarks.md).
# Usage: server/vllm-cpu/bench-short.sh [PYTHON] [VLLM_VENV]
#   PYTHON: the venv with llmbatch, llmbatch-server and llmbatch-bench (.venv/bin/python)
#   VLLM_VENV: where install.sh put vLLM (default $LLMBATCH_VLLM_VENV or /work/vllm-venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${1:-.venv/bin/python}"
VENV="${2:-${LLMBATCH_VLLM_VENV:-/work/vllm-venv}}"
work=$(mktemp -d)
launcher=""
cleanup() {
    # The launcher stops vLLM's whole process group on SIGTERM, then exits.
    if [ -n "$launcher" ]; then kill -TERM "$launcher" 2>/dev/null || true; wait "$launcher" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# The tiny model the real-vLLM tests use, built by the vLLM venv's torch.
PYTHONPATH=server "$VENV/bin/python" -c \
    "import sys; from llmbatch_server.tiny_model import make_tiny_model; make_tiny_model(sys.argv[1])" \
    "$work/model" >/dev/null
# The engine's ceiling in its short form (~1 min): vLLM's offline LLM.generate with the
# server's engine flags, then llmbatch and raw aiohttp over HTTP, as shares of it.
VLLM_CPU_KVCACHE_SPACE=1 timeout --kill-after=30 600 "$PYTHON" -m llmbatch_bench \
    --vllm "$work/model" --vllm-bin "$VENV/bin/vllm" --scenario ceiling --prompts short \
    --n 300 --max-tokens 4 --clients llmbatch,aiohttp -- --enforce-eager --max-model-len 1024
port=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
VLLM_CPU_KVCACHE_SPACE=1 "$PYTHON" -m llmbatch_server vllm --model "$work/model" \
    --profile latency --port "$port" --vllm-bin "$VENV/bin/vllm" --startup-timeout 300 \
    -- --enforce-eager --max-num-seqs 16 --max-model-len 1024 >"$work/vllm.log" 2>&1 &
launcher=$!
"$PYTHON" - "$port" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(url, timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("vLLM did not answer /health within 300 s")
PY
timeout --kill-after=30 600 "$PYTHON" -m llmbatch_bench --url "http://127.0.0.1:$port/v1" \
    --scenario bulk,slo --n 300 --max-tokens 4 --clients llmbatch,openai \
    --slo-baselines '' --realtime-rate 2 --realtime-max-tokens 16 --slo-warmup 3 --slo-duration 8

# Fit the simulator to this vLLM (reduced probes, ~30 s) and serve one request with it.
"$PYTHON" -m llmbatch_server fit --url "http://127.0.0.1:$port/v1" -o "$work/fit.json" \
    --sequences 1,4,16 --tokens 16 --repeat 1 --prompt-lengths 16,256
# The gauge series under a saturating map (issue #31), on vLLM, then on the fitted
# simulator: the short form of fit-compare.sh's comparison, printed.
echo "gauges, vLLM:"
"$PYTHON" -m llmbatch_bench.experiments.gauges --url "http://127.0.0.1:$port/v1" --seconds 5 --warmup 2
"$PYTHON" - "$work/fit.json" <<'PY'
import subprocess, sys, httpx
from llmbatch_server.testing import run_simulator
# The fit's probes stop at 16 sequences, so they cannot show vLLM's cap of 16 here:
# the simulator is told it, as the launcher's profile tells vLLM.
with run_simulator("--fitted", sys.argv[1], "--max-num-seqs", "16") as sim:
    model = httpx.get(sim.base_url + "/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "prompt": "hello", "max_tokens": 4}
    answer = httpx.post(sim.base_url + "/completions", json=body, timeout=60)
    answer.raise_for_status()
    print("sim --fitted answered:", answer.json()["usage"])
    print("gauges, the fitted simulator:", flush=True)
    gauges = [sys.executable, "-m", "llmbatch_bench.experiments.gauges", "--url", sim.base_url]
    subprocess.run([*gauges, "--seconds", "5", "--warmup", "2"], check=True, timeout=60)
PY
