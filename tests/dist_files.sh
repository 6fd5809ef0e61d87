#!/usr/bin/env bash
# dist_files.sh - the cluster launch files.
#  - tools/slurm/train.sbatch parses (bash -n), carries the documented
#    #SBATCH settings, and runs the orch command the other dist suites run:
#    it is executed here under a stand-in `srun` (mpirun -np 2 on loopback)
#    and `scontrol`: SIGUSR1 (what --signal=USR1@120 sends) makes it
#    checkpoint, exit 3 and requeue; the requeued run resumes and ends with
#    the same losses as an uninterrupted 2-rank run of the same command.
#  - tools/k8s/volcano-train.yaml parses (python3-yaml): a Volcano Queue and
#    a Job with the MPI plugin, gang scheduling (minAvailable = launcher +
#    worker replicas, RANKS = worker replicas), the queue, resource requests, a restart policy for
#    exit status 3, and a launcher script (bash -n) that runs the same
#    `orch train` command.
# The sbatch run is skipped (with a note) without mpirun or an MPI orch.
set -u
source "$(dirname "$0")/dist/lib.sh"
sbatch="$root/tools/slurm/train.sbatch"
yaml="$root/tools/k8s/volcano-train.yaml"
# The command both files run, as the tests run it ($ORCH_BIN train --config
# FILE --out DIR, plus --resume when the run has a checkpoint).
cmd='train --config "$ORCH_CONFIG" --out "$ORCH_RUN_DIR" "${resume[@]}"'

# --- sbatch: static -------------------------------------------------------------
bash -n "$sbatch" || fail "train.sbatch: bash -n"
for want in '^#SBATCH --nodes=' '^#SBATCH --ntasks-per-node=' '^#SBATCH --gpus-per-task=' \
            '^#SBATCH --time=' '^#SBATCH --signal=USR1@120' '^#SBATCH --requeue' \
            'srun --mpi=' 'scontrol requeue' '--kill-on-bad-exit=1'; do
  grep -qE -- "$want" "$sbatch" || fail "train.sbatch lacks '$want'"
done
grep -qF -- "$cmd" "$sbatch" || fail "train.sbatch does not run: orch $cmd"

# --- Volcano: static -------------------------------------------------------------
"$PY" - "$yaml" "$cmd" <<'PYEOF' || fail "volcano-train.yaml"
import subprocess, sys, yaml
path, cmd = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
kinds = {d["kind"]: d for d in docs}
bad = []
def check(cond, what):
    if not cond: bad.append(what)
check(set(kinds) == {"Queue", "Job"}, f"documents {sorted(kinds)}")
q, job = kinds.get("Queue", {}), kinds.get("Job", {})
check(q.get("apiVersion") == "scheduling.volcano.sh/v1beta1", "Queue apiVersion")
check(job.get("apiVersion") == "batch.volcano.sh/v1alpha1", "Job apiVersion")
spec = job.get("spec", {})
check(spec.get("schedulerName") == "volcano", "schedulerName")
check(spec.get("queue") == q.get("metadata", {}).get("name"), "the Job's queue is the Queue")
tasks = {t["name"]: t for t in spec.get("tasks", [])}
mpi = spec.get("plugins", {}).get("mpi", [])
master = next((a.split("=", 1)[1] for a in mpi if a.startswith("--master=")), None)
worker = next((a.split("=", 1)[1] for a in mpi if a.startswith("--worker=")), None)
check(master in tasks and worker in tasks, f"mpi plugin names tasks that exist ({master}, {worker})")
if master in tasks and worker in tasks:
    w, m = tasks[worker], tasks[master]
    check(spec.get("minAvailable") == w["replicas"] + m["replicas"],
          "minAvailable == launcher + worker replicas (gang: Volcano counts every pod)")
    env = {e["name"]: e.get("value") for e in m["template"]["spec"]["containers"][0].get("env", [])}
    check(str(env.get("RANKS")) == str(w["replicas"]), "RANKS == worker replicas")
    res = w["template"]["spec"]["containers"][0].get("resources", {}).get("requests", {})
    check({"cpu", "memory"} <= set(res), "worker resource requests")
    pol = m.get("policies", [])
    check(any(p.get("exitCode") == 3 and p.get("action") == "RestartJob" for p in pol),
          "exit status 3 restarts the Job")
    script = "\n".join(m["template"]["spec"]["containers"][0].get("args", []))
    check("mpirun" in script and "--host \"$MPI_HOST\"" in script, "launcher runs mpirun over MPI_HOST")
    check(("orch " + cmd) in script, "launcher runs: orch " + cmd)
    r = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    check(r.returncode == 0, "launcher script: bash -n: " + r.stderr.strip())
for b in bad:
    print("volcano-train.yaml:", b)
sys.exit(1 if bad else 0)
PYEOF
echo "ok: train.sbatch and volcano-train.yaml parse and run: orch $cmd"

# --- sbatch: run it under a stand-in srun ---------------------------------------
if ! command -v mpirun >/dev/null 2>&1 || ! dist_have_mpi_orch; then
  echo "note: no mpirun or no MPI in $ORCH_BIN: the sbatch run is skipped"
  finish
fi
prepare_corpus
fake="$tmp/fakebin"
mkdir -p "$fake"
# srun OPTIONS... PROGRAM ARGS...: drop the options, run on loopback.
cat >"$fake/srun" <<SH
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#--}" != "\$1" ]; do shift; done
for v in \$(compgen -e | grep '^SLURM_'); do unset "\$v"; done
exec ${MPIRUN[*]} "\$@"
SH
printf '#!/bin/sh\necho "$@" >>"%s/scontrol.calls"\n' "$tmp" >"$fake/scontrol"
chmod +x "$fake/srun" "$fake/scontrol"
extra=(--set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin" --steps 120)
job_env=(ORCH="$ORCH_BIN" ORCH_CONFIG="$root/configs/tiny-test.json" ORCH_RUN_DIR="$tmp/sb"
         ORCH_ENGINE=mock ORCH_DIST_TIMEOUT=10 SLURM_JOB_ID=4242 SLURM_NTASKS=2
         SLURM_CPUS_PER_TASK=1 PATH="$fake:$PATH")

env "${job_env[@]}" ORCH_MOCK_SLEEP_MS=40 setsid bash "$sbatch" "${extra[@]}" >"$tmp/sb1.log" 2>&1 &
job=$!
bg_pids+=("$job")
if wait_steps "$tmp/sb/metrics.jsonl" 12 30; then
  mp=$(pgrep -P "$job" -x mpirun | head -n 1)
  kill -USR1 "$mp" # what Slurm sends 120 s before the time limit
else
  fail "sbatch: the run did not reach step 12"
fi
wait "$job"
rc=$?
[ $rc -eq 3 ] || { tail -n 20 "$tmp/sb1.log"; fail "sbatch: exit $rc after SIGUSR1, want 3"; }
grep -qx "requeue 4242" "$tmp/scontrol.calls" 2>/dev/null || fail "sbatch: did not requeue the job"
stopped=$(cat "$tmp/sb/latest" 2>/dev/null)
env "${job_env[@]}" SLURM_RESTART_COUNT=1 bash "$sbatch" "${extra[@]}" >"$tmp/sb2.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -n 20 "$tmp/sb2.log"; fail "sbatch: requeued run exit $rc"; }
grep -q "resuming from .*$stopped" "$tmp/sb2.log" || fail "sbatch: the requeued run did not resume from $stopped"
# The same command without the stop, straight through.
"${MPIRUN[@]}" "$ORCH_BIN" train --config "$root/configs/tiny-test.json" --out "$tmp/straight" \
  --engine mock --set engine.threads=1 "${extra[@]}" >"$tmp/straight.log" 2>&1 ||
  fail "sbatch: the straight run failed"
diff <(figures "$tmp/straight/metrics.jsonl") <(figures "$tmp/sb/metrics.jsonl") >/dev/null ||
  fail "sbatch: stop + requeue + resume differs from the straight run"
echo "ok: train.sbatch: SIGUSR1 -> checkpoint $stopped, exit 3, requeue, resume == straight run"
finish
