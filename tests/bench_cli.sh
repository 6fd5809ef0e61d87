#!/usr/bin/env bash
# bench_cli.sh - `orch bench` prints the JSON fields the benchmarks promise
# (train: tokens_per_s, ms_per_step, model_gflops_per_s, sgemm peak, mfu,
# the physical peak = cores x measured clock x FLOPs/cycle of the ISA and
# mfu_physical, peak RSS; infer: prefill/decode rates, memory bandwidth,
# decode_bw_fraction in the weight format), mfu follows --peak-gflops,
# --precision bf16 divides by the bf16 peak and oneDNN's GEMM where the CPU
# has native bf16 (and is refused in one line where not), and bad arguments
# exit 2. Behaviour only: no speed is asserted here.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
cd "$(dirname "$0")/.." || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PY=$(command -v python3) || { echo "skip: python3 missing"; exit 77; }
cfg=configs/tiny-test.json

j=$("$ORCH_BIN" bench train --engine=cpu --config $cfg --steps 3 --json) || fail "bench train cpu"
"$PY" - "$j" <<'PYEOF' || fail "bench train cpu fields: $j"
import json, sys
j = json.loads(sys.argv[1])
for k in ("tokens_per_s", "ms_per_step", "model_gflops_per_s", "sgemm_peak_gflops_per_s", "mfu"):
    assert isinstance(j[k], (int, float)) and j[k] > 0, k
assert abs(j["mfu"] - j["model_gflops_per_s"] / j["sgemm_peak_gflops_per_s"]) < 1e-9
# 6*N + 12*layers*seq*width, N without wpe (tiny-test: 32x32 wpe)
assert j["flops_per_token"] == 6 * (j["params"] - 32 * 32) + 12 * 2 * 16 * 32, j["flops_per_token"]
assert j["precision"] == "fp32" and j["best_gemm"] == "OpenBLAS sgemm"
assert j["best_gemm_gflops_per_s"] == j["sgemm_peak_gflops_per_s"]
flags = open("/proc/cpuinfo").read().split()
per_cycle = 64 if "avx512f" in flags else 32 if "avx2" in flags and "fma" in flags else 8
assert j["peak_isa"] == {64: "AVX-512 FMA", 32: "AVX2 FMA", 8: "SSE"}[per_cycle], j["peak_isa"]
assert 0.2 < j["clock_ghz"] < 8, j["clock_ghz"]
assert 1 <= j["cores"] <= j["threads"]
assert abs(j["physical_peak_gflops"] - j["cores"] * j["clock_ghz"] * per_cycle) < 1e-6
assert abs(j["mfu_physical"] - j["model_gflops_per_s"] / j["physical_peak_gflops"]) < 1e-9
assert j["peak_rss_mb"] > 1
PYEOF

if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then
  j=$("$ORCH_BIN" bench train --engine=cpu --config $cfg --steps 3 --precision bf16 --json) ||
    fail "bench train --precision bf16"
  "$PY" - "$j" <<'PYEOF' || fail "bench train bf16 fields: $j"
import json, sys
j = json.loads(sys.argv[1])
flags = open("/proc/cpuinfo").read().split()
amx = "amx_bf16" in flags
assert j["precision"] == "bf16" and j["best_gemm"] == "oneDNN bf16 matmul", j
assert j["peak_isa"] == ("AMX-BF16" if amx else "AVX512_BF16"), j["peak_isa"]
assert abs(j["physical_peak_gflops"] - j["cores"] * j["clock_ghz"] * (1024 if amx else 128)) < 1e-6
assert j["best_gemm_gflops_per_s"] > 0, "oneDNN loaded by the engine must be measured"
assert abs(j["mfu"] - j["model_gflops_per_s"] / j["best_gemm_gflops_per_s"]) < 1e-9
PYEOF
else
  echo "bench_cli: no AMX-BF16/AVX512_BF16 here: checking that bf16 is refused"
  "$ORCH_BIN" bench train --engine=cpu --config $cfg --steps 1 --precision bf16 \
      >/dev/null 2>"$work/err" && fail "bf16 without native support must fail"
  grep -q "precision=bf16" "$work/err" || fail "bf16 refusal names the option: $(cat "$work/err")"
fi

j=$("$ORCH_BIN" bench train --engine=mock --config $cfg --steps 3 --peak-gflops 250 --json) || fail "bench train mock"
"$PY" - "$j" <<'PYEOF' || fail "bench --peak-gflops: $j"
import json, sys
j = json.loads(sys.argv[1])
assert j["peak_gflops_per_s"] == 250 and j["mfu_peak"] == "given"
assert abs(j["mfu"] - j["model_gflops_per_s"] / 250) < 1e-12
PYEOF

j=$("$ORCH_BIN" bench infer --engine=cpu --config $cfg --prompt 16 --decode-prompt 8 --decode-steps 8 --json) || fail "bench infer"
"$PY" - "$j" <<'PYEOF' || fail "bench infer fields: $j"
import json, sys
j = json.loads(sys.argv[1])
for k in ("prefill_tokens_per_s", "decode_tokens_per_s_1", "decode_tokens_per_s_4",
          "decode_tokens_per_s_16", "mem_bw_gb_per_s", "decode_bw_fraction"):
    assert isinstance(j[k], (int, float)) and j[k] > 0, k
assert j["weights"] == "fp32"
PYEOF

j8=$("$ORCH_BIN" bench infer --engine=cpu --config $cfg --prompt 16 --decode-prompt 8 \
    --decode-steps 8 --quantize int8 --json) || fail "bench infer --quantize int8"
"$PY" - "$j" "$j8" <<'PYEOF' || fail "bench infer int8 fields: $j8"
import json, sys
f, q = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert q["weights"] == "int8"
# matrices go from 4 to 1.125 bytes a weight; biases and LayerNorm stay fp32
assert 0.25 < q["weight_bytes"] / f["weight_bytes"] < 0.40, (q["weight_bytes"], f["weight_bytes"])
assert abs(q["decode_bw_fraction"] - q["weight_bytes"] * q["decode_tokens_per_s_1"] /
           (q["mem_bw_gb_per_s"] * 1e9)) < 1e-9
PYEOF
"$ORCH_BIN" bench infer --config $cfg --quantize int4 >/dev/null 2>"$work/err"; rc=$?
grep -q "quantize" "$work/err" && [ $rc -eq 2 ] || fail "bad --quantize: rc $rc"

"$ORCH_BIN" bench train --engine=cpu --config $cfg --options precision=auto >/dev/null 2>"$work/err"; rc=$?
grep -q "precision=auto" "$work/err" && [ $rc -eq 2 ] || fail "precision=auto must be refused: rc $rc"
"$ORCH_BIN" bench train --config $cfg --peak-gflops 0 >/dev/null 2>"$work/err"; rc=$?
grep -q "peak-gflops" "$work/err" && [ $rc -eq 2 ] || fail "bad --peak-gflops: rc $rc"
"$ORCH_BIN" bench sideways >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 2 ] || fail "unknown bench kind: rc $rc"
echo "bench_cli: ok"
