# route/common.sh - sourced by tests/route_*.sh: everything of
# tests/serve/common.sh (temp dir, mock workers on free ports, cleanup) plus
# routers started the same way and the fake worker of fake_worker.py.
source "$(dirname "${BASH_SOURCE[0]}")/../serve/common.sh"
ROUTE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$ROUTE_DIR:$PYTHONPATH"

# start_router NAME [orch route options...]: sets PORT and PID; log $T/NAME.log.
start_router() {
  local name=$1; shift
  local log="$T/$name.log"
  "$ORCH_BIN" route --port 0 "$@" 2>"$log" &
  PID=$!
  SERVER_PIDS+=("$PID")
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' "$log" 2>/dev/null | head -n1 | sed -E 's/.*:([0-9]+)$/\1/')
    if [ -n "$PORT" ] && grep -q 'orch route: ready' "$log" 2>/dev/null; then return 0; fi
    if ! kill -0 "$PID" 2>/dev/null; then cat "$log"; fail "router $name exited during start-up"; fi
    sleep 0.05
  done
  cat "$log"
  fail "router $name did not become ready"
}

# start_fake NAME: the fake worker; sets PORT and PID.
start_fake() {
  local pf="$T/$1.port"
  "$PY" "$ROUTE_DIR/fake_worker.py" "$pf" &
  PID=$!
  SERVER_PIDS+=("$PID")
  for _ in $(seq 1 200); do [ -s "$pf" ] && break; sleep 0.05; done
  [ -s "$pf" ] || fail "fake worker $1 did not start"
  PORT=$(cat "$pf")
}
