#!/usr/bin/env bash
# run_tests.sh - runs every Check suite (build/tests/test_*) and every shell
# suite (tests/*.sh) and prints one closing line "N passed, N failed, N skipped".
# A suite that exits 77 counts as skipped (it printed why). TESTS limits which
# suites run: one or more space-separated globs (e.g. TESTS='*serve* test_sampler').
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export ORCH_BIN="$PWD/$BUILD/orch" ORCH_BUILD="$PWD/$BUILD"
export ORCH_ENGINE_PATH="$PWD/$BUILD"
# The GPT-2 vocabulary of tools/setup.sh, also for binaries in build/asan and
# build/tsan (whose ../data is not the repository's).
export ORCH_DATA_DIR="${ORCH_DATA_DIR:-$PWD/data}"
export CK_FORK=yes
read -r -a patterns <<<"${TESTS:-*}"
selected() { # name
  local p
  for p in "${patterns[@]}"; do [[ $1 == $p ]] && return 0; done
  return 1
}
passed=0 failed=0 skipped=0
failed_names=()
log_dir="$BUILD/test-logs"
mkdir -p "$log_dir"

run_one() { # name, command...
  local name=$1; shift
  local log="$log_dir/$name.log" start end rc
  start=$(date +%s)
  "$@" >"$log" 2>&1
  rc=$?
  end=$(date +%s)
  # Check prints "NN%: Checks: X, Failures: F, Errors: E"
  local line checks=0 bad=0
  while read -r line; do
    local c f e
    c=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
    f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
    e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
    checks=$((checks + c)); bad=$((bad + f + e))
  done < <(grep -E '^[0-9]+%: Checks: [0-9]+' "$log")
  if [ "$rc" -eq 77 ]; then
    skipped=$((skipped + 1))
    printf 'SKIP  %-28s %3ss  %s\n' "$name" $((end - start)) "$(grep -m1 -i 'skip' "$log")"
  elif [ "$rc" -eq 0 ] && [ "$bad" -eq 0 ]; then
    if [ "$checks" -gt 0 ]; then passed=$((passed + checks)); else passed=$((passed + 1)); fi
    printf 'PASS  %-28s %3ss  %s\n' "$name" $((end - start)) "$( [ "$checks" -gt 0 ] && echo "$checks checks")"
  else
    local ok=$((checks - bad))
    [ "$ok" -gt 0 ] && passed=$((passed + ok))
    if [ "$bad" -gt 0 ]; then failed=$((failed + bad)); else failed=$((failed + 1)); fi
    failed_names+=("$name")
    printf 'FAIL  %-28s %3ss  (exit %s; log %s)\n' "$name" $((end - start)) "$rc" "$log"
    grep -E 'FAIL|Failure|Error|error|failed' "$log" | head -n 15 | sed 's/^/      /'
  fi
}

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  selected "$name" || continue
  run_one "$name" "$t"
done
for s in tests/*.sh; do
  [ -f "$s" ] || continue
  name=$(basename "$s" .sh)
  [ "$name" = run_tests ] && continue
  selected "$name" || continue
  run_one "$name" bash "$s"
done

echo
if [ "${#failed_names[@]}" -gt 0 ]; then
  echo "failed suites: ${failed_names[*]}"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
