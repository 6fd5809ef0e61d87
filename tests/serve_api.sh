#!/usr/bin/env bash
# serve_api.sh - orch serve on the mock engine over real HTTP: every endpoint,
# completions (string/token/list prompts, n, echo, logprobs, stop strings,
# seeds), streaming (chunk sequence, usage, [DONE]), chat, every error case
# (400s, 401, 404, 405, 413), 64 concurrent requests with exact texts, and
# the /metrics exposition checked by promtool, prefix caching (cached_tokens,
# streaming usage too, --no-prefix-cache, metrics). (tests/serve/api_checks.py)
source "$(dirname "$0")/serve/common.sh"

start_server main
P_MAIN=$PORT; PID_MAIN=$PID
start_server key --api-key sekret
P_KEY=$PORT; PID_KEY=$PID
start_server small --max-body 2048 --model-name small-model
P_SMALL=$PORT; PID_SMALL=$PID
start_server nocache --no-prefix-cache
P_NOCACHE=$PORT; PID_NOCACHE=$PID
grep -q 'prefix cache off' "$T/nocache.log" || fail "--no-prefix-cache not in the ready line"

"$PY" "$SERVE_DIR/api_checks.py" "$P_MAIN" "$P_KEY" "$P_SMALL" "$P_NOCACHE" || fail "api checks"

# The exposition passes promtool.
if command -v promtool >/dev/null; then
  "$PY" -c "import sys,client; sys.stdout.write(client.request($P_MAIN,'GET','/metrics')[2].decode())" >"$T/metrics.txt"
  promtool check metrics <"$T/metrics.txt" >"$T/promtool.out" 2>&1 || { cat "$T/promtool.out"; fail "promtool check metrics"; }
  grep -q '^orch_requests_total{endpoint="/v1/completions",status="200"}' "$T/metrics.txt" || fail "requests_total missing"
else
  echo "note: promtool not installed; exposition format not checked"
fi

# Binds 127.0.0.1 by default.
grep -q 'listening on http://127.0.0.1:' "$T/main.log" || fail "default bind address"
# usage errors
"$ORCH_BIN" serve --help | grep -q -- '--max-batch-tokens' || fail "serve --help"
"$ORCH_BIN" serve --engine=mock --max-seqs 0 2>"$T/e1"; [ $? -eq 2 ] || fail "--max-seqs 0 exit status"
grep -q 'max-seqs' "$T/e1" || fail "--max-seqs message"
"$ORCH_BIN" serve 2>"$T/e2"; [ $? -eq 2 ] && grep -q -- '--checkpoint' "$T/e2" || fail "missing checkpoint message"
"$ORCH_BIN" serve --engine=mock --host nonsense 2>"$T/e3"; [ $? -eq 2 ] && grep -q 'IPv4' "$T/e3" || fail "bad host"
"$ORCH_BIN" serve --engine=mock --port "$P_MAIN" 2>"$T/e4"; [ $? -eq 2 ] && grep -q 'cannot listen' "$T/e4" || fail "port in use"
"$ORCH_BIN" serve --engine=mock --kv-blocks 10 --port 0 2>"$T/e5"; [ $? -eq 2 ] && grep -q 'too small' "$T/e5" || fail "tiny pool"

for p in $PID_MAIN $PID_KEY $PID_SMALL $PID_NOCACHE; do
  stop_server "$p" || fail "server exit status $? after SIGTERM"
done
echo "serve_api: ok"
