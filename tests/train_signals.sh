#!/usr/bin/env bash
# train_signals.sh - SIGTERM, SIGUSR1 and SIGINT during `orch train` finish the
# step, leave a checkpoint at the step reached and exit with status 3; the
# run then resumes from that step. A second SIGINT exits at once with 130 and
# leaves the last good checkpoint untouched. Mock engine, slowed down with
# its sleep_ms option.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BUILD=${ORCH_BUILD:-build}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$ORCH_BUILD}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

awk 'BEGIN { for (i = 0; i < 300; i++) printf "line %d of a small corpus for signal tests.\n", i }' \
  >"$tmp/corpus.txt"
"$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/data" \
  --val-fraction 0.1 >/dev/null 2>&1 || { echo "FAIL: orch prepare"; exit 1; }

common=(--config "$root/configs/tiny-test.json" --engine mock
        --set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin"
        --set train.checkpoint_every=0 --set train.eval_every=0 --steps 100000)

# Wait until FILE has at least N lines (up to ~20 s).
wait_lines() {
  local f=$1 n=$2 i
  for i in $(seq 200); do
    [ -f "$f" ] && [ "$(wc -l <"$f")" -ge "$n" ] && return 0
    sleep 0.1
  done
  return 1
}

last_step() { tail -n 1 "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\).*/\1/'; }

for sig in TERM USR1 INT; do
  d="$tmp/run-$sig"
  "$ORCH_BIN" train "${common[@]}" --set engine.options=sleep_ms=40 --out "$d" \
    >"$tmp/$sig.log" 2>&1 &
  pid=$!
  wait_lines "$d/metrics.jsonl" 3 || fail "$sig: the run did not start"
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  pid=""
  [ $rc -eq 3 ] || { cat "$tmp/$sig.log"; fail "SIG$sig: exit status $rc, want 3"; continue; }
  step=$(last_step "$d")
  want=$(printf 'ckpt-%08d' "$step")
  [ "$(cat "$d/latest")" = "$want" ] ||
    fail "SIG$sig: latest is '$(cat "$d/latest")', want $want (last logged step $step)"
  (cd "$d/$want" && sha256sum -c --quiet checksums.sha256) || fail "SIG$sig: checkpoint does not verify"
  grep -q "\"step\":\s*$step," "$d/$want/state.json" || fail "SIG$sig: state.json step is not $step"
  grep -q "continue with: orch train --resume=$d" "$tmp/$sig.log" || fail "SIG$sig: no resume hint"
  echo "ok: SIG$sig: exit 3, checkpoint $want at the step reached"
done

# The interrupted run resumes from the step reached.
d="$tmp/run-TERM"
step=$(last_step "$d")
"$ORCH_BIN" train --resume="$d" --set engine.options= --stop-after 2 >"$tmp/resume.log" 2>&1 ||
  { cat "$tmp/resume.log"; fail "resume after SIGTERM"; }
[ "$(last_step "$d")" -eq $((step + 2)) ] || fail "resume after SIGTERM: last step $(last_step "$d"), want $((step + 2))"
[ "$(wc -l <"$d/metrics.jsonl")" -eq $((step + 2)) ] || fail "resume after SIGTERM: metrics.jsonl has gaps or repeats"

# A second SIGINT exits at once (130); the last good checkpoint stays.
d="$tmp/run-INT2"
"$ORCH_BIN" train "${common[@]}" --out "$d" --stop-after 2 >/dev/null 2>&1 || fail "INT2: first part"
before=$(cat "$d/latest")
sums=$(cat "$d/$before/checksums.sha256")
# Steps now take ~2 s (sleep_ms applies per micro-batch).
"$ORCH_BIN" train --resume="$d" --set engine.options=sleep_ms=1000 >"$tmp/int2.log" 2>&1 &
pid=$!
for i in $(seq 100); do grep -q "resuming from" "$tmp/int2.log" && break; sleep 0.1; done
sleep 0.3
kill -INT "$pid"
sleep 0.3
kill -INT "$pid"
wait "$pid"
rc=$?
pid=""
[ $rc -eq 130 ] || { cat "$tmp/int2.log"; fail "second SIGINT: exit $rc, want 130"; }
[ "$(cat "$d/latest")" = "$before" ] || fail "second SIGINT: latest changed to $(cat "$d/latest")"
[ "$(cat "$d/$before/checksums.sha256")" = "$sums" ] || fail "second SIGINT: checkpoint changed"
(cd "$d/$before" && sha256sum -c --quiet checksums.sha256) || fail "second SIGINT: checkpoint does not verify"
echo "ok: second SIGINT: exit 130, $before untouched"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all signal checks passed"
