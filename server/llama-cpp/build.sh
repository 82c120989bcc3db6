#!/usr/bin/env bash
# Build llama.cpp's own server (`llama-server`, CPU) from the sources that the
# llama-cpp-python sdist vendors (PyPI is the only registry this project reaches).
# Idempotent: an existing binary is kept. Prints the binary's path.
# Usage: server/llama-cpp/build.sh [DIR]   (default /work/llama-cpp)
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), BUILD_JOBS (default: nproc).
set -euo pipefail
DIR="${1:-${LLMBATCH_LLAMA_DIR:-/work/llama-cpp}}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
BIN="$DIR/build/bin/llama-server"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$DIR"
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
    work=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: -d "$work" \
        "llama-cpp-python==$VERSION" >&2
    tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
    rm -rf "$DIR/src"
    mv "$work"/llama_cpp_python-*/vendor/llama.cpp "$DIR/src"
    rm -rf "$work"
fi
command -v cmake >/dev/null || { echo "llama.cpp needs cmake" >&2; exit 1; }
# CPU only, no curl (nothing is fetched at run time), the server target alone.
cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$DIR/build" --target llama-server -j "${BUILD_JOBS:-$(nproc)}" >&2
echo "$BIN"
