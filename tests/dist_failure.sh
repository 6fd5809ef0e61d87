#!/usr/bin/env bash
# dist_failure.sh - failures and signals in data-parallel training (2 ranks).
#  - A launcher world size > 1 that orch cannot serve is refused with a clear
#    message: a build without MPI names the launcher variable; an MPI build
#    whose MPI_Init sees a different world (srun without PMI) says so.
#  - Rank 1 hangs (SIGSTOP): rank 0's watchdog reports the stuck collective
#    and the job exits non-zero within ORCH_DIST_TIMEOUT (3 s here), never a
#    silent hang; the last checkpoint resumes to the same losses as an
#    uninterrupted run.
#  - Rank 1 dies (SIGKILL): the job exits non-zero within 30 s with a
#    message; the last checkpoint is good (resumes exactly).
#  - An engine error on rank 1 alone: its one-line error (step, call, last
#    good checkpoint) and the whole job stops (MPI_Abort), non-zero.
#  - SIGUSR1 delivered to rank 1 alone: both ranks stop at the same step,
#    rank 0 writes a checkpoint at that step, the job exits with status 3,
#    and resuming it gives the same losses as an uninterrupted run.
set -u
source "$(dirname "$0")/dist/lib.sh"
prepare_corpus
STEPS=150
run=(train "${common[@]}" --engine mock --steps $STEPS --set train.grad_accum=1)

# --- refusal -----------------------------------------------------------------
OMPI_COMM_WORLD_SIZE=2 timeout 60 "$ORCH_BIN" "${run[@]}" --out "$tmp/refused" >"$tmp/refused.log" 2>&1
rc=$?
if dist_have_mpi_orch; then
  want="MPI sees a world of 1"
else
  want="built without MPI"
fi
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "a 2-process launch env that orch cannot serve: exit $rc"
grep -q "$want" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "no '$want' message"; }
grep -q "OMPI_COMM_WORLD_SIZE=2" "$tmp/refused.log" || fail "the refusal does not name the launcher variable"
[ -e "$tmp/refused/latest" ] && fail "a refused run wrote a checkpoint"
echo "ok: world size 2 without a usable MPI world is refused ($want)"

if ! command -v mpirun >/dev/null 2>&1 || ! dist_have_mpi_orch; then
  echo "note: no mpirun or no MPI in $ORCH_BIN: the 2-rank failure checks are skipped"
  finish
fi

# The uninterrupted reference.
"${MPIRUN[@]}" "$ORCH_BIN" "${run[@]}" --out "$tmp/ref" >"$tmp/ref.log" 2>&1 ||
  { tail -n 20 "$tmp/ref.log"; fail "reference 2-rank run"; finish; }

# Start a slowed-down 2-rank run in its own process group; mp = mpirun's pid.
start_slow() { # dir, extra env...
  local dir=$1; shift
  env ORCH_MOCK_SLEEP_MS=40 "$@" setsid "${MPIRUN[@]}" "$ORCH_BIN" "${run[@]}" --out "$dir" \
    >"$dir.log" 2>&1 &
  mp=$!
  bg_pids+=("$mp")
}

# Resume DIR with 2 ranks to the end; compare with the reference.
resume_matches() { # dir, what
  local dir=$1 what=$2
  "${MPIRUN[@]}" "$ORCH_BIN" train --resume="$dir" >"$dir-resume.log" 2>&1 ||
    { tail -n 20 "$dir-resume.log"; fail "$what: resume from $(cat "$dir/latest" 2>/dev/null) failed"; return; }
  diff <(figures "$tmp/ref/metrics.jsonl") <(figures "$dir/metrics.jsonl") >"$dir.diff" ||
    { head -n 6 "$dir.diff"; fail "$what: the resumed run differs from the uninterrupted one"; }
}

elapsed_since() { echo "$(date +%s.%N) $1" | awk '{ printf "%.1f", $1 - $2 }'; }

# --- a hung rank ---------------------------------------------------------------
f0=$fails
dir="$tmp/hang"
start_slow "$dir" ORCH_DIST_TIMEOUT=3
wait_steps "$dir/metrics.jsonl" 15 30 || fail "hang: the run did not reach step 15"
r1=$(rank_pid "$mp" 1) || fail "hang: rank 1 not found"
t0=$(date +%s.%N)
kill -STOP "$r1"
wait "$mp"
rc=$?
took=$(elapsed_since "$t0")
[ $rc -ne 0 ] || fail "hang: exit status 0"
grep -q "rank 0 of 2: gradient all-reduce at step [0-9]* has not completed after 3 s (ORCH_DIST_TIMEOUT)" "$dir.log" ||
  { tail -n 20 "$dir.log"; fail "hang: no watchdog message from rank 0"; }
awk -v t="$took" 'BEGIN { exit !(t < 20) }' || fail "hang: took $took s to exit"
[ "$fails" -eq "$f0" ] && echo "ok: a hung rank: exit $rc after $took s: $(grep -o 'rank 0 of 2: gradient.*ORCH_DIST_TIMEOUT)' "$dir.log")"
resume_matches "$dir" "hang"

# --- a dead rank ---------------------------------------------------------------
f0=$fails
dir="$tmp/dead"
start_slow "$dir" ORCH_DIST_TIMEOUT=10
wait_steps "$dir/metrics.jsonl" 15 30 || fail "dead: the run did not reach step 15"
r1=$(rank_pid "$mp" 1) || fail "dead: rank 1 not found"
t0=$(date +%s.%N)
kill -KILL "$r1"
wait "$mp"
rc=$?
took=$(elapsed_since "$t0")
[ $rc -ne 0 ] || fail "dead: exit status 0"
grep -qE "exited on signal 9|has not completed after|orch: error" "$dir.log" ||
  { tail -n 20 "$dir.log"; fail "dead: no message about the dead rank"; }
awk -v t="$took" 'BEGIN { exit !(t < 30) }' || fail "dead: took $took s to exit"
[ "$fails" -eq "$f0" ] && echo "ok: a dead rank: exit $rc after $took s"
resume_matches "$dir" "dead"

# --- an engine error on one rank --------------------------------------------------
f0=$fails
dir="$tmp/fault"
printf '#!/bin/sh\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && export ORCH_MOCK_FAULT=forward_backward:15\nexec "$@"\n' \
  >"$tmp/fault1.sh"
chmod +x "$tmp/fault1.sh"
timeout 60 "${MPIRUN[@]}" "$tmp/fault1.sh" "$ORCH_BIN" "${run[@]}" --out "$dir" >"$dir.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "fault: exit status $rc"
grep -q "rank 1 of 2: step 15: engine mock: forward_backward[_a-z]* failed: .*injected fault.*last good checkpoint: .*ckpt-00000010" "$dir.log" ||
  { tail -n 20 "$dir.log"; fail "fault: rank 1's error does not name the step, the call and the last checkpoint"; }
[ "$(cat "$dir/latest" 2>/dev/null)" = ckpt-00000010 ] || fail "fault: latest is not ckpt-00000010"
[ "$fails" -eq "$f0" ] && echo "ok: an engine error on rank 1 stops the job (exit $rc) with its message"

# --- a signal that reaches one rank only ---------------------------------------
f0=$fails
dir="$tmp/usr1"
start_slow "$dir" ORCH_DIST_TIMEOUT=10
wait_steps "$dir/metrics.jsonl" 15 30 || fail "usr1: the run did not reach step 15"
kill -USR1 "$(rank_pid "$mp" 1)"
wait "$mp"
rc=$?
[ $rc -eq 3 ] || { tail -n 20 "$dir.log"; fail "usr1: exit status $rc, want 3"; }
last=$(tail -n 1 "$dir/metrics.jsonl" | sed -E 's/^\{"step":([0-9]+).*/\1/')
want=$(printf 'ckpt-%08d' "$last")
[ "$(cat "$dir/latest" 2>/dev/null)" = "$want" ] ||
  fail "usr1: latest is '$(cat "$dir/latest" 2>/dev/null)', the last logged step is $last"
[ "$last" -lt $STEPS ] || fail "usr1: the run was not stopped early"
[ "$fails" -eq "$f0" ] && echo "ok: SIGUSR1 to rank 1 alone: both ranks stopped at step $last with a checkpoint, exit 3"
resume_matches "$dir" "usr1"
finish
