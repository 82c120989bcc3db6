#!/usr/bin/env bash
# Each package as a user installs it on its own: its wheel into a fresh venv with only
# what it declares (no dev extras, no checkout on the path), every public name touched.
# llmbatch alone; llmbatch-server alone; llmbatch-bench with its two sibling wheels
# through --find-links (they are not on the package index). Then the llmbatch venv runs
# the quickstart's first program against a simulator started from the server's venv.
# An import that a package uses but does not declare fails here.
# Usage: .ci/alone.sh DIST (a folder with the three wheels; .ci/wheels.sh builds them)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
dist=$(cd "$1" && pwd)
work=$(mktemp -d)
sim_pid=""
cleanup() {
    if [ -n "$sim_pid" ]; then kill "$sim_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

alone() {  # alone NAME WHEEL-GLOB: a fresh venv with that wheel and what it declares
    python3 -m venv "$work/$1"
    "$work/$1/bin/pip" install -q --find-links "$dist" "$dist"/$2 2>&1 \
        | { grep -v "^WARNING: Location" || true; }
}
alone client 'llmbatch-*.whl'
alone server 'llmbatch_server-*.whl'
alone bench 'llmbatch_bench-*.whl'

cd "$work"  # nothing of the checkout importable from here
"$work/client/bin/python" "$repo/.ci/touch_public.py" llmbatch
"$work/server/bin/python" "$repo/.ci/touch_public.py" llmbatch_server
"$work/bench/bin/python" "$repo/.ci/touch_public.py" llmbatch_bench
"$work/client/bin/llmbatch" --version
"$work/server/bin/llmbatch-server" --version
"$work/bench/bin/llmbatch-bench" --version

# The quickstart's first program, as written, against a simulator on its port.
port=$("$work/server/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$work/server/bin/llmbatch-server" sim --port "$port" >"$work/sim.log" 2>&1 &
sim_pid=$!
"$work/client/bin/python" "$repo/.ci/quickstart_first.py" "$repo/docs/quickstart.md" "$port"
