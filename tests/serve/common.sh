# common.sh - sourced by tests/serve_*.sh: a temp dir, servers started on free
# ports (--port 0, the port read from the log) and killed by a trap, and the
# Python HTTP helpers in tests/serve/client.py.
set -u
: "${ORCH_BIN:?ORCH_BIN must point at the orch binary (tests/run_tests.sh sets it)}"
SERVE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$SERVE_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
T=$(mktemp -d)
SERVER_PIDS=()
cleanup() {
  for p in "${SERVER_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }

# start_server NAME [orch serve options...]: sets PORT and PID; the log is
# $T/NAME.log. Waits for "ready" (or returns as soon as the port is known with
# START_NO_WAIT=1).
start_server() {
  local name=$1; shift
  local log="$T/$name.log"
  "$ORCH_BIN" serve --engine=mock --port 0 "$@" 2>"$log" &
  PID=$!
  SERVER_PIDS+=("$PID")
  PORT=""
  for _ in $(seq 1 600); do
    if [ -z "$PORT" ]; then
      PORT=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' "$log" 2>/dev/null | head -n1 | sed -E 's/.*:([0-9]+)$/\1/')
    fi
    if [ -n "$PORT" ] && { [ "${START_NO_WAIT:-0}" = 1 ] || grep -q 'orch serve: ready' "$log"; }; then
      return 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then
      cat "$log"
      fail "server $name exited during start-up"
    fi
    sleep 0.05
  done
  cat "$log"
  fail "server $name did not become ready"
}

# stop_server PID: SIGTERM, wait (up to 30 s), return its exit status.
stop_server() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  wait "$pid"
}
