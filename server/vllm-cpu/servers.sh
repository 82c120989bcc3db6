# Shared by fit-compare.sh and frontier.sh (sourced, after PYTHON and STEPS are set):
# one server child at a time, stopped on exit; a free port; its /health awaited; which
# of the script's steps run.
pid=""
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" || true; fi; }
trap cleanup EXIT
free_port() { "$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
wait_health() {
    "$PYTHON" - "$1" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("no /health within 300 s")
PY
}
step() { [[ ",$STEPS," == *",$1,"* ]]; }
