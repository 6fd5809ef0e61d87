#!/usr/bin/env bash
# serve_files.sh - OpenAI's files API on orch serve --state-dir (mock engine):
# multipart uploads validated line by line, list/retrieve/content/delete, the
# official Node client, persistence across a restart, and every refusal
# (no --state-dir, wrong media type, unknown part, missing part, purpose,
# size limit, a disk that fails mid-upload) leaving nothing behind.
source "$(dirname "$0")/serve/common.sh"
ROOT=$(cd "$SERVE_DIR/../.." && pwd)
MODULES="$ROOT/data/node/node_modules"
STATE="$T/state"
cat >"$T/good.jsonl" <<'J'
{"prompt": "2+2=", "completion": " 4"}

{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
{"text": "plain text to learn"}
J
printf '%s\n' '{"prompt":"a","completion":"b"}' '{"text":"ok"}' '{"messages":[{"role":"user","content":"no answer"}]}' >"$T/bad.jsonl"
printf '%s\n' '{"prompt":"a","completion":"b"}' 'not json' >"$T/notjson.jsonl"

up() { # file [extra curl args...]: prints "STATUS BODY"
  local f=$1; shift
  curl -s -o "$T/out" -w '%{http_code}' -F purpose=fine-tune -F "file=@$f" "$@" \
    "http://127.0.0.1:$PORT/v1/files" >"$T/code"
  echo "$(cat "$T/code") $(cat "$T/out")"
}
files_left() { find "$STATE/files" -type f | wc -l; }

# 1. off without --state-dir, saying how to turn it on
start_server off
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT/v1/files")
[[ $r == *"--state-dir DIR"*" 404" ]] || fail "files API without --state-dir: $r"
stop_server "$PID" || fail "exit status (off)"

# 2. uploads, refusals
start_server on --state-dir "$STATE" --max-upload-mib 1
r=$(up "$T/good.jsonl")
[[ $r == "200 "*'"object":"file"'*'"purpose":"fine-tune"'* ]] || fail "upload: $r"
id=$(sed -E 's/.*"id":"(file-[0-9a-f]+)".*/\1/' <<<"$r")
[ "$(curl -s "http://127.0.0.1:$PORT/v1/files/$id/content" | md5sum)" = "$(md5sum <"$T/good.jsonl")" ] ||
  fail "content differs"
r=$(up "$T/bad.jsonl"); [[ $r == "400 "*'line 3: \"messages\" has no assistant turn'* ]] || fail "bad: $r"
r=$(up "$T/notjson.jsonl"); [[ $r == "400 "*"line 2: not valid JSON"* ]] || fail "not json: $r"
: >"$T/empty.jsonl"
r=$(up "$T/empty.jsonl"); [[ $r == "400 "*"has no examples"* ]] || fail "empty: $r"
r=$(curl -s -w ' %{http_code}' -F purpose=batch -F "file=@$T/good.jsonl" "http://127.0.0.1:$PORT/v1/files")
[[ $r == *"purpose 'batch' is not supported"*" 400" ]] || fail "purpose: $r"
r=$(curl -s -w ' %{http_code}' -F purpose=fine-tune "http://127.0.0.1:$PORT/v1/files")
[[ $r == *"missing the 'file' part"*" 400" ]] || fail "no file part: $r"
r=$(curl -s -w ' %{http_code}' -F purpose=fine-tune -F "file=@$T/good.jsonl" -F extra=1 "http://127.0.0.1:$PORT/v1/files")
[[ $r == *"unknown field 'extra'"*" 400" ]] || fail "unknown part: $r"
r=$(curl -s -w ' %{http_code}' -H 'Content-Type: application/json' -d '{}' "http://127.0.0.1:$PORT/v1/files")
[[ $r == *"must be multipart/form-data"*" 415" ]] || fail "media type: $r"
head -c 1100000 /dev/zero | tr '\0' 'x' | sed 's/^/{"text":"/; s/$/"}/' >"$T/big.jsonl"
r=$(up "$T/big.jsonl"); [[ $r == "413 "*"over the limit of 1048576 bytes"* ]] || fail "size: $r"
r=$(curl -s -w ' %{http_code}' -X PUT "http://127.0.0.1:$PORT/v1/files")
[[ $r == *" 405" ]] || fail "PUT: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT/v1/files/file-000000000000000000000000")
[[ $r == *"no such file"*" 404" ]] || fail "unknown id: $r"
[ "$(files_left)" = 2 ] || { find "$STATE"; fail "refused uploads left files behind"; }

# 3. the official Node client
if command -v node >/dev/null && [ -f "$MODULES/openai/package.json" ]; then
  stop_server "$PID" || fail "exit status (on)"
  start_server node --state-dir "$STATE" --api-key sekret
  printf '%s\n' '{"text":"a"}' '{"text":"b"}' '{"prompt":1,"completion":"x"}' >"$T/bad3.jsonl"
  node "$ROOT/tests/openai_client/files_test.mjs" "http://127.0.0.1:$PORT/v1" "$MODULES" \
    "$T/good.jsonl" "$T/bad3.jsonl" >"$T/node.out" || { cat "$T/node.out"; fail "openai node client"; }
  kept=$(sed -n 's/^kept //p' "$T/node.out")
  AUTH=(-H 'Authorization: Bearer sekret')
else
  echo "note: node or npm openai absent: the Node client part is skipped"
  kept=$id
  AUTH=()
fi

# 4. a restart keeps the files
stop_server "$PID" || fail "exit status"
start_server again --state-dir "$STATE" ${AUTH:+--api-key sekret}
r=$(curl -s "${AUTH[@]}" "http://127.0.0.1:$PORT/v1/files")
[[ $r == *"\"$kept\""* ]] || fail "after restart: $r"
r=$(curl -s "${AUTH[@]}" "http://127.0.0.1:$PORT/v1/files/$id")
[[ $r == *"\"bytes\":$(stat -c %s "$T/good.jsonl")"* ]] || fail "metadata after restart: $r"
stop_server "$PID" || fail "exit status (again)"

# 5. the disk fails while the upload is written (fault site 4: opendir and
# mkdir at start, the temp file, its first write): 500, nothing left behind,
# the server and the other files fine
before=$(files_left)
ORCH_FSIO_FAULT=enospc:4 start_server disk --state-dir "$STATE"
r=$(up "$T/good.jsonl")
[[ $r == "500 "*"write: no space left on device"* ]] || fail "disk full: $r"
[ "$(files_left)" = "$before" ] || { find "$STATE"; fail "a failed upload left files behind"; }
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT/health"); [[ $r == *" 200" ]] || fail "health after disk full: $r"
stop_server "$PID" || fail "exit status (disk)"
echo "serve_files: ok"
