#!/usr/bin/env bash
# serve_fuzz.sh - malformed input never crashes orch serve: random bytes,
# garbage HTTP, mutated JSON (wrong types, huge numbers, invalid UTF-8, deep
# nesting), truncated bodies and early disconnects (tests/serve/fuzz.py); the
# server stays healthy, answers every request with a documented status, then
# drains and exits 0 (under the asan build: with no leak or sanitizer report).
source "$(dirname "$0")/serve/common.sh"
ITER=${SERVE_FUZZ_ITERATIONS:-1500}
[ "${ORCH_SAN:-0}" = 1 ] && ITER=${SERVE_FUZZ_ITERATIONS:-600}
start_server fuzz --max-body 65536
"$PY" "$SERVE_DIR/fuzz.py" "$PORT" "$ITER" "${SERVE_FUZZ_SEED:-1}" || { tail -n 20 "$T/fuzz.log"; fail "fuzz"; }
stop_server "$PID" || { tail -n 30 "$T/fuzz.log"; fail "exit status $? after fuzzing"; }
if grep -qE 'ERROR: AddressSanitizer|runtime error:|LeakSanitizer' "$T/fuzz.log"; then
  grep -E -A5 'ERROR: AddressSanitizer|runtime error:|LeakSanitizer' "$T/fuzz.log" | head -n 40
  fail "sanitizer report"
fi
echo "serve_fuzz: ok"
