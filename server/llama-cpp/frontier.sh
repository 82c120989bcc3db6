#!/usr/bin/env bash
# The frontier (issue #46) on llama.cpp's server: `llmbatch bench --scenario frontier`
# against llama-server with 16 slots (as in CI's stage), caps 1 to 32 (past its slots
# bulk only queues there). Builds llama-server and the model if they are missing
# (build.sh, model.sh). ~15 minutes.
# Usage: server/llama-cpp/frontier.sh OUT_DIR [PYTHON]
# Env: LLMBATCH_LLAMA_DIR (default /work/llama-cpp); FRONTIER_ARGS, more bench options;
#   LLAMA_PROMPT_CACHE_MIB, llama-server's --cache-ram (default 0: off; "default": its own).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="$1"
PYTHON="${2:-.venv/bin/python}"
DIR="${LLMBATCH_LLAMA_DIR:-/work/llama-cpp}"
mkdir -p "$OUT"
binary=$(server/llama-cpp/build.sh "$DIR")
model=$(server/llama-cpp/model.sh "$DIR")
"$PYTHON" - "$binary" "$model" "$OUT" "${FRONTIER_ARGS:-}" "${LLAMA_PROMPT_CACHE_MIB:-0}" <<'PY'
import shlex, subprocess, sys
from llmbatch_server.llama_process import LlamaServerProcess
binary, model, out, more, cache = sys.argv[1:]
mib = None if cache == "default" else int(cache)
with LlamaServerProcess(binary, model, parallel=16, prompt_cache_mib=mib) as server, open(f"{out}/frontier-llamacpp.txt", "w") as log:
    subprocess.run(
        [sys.executable, "-m", "llmbatch_bench", "--url", server.base_url, "--scenario", "frontier",
         "--frontier-caps", "1,2,4,8,16,32", *shlex.split(more),
         "--json", f"{out}/frontier-llamacpp.json", "--plots", f"{out}/frontier-llamacpp"],
        check=True, timeout=3600, stdout=log, stderr=subprocess.STDOUT,
    )
PY
echo "results in $OUT/frontier-llamacpp*"
