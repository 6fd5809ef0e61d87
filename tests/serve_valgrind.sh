#!/usr/bin/env bash
# serve_valgrind.sh - orch serve under valgrind's memcheck: a few requests of
# every kind (tests/serve/smoke_checks.py: every route, prompt form, stop
# strings (the stop-string scan once read an unset value), streams, a client
# that leaves mid-stream, chat, CORS preflight, every error path) and the
# files API (upload, refusal, size limit, list, content, delete), then
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
start_server vg --api-key sekret --cors-origin http://app.example --max-body 65536 \
  --state-dir "$T/state" --max-upload-mib 1
"$PY" "$SERVE_DIR/smoke_checks.py" "$PORT" || { tail -n 40 "$T/vg.log"; fail "smoke checks"; }
# the files API: an upload, a refused one, one cut off by the size limit,
# list, content, delete
A=(-s -o /dev/null -w '%{http_code} ' -H 'Authorization: Bearer sekret')
U="http://127.0.0.1:$PORT/v1/files"
printf '{"text":"a"}\n' >"$T/ok.jsonl"; printf '{"text":"a"}\n{"text":2}\n' >"$T/bad.jsonl"
head -c 1100000 /dev/zero >"$T/big.jsonl"
codes=$(curl "${A[@]}" -F purpose=fine-tune -F "file=@$T/ok.jsonl" "$U"
        curl "${A[@]}" -F purpose=fine-tune -F "file=@$T/bad.jsonl" "$U"
        curl "${A[@]}" -F purpose=fine-tune -F "file=@$T/big.jsonl" "$U"
        curl "${A[@]}" "$U")
id=$(curl -s -H 'Authorization: Bearer sekret' "$U" | sed -E 's/.*"id":"(file-[0-9a-f]+)".*/\1/')
codes+=$(curl "${A[@]}" "$U/$id/content"; curl "${A[@]}" -X DELETE "$U/$id")
[ "$codes" = "200 400 413 200 200 200 " ] || fail "files API under valgrind: $codes"
stop_server "$PID"
rc=$?
if [ "$rc" -ne 0 ] || grep -q '^==[0-9]*==' "$T/vg.log"; then
  grep -A25 '^==[0-9]*==' "$T/vg.log" | head -n 120
  fail "valgrind reported errors (exit status $rc)"
fi
echo "serve_valgrind: ok (valgrind memcheck clean)"
