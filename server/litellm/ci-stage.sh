#!/usr/bin/env bash
# CI stage: LiteLLM's proxy, a server nobody here wrote, in front of the simulator
# with limits of its own. Installs litellm[proxy] into a venv of its own (its
# dependencies would pin the test environment's; ~1 min), then runs
# tests/real_litellm against it.
# Usage: server/litellm/ci-stage.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${1:-.venv/bin/python}"
VENV="${LLMBATCH_LITELLM_VENV:-/work/litellm-venv}"
start=$(date +%s)
if [ ! -x "$VENV/bin/litellm" ]; then
    python3 -m venv "$VENV"
    # The version the closing notes' runs used; the proxy's extra brings its server.
    timeout 900 "$VENV/bin/pip" install -q 'litellm[proxy]==1.108.7'
fi
echo "litellm: $("$VENV/bin/pip" show litellm | sed -n 's/^Version: //p') ($(($(date +%s) - start)) s to install)"
LLMBATCH_LITELLM="$VENV/bin/litellm" \
    timeout --kill-after=30 600 "$PYTHON" -m pytest tests/real_litellm -p no:cacheprovider -q -s
echo "LiteLLM stage took $(($(date +%s) - start)) s"
