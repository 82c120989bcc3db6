#!/usr/bin/env bash
# The release as a user installs it: build an sdist and a wheel of each package (the
# wheel from the sdist, so the sdist is complete), check their metadata, install the
# three wheels into a fresh venv (not editable, no checkout on the path) and run the
# demo and a short bench from a scratch directory; then each wheel in a venv of its own
# (.ci/alone.sh). Usage: .ci/wheels.sh PYTHON
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m pip install -q build twine
for package in . server bench; do
    "$python" -m build -q --outdir "$work/dist" "$package" >/dev/null
done
ls "$work/dist"
"$python" -m twine check --strict "$work"/dist/*

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/*.whl
cd "$work"  # nothing of the checkout importable from here
"$work/venv/bin/python" - <<'PY'
import sys
import llmbatch, llmbatch_bench, llmbatch_server
for module in (llmbatch, llmbatch_bench, llmbatch_server):
    assert "site-packages" in module.__file__, module.__file__
    assert module.__version__ == llmbatch.__version__, module
print("installed from the wheels:", llmbatch.__version__, file=sys.stderr)
PY
"$work/venv/bin/llmbatch" --version
"$work/venv/bin/llmbatch-server" --version
"$work/venv/bin/llmbatch-bench" --version
timeout 300 "$work/venv/bin/python" "$repo/examples/demo.py" --bulk 300
timeout 300 "$work/venv/bin/llmbatch" bench --scenario bulk,single --n 200 --single-n 100 \
    --repeat 1 --json "$work/bench.json"

# Each wheel alone, with only what it declares (~45 s).
"$repo/.ci/alone.sh" "$work/dist"
