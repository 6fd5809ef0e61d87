#!/usr/bin/env bash
# q8_kernel_bench.sh - build/tools/q8_kernel_bench: every kernel the CPU can
# run reports a positive time and rate for each row count and size, the
# portable kernel runs when asked for, and bad arguments exit 2 with a
# message.
set -u
BUILD=${BUILD:-build}
bin="$BUILD/tools/q8_kernel_bench"
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"

out=$("$bin" --rows 1,4,16 --dram-mb 16 --reps 2 --json) || fail "default run exited $?"
echo "$out"
grep -q '"stream_read_gb_per_s":[1-9]' <<<"$out" || fail "no streaming read figure"
lines=$(grep -c '"kernel":' <<<"$out")
# avx2 at least on any x86-64 CPU this project runs on; 3 rows x 3 sizes each
[ "$lines" -ge 9 ] && [ $((lines % 9)) -eq 0 ] || fail "expected 9 lines per kernel, got $lines"
if grep '"kernel":' <<<"$out" | grep -Eq '"ns_per_block":0\.00|"gb_per_s":0\.00|nan|inf'; then
  fail "a zero or non-finite figure"
fi
grep -q '"kernel":"generic"' <<<"$out" && fail "the portable kernel ran without --kernel generic"

gen=$("$bin" --kernel generic --rows 1 --dram-mb 16 --reps 1 --json) || fail "generic run exited $?"
[ "$(grep -c '"kernel":"generic"' <<<"$gen")" -eq 3 ] || fail "generic: expected 3 lines: $gen"

for bad in "--rows 0" "--rows 1,x" "--dram-mb 1" "--reps 0" "--kernel nope" "--frobnicate"; do
  # shellcheck disable=SC2086
  err=$("$bin" $bad 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$bad: exit $rc, want 2"
  grep -q "q8_kernel_bench" <<<"$err" || fail "$bad: no message: $err"
done
"$bin" --help | grep -q "usage: q8_kernel_bench" || fail "--help"
echo "q8_kernel_bench: ok"
