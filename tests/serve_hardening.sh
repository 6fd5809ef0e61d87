#!/usr/bin/env bash
# serve_hardening.sh - what a hostile or careless client sends is refused
# cleanly (tests/serve/limit_checks.py): Host names other than loopback ones
# (DNS rebinding) and bodies that are not application/json (cross-site
# forms); CORS headers and preflight only for --cors-origin; duplicate keys,
# data after the JSON and NULs in strings; two different Content-Length
# headers; one request of more sequences than --max-waiting; 429 and 503 with
# Retry-After; request bodies in flight capped by --max-body-memory-mib; and
# /health answering fast while 4 MB prompts are parsed and refused.
source "$(dirname "$0")/serve/common.sh"
run() { "$PY" "$SERVE_DIR/limit_checks.py" "$@" || fail "$1"; }

start_server headers --cors-origin http://app.example --allowed-host api.example \
  --max-seqs 1 --max-waiting 4 --engine-options sleep_ms=20
run headers "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"

start_server bodies --max-body-memory-mib 1 --max-body 600000
run body_memory "$PORT"
stop_server "$PID" || fail "exit status after SIGTERM"

# --max-body over the bodies' memory cap is a usage error
"$ORCH_BIN" serve --engine=mock --max-body 3000000 --max-body-memory-mib 2 2>"$T/e1"
[ $? -eq 2 ] && grep -q 'must not exceed --max-body-memory-mib' "$T/e1" || fail "--max-body over the cap"

P99=100
case "${ORCH_SAN:-0}" in 1 | thread) P99=400 ;; esac
start_server big --http-threads 2
run big_prompts "$PORT" "$P99"
stop_server "$PID" || fail "exit status after SIGTERM"
echo "serve_hardening: ok"
