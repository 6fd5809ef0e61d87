#!/usr/bin/env bash
# gpu_check.sh - every check of the CUDA engine that needs a GPU, in one run
# of at most ~7.5 minutes on one H200, with a summary at the end.
#
#   tools/gpu_check.sh [OUT_DIR]   on the GPU machine (OUT_DIR: $OUT if set,
#                                  else build/gpu_check)
#   tools/gpu_check.sh pack        on the build machine: packs prebuilt
#                                  binaries + their non-system libraries into
#                                  build/gpu_bundle.tar.xz, for GPU machines
#                                  that lack the build dependencies
#
# Steps (each with a time cap inside a global budget, GPU_CHECK_BUDGET=450 s):
#   build      make all test-bins (falls back to building only the CUDA engine
#              and tools, and then to build/gpu_bundle.tar.xz when present)
#   probe      orch info --engine=cuda
#   conformance  tests/test_conformance on mock, cpu and cuda
#   parity     tests/test_cuda_engine (CUDA vs CPU engine)
#   lora       tests/test_cuda_lora (LoRA adapters vs torch and the CPU engine)
#   ft_stream  tests/test_cuda_ft_stream (ABI 1.5 token-level fine-tuning
#              streams vs adapter_forward_backward and the CPU engine)
#   train_*    orch bench train --engine=cuda --config configs/gpt2-124m.json
#              --batch 16 --seq 1024 (fp32, then --options math=tf32 and bf16)
#   infer      orch bench infer --engine=cuda --config configs/gpt2-124m.json
#   decode_*   build/tools/engine_decode_bench: 1 vs 64 sequences
# then MFU against the H200's dense peak for the math mode (fp32 67, tf32
# 494.7, bf16 989.4 TFLOP/s; GPU_PEAK_FP32/TF32/BF16 override, in TFLOP/s)
# and the decode speedup, next to the targets (MFU >= 0.35 in tf32/bf16,
# 64 sequences >= 20x one).
#
# Output: OUT_DIR/summary.txt (one line per step, then the numbers) and
# OUT_DIR/gpu_check_logs.tar.gz (every step's full log). Exit 0 when no step
# failed (skips and missed speed targets do not fail the run).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD

# --------------------------------------------------------------------------
# pack mode
# --------------------------------------------------------------------------
if [ "${1:-}" = pack ]; then
  make -j"$(nproc)" all test-bins >/dev/null || { echo "gpu_check pack: build failed"; exit 1; }
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/gpu_bundle/bin" "$stage/gpu_bundle/lib"
  for f in build/orch build/libengine_mock.so build/libengine_cpu.so build/libengine_cuda.so \
           build/tests/test_conformance build/tests/test_cuda_engine build/tests/test_cuda_lora \
           build/tests/test_cuda_ft_stream \
           build/tools/engine_decode_bench; do
    [ -e "$f" ] && cp "$f" "$stage/gpu_bundle/bin/"
  done
  # every shared library they use, except the C/C++ runtime and CUDA's own
  for f in "$stage"/gpu_bundle/bin/*; do
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
  done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnvidia[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/gpu_bundle/lib/"; done
  tar -C "$stage" -cJf build/gpu_bundle.tar.xz gpu_bundle
  echo "gpu_check pack: build/gpu_bundle.tar.xz ($(du -h build/gpu_bundle.tar.xz | cut -f1));"
  echo "  carry it to the GPU machine (run: carry [\"build/gpu_bundle.tar.xz\"])"
  exit 0
fi

# --------------------------------------------------------------------------
# run mode
# --------------------------------------------------------------------------
OUT_DIR=${1:-${OUT:-build/gpu_check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
SUMMARY=$OUT_DIR/summary.txt
BUDGET=${GPU_CHECK_BUDGET:-450}
START=$(date +%s)
: >"$SUMMARY"
n_pass=0 n_fail=0 n_skip=0

say() { echo "$*" | tee -a "$SUMMARY"; }

# run_step NAME CAP_SECONDS COMMAND... : runs with a timeout inside the budget,
# logs to $LOGS/NAME.log, records PASS (0) / SKIP (77) / TIMEOUT / FAIL.
run_step() {
  local name=$1 cap=$2
  shift 2
  local now left t0 rc status line
  now=$(date +%s)
  left=$((START + BUDGET - now))
  if [ "$left" -lt 25 ]; then
    say "$(printf 'SKIP     %-16s    -   out of time (budget %ss)' "$name" "$BUDGET")"
    n_skip=$((n_skip + 1))
    return 3
  fi
  [ "$cap" -gt $((left - 15)) ] && cap=$((left - 15))
  t0=$(date +%s)
  timeout -k 5 "$cap" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=PASS; n_pass=$((n_pass + 1)) ;;
    77) status=SKIP; n_skip=$((n_skip + 1)) ;;
    124 | 137) status=TIMEOUT; n_fail=$((n_fail + 1)) ;;
    *) status=FAIL; n_fail=$((n_fail + 1)) ;;
  esac
  line=$(grep -E 'Checks:|skipped|error|Error|"bench"' "$LOGS/$name.log" | tail -n 1 | cut -c1-150)
  [ -z "$line" ] && line=$(tail -n 1 "$LOGS/$name.log" | cut -c1-150)
  say "$(printf '%-8s %-16s %4ss  %s' "$status" "$name" "$(($(date +%s) - t0))" "$line")"
  return $rc
}

say "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  command -v nvcc >/dev/null && nvcc --version | tail -n 1
} | sed 's/^/  /' | tee -a "$SUMMARY"

# ---- build --------------------------------------------------------------
BIN=$ROOT/build
TESTS=$ROOT/build/tests
ENG=$ROOT/build
if run_step build 240 make -j"$(nproc)" all test-bins; then
  :
else
  run_step build_cuda 150 make -j"$(nproc)" build/libengine_cuda.so build/tools/engine_decode_bench
  if [ -f build/gpu_bundle.tar.xz ]; then
    mkdir -p "$LOGS/bundle"
    tar -C "$LOGS/bundle" -xJf build/gpu_bundle.tar.xz
    B=$LOGS/bundle/gpu_bundle
    export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    BIN=$B/bin TESTS=$B/bin ENG=$B/bin
    # the CUDA engine and the tool built here are preferred when they built
    [ -f build/libengine_cuda.so ] && cp build/libengine_cuda.so "$B/bin/"
    [ -x build/tools/engine_decode_bench ] && cp build/tools/engine_decode_bench "$B/bin/"
    say "  using the prebuilt bundle build/gpu_bundle.tar.xz for orch, tests and the cpu engine"
  fi
fi
ORCH=$BIN/orch
DECODE=$BIN/engine_decode_bench
[ -x "$DECODE" ] || DECODE=$ROOT/build/tools/engine_decode_bench
export ORCH_ENGINE_PATH=$ENG ORCH_BUILD=$ENG ORCH_BIN=$ORCH CK_FORK=yes

# ---- correctness ----------------------------------------------------------
run_step probe 30 "$ORCH" info --engine=cuda
export ORCH_CONFORMANCE_ENGINES="$ENG/libengine_mock.so,$ENG/libengine_cpu.so,$ENG/libengine_cuda.so"
run_step conformance 120 "$TESTS/test_conformance"
run_step parity 120 "$TESTS/test_cuda_engine"
run_step lora 60 "$TESTS/test_cuda_lora"
run_step ft_stream 60 "$TESTS/test_cuda_ft_stream"

# ---- speed ----------------------------------------------------------------
TRAIN=(bench train --engine=cuda --config configs/gpt2-124m.json --batch 16 --seq 1024 --json)
run_step train_fp32 90 "$ORCH" "${TRAIN[@]}"
run_step train_tf32 90 "$ORCH" "${TRAIN[@]}" --options math=tf32
run_step train_bf16 90 "$ORCH" "${TRAIN[@]}" --options math=bf16
run_step infer 90 "$ORCH" bench infer --engine=cuda --config configs/gpt2-124m.json --json
run_step decode_fp32 60 "$DECODE" "$ENG/libengine_cuda.so" --batches 1,16,64
run_step decode_tf32 60 "$DECODE" "$ENG/libengine_cuda.so" --batches 1,16,64 --options math=tf32

# ---- numbers against the targets -----------------------------------------
say ""
say "numbers (H200 dense peaks: fp32 ${GPU_PEAK_FP32:-67} / tf32 ${GPU_PEAK_TF32:-494.7} / bf16 ${GPU_PEAK_BF16:-989.4} TFLOP/s):"
if command -v python3 >/dev/null; then
  python3 - "$LOGS" <<'PY' | tee -a "$SUMMARY"
import json, os, sys
logs = sys.argv[1]
peak = {"fp32": float(os.environ.get("GPU_PEAK_FP32", 67.0)),
        "tf32": float(os.environ.get("GPU_PEAK_TF32", 494.7)),
        "bf16": float(os.environ.get("GPU_PEAK_BF16", 989.4))}
def last_json(name):
    try:
        lines = [l for l in open(os.path.join(logs, name + ".log")) if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None
for mode in ("fp32", "tf32", "bf16"):
    j = last_json("train_" + mode)
    if not j:
        print(f"  train {mode}: no result"); continue
    mfu = j["model_gflops_per_s"] / (peak[mode] * 1000.0)
    target = "" if mode == "fp32" else ("  (target >= 0.35: %s)" % ("met" if mfu >= 0.35 else "MISSED"))
    print(f"  train {mode}: {j['ms_per_step']:.1f} ms/step, {j['tokens_per_s']:.0f} tokens/s, "
          f"{j['model_gflops_per_s']/1000:.1f} TFLOP/s, MFU {mfu:.3f}{target}, "
          f"loss {j['first_loss']:.3f} -> {j['last_loss']:.3f}")
j = last_json("infer")
if j:
    print("  infer: prefill %.0f tokens/s; decode 1/4/16 seqs: %.0f / %.0f / %.0f tokens/s" % (
        j["prefill_tokens_per_s"], j["decode_tokens_per_s_1"], j["decode_tokens_per_s_4"],
        j["decode_tokens_per_s_16"]))
for mode in ("fp32", "tf32"):
    j = last_json("decode_" + mode)
    if not j:
        print(f"  decode {mode}: no result"); continue
    s = j.get("speedup_64", 0.0)
    print("  decode %s: 1 seq %.0f, 16 seqs %.0f, 64 seqs %.0f tokens/s; 64/1 = %.1fx "
          "(target >= 20x: %s)" % (mode, j["decode_tokens_per_s_1"], j["decode_tokens_per_s_16"],
                                    j["decode_tokens_per_s_64"], s, "met" if s >= 20 else "MISSED"))
PY
else
  say "  (python3 not found: see the JSON lines in the logs)"
fi

say ""
say "gpu_check: $n_pass passed, $n_fail failed, $n_skip skipped in $(($(date +%s) - START))s"
tar -C "$LOGS" -czf "$OUT_DIR/gpu_check_logs.tar.gz" --exclude=bundle . 2>/dev/null
echo "summary: $SUMMARY; logs: $OUT_DIR/gpu_check_logs.tar.gz"
[ "$n_fail" -eq 0 ]
