#!/usr/bin/env bash
# run.sh - run every libFuzzer harness of tests/fuzz/ for a bounded time on a
# copy of its committed seed corpus; fail when any finds a crash, a leak, an
# out-of-memory or a timeout (see tests/fuzz/README.md).
#
#   tests/fuzz/run.sh SECONDS       (after `make fuzz`)
#
# Environment: FUZZ_JOBS harnesses at once (default 2); FUZZ_ONLY="request
# shard" to run some; FUZZ_BUILD the binaries' directory (default build/fuzz);
# FUZZ_ARGS extra libFuzzer flags (e.g. -runs=10000000 -jobs=1). The corpus
# copies and the logs live in a temp directory, removed when all pass; on a
# failure it is kept, and the reproducer's path is printed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD

SECS=${1:-}
if ! [[ "$SECS" =~ ^[0-9]+$ ]] || [ "$SECS" -lt 1 ]; then
  echo "usage: tests/fuzz/run.sh SECONDS" >&2
  exit 2
fi
BIN_DIR=${FUZZ_BUILD:-build/fuzz}
JOBS=${FUZZ_JOBS:-2}
export ORCH_DATA_DIR=${ORCH_DATA_DIR:-$ROOT/data}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ ! -f "$ORCH_DATA_DIR/gpt2/encoder.json" ] || [ ! -f "$ORCH_DATA_DIR/gpt2/vocab.bpe" ]; then
  echo "fuzz: GPT-2 vocabulary missing in $ORCH_DATA_DIR/gpt2; run tools/setup.sh" >&2
  exit 1
fi

names=()
for c in tests/fuzz/corpus/*/; do
  n=$(basename "$c")
  if [ -n "${FUZZ_ONLY:-}" ] && ! [[ " $FUZZ_ONLY " == *" $n "* ]]; then continue; fi
  if [ ! -x "$BIN_DIR/fuzz_$n" ]; then
    echo "fuzz: $BIN_DIR/fuzz_$n is missing; run make fuzz" >&2
    exit 1
  fi
  names+=("$n")
done
if [ "${#names[@]}" -eq 0 ]; then
  echo "fuzz: no harness selected" >&2
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/orch-fuzz-run.XXXXXX")

# One harness: corpus copy, libFuzzer bounded by SECS, its verdict in WORK/NAME.rc.
run_one() {
  local n=$1 dir=$WORK/$1
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp tests/fuzz/corpus/"$n"/* "$dir/corpus/"
  local dict=()
  [ -f "tests/fuzz/dict/$n.dict" ] && dict=(-dict="tests/fuzz/dict/$n.dict")
  # Scratch files of the readers that take a path: in memory where possible.
  local base=/dev/shm
  [ -d "$base" ] && [ -w "$base" ] || base=$dir
  local scratch
  scratch=$(mktemp -d "$base/orch-fuzz-$n.XXXXXX")
  local t0
  t0=$(date +%s)
  # FUZZ_ARGS is split into words on purpose (several flags).
  # shellcheck disable=SC2086
  FUZZ_SCRATCH=$scratch timeout -k 10 $((SECS + 120)) "$BIN_DIR/fuzz_$n" \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "${dict[@]}" ${FUZZ_ARGS:-} \
    "$dir/corpus" >"$dir/log" 2>&1
  echo $? >"$dir/rc"
  echo $(($(date +%s) - t0)) >"$dir/secs"
  rm -rf "$scratch"
}

start=$(date +%s)
running=0
for n in "${names[@]}"; do
  run_one "$n" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

fail=0
printf '%-12s %12s %8s %6s %6s %7s  %s\n' harness execs exec/s secs cov ft result
for n in "${names[@]}"; do
  dir=$WORK/$n
  rc=$(cat "$dir/rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  done_line=$(grep -E '^#[0-9]+.*(DONE|pulse|INITED)' "$dir/log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  artifacts=$(ls "$dir/artifacts" 2>/dev/null)
  if [ "$rc" = 0 ] && [ -z "$artifacts" ]; then
    result=ok
  else
    result="FAILED (exit $rc)"
    fail=1
  fi
  printf '%-12s %12s %8s %6s %6s %7s  %s\n' "$n" "${execs:-?}" "${rate:-?}" \
    "$(cat "$dir/secs" 2>/dev/null)" "${cov:-?}" "${ft:-?}" "$result"
done
for n in "${names[@]}"; do
  dir=$WORK/$n
  rc=$(cat "$dir/rc" 2>/dev/null || echo 1)
  if [ "$rc" != 0 ] || [ -n "$(ls "$dir/artifacts" 2>/dev/null)" ]; then
    echo "---- fuzz_$n: last lines of $dir/log"
    grep -vE '^#[0-9]+ +(NEW|REDUCE|pulse)' "$dir/log" | tail -40
    for a in "$dir"/artifacts/*; do
      [ -e "$a" ] && echo "reproducer: $a (rerun: $BIN_DIR/fuzz_$n $a)"
    done
  fi
done
echo "fuzz: ${#names[@]} harnesses, ${SECS}s each, $JOBS at a time, $(($(date +%s) - start))s"
if [ "$fail" -ne 0 ]; then
  echo "fuzz: FAILED (logs and reproducers kept in $WORK)" >&2
  exit 1
fi
rm -rf "$WORK"
echo "fuzz: all clean"
