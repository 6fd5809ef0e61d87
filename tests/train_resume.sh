#!/usr/bin/env bash
# train_resume.sh - exact resume: 40 steps straight versus 20 steps, stop,
# resume, 20 more, on the mock engine and on the CPU engine (tiny config).
# The loss sequences (and lr, grad_norm, val_loss) in metrics.jsonl must be
# identical as text. Also: a resume after metrics.jsonl ran past the
# checkpoint cuts the extra lines; resuming a finished run does nothing.
# The CPU half is skipped (with a message) when libengine_cpu.so is not built.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BUILD=${ORCH_BUILD:-build}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$ORCH_BUILD}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A small corpus with some structure, prepared as byte shards.
awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) {
  printf "%d: and the %s said unto the %s, let there be %s.\n", i,
    (i % 3 ? "lord" : "king"), (i % 5 ? "people" : "waters"), (i % 7 ? "light" : "bread") } }' \
  >"$tmp/corpus.txt"
if ! "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" \
    --out "$tmp/data" --val-fraction 0.1 >"$tmp/prepare.log" 2>&1; then
  cat "$tmp/prepare.log"; echo "FAIL: orch prepare"; exit 1
fi

common=(--config "$root/configs/tiny-test.json"
        --set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin"
        --set engine.threads=1 --steps 40)

# The comparable part of each metrics.jsonl line: everything but the
# timing fields.
figures() {
  sed -E 's/,"tokens_per_s":[^,}]*//; s/,"elapsed":[^,}]*//' "$1"
}

check_pair() { # engine
  local e=$1 s p rc
  s="$tmp/$e-straight" p="$tmp/$e-split"
  "$ORCH_BIN" train "${common[@]}" --engine "$e" --out "$s" >"$tmp/$e-a.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { cat "$tmp/$e-a.log"; fail "$e: straight run exit $rc"; return; }
  "$ORCH_BIN" train "${common[@]}" --engine "$e" --out "$p" --stop-after 20 \
    >"$tmp/$e-b.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { cat "$tmp/$e-b.log"; fail "$e: first half exit $rc"; return; }
  [ "$(cat "$p/latest" 2>/dev/null)" = "ckpt-00000020" ] ||
    fail "$e: latest after the first half is '$(cat "$p/latest" 2>/dev/null)'"
  [ "$(wc -l <"$p/metrics.jsonl")" -eq 20 ] || fail "$e: first half logged $(wc -l <"$p/metrics.jsonl") steps"
  # Second half: the config comes from the checkpoint (--resume=DIR only).
  "$ORCH_BIN" train --resume="$p" >"$tmp/$e-c.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { cat "$tmp/$e-c.log"; fail "$e: resumed half exit $rc"; return; }
  grep -q "resuming from .*ckpt-00000020 (step 20)" "$tmp/$e-c.log" ||
    fail "$e: no resume line: $(head -n 5 "$tmp/$e-c.log")"
  if ! diff <(figures "$s/metrics.jsonl") <(figures "$p/metrics.jsonl") >"$tmp/$e.diff"; then
    head -n 8 "$tmp/$e.diff"
    fail "$e: 20 + resume + 20 differs from 40 straight"
  fi
  [ "$(figures "$s/metrics.jsonl" | grep -c '"loss"')" -eq 40 ] || fail "$e: straight run has no 40 losses"
  # losses fall (the run trains)
  local first last
  first=$(sed -n '1s/.*"loss":\([^,]*\).*/\1/p' "$s/metrics.jsonl")
  last=$(sed -n '40s/.*"loss":\([^,]*\).*/\1/p' "$s/metrics.jsonl")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' ||
    fail "$e: loss did not fall ($first -> $last)"
  echo "ok: $e: 40 straight == 20 + resume + 20 (loss $first -> $last)"
}

check_pair mock

# Resume after the log ran past the checkpoint (a crash between checkpoints):
# the extra lines are cut, and the result still matches the straight run.
x="$tmp/mock-crash"
"$ORCH_BIN" train "${common[@]}" --engine mock --out "$x" --stop-after 20 >/dev/null 2>&1 ||
  fail "mock crash: first half"
sed -n '20p' "$x/metrics.jsonl" | sed 's/"step":20/"step":21/; s/"loss":[^,]*/"loss":99/' >>"$x/metrics.jsonl"
printf '{"step":22,"loss":' >>"$x/metrics.jsonl" # torn last line
"$ORCH_BIN" train "${common[@]}" --engine mock --out "$x" --resume >"$tmp/crash.log" 2>&1 ||
  { cat "$tmp/crash.log"; fail "mock crash: resume"; }
diff <(figures "$tmp/mock-straight/metrics.jsonl") <(figures "$x/metrics.jsonl") >/dev/null ||
  fail "mock crash: metrics.jsonl after resume differs from the straight run"

# A finished run resumed: nothing to do, exit 0, nothing changes.
before=$(md5sum <"$tmp/mock-straight/metrics.jsonl")
out=$("$ORCH_BIN" train --resume="$tmp/mock-straight" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "resume of a finished run: exit $rc: $out"
grep -q "nothing to do" <<<"$out" || fail "resume of a finished run: '$out'"
[ "$before" = "$(md5sum <"$tmp/mock-straight/metrics.jsonl")" ] ||
  fail "resume of a finished run changed metrics.jsonl"

# A fresh run into a directory holding checkpoints is refused.
out=$("$ORCH_BIN" train "${common[@]}" --engine mock --out "$tmp/mock-straight" 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "already holds checkpoints" <<<"$out" ||
  fail "fresh run over an existing one: exit $rc: $out"

if [ -f "$ORCH_BUILD/libengine_cpu.so" ]; then
  check_pair cpu
  # A checkpoint written through the mock continues through the CPU engine.
  m="$tmp/mock-to-cpu"
  "$ORCH_BIN" train "${common[@]}" --engine mock --out "$m" --stop-after 10 >/dev/null 2>&1 &&
    "$ORCH_BIN" train --resume="$m" --engine cpu --steps 12 >"$tmp/m2c.log" 2>&1 ||
    { cat "$tmp/m2c.log"; fail "mock checkpoint resumed on the cpu engine"; }
else
  echo "skip: cpu half: $ORCH_BUILD/libengine_cpu.so is not built"
fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all resume checks passed"
