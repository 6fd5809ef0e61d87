#!/usr/bin/env bash
# bench_vs_torch.sh - GPT-2 training step of orch's CPU engine next to
# PyTorch's on the same model, batch and sequence length, in one run.
#
#   tools/bench_vs_torch.sh [--config FILE] [--batch B] [--seq T] [--steps N]
#                           [--threads N] [--rounds R]
#
# Defaults: configs/bench-gpt2-124m.json (GPT-2 124M), batch 4, seq 64,
# 10 steps, 2 threads, 1 round. Each round runs `orch bench train` and then
# tools/torch_bench.py (Debian python3-torch, /usr/bin/python3) with PyTorch's
# best settings on this machine: torch.set_num_threads(THREADS),
# OMP_WAIT_POLICY=PASSIVE and
# GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736.
# It prints both figures per round and the median ratio (torch time / orch
# time; > 1 means orch is faster). ORCH_BIN overrides the orch binary.
set -euo pipefail
cd "$(dirname "$0")/.."
ORCH_BIN=${ORCH_BIN:-build/orch}
config=configs/bench-gpt2-124m.json batch=4 seq=64 steps=10 threads=2 rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_vs_torch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$ORCH_BIN" ] || { echo "bench_vs_torch.sh: $ORCH_BIN not built (make)" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "bench_vs_torch.sh: /usr/bin/python3 cannot import torch (apt-get install python3-torch)" >&2; exit 2; }

echo "machine: $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $config, batch $batch x seq $seq, $steps timed steps, $threads threads"
results=()
for r in $(seq 1 "$rounds"); do
  orch_json=$("$ORCH_BIN" bench train --engine=cpu --config "$config" --batch "$batch" \
      --seq "$seq" --steps "$steps" --threads "$threads" --json)
  torch_json=$(OMP_WAIT_POLICY=PASSIVE \
      GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \
      /usr/bin/python3 tools/torch_bench.py --config "$config" --batch "$batch" \
      --seq "$seq" --steps "$steps" --threads "$threads" --json)
  line=$(/usr/bin/python3 - "$orch_json" "$torch_json" <<'EOF'
import json, sys
o, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def f(x):
    return "n/a" if x is None else "%.3f" % x
for name, j in (("orch cpu", o), (t["engine"], t)):
    print("  %-14s %8.1f ms/step  %7.1f tokens/s  %6.1f model GFLOP/s  "
          "sgemm peak %6.1f  mfu %s" % (name, j["ms_per_step"], j["tokens_per_s"],
          j["model_gflops_per_s"], j["sgemm_peak_gflops_per_s"] or 0, f(j["mfu"])))
print("RATIO %.4f" % (t["ms_per_step"] / o["ms_per_step"]))
EOF
)
  echo "round $r:"
  echo "$line" | grep -v '^RATIO'
  results+=("$(echo "$line" | sed -n 's/^RATIO //p')")
done
median=$(printf '%s\n' "${results[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
echo "orch is ${median}x the speed of PyTorch (median over $rounds round(s); torch ms/step / orch ms/step)"
