#!/usr/bin/env bash
# slurm_train.sh - tools/slurm/train.sbatch on a real Slurm: a one-node
# cluster on loopback (tests/slurm/cluster.sh: munged, slurmctld, slurmd,
# started here and stopped on exit) runs the template with 2 tasks; srun
# starts 2 MPI ranks of orch through PMIx.
#   1. An uninterrupted job: 2 ranks train to the end (exit 0).
#   2. The same job, sent `scancel --signal=USR1` mid-run (what the template's
#      --signal=USR1@120 does before the time limit): the ranks agree on the
#      signal, rank 0 writes a checkpoint, orch exits with status 3, the
#      template requeues the job, Slurm runs it again (restart 1), the template
#      passes --resume and training ends at the same step with the same
#      metrics and the same weights as job 1, bit for bit (mock engine).
#   0. Without a cluster: the template fails a job whose srun returned 0 but
#      started no orch rank (Slurm 22.05 does that when a step aborts at
#      launch).
# Slurm holds a requeued job for about two minutes (EligibleTime); the test
# releases it at once with `scontrol update StartTime=now`.
# Skips (77) with one line when the machine cannot run the cluster (not root,
# no slurm-wlm/munge) or orch has no MPI.
set -u
cd "$(dirname "$0")/.."
. tests/dist/lib.sh
. tests/slurm/cluster.sh
# 0. (No cluster needed.) An srun that returns 0 without starting the tasks,
# as Slurm 22.05 does for a step that aborts at launch, is a failure of the
# job, not a finished run.
mkdir -p "$tmp/fake-bin"
printf '#!/bin/sh\necho "srun: error: task 0 launch failed: Unspecified error" >&2\nexit 0\n' \
  >"$tmp/fake-bin/srun"
chmod +x "$tmp/fake-bin/srun"
PATH="$tmp/fake-bin:$PATH" ORCH=/bin/true ORCH_RUN_DIR="$tmp/fake-run" SLURM_JOB_ID=1 \
  bash tools/slurm/train.sbatch >"$tmp/fake.out" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -q "srun returned 0 but orch rank 0 never ran" "$tmp/fake.out"; then
  cat "$tmp/fake.out"; fail "template: an srun that started nothing read as rc $rc"
else
  echo "ok: template: srun exit 0 with no rank run -> job fails (exit 1)"
fi
dist_require_mpi
reason=$(slurm_cluster_skip_reason)
if [ -n "$reason" ]; then echo "SKIP: slurm_train: $reason"; exit 77; fi
trap 'slurm_cluster_stop; cleanup' EXIT
if ! slurm_cluster_start "$tmp/slurm" >"$tmp/cluster.log"; then
  echo "FAIL: the test cluster did not start: $(cat "$tmp/cluster.log")"
  tail -n 5 "$tmp"/slurm/log/*.log 2>/dev/null
  exit 1
fi
echo "ok: one-node Slurm cluster up ($(sinfo -V), node $SLURM_NODE, $(nproc) CPUs)"
prepare_corpus

steps=200
case $ORCH_BIN in /*) orch_abs=$ORCH_BIN ;; *) orch_abs=$root/$ORCH_BIN ;; esac
submit() { # submit RUN_DIR OUT [sbatch options]: prints the job id
  local run=$1 out=$2
  shift 2
  ORCH="$orch_abs" ORCH_CONFIG="$root/configs/tiny-test.json" ORCH_RUN_DIR="$run" \
    ORCH_ENGINE=mock ORCH_DIST_TIMEOUT=60 \
    sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 \
    --gpus-per-task=0 --time=10 --output="$out" "$@" "$root/tools/slurm/train.sbatch" \
    --set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin" \
    --set train.max_steps=$steps --set engine.threads=1 --set engine.options=sleep_ms=15
}

# 1. Uninterrupted.
if ! job1=$(submit "$tmp/run1" "$tmp/job1.out"); then
  fail "sbatch of the uninterrupted job failed"; finish
fi
st=$(slurm_wait_state "$job1" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 300) ||
  fail "job 1 did not end within 300 s (state $st)"
grep -q "data parallel over 2 ranks" "$tmp/job1.out" ||
  fail "job 1 did not run 2 ranks: $(grep -m1 '^train:' "$tmp/job1.out")"
grep -q "orch-train: finished" "$tmp/job1.out" || fail "job 1 did not finish"
[ "$(slurm_job_field "$job1" ExitCode)" = "0:0" ] ||
  fail "job 1 exit code $(slurm_job_field "$job1" ExitCode)"
[ -d "$tmp/run1/ckpt-$(printf %08d $steps)" ] || fail "job 1 wrote no final checkpoint"
if [ "$fails" -ne 0 ]; then
  echo "--- job 1 log (step lines left out):"; grep -v '^step ' "$tmp/job1.out"; finish
fi
echo "ok: job $job1: 2 ranks through srun --mpi=pmix trained $steps steps (${SECONDS}s into the test)"

# 2. Signalled mid-run, requeued, resumed.
job2=$(submit "$tmp/run2" "$tmp/job2.out") || { fail "sbatch of job 2 failed"; finish; }
for ((i = 0; i < 1200; i++)); do # step 30, unless the job ends first
  [ -f "$tmp/run2/metrics.jsonl" ] && [ "$(wc -l <"$tmp/run2/metrics.jsonl")" -ge 30 ] && break
  grep -qE "orch-train: (finished|failed)" "$tmp/job2.out" 2>/dev/null && break
  sleep 0.1
done
if ! [ "$(wc -l <"$tmp/run2/metrics.jsonl" 2>/dev/null)" -ge 30 ] 2>/dev/null; then
  fail "job 2 never reached step 30"
  echo "--- job 2 log:"; grep -v '^step ' "$tmp/job2.out"; finish
fi
scancel --signal=USR1 "$job2"
# The template requeues the job; Slurm holds a requeued job about two minutes
# (EligibleTime); release it as soon as it is pending on an idle node.
for ((i = 0; i < 600; i++)); do
  grep -qF "requeueing" "$tmp/job2.out" 2>/dev/null && break
  sleep 0.1
done
for ((i = 0; i < 300; i++)); do
  grep -qF "restart 1:" "$tmp/job2.out" && break
  # Only once every slurmstepd of the first run is gone: a step of the new
  # run reuses the step id (JOB.0) and its PMIx socket, which the old stepd
  # holds until it exits ("Cannot bind() UNIX socket ... stepd.slurm.pmix.J.0:
  # Address already in use" and "srun: task 0 launch failed"); the node
  # reads idle before that.
  [ "$(slurm_job_field "$job2" JobState)" = PENDING ] &&
    ! pgrep -f "slurmstepd: \[$job2\." >/dev/null &&
    scontrol update JobId="$job2" StartTime=now 2>/dev/null
  sleep 0.3
done
grep -qF "restart 1:" "$tmp/job2.out" ||
  fail "job 2 did not run again after the requeue (state $(slurm_job_field "$job2" JobState), restarts $(slurm_job_field "$job2" Restarts))"
for ((i = 0; i < 900; i++)); do # the second run ends
  sed -n '/restart 1:/,$p' "$tmp/job2.out" | grep -qE "orch-train: (finished|failed|stopped)" && break
  sleep 0.2
done
st=$(slurm_wait_state "$job2" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED" 60) ||
  fail "job 2 did not end (state $st)"
[ "$st" = COMPLETED ] || fail "job 2 ended $st"
[ "$(slurm_job_field "$job2" ExitCode)" = "0:0" ] ||
  fail "job 2 exit code $(slurm_job_field "$job2" ExitCode)"
for want in "signal received" "orch-train: stopped by a signal with a checkpoint: requeueing" \
            "restart 1: 2 ranks" "resuming from $tmp/run2/ckpt-" "orch-train: finished"; do
  grep -qF "$want" "$tmp/job2.out" || fail "job 2 log lacks: $want"
done
cut=$(sed -n 's/.*resuming from .*(step \([0-9]*\)).*/\1/p' "$tmp/job2.out" | head -n 1)
if [ -n "$cut" ] && { [ "$cut" -lt 30 ] || [ "$cut" -ge "$steps" ]; }; then
  fail "job 2 resumed from step $cut, not from mid-run"
fi
if ! diff <(figures "$tmp/run1/metrics.jsonl") <(figures "$tmp/run2/metrics.jsonl") \
    >"$tmp/metrics.diff"; then
  head -n 6 "$tmp/metrics.diff"; fail "signalled + requeued + resumed metrics differ from job 1"
fi
last=ckpt-$(printf %08d $steps)
"$PY" "$root/tests/dist/compare.py" weights "$tmp/run1/$last" "$tmp/run2/$last" 0 \
  >"$tmp/weights.log" 2>&1 || { cat "$tmp/weights.log"; fail "final weights differ"; }
[ "$fails" -eq 0 ] || { echo "--- job 2 log (step lines left out):"; grep -v '^step ' "$tmp/job2.out"; }
[ "$fails" -eq 0 ] && echo "ok: job $job2: USR1 at step ${cut:-?} -> checkpoint, exit 3, requeue, restart 1," \
  "--resume: metrics and weights equal the uninterrupted job (${SECONDS}s into the test)"
finish
