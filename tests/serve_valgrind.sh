#!/usr/bin/env bash
# serve_valgrind.sh - orch serve under valgrind's memcheck: a few requests of
# every kind (tests/serve/smoke_checks.py: every route, prompt form, stop
# strings (the stop-string scan once read an unset value), streams, a client
# that leaves mid-stream, chat, CORS preflight, every error path), then
# SIGTERM; any memory error or definite leak fails (--error-exitcode=1).
# Skips when valgrind is missing or the build is a sanitizer build.
source "$(dirname "$0")/serve/common.sh"
command -v valgrind >/dev/null || { echo "skip: valgrind is not installed"; exit 77; }
[ "${ORCH_SAN:-0}" = 0 ] || { echo "skip: valgrind does not run sanitizer builds"; exit 77; }
REAL_BIN=$ORCH_BIN
VG=(valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --track-origins=yes --num-callers=30 -q)
# start_server runs "$ORCH_BIN serve ..."; run it through valgrind instead
ORCH_BIN=$T/orch-vg
printf '#!/bin/sh\nexec %s "%s" "$@"\n' "${VG[*]}" "$REAL_BIN" >"$ORCH_BIN"
chmod +x "$ORCH_BIN"
start_server vg --api-key sekret --cors-origin http://app.example --max-body 65536
"$PY" "$SERVE_DIR/smoke_checks.py" "$PORT" || { tail -n 40 "$T/vg.log"; fail "smoke checks"; }
stop_server "$PID"
rc=$?
if [ "$rc" -ne 0 ] || grep -q '^==[0-9]*==' "$T/vg.log"; then
  grep -A25 '^==[0-9]*==' "$T/vg.log" | head -n 120
  fail "valgrind reported errors (exit status $rc)"
fi
echo "serve_valgrind: ok (valgrind memcheck clean)"
