#!/usr/bin/env bash
# dist_zero.sh - ZeRO-1 (train.zero = 1, ABI 1.2) and elastic resume, on MPI
# with 2 ranks on loopback (tiny config, train.eps 1e-6 as in dist_train.sh).
#  ZeRO-1, on the mock and the CPU engine:
#  - 2 ranks zero=1 == 2 ranks zero=0: every step's loss, lr, grad norm and
#    val loss, and the final weights and AdamW moments (the checkpoint, which
#    rank 0 writes after gathering the moment shards) within 1e-5. The
#    sharded run differs only by the summation order of the global gradient
#    norm (each rank sums the squares of its shard), so 1e-5 is generous.
#  - Optimizer memory per rank falls as 1/world: the "optimizer state per
#    rank" line (every rank's engine optimizer_bytes, after step 1) shows
#    the full 8 bytes x parameters on each rank with zero=0 and, with zero=1,
#    shards that add up to it with each at most half plus one element (the
#    CUDA engine pads a shard to 64 floats, not run here).
#  - 1 rank zero=1 (the ranged step over one shard: everything) == zero=0.
#  - Checkpoints are world-size independent: a zero=1 checkpoint at step 20
#    resumed with zero=0, a zero=0 one resumed with zero=1, and a 2-rank
#    zero=1 one resumed on 1 rank with zero=1 all end (step 40) equal to the
#    uninterrupted zero=0 run within 1e-5.
#  - An ABI 1.1 engine (tests/engines/abi11_mock.c: the mock's table cut at
#    1.1) trains with zero=0 and refuses zero=1 with one line.
#  Elastic resume (2 ranks -> 1 -> 2), mock and CPU engine:
#  - 20 steps on 2 ranks x grad_accum 1, then 10 on 1 rank, then the last 10
#    on 2 ranks, against 40 straight on 2 ranks. Each resume prints
#    "resuming on N ranks (checkpoint was written by M): data windows
#    re-derived, grad_accum A -> A' ...", and every step's loss and grad
#    norm, and the final weights, equal the straight run within 1e-5.
#    What that asserts about the data: each step's loss is the mean over
#    the step's windows, and the mock engine's loss terms are a function of
#    the tokens, so a skipped, repeated or shifted window changes that step's
#    loss by far more than 1e-5 (the CPU engine's too). The straight run's
#    step k consumes windows 2k..2k+1 of the one shared sampler stream (rank r
#    takes draw r); the 1-rank leg must consume the same two per step (as
#    grad_accum 2: micro-batch 1 = draw 0, micro-batch 2 = draw 1) and the
#    last leg continues the stream where the 1-rank leg stopped. The state
#    of each checkpoint records data.world and data.grad_accum, checked too.
#  - A checkpoint of 2 micro-batches per step cannot be split over 3 ranks:
#    refused with one line naming both numbers. A grad_accum set on the
#    command line of the resume wins, and the line says so.
# Skips (77) when mpirun is missing or orch was built without MPI.
set -u
source "$(dirname "$0")/dist/lib.sh"
dist_require_mpi
prepare_corpus
TOL=1e-5
# grad_accum 1 (the tiny config says 2): 2 micro-batches per step on 2 ranks.
common+=(--set train.eps=1e-6 --set train.grad_accum=1)
MPIRUN1=("${MPIRUN[@]}")
MPIRUN1[${#MPIRUN1[@]}-1]=1 # the same launcher, one rank
MPIRUN3=("${MPIRUN[@]}")
MPIRUN3[${#MPIRUN3[@]}-1]=3

cmp_runs() { # label a b step
  "$PY" "$root/tests/dist/compare.py" metrics "$2/metrics.jsonl" "$3/metrics.jsonl" $TOL \
    >"$tmp/cmp.log" 2>&1 || { cat "$tmp/cmp.log"; fail "$1 (metrics)"; }
  "$PY" "$root/tests/dist/compare.py" weights "$2/ckpt-$(printf %08d "$4")" \
    "$3/ckpt-$(printf %08d "$4")" $TOL >"$tmp/cmp.log" 2>&1 ||
    { cat "$tmp/cmp.log"; fail "$1 (weights and moments)"; }
}

run() { # log, launcher words..., -- orch train args...
  local log=$1; shift
  "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { tail -n 8 "$log"; fail "exit $rc: ${*: -6}"; }
  return $rc
}

# data.world and data.grad_accum of a checkpoint's state.json: "W A"
layout() {
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))["data"]; print(d["world"], d["grad_accum"])' \
    "$1/state.json" 2>/dev/null
}

# "optimizer state per rank: A, B bytes ..." -> "A B"
opt_bytes() { sed -n 's/^train: optimizer state per rank: \([0-9, ]*\) bytes.*/\1/p' "$1" | tr -d ,; }

check_zero() { # engine
  local e=$1
  local z0="$tmp/$e-z0" z1="$tmp/$e-z1" f0=$fails
  run "$tmp/$e-z0.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$e" \
    --steps 40 --out "$z0" || return
  run "$tmp/$e-z1.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$e" \
    --steps 40 --set train.zero=1 --out "$z1" || return
  grep -q "ZeRO-1: AdamW moments sharded over 2 ranks" "$tmp/$e-z1.log" ||
    fail "$e: no ZeRO-1 line"
  cmp_runs "$e: 2 ranks zero=1 differs from zero=0" "$z0" "$z1" 40

  # Optimizer memory per rank.
  local full b0 b1 a0 a1 n
  read -r a0 a1 <<<"$(opt_bytes "$tmp/$e-z0.log")"
  read -r b0 b1 <<<"$(opt_bytes "$tmp/$e-z1.log")"
  n=$(sed -n 's/.*rank[s]*, \([0-9]*\) parameters.*/\1/p' "$tmp/$e-z1.log" | head -n 1)
  full=$((8 * n))
  echo "$e: optimizer bytes per rank: zero=0 $a0 $a1, zero=1 $b0 $b1 ($n parameters)"
  [ "${a0:-x}" = "$full" ] && [ "${a1:-x}" = "$full" ] ||
    fail "$e: zero=0 ranks hold $a0 / $a1 optimizer bytes, expected $full each"
  if [ -z "${b0:-}" ] || [ -z "${b1:-}" ] || [ $((b0 + b1)) -ne "$full" ] ||
     [ "$b0" -gt $((full / 2 + 8)) ] || [ "$b1" -gt $((full / 2 + 8)) ]; then
    fail "$e: zero=1 ranks hold $b0 / $b1 optimizer bytes, expected halves of $full"
  fi

  # One rank: the ranged step over a single shard.
  run "$tmp/$e-1z1.log" "$ORCH_BIN" train "${common[@]}" --engine "$e" --steps 20 \
    --set train.zero=1 --out "$tmp/$e-1z1" || return
  run "$tmp/$e-1z0.log" "$ORCH_BIN" train "${common[@]}" --engine "$e" --steps 20 \
    --out "$tmp/$e-1z0" || return
  cmp_runs "$e: 1 rank zero=1 differs from zero=0" "$tmp/$e-1z0" "$tmp/$e-1z1" 20

  # Checkpoints across modes and world sizes: first 20 steps, then resume.
  local a="$tmp/$e-z1to0" b="$tmp/$e-z0to1" c="$tmp/$e-z1to1rank"
  run "$tmp/$e-a1.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$e" \
    --steps 40 --set train.zero=1 --out "$a" --stop-after 20 &&
    run "$tmp/$e-a2.log" "${MPIRUN[@]}" "$ORCH_BIN" train --resume="$a" \
      --set train.zero=0 &&
    cmp_runs "$e: zero=1 checkpoint resumed with zero=0 differs" "$z0" "$a" 40
  run "$tmp/$e-b1.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$e" \
    --steps 40 --out "$b" --stop-after 20 &&
    run "$tmp/$e-b2.log" "${MPIRUN[@]}" "$ORCH_BIN" train --resume="$b" \
      --set train.zero=1 &&
    cmp_runs "$e: zero=0 checkpoint resumed with zero=1 differs" "$z0" "$b" 40
  run "$tmp/$e-c1.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$e" \
    --steps 40 --set train.zero=1 --out "$c" --stop-after 20 &&
    run "$tmp/$e-c2.log" "$ORCH_BIN" train --resume="$c" &&
    cmp_runs "$e: 2-rank zero=1 checkpoint resumed on 1 rank differs" "$z0" "$c" 40
  grep -q "resuming on 1 rank (checkpoint was written by 2)" "$tmp/$e-c2.log" ||
    fail "$e: no elastic line when a 2-rank checkpoint resumes on 1 rank"
  [ "$fails" -eq "$f0" ] &&
    echo "ok: $e: zero=1 == zero=0 (within $TOL), moments halved, checkpoints portable"
}

check_elastic() { # engine
  local e=$1
  local straight="$tmp/$e-z0" el="$tmp/$e-elastic"
  local f0=$fails
  run "$tmp/$e-e1.log" "${MPIRUN[@]}" "$ORCH_BIN" train "${common[@]}" --engine "$e" \
    --steps 40 --out "$el" --stop-after 20 || return
  run "$tmp/$e-e2.log" "$ORCH_BIN" train --resume="$el" --stop-after 10 || return
  grep -q "resuming on 1 rank (checkpoint was written by 2): data windows re-derived, grad_accum 1 -> 2" \
    "$tmp/$e-e2.log" || { grep resuming "$tmp/$e-e2.log"; fail "$e: no 2 -> 1 elastic line"; }
  [ "$(layout "$el/ckpt-00000030")" = "1 2" ] ||
    fail "$e: the 1-rank checkpoint does not record world 1 x grad_accum 2"
  run "$tmp/$e-e3.log" "${MPIRUN[@]}" "$ORCH_BIN" train --resume="$el" || return
  grep -q "resuming on 2 ranks (checkpoint was written by 1): data windows re-derived, grad_accum 2 -> 1" \
    "$tmp/$e-e3.log" || fail "$e: no 1 -> 2 elastic line"
  [ "$(layout "$el/ckpt-00000040")" = "2 1" ] ||
    fail "$e: the final checkpoint does not record world 2 x grad_accum 1"
  cmp_runs "$e: 2 -> 1 -> 2 ranks differs from 2 ranks straight" "$straight" "$el" 40
  [ "$fails" -eq "$f0" ] && echo "ok: $e: elastic 2 -> 1 -> 2 ranks == 2 ranks straight (within $TOL)"
}

check_zero mock
check_elastic mock
# The comparison can fail: the first 20 steps of the 2-rank run (2 windows
# a step) against the 1-rank grad_accum 1 run (1 window a step, the first
# of each pair): the losses must differ.
head -n 20 "$tmp/mock-z0/metrics.jsonl" >"$tmp/first20.jsonl"
if "$PY" "$root/tests/dist/compare.py" metrics "$tmp/first20.jsonl" \
    "$tmp/mock-1z0/metrics.jsonl" $TOL >/dev/null 2>&1; then
  fail "compare.py finds no difference when each step takes half the windows"
fi

# 2 micro-batches per step do not split over 3 ranks.
if "${MPIRUN3[@]}" "$ORCH_BIN" train --resume="$tmp/mock-z0" --steps 50 >"$tmp/three.log" 2>&1; then
  fail "mock: a 2-micro-batch checkpoint resumed on 3 ranks"
fi
grep -q "resume: .* was written by 2 ranks x grad_accum 1 = 2 micro-batches per step, which 3 ranks cannot split evenly" \
  "$tmp/three.log" || { tail -n 3 "$tmp/three.log"; fail "mock: no one-line refusal for 3 ranks"; }

# A grad_accum other than the checkpoint's, given on the command line, wins
# over the re-derived one, and the line says what changes.
run "$tmp/set.log" "${MPIRUN1[@]}" "$ORCH_BIN" train --resume="$tmp/mock-z0" --steps 44 \
  --set train.grad_accum=3
grep -q "resuming on 1 rank (checkpoint was written by 2): data windows re-derived from the sample stream, grad_accum 3 as set (3 micro-batches per step instead of 2)" \
  "$tmp/set.log" || { grep resuming "$tmp/set.log"; fail "mock: no line for a grad_accum set on resume"; }

# An ABI 1.1 engine: trains with zero=0, refuses zero=1 in one line.
old="$ORCH_BUILD/tests/engines/abi11_mock.so"
if [ -e "$old" ]; then
  run "$tmp/old0.log" "$ORCH_BIN" train "${common[@]}" --engine "$old" --steps 3 \
    --out "$tmp/old0"
  if "$ORCH_BIN" train "${common[@]}" --engine "$old" --steps 3 --set train.zero=1 \
      --out "$tmp/old1" >"$tmp/old1.log" 2>&1; then
    fail "an ABI 1.1 engine accepted train.zero=1"
  fi
  grep -q "train.zero = 1: engine mock-abi11 has ABI 1.1 without the ranged optimizer step" \
    "$tmp/old1.log" || { cat "$tmp/old1.log"; fail "no one-line refusal of zero=1 on ABI 1.1"; }
else
  fail "$old not built (make test-bins)"
fi

if [ -e "$ORCH_BUILD/libengine_cpu.so" ]; then
  check_zero cpu
  check_elastic cpu
else
  echo "note: $ORCH_BUILD/libengine_cpu.so not built: CPU half skipped"
fi
finish
