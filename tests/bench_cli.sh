#!/usr/bin/env bash
# bench_cli.sh - `orch bench` prints the JSON fields the benchmarks promise
# (train: tokens_per_s, ms_per_step, model_gflops_per_s, sgemm peak, mfu;
# infer: prefill/decode rates, memory bandwidth, decode_bw_fraction), mfu
# follows --peak-gflops, and bad arguments exit 2. Behaviour only: no speed is
# asserted here.
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
PYEOF

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
PYEOF

"$ORCH_BIN" bench train --config $cfg --peak-gflops 0 >/dev/null 2>"$work/err"; rc=$?
grep -q "peak-gflops" "$work/err" && [ $rc -eq 2 ] || fail "bad --peak-gflops: rc $rc"
"$ORCH_BIN" bench sideways >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 2 ] || fail "unknown bench kind: rc $rc"
echo "bench_cli: ok"
