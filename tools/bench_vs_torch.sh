#!/usr/bin/env bash
# bench_vs_torch.sh - GPT-2 training step of orch's CPU engine next to
# PyTorch's on the same model, batch and sequence length, in one run, for
# fp32 and for bf16 (orch precision=bf16 vs torch.autocast bf16).
#
#   tools/bench_vs_torch.sh [--config FILE] [--batch B] [--seq T] [--steps N]
#                           [--threads N] [--rounds R] [--precision fp32|bf16|both]
#
# Defaults: configs/bench-gpt2-124m.json (GPT-2 124M), batch 4, seq 64,
# 10 steps, 2 threads, 1 round, both precisions (bf16 only where the CPU has
# AMX-BF16 or AVX512_BF16; otherwise it says so and skips it). Each round
# runs `orch bench train` and then tools/torch_bench.py (Debian python3-torch,
# /usr/bin/python3) with PyTorch's best settings on this machine:
# torch.set_num_threads(THREADS), OMP_WAIT_POLICY=PASSIVE and
# GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736.
# It prints both figures per round (tokens/s, MFU against the physical peak
# and against the best GEMM of the precision, peak RSS) and the median ratio
# per precision (torch time / orch time; > 1 means orch is faster).
# ORCH_BIN overrides the orch binary.
set -euo pipefail
cd "$(dirname "$0")/.."
ORCH_BIN=${ORCH_BIN:-build/orch}
config=configs/bench-gpt2-124m.json batch=4 seq=64 steps=10 threads=2 rounds=1 prec=both
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --precision) prec=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_vs_torch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$prec" in fp32) precs=(fp32) ;; bf16) precs=(bf16) ;; both) precs=(fp32 bf16) ;;
  *) echo "bench_vs_torch.sh: --precision must be fp32, bf16 or both" >&2; exit 2 ;; esac
[ -x "$ORCH_BIN" ] || { echo "bench_vs_torch.sh: $ORCH_BIN not built (make)" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "bench_vs_torch.sh: /usr/bin/python3 cannot import torch (apt-get install python3-torch)" >&2; exit 2; }
if [ "$prec" = both ] && ! grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then
  echo "bf16: this CPU has neither AMX-BF16 nor AVX512_BF16; comparing fp32 only"
  precs=(fp32)
fi

echo "machine: $(nproc) cores of $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $config, batch $batch x seq $seq, $steps timed steps, $threads threads"
declare -A results
for r in $(seq 1 "$rounds"); do
  echo "round $r:"
  for p in "${precs[@]}"; do
    orch_json=$("$ORCH_BIN" bench train --engine=cpu --config "$config" --batch "$batch" \
        --seq "$seq" --steps "$steps" --threads "$threads" --precision "$p" --json)
    torch_json=$(OMP_WAIT_POLICY=PASSIVE \
        GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \
        /usr/bin/python3 tools/torch_bench.py --config "$config" --batch "$batch" \
        --seq "$seq" --steps "$steps" --threads "$threads" --precision "$p" --json)
    line=$(/usr/bin/python3 - "$orch_json" "$torch_json" <<'PY'
import json, sys
o, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def f(x):
    return "  n/a" if x is None else "%.3f" % x
peak = o.get("physical_peak_gflops")
for name, j in (("orch cpu " + o["precision"], o), (t["engine"], t)):
    phys = j["model_gflops_per_s"] / peak if peak else None
    print("  %-26s %8.1f ms/step %7.1f tokens/s %6.1f GFLOP/s  mfu physical %s  "
          "vs best GEMM %s (%s %.0f)  peak RSS %.0f MiB" % (
          name, j["ms_per_step"], j["tokens_per_s"], j["model_gflops_per_s"], f(phys),
          f(j["mfu"]), "own" if j is t else o["best_gemm"],
          j["sgemm_peak_gflops_per_s"] if j is t else (o["best_gemm_gflops_per_s"] or 0),
          j.get("peak_rss_mb", 0)))
if peak:
    print("  physical %s peak: %.0f GFLOP/s (%d cores x %.2f GHz, %s)" % (
        o["precision"], peak, o["cores"], o["clock_ghz"] or 0, o["peak_isa"]))
print("RATIO %.4f" % (t["ms_per_step"] / o["ms_per_step"]))
PY
)
    echo "$line" | grep -v '^RATIO'
    results[$p]+="$(echo "$line" | sed -n 's/^RATIO //p') "
  done
done
for p in "${precs[@]}"; do
  median=$(printf '%s\n' ${results[$p]} | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
  echo "$p: orch is ${median}x the speed of PyTorch (median over $rounds round(s); torch ms/step / orch ms/step)"
done
