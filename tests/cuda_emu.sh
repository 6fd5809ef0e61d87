#!/usr/bin/env bash
# cuda_emu.sh - runs the CUDA engine's parity suite without a GPU: compiles
# engines/cuda/*.cu as plain C++ against the CPU emulator of tests/cuda_emu
# (fake CUDA runtime + cuBLAS: fibers for threads, real barriers, cuBLAS's
# column-major semantics and argument checks) into a temporary
# libengine_cuda_emu.so, and points $ORCH_BUILD/tests/test_cuda_engine at it
# (ORCH_CUDA_ENGINE), so every kernel, GEMM layout and host path of the CUDA
# engine is checked against the CPU engine in `make test`.
# Skips (77) under sanitizers (the emulator switches stacks), without g++, or
# when the test binary or the CPU engine is not built.
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
if [ ! -x "$BUILD_DIR/tests/test_cuda_engine" ] || [ ! -f "$BUILD_DIR/libengine_cpu.so" ]; then
  echo "cuda_emu: skipped: $BUILD_DIR/tests/test_cuda_engine or libengine_cpu.so is not built"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# engines/common is C11: compiled by the C compiler, linked in like the .so rule.
if ! "${CC:-cc}" -std=c11 -O2 -g -fPIC -fvisibility=hidden -Wall -Wextra -D_GNU_SOURCE \
    -I . -c engines/common/engine_common.c -o "$tmp/engine_common.o" ||
   ! "$CXX" -std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra \
    -I tests/cuda_emu -I . -x c++ engines/cuda/*.cu tests/cuda_emu/emu.cpp \
    -x none "$tmp/engine_common.o" -o "$tmp/libengine_cuda_emu.so"; then
  echo "cuda_emu: FAIL: the CUDA engine does not compile against the emulator"
  exit 1
fi
ORCH_CUDA_ENGINE="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_cuda_engine"
