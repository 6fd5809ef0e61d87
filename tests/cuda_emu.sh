#!/usr/bin/env bash
# cuda_emu.sh - runs the CUDA engine's parity and conformance suites without a
# GPU: compiles engines/cuda/*.cu as plain C++ against the CPU emulator of
# tests/cuda_emu (fake CUDA runtime + cuBLAS: fibers for threads, real
# barriers, cuBLAS's column-major semantics and argument checks), with the C
# objects of engines/common linked in as the libengine_cuda.so rule does, into
# a temporary libengine_cuda_emu.so; then runs $ORCH_BUILD/tests/test_cuda_engine
# against it (ORCH_CUDA_ENGINE: every kernel, GEMM layout and host path of the
# CUDA engine checked against the CPU engine for GPT-2, and against the torch
# fixtures tests/fixtures/cpu_llama_tiny_kv*.safetensors for LLaMA) and
# $ORCH_BUILD/tests/test_conformance on it alone (ORCH_CONFORMANCE_ENGINES:
# the ABI's rules), so both run in `make test`.
# Skips (77) under sanitizers (the emulator switches stacks), without g++, or
# when the test binaries or the CPU engine are not built.
set -u
cd "$(dirname "$0")/.."
BUILD_DIR=${ORCH_BUILD:-$PWD/build}
if [ -n "${ORCH_SAN:-}" ]; then
  echo "cuda_emu: skipped under sanitizers (the CUDA emulator switches stacks)"
  exit 77
fi
CXX=${CXX:-g++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "cuda_emu: skipped: no C++ compiler ($CXX) to build the emulated engine"
  exit 77
fi
for f in tests/test_cuda_engine tests/test_conformance libengine_cpu.so; do
  if [ ! -e "$BUILD_DIR/$f" ]; then
    echo "cuda_emu: skipped: $BUILD_DIR/$f is not built"
    exit 77
  fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# engines/common is C11: compiled by the C compiler, linked in like the .so rule.
objs=()
for c in engines/common/*.c; do
  o="$tmp/$(basename "$c" .c).o"
  if ! "${CC:-cc}" -std=c11 -O2 -g -fPIC -fvisibility=hidden -Wall -Wextra -Werror \
      -D_GNU_SOURCE -I . -c "$c" -o "$o"; then
    echo "cuda_emu: FAIL: $c does not compile"
    exit 1
  fi
  objs+=("$o")
done
if ! "$CXX" -std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra \
    -I tests/cuda_emu -I . -x c++ engines/cuda/*.cu tests/cuda_emu/emu.cpp \
    -x none "${objs[@]}" -o "$tmp/libengine_cuda_emu.so"; then
  echo "cuda_emu: FAIL: the CUDA engine does not compile against the emulator"
  exit 1
fi
rc=0
ORCH_CUDA_ENGINE="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_cuda_engine" || rc=1
ORCH_CONFORMANCE_ENGINES="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_conformance" | tee "$tmp/conformance.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# The conformance suite falls back to the mock when the named engine cannot
# run: make sure it tested the emulated engine.
if ! grep -q '^conformance: testing engine cuda ' "$tmp/conformance.log"; then
  echo "cuda_emu: FAIL: the conformance suite did not test the emulated CUDA engine"
  rc=1
fi
exit $rc
