#!/usr/bin/env bash
# cpu_isa_cli.sh - the CPU engine runs kernels that match the CPU, whatever
# OpenBLAS's own model table says:
#   - `orch info --engine=cpu` names the ISA features, the vector kernels, the
#     OpenBLAS kernel in use and how it was chosen, and the precision paths;
#   - with OPENBLAS_CORETYPE unset the engine asks OpenBLAS for the kernel
#     that matches cpuid (SkylakeX with AVX-512F/BW/VL/DQ, Haswell or Zen
#     with AVX2+FMA), never the SSE3 "Prescott" fallback on such a CPU;
#   - a user's OPENBLAS_CORETYPE is respected and reported as the user's;
#   - a training run gives the same loss whichever OpenBLAS kernel runs
#     (within fp32 reassociation noise).
# Needs ORCH_BIN and ORCH_BUILD (set by tests/run_tests.sh).
set -u
: "${ORCH_BIN:?ORCH_BIN must name the orch binary}"
: "${ORCH_BUILD:?ORCH_BUILD must name the build directory}"
export ORCH_ENGINE_PATH="${ORCH_ENGINE_PATH:-$ORCH_BUILD}"
unset OPENBLAS_CORETYPE
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failures=$((failures + 1)); }

flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }
want=""
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
  want=SkylakeX
elif has avx2 && has fma; then
  if grep -q AuthenticAMD /proc/cpuinfo; then want=Zen; else want=Haswell; fi
fi

"$ORCH_BIN" info --engine=cpu >"$tmp/out" 2>"$tmp/err"
rc=$?
probe=$(sed -n 's/^probe: *//p' "$tmp/out")
if [ $rc -eq 0 ] && [ -n "$probe" ]; then pass "orch info --engine=cpu: $probe"
else fail "orch info --engine=cpu: rc $rc: $(cat "$tmp/err")"; fi
for word in "ISA:" "vector kernels:" "GEMM: OpenBLAS kernel" "precisions: fp32"; do
  case "$probe" in *"$word"*) ;; *) fail "info lacks '$word'" ;; esac
done
if has avx2; then
  case "$probe" in *"AVX2"*) pass "info names AVX2" ;; *) fail "info misses AVX2" ;; esac
fi
if has amx_bf16 || has avx512_bf16; then
  case "$probe" in *"bf16 ("*) pass "info lists the bf16 path" ;; *) fail "no bf16 path listed" ;; esac
else
  case "$probe" in *"bf16 ("*) fail "bf16 listed without native support" ;; *) pass "no bf16 path on this CPU" ;; esac
fi

if [ -n "$want" ]; then
  case "$probe" in
    *"OpenBLAS kernel $want (chosen by the engine from cpuid"*) pass "OpenBLAS runs $want kernels, chosen from cpuid" ;;
    *"OpenBLAS kernel Prescott"*) fail "OpenBLAS fell back to Prescott on a $want-class CPU: $probe" ;;
    *) fail "expected OpenBLAS kernel $want chosen from cpuid: $probe" ;;
  esac
else
  echo "skip  no AVX2+FMA: OpenBLAS's own detection is used"
fi

if has avx2 && has fma; then
  probe=$(OPENBLAS_CORETYPE=Haswell "$ORCH_BIN" info --engine=cpu | sed -n 's/^probe: *//p')
  case "$probe" in
    *"OpenBLAS kernel Haswell (set by the user"*) pass "a user's OPENBLAS_CORETYPE=Haswell is respected" ;;
    *) fail "user's OPENBLAS_CORETYPE not respected: $probe" ;;
  esac
fi

# Two short runs, engine-chosen kernel and the user's Haswell: same losses
# up to fp32 reassociation (different kernels sum in different orders).
if has avx2 && has fma; then
  run() {
    env "$@" "$ORCH_BIN" bench train --engine=cpu --config configs/tiny-test.json \
      --steps 3 --warmup 0 --threads 1 --json
  }
  a=$(run) && b=$(run OPENBLAS_CORETYPE=Haswell) || fail "bench train runs"
  if /usr/bin/env python3 - "$a" "$b" <<'PY'; then pass "same losses with either OpenBLAS kernel"; else fail "losses differ: $a / $b"; fi
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert abs(a["first_loss"] - b["first_loss"]) < 1e-4 and abs(a["last_loss"] - b["last_loss"]) < 1e-4
PY
fi

[ $failures -eq 0 ] && { echo "cpu_isa_cli: ok"; exit 0; }
echo "cpu_isa_cli: $failures failure(s)"
exit 1
