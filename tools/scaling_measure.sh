#!/usr/bin/env bash
# scaling_measure.sh - the measurements behind docs/scaling.md, on this machine.
#
#   make all mpi-tools && tools/scaling_measure.sh [STEPS]
#
# 1. MPI_Allreduce bandwidth between 2 ranks (build/tools/mpi/allreduce_bench)
#    over shared memory (btl vader) and over TCP loopback (btl tcp).
# 2. Data-parallel training step times of the GPT-2 124M shape
#    (configs/gpt2-124m.json, micro-batch 4 x 64 tokens, cpu engine, STEPS
#    steps, default 8; the median of steps 3..STEPS), on a 2 MB slice of the
#    KJV corpus tokenized with GPT-2 BPE:
#      1 rank  x 1 thread,  grad_accum 1   (one rank's compute, no all-reduce)
#      1 rank  x 2 threads, grad_accum 2   (the global batch of 2 ranks)
#      2 ranks x 1 thread,  grad_accum 1   (mpirun, vader; then tcp; both with
#                                           the all-reduce overlapped, the default)
#      2 ranks x 1 thread, vader, train.overlap_allreduce=false
#    with the all-reduce time each 2-rank run waited after the backward.
# Prints the machine (CPU model, cores, load average) and a table. Needs
# mpirun and an MPI build of orch; takes about 3 minutes on 2 cores.
set -u
cd "$(dirname "$0")/.."
STEPS=${1:-8}
ORCH=${ORCH_BIN:-build/orch}
BENCH=${BENCH:-build/tools/mpi/allreduce_bench}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-build} ORCH_DATA_DIR=${ORCH_DATA_DIR:-$PWD/data}
for v in $(compgen -e | grep -E '^(SLURM_|OMPI_|PMI_|PMIX_)'); do unset "$v"; done
for f in "$ORCH" "$BENCH" data/kjv.txt; do
  [ -e "$f" ] || { echo "scaling_measure: $f is missing (make all mpi-tools; tools/setup.sh)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 -np 2)
VADER=(--mca btl self,vader --mca btl_vader_single_copy_mechanism none)
TCP=(--mca btl self,tcp --mca btl_tcp_if_include lo)

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u +%FT%TZ)"
echo
echo "== MPI_Allreduce, 2 ranks, shared memory (vader) =="
"${MPI[@]}" "${VADER[@]}" "$BENCH" || exit 1
echo
echo "== MPI_Allreduce, 2 ranks, TCP loopback =="
"${MPI[@]}" "${TCP[@]}" "$BENCH" || exit 1

head -c 2000000 data/kjv.txt >"$tmp/kjv.txt"
"$ORCH" prepare --tokenizer gpt2 --input "$tmp/kjv.txt" --out "$tmp/data" --val-fraction 0.05 >/dev/null ||
  exit 1
common=(train --config configs/gpt2-124m.json --engine cpu --steps "$STEPS"
        --set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin"
        --set train.micro_batch=4 --set train.seq_len=64 --set train.eval_every=0
        --set train.checkpoint_every=0 --set train.warmup_steps=0)
median_step() { # metrics.jsonl -> median seconds per step over steps 3..
  /usr/bin/python3 - "$1" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
t = [r["elapsed"] for r in rows]
d = sorted(b - a for a, b in zip(t[1:], t[2:]))
print("%.3f" % d[len(d) // 2] if d else "nan")
PYEOF
}
run() { # label, runner..., -- extra orch args
  local label=$1; shift
  local pre=() out="$tmp/run-$RANDOM"
  while [ "$1" != -- ]; do pre+=("$1"); shift; done
  shift
  if ! "${pre[@]}" "$ORCH" "${common[@]}" "$@" --out "$out" >"$out.log" 2>&1; then
    tail -n 5 "$out.log"; echo "scaling_measure: $label failed" >&2; exit 1
  fi
  printf '%-34s %8s s/step  %s\n' "$label" "$(median_step "$out/metrics.jsonl")" \
    "$(sed -n 's/^train: gradient all-reduce (\(.*\)): \([0-9.]* ms\) per step waited.*/\1: \2 waited/p' "$out.log")"
}
echo
echo "== GPT-2 124M shape, cpu engine, micro-batch 4 x 64 tokens, median of steps 3..$STEPS =="
run "1 rank x 1 thread, accum 1" -- --set engine.threads=1 --set train.grad_accum=1
run "1 rank x 2 threads, accum 2" -- --set engine.threads=2 --set train.grad_accum=2
run "2 ranks x 1 thread (vader)" "${MPI[@]}" "${VADER[@]}" -- --set engine.threads=1 --set train.grad_accum=1
run "2 ranks x 1 thread (tcp)" "${MPI[@]}" "${TCP[@]}" -- --set engine.threads=1 --set train.grad_accum=1
run "2 ranks, vader, overlap off" "${MPI[@]}" "${VADER[@]}" -- --set engine.threads=1 --set train.grad_accum=1 \
  --set train.overlap_allreduce=false
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
