#!/usr/bin/env bash
# route_api.sh - orch route in front of mock `orch serve` workers on
# loopback: answers equal to direct ones, streams passed on byte for byte
# (a fake worker that splits events awkwardly), a stream cut by its worker
# ending in a clean error event, worker errors and headers untouched, the
# router's own checks (401/403/404/405/413/415, the connection limit), API
# key passthrough and the router's own key, /v1/models as the union,
# LoRA-style routing by model, workers added and removed at run time (the new
# one gets traffic), /metrics (promtool when installed), usage errors. (tests/route/route_checks.py)
source "$(dirname "$0")/route/common.sh"

start_server w1; P_W1=$PORT
start_server w2; P_W2=$PORT
start_server w3 --model-name lora-a; P_W3=$PORT
start_server wk --api-key wk; P_WK=$PORT
start_server wnew; P_NEW=$PORT
start_fake fake; P_FAKE=$PORT
W() { echo "--worker http://127.0.0.1:$1"; }

# shellcheck disable=SC2046
start_router main $(W "$P_W1") $(W "$P_W2") $(W "$P_W3") --max-body 4096 --health-interval-s 0.1
R_MAIN=$PORT; PID_MAIN=$PID
start_router pass $(W "$P_WK"); R_PASS=$PORT
start_router own $(W "$P_WK") --api-key rk --worker-api-key wk; R_OWN=$PORT
start_router fake $(W "$P_FAKE"); R_FAKE=$PORT
start_router lim $(W "$P_W1") --max-connections 2; R_LIM=$PORT

"$PY" "$ROUTE_DIR/route_checks.py" "$R_MAIN" "$R_PASS" "$R_OWN" "$R_FAKE" \
  "$P_W1" "$P_W2" "$P_W3" "$P_WK" "$P_NEW" "$P_FAKE" || fail "route checks"

# the listener's connection limit: two idle connections held, a third is refused
"$PY" - "$R_LIM" <<'PY' || fail "connection limit"
import socket, sys, time
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
time.sleep(0.3)
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
s.settimeout(5)
data = s.recv(4096)
assert data.startswith(b"HTTP/1.1 503") and b"too_many_connections" in data, data
PY

if command -v promtool >/dev/null; then
  "$PY" -c "import sys,client; sys.stdout.write(client.request($R_MAIN,'GET','/metrics')[2].decode())" >"$T/metrics.txt"
  promtool check metrics <"$T/metrics.txt" >"$T/promtool.out" 2>&1 || { cat "$T/promtool.out"; fail "promtool check metrics"; }
else
  echo "note: promtool not installed; exposition format not checked"
fi

grep -q 'listening on http://127.0.0.1:' "$T/main.log" || fail "default bind address"
"$ORCH_BIN" route --help | grep -q -- '--cache-threshold' || fail "route --help"
"$ORCH_BIN" route 2>"$T/e1"; [ $? -eq 2 ] && grep -q -- '--worker' "$T/e1" || fail "no worker"
"$ORCH_BIN" route --worker http://127.0.0.1:1 --policy random 2>"$T/e2"; [ $? -eq 2 ] && grep -q 'power_of_two' "$T/e2" || fail "bad policy"
"$ORCH_BIN" route --worker localhost:1 2>"$T/e3"; [ $? -eq 2 ] && grep -q 'http://HOST:PORT' "$T/e3" || fail "bad worker URL"
"$ORCH_BIN" route --worker http://127.0.0.1:1 --port "$R_MAIN" 2>"$T/e4"; [ $? -eq 2 ] && grep -q 'cannot listen' "$T/e4" || fail "port in use"
"$ORCH_BIN" route --worker http://127.0.0.1:1 --host nonsense 2>"$T/e5"; [ $? -eq 2 ] && grep -q 'IPv4' "$T/e5" || fail "bad host"

stop_server "$PID_MAIN" || fail "router exit status $? after SIGTERM"
echo "route_api: ok"
