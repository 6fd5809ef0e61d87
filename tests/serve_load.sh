#!/usr/bin/env bash
# serve_load.sh - scheduler behaviour through orch serve on the mock engine:
# KV exhaustion preempts and every request still completes exactly;
# disconnects cancel and free blocks at once (streaming, suspended and
# waiting clients); a full waiting queue gives 429; an engine error fails its
# requests with 500 (and a stream error event) while the server carries on;
# 503 while loading (429 and 503 with Retry-After); SIGTERM drains (running
# requests finish, new connections are refused, exit 0) and a drain timeout
# cancels what is left.
source "$(dirname "$0")/serve/common.sh"
run() { "$PY" "$SERVE_DIR/load_checks.py" "$@" || fail "$1"; }

# sleep_ms=2 keeps every request running long enough for all 16 to overlap.
start_server preempt --kv-blocks 64 --max-seqs 16 --max-batch-tokens 256 --engine-options sleep_ms=2
run preemption "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"

start_server cancel --engine-options sleep_ms=20
run cancellation "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"

start_server qfull --engine-options sleep_ms=20 --max-seqs 1 --max-waiting 1
run queue_full "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"

ORCH_MOCK_FAULT=infer_forward:4 start_server fault
run engine_fault "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"
ORCH_MOCK_FAULT=infer_forward:4 start_server sfault
run stream_fault "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"

START_NO_WAIT=1 start_server loading --engine-options sleep_ms=1500
run loading "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM while loading"

# ---- SIGTERM drains ---------------------------------------------------------
start_server drain --engine-options sleep_ms=10
"$PY" - "$PORT" >"$T/drain.out" 2>&1 <<'PYEOF' &
import sys
from client import stream, greedy
port = int(sys.argv[1])
st, _, ev = stream(port, "/v1/completions", {"prompt": "drain", "max_tokens": 60, "temperature": 0, "stream": True})
text = "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]")
print("status", st, "done", ev[-1] == "[DONE]", "exact", text == greedy("drain", 60))
PYEOF
CLIENT=$!
# a keep-alive connection opened before the signal: its next requests get 503
"$PY" - "$PORT" "$T/termed" >"$T/keepalive.out" 2>&1 <<'PYEOF' &
import http.client, json, os, sys, time
port, flag = int(sys.argv[1]), sys.argv[2]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request("GET", "/health"); r = c.getresponse(); r.read()
assert r.status == 200
while not os.path.exists(flag):
    time.sleep(0.01)
time.sleep(0.05)
c.request("POST", "/v1/completions", body=json.dumps({"prompt": "late", "max_tokens": 2}),
          headers={"Content-Type": "application/json"})
r = c.getresponse(); js = json.loads(r.read())
c.request("GET", "/health"); h = c.getresponse(); hb = json.loads(h.read())
print("post", r.status, js["error"]["code"], "health", h.status, hb["status"])
PYEOF
KEEPALIVE=$!
"$PY" -c "
import sys, client
client.wait_for(lambda: client.metrics($PORT)['orch_generation_tokens_total'] >= 3, 10, 'the stream to start')"
kill -TERM "$PID"
touch "$T/termed"
sleep 0.2
# new connections are refused while draining
if "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), timeout=2)" 2>/dev/null; then
  fail "a new connection was accepted while draining"
fi
wait "$CLIENT"
grep -q "status 200 done True exact True" "$T/drain.out" || { cat "$T/drain.out"; fail "request during drain"; }
wait "$KEEPALIVE"
grep -q "post 503 server_draining health 503 draining" "$T/keepalive.out" || { cat "$T/keepalive.out"; fail "503 while draining"; }
for _ in $(seq 1 200); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
wait "$PID"; rc=$?
[ "$rc" -eq 0 ] || { cat "$T/drain.log"; fail "exit status $rc after drain"; }
grep -q "orch serve: stopped" "$T/drain.log" || fail "no clean stop"

# ---- drain timeout cancels ------------------------------------------------------
start_server drain2 --engine-options sleep_ms=10 --drain-timeout 1
"$PY" - "$PORT" >"$T/drain2.out" 2>&1 <<'PYEOF' &
import sys
from client import post
st, js, _ = post(int(sys.argv[1]), "/v1/completions", {"prompt": "long", "max_tokens": 900, "temperature": 0})
print("status", st, js["error"]["code"] if st != 200 else "")
PYEOF
CLIENT=$!
"$PY" -c "
import client
client.wait_for(lambda: client.metrics($PORT)['orch_requests_running'] == 1, 10, 'the request to run')"
start=$(date +%s.%N)
kill -TERM "$PID"
wait "$CLIENT"
wait "$PID"; rc=$?
end=$(date +%s.%N)
[ "$rc" -eq 0 ] || fail "exit status $rc after drain timeout"
grep -q "status 503 server_draining" "$T/drain2.out" || { cat "$T/drain2.out"; fail "cancelled request status"; }
"$PY" -c "import sys; sys.exit(0 if $end - $start < 6 else 1)" || fail "drain timeout not honoured"
grep -q "drain timeout: cancelling 1 sequences" "$T/drain2.log" || fail "drain timeout message"
echo "serve_load: ok"
