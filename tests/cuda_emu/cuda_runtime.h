/*
 * cuda_runtime.h (emulated) - the subset of the CUDA runtime that the orch CUDA
 * engine uses, implemented on the CPU by tests/cuda_emu/emu.cpp, so the engine
 * source (the .cu files of engines/cuda, compiled as C++ with -I tests/cuda_emu) runs
 * without a GPU in `make test` (tests/cuda_emu.sh).
 *
 * Model: "device" memory is host memory from malloc, filled with NaN bytes on
 * allocation (so reads of never-written device memory show up as NaN); a
 * kernel launch runs every thread of every block to completion before it
 * returns, each thread on its own fiber (ucontext), blocks one after another.
 * __syncthreads() and warp shuffles are real barriers between those fibers.
 * __shared__ arrays become function statics, which is exact because the
 * blocks of a launch run one at a time. Streams are synchronous.
 *
 * This is a test fixture, not a CUDA implementation: only what the engine
 * calls exists, and device-side races are not detected (fibers switch only at
 * barriers).
 */
#ifndef ORCH_CUDA_EMU_RUNTIME_H
#define ORCH_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>

#define ORCH_CUDA_EMU  1
#define CUDART_VERSION 13000

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static

struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};

typedef struct emu_stream *cudaStream_t;

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorLaunchFailure = 719
};
typedef enum cudaError_t cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

#define cudaStreamNonBlocking 0x01u

enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
    int multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) {
    return cudaSuccess;
}

/* ---- device side ---- */
struct emu_uint3 {
    unsigned int x, y, z;
};
struct emu_ids {
    emu_uint3 tid, bid, bdim, gdim;
};
emu_ids *emu_current_ids(void);
#define threadIdx (emu_current_ids()->tid)
#define blockIdx  (emu_current_ids()->bid)
#define blockDim  (emu_current_ids()->bdim)
#define gridDim   (emu_current_ids()->gdim)

void __syncthreads(void);
float emu_shfl_xor(float v, int lane_mask);
double emu_shfl_xor_d(double v, int lane_mask);
static inline float __shfl_xor_sync(unsigned int, float v, int m) {
    return emu_shfl_xor(v, m);
}
static inline double __shfl_xor_sync(unsigned int, double v, int m) {
    return emu_shfl_xor_d(v, m);
}
void *emu_dyn_smem(void);

cudaError_t emu_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                       std::function<void()> fn);

#define KLAUNCH(kernel, grid, block, smem, stream, ...) \
    emu_launch(dim3(grid), dim3(block), (smem), (stream), [=]() { kernel(__VA_ARGS__); })
#define CU_DYN_SHARED(type, name) type *name = (type *)emu_dyn_smem()

#endif
