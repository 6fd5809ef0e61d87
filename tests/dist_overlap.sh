#!/usr/bin/env bash
# dist_overlap.sh - the gradient all-reduce overlapped with the backward
# (train.overlap_allreduce, ABI 1.3 forward_backward_notify), on MPI with 2
# ranks on loopback (tiny configs, train.eps 1e-6 as in dist_train.sh).
#  - CPU engine, GPT-2 and LLaMA (untied head), 2 ranks x grad_accum 2 (the
#    overlapped call is the second micro-batch: its ranges hold accumulated
#    gradients): overlap on == off BIT FOR BIT after 20 steps: every
#    metrics.jsonl figure but the timings (text) and the checkpoint files
#    (model.safetensors, optimizer.safetensors, bytes). Run once with tiny
#    buckets (0.003 MiB: ~45 buckets, all but the last started inside the
#    backward, which the run's closing all-reduce line reports) and once with
#    the default 25 MiB (one bucket). With 2 ranks every element is a + b in
#    either path, whatever the cut into buckets (see dist.h).
#  - 2 ranks overlapped == 1 rank x grad_accum 4 on the same windows within
#    1e-5 (metrics and weights), as tests/dist_train.sh checks without it.
#  - The mock engine: on == off bit for bit; ZeRO-1 (train.zero = 1) keeps its
#    own path (no overlap line); an ABI 1.1 engine (tests/engines/abi11_mock.c)
#    trains with one line saying it has no forward_backward_notify.
#  - An engine whose ranges miss part of the buffer (tests/engines/
#    notify_gap_mock.c) stops the run with one line naming the engine and the
#    counts.
#  - Prints (does not assert) the step time on and off and the all-reduce
#    time waited after the backward, from the runs' closing lines.
# Skips (77) when mpirun is missing or orch was built without MPI.
set -u
source "$(dirname "$0")/dist/lib.sh"
dist_require_mpi
prepare_corpus
TOL=1e-5
common+=(--set train.eps=1e-6 --set train.grad_accum=2)
MPIRUN1=("${MPIRUN[@]}")
MPIRUN1[${#MPIRUN1[@]}-1]=1

run() { # log, launcher words..., -- orch train args...
  local log=$1; shift
  "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { tail -n 8 "$log"; fail "exit $rc: ${*: -6}"; }
  return $rc
}

same_bits() { # label dirA dirB step
  local c a b
  c=ckpt-$(printf %08d "$4")
  diff <(figures "$2/metrics.jsonl") <(figures "$3/metrics.jsonl") >"$tmp/diff" ||
    { head -n 4 "$tmp/diff"; fail "$1: metrics differ"; }
  for f in model.safetensors optimizer.safetensors; do
    a="$2/$c/$f" b="$3/$c/$f"
    [ -s "$a" ] && [ -s "$b" ] || { fail "$1: $c/$f missing"; continue; }
    cmp -s "$a" "$b" || fail "$1: $c/$f differs"
  done
}

# "tokens_per_s" of the steps after the first, averaged: ms per step.
step_ms() {
  "$PY" -c '
import json, sys
tps = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]) if "\"loss\"" in l][1:]
tok = float(sys.argv[2])
print("%.1f" % (1e3 * sum(tok / t for t in tps) / len(tps)) if tps else "?")' "$1" "$2"
}
ar_line() { sed -n 's/^train: gradient all-reduce (\(.*\)): \(.*\)/\1: \2/p' "$1"; }

check_cpu() { # label config
  local l=$1 cfg=$2 d="$tmp/$1" mb
  local -a c=("${common[@]}" --engine cpu --steps 20)
  c[1]=$cfg # common starts with --config FILE
  for mb in 0.003 25; do
    run "$tmp/$l-on-$mb.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${c[@]}" \
      --set train.allreduce_bucket_mb=$mb --out "$d-on-$mb" || return
    run "$tmp/$l-off-$mb.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${c[@]}" \
      --set train.allreduce_bucket_mb=$mb --set train.overlap_allreduce=false \
      --out "$d-off-$mb" || return
    grep -q "^train: gradient all-reduce overlapped with the backward (buckets of $mb MiB)" \
      "$tmp/$l-on-$mb.log" || fail "$l: no overlap line with $mb MiB buckets"
    grep -q "overlapped with the backward" "$tmp/$l-off-$mb.log" &&
      fail "$l: overlap_allreduce=false still overlapped"
    same_bits "$l: $mb MiB buckets: overlap on vs off" "$d-on-$mb" "$d-off-$mb" 20
    echo "$l, $mb MiB buckets: on  $(ar_line "$tmp/$l-on-$mb.log")"
    echo "$l, $mb MiB buckets: off $(ar_line "$tmp/$l-off-$mb.log")"
  done
  # Tiny buckets: all but the last bucket start during the backward.
  local early
  early=$(sed -n 's/.* buckets per step (\([0-9.]*\) started during it)/\1/p' \
    "$tmp/$l-on-0.003.log")
  "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 10 else 1)' "${early:-0}" ||
    fail "$l: only ${early:-no} buckets per step started during the backward"
  # Against one process on the same windows.
  run "$tmp/$l-one.log" "$ORCH_BIN" train "${c[@]}" --set train.grad_accum=4 \
    --out "$d-one" || return
  "$PY" "$root/tests/dist/compare.py" metrics "$d-one/metrics.jsonl" \
    "$d-on-0.003/metrics.jsonl" $TOL >"$tmp/cmp.log" 2>&1 ||
    { cat "$tmp/cmp.log"; fail "$l: 2 ranks overlapped differ from 1 rank (metrics)"; }
  "$PY" "$root/tests/dist/compare.py" weights "$d-one/ckpt-00000020" \
    "$d-on-0.003/ckpt-00000020" $TOL >"$tmp/cmp.log" 2>&1 ||
    { cat "$tmp/cmp.log"; fail "$l: 2 ranks overlapped differ from 1 rank (weights)"; }
  local tok
  tok=$("$PY" -c 'import json,sys; t=json.load(open(sys.argv[1]))["train"]; print(t["micro_batch"]*t["seq_len"]*4)' \
    "$d-on-25/config.json" 2>/dev/null || echo 1)
  echo "$l: step time (2 ranks, mean of steps 2-20): overlap on $(step_ms "$d-on-25/metrics.jsonl" "$tok") ms, off $(step_ms "$d-off-25/metrics.jsonl" "$tok") ms"
}

# Mock: bit for bit, ZeRO-1 keeps its path.
c=("${common[@]}" --engine mock --steps 20 --set train.allreduce_bucket_mb=0.001)
run "$tmp/m-on.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${c[@]}" --out "$tmp/m-on" &&
  run "$tmp/m-off.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${c[@]}" \
    --set train.overlap_allreduce=false --out "$tmp/m-off" &&
  same_bits "mock: overlap on vs off" "$tmp/m-on" "$tmp/m-off" 20
grep -q "overlapped with the backward" "$tmp/m-on.log" || fail "mock: no overlap line"
run "$tmp/m-z.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${c[@]}" --set train.zero=1 \
  --out "$tmp/m-z" &&
  { grep -q "ZeRO-1: AdamW moments sharded" "$tmp/m-z.log" || fail "mock: no ZeRO-1 line"
    grep -q "^train: ZeRO-1 reduce-scatters the gradients after the backward (train.overlap_allreduce applies to zero = 0)" \
      "$tmp/m-z.log" || fail "mock: zero=1 does not say that the overlap does not apply"
    grep -q "overlapped\|all-reduce after the backward" "$tmp/m-z.log" &&
      fail "mock: zero=1 took the all-reduce path"; }

old="$ORCH_BUILD/tests/engines/abi11_mock.so"
if [ -e "$old" ]; then
  run "$tmp/old.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$old" \
    --steps 3 --out "$tmp/old" &&
    { grep -q "^train: gradient all-reduce after the backward: engine mock-abi11 (ABI 1.1) has no forward_backward_notify (ABI 1.3)" \
        "$tmp/old.log" || { cat "$tmp/old.log"; fail "ABI 1.1 engine: no line saying why not overlapped"; }; }
else
  fail "$old not built (make test-bins)"
fi

# An engine whose ranges do not cover the buffer: the run stops with one line.
gap="$ORCH_BUILD/tests/engines/notify_gap_mock.so"
if [ -e "$gap" ]; then
  if timeout 60 "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$gap" --steps 3 \
      --out "$tmp/gap" >"$tmp/gap.log" 2>&1; then
    fail "an engine that drops a gradient range trained"
  fi
  grep -q "engine mock-notify-gap: forward_backward_notify reported [0-9]* of [0-9]* gradient elements" \
    "$tmp/gap.log" || { tail -n 5 "$tmp/gap.log"; fail "no line naming the uncovered gradient"; }
else
  fail "$gap not built (make test-bins)"
fi

# Config errors name the key and the value.
for bad in train.allreduce_bucket_mb=0 train.allreduce_bucket_mb=1025 \
    train.overlap_allreduce=1; do
  if "$ORCH_BIN" train "${common[@]}" --engine mock --steps 1 --set "$bad" \
      --out "$tmp/bad" >"$tmp/bad.log" 2>&1; then
    fail "--set $bad accepted"
  fi
  grep -q "train\.${bad%%=*}\|${bad%%=*}:" "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "--set $bad: no message naming the key"; }
done

if [ -e "$ORCH_BUILD/libengine_cpu.so" ]; then
  check_cpu gpt2 "$root/configs/tiny-test.json"
  check_cpu llama "$root/configs/llama_tiny.json"
else
  echo "note: $ORCH_BUILD/libengine_cpu.so not built: CPU half skipped"
fi
finish
