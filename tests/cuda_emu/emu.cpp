/*
 * emu.cpp - CPU implementation of the emulated CUDA runtime and cuBLAS subset
 * declared in tests/cuda_emu/cuda_runtime.h and cublas_v2.h (see there for the
 * model). Single-threaded: the engine contract has one thread per context, and
 * the test drives one context at a time.
 *
 * Environment:
 *   ORCH_CUDA_EMU_MEM   bytes of emulated device memory (default 2 GiB); an
 *                       allocation past it fails with cudaErrorMemoryAllocation
 *
 * For the suites, the library also exports orch_cuda_emu_gemm_calls(): the
 * number of cublasGemmEx calls with work (m, n > 0) so far, e.g. to count
 * the passes over the weights a call makes (tests/test_cuda_lora.c).
 */
#include "cuda_runtime.h"
#include "cublas_v2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

#include <map>
#include <vector>

/* ------------------------------------------------------------------------- */
/* Errors, device, memory                                                     */
/* ------------------------------------------------------------------------- */

static cudaError_t g_last = cudaSuccess;
static cudaError_t set_err(cudaError_t e) {
    if (e != cudaSuccess) g_last = e;
    return e;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unspecified launch failure";
    }
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorLaunchFailure";
    }
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

static size_t mem_limit(void) {
    static size_t lim = 0;
    if (!lim) {
        const char *e = getenv("ORCH_CUDA_EMU_MEM");
        lim = e && *e ? (size_t)strtoull(e, NULL, 10) : ((size_t)2 << 30);
    }
    return lim;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev != 0) return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulator (CPU)");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = mem_limit();
    p->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev) {
    if (dev != 0) return set_err(cudaErrorInvalidDevice);
    *v = a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 227 * 1024 : 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
    return dev == 0 ? cudaSuccess : set_err(cudaErrorInvalidDevice);
}

static std::map<uintptr_t, size_t> g_allocs; /* device allocations */
static size_t g_used = 0;

cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (bytes > mem_limit() || g_used > mem_limit() - bytes)
        return set_err(cudaErrorMemoryAllocation);
    void *m = malloc(bytes);
    if (!m) return set_err(cudaErrorMemoryAllocation);
    memset(m, 0xff, bytes); /* NaN: never-written device memory is visible */
    g_allocs[(uintptr_t)m] = bytes;
    g_used += bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) return set_err(cudaErrorInvalidValue);
    g_used -= it->second;
    g_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

/* True when [p, p+bytes) lies inside one device allocation. */
static bool in_device(const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    void *m = malloc(bytes ? bytes : 1);
    if (!m) return set_err(cudaErrorMemoryAllocation);
    memset(m, 0xff, bytes);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t) {
    if (bytes == 0) return cudaSuccess;
    bool dst_dev = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    bool src_dev = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !in_device(dst, bytes)) || (src_dev && !in_device(src, bytes))) {
        fprintf(stderr, "cuda emulator: cudaMemcpyAsync outside a device allocation\n");
        return set_err(cudaErrorInvalidValue);
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t) {
    if (bytes == 0) return cudaSuccess;
    if (!in_device(dst, bytes)) {
        fprintf(stderr, "cuda emulator: cudaMemsetAsync outside a device allocation\n");
        return set_err(cudaErrorInvalidValue);
    }
    memset(dst, value, bytes);
    return cudaSuccess;
}

struct emu_stream {
    int dummy;
};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
    *s = (cudaStream_t)calloc(1, sizeof(emu_stream));
    return *s ? cudaSuccess : set_err(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

/* ------------------------------------------------------------------------- */
/* Kernel launches: one fiber per thread, blocks in sequence                  */
/* ------------------------------------------------------------------------- */

/* Fibers are created once per launch (one per thread of a block, each on its
 * own stack via makecontext) and reused for every block: after the kernel
 * body returns, a fiber parks until the scheduler hands it the next block.
 * Switches use _setjmp/_longjmp (no signal-mask system calls); swapcontext
 * is used only to enter a fresh fiber the first time. */
enum { F_READY, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };

struct fiber {
    ucontext_t uc;
    jmp_buf env;
    int started;
    int state;
    unsigned int wait_gen;
    int lin; /* linear thread index in the block */
    emu_ids ids;
};

static ucontext_t g_sched_uc;
static jmp_buf g_sched_env;
static std::vector<fiber> g_fibers;
static char *g_stacks = NULL;
static size_t g_stack_count = 0;
static const size_t STACK_BYTES = 256 * 1024;
static fiber *g_cur = NULL;
static std::function<void()> *g_fn = NULL;
static int g_nthreads = 0, g_ndone = 0, g_barrived = 0;
static unsigned int g_bgen = 0;
static std::vector<unsigned int> g_wgen;
static std::vector<int> g_warrived, g_wdone, g_wsize;
static std::vector<double> g_slots;
static std::vector<unsigned char> g_smem;
static emu_ids g_host_ids; /* outside kernels */

emu_ids *emu_current_ids(void) { return g_cur ? &g_cur->ids : &g_host_ids; }

void *emu_dyn_smem(void) { return g_smem.data(); }

/* Back to the scheduler; returns when the scheduler resumes this fiber. */
static void yield_to_scheduler(void) {
    if (!_setjmp(g_cur->env)) _longjmp(g_sched_env, 1);
}

static void release_if_complete(int w) {
    if (g_barrived > 0 && g_barrived == g_nthreads - g_ndone) {
        g_bgen++;
        g_barrived = 0;
    }
    if (w >= 0 && g_warrived[w] > 0 && g_warrived[w] == g_wsize[w] - g_wdone[w]) {
        g_wgen[w]++;
        g_warrived[w] = 0;
    }
}

void __syncthreads(void) {
    fiber *f = g_cur;
    if (!f) return;
    f->wait_gen = g_bgen;
    f->state = F_WAIT_BLOCK;
    g_barrived++;
    release_if_complete(-1);
    yield_to_scheduler();
}

static void warp_barrier(void) {
    fiber *f = g_cur;
    int w = f->lin / 32;
    f->wait_gen = g_wgen[w];
    f->state = F_WAIT_WARP;
    g_warrived[w]++;
    release_if_complete(w);
    yield_to_scheduler();
}

static double shfl(double v, int m) {
    fiber *f = g_cur;
    if (!f) return v;
    int w = f->lin / 32, lane = f->lin % 32;
    g_slots[f->lin] = v;
    warp_barrier();
    int partner = lane ^ m;
    double r = partner < g_wsize[w] ? g_slots[w * 32 + partner] : v;
    warp_barrier();
    return r;
}

float emu_shfl_xor(float v, int m) { return (float)shfl(v, m); }
double emu_shfl_xor_d(double v, int m) { return shfl(v, m); }

static void fiber_main(void) {
    for (;;) {
        (*g_fn)();
        fiber *f = g_cur;
        f->state = F_DONE;
        g_ndone++;
        int w = f->lin / 32;
        g_wdone[w]++;
        release_if_complete(w);
        yield_to_scheduler(); /* parked until the next block */
    }
}

static bool runnable(const fiber *f) {
    switch (f->state) {
    case F_READY: return true;
    case F_WAIT_BLOCK: return f->wait_gen != g_bgen;
    case F_WAIT_WARP: return f->wait_gen != g_wgen[f->lin / 32];
    default: return false;
    }
}

static void resume(fiber *f) {
    g_cur = f;
    if (!_setjmp(g_sched_env)) {
        if (!f->started) {
            f->started = 1;
            swapcontext(&g_sched_uc, &f->uc);
        } else {
            _longjmp(f->env, 1);
        }
    }
    g_cur = NULL;
}

cudaError_t emu_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t,
                       std::function<void()> fn) {
    unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.y > 65535 || grid.z > 65535 || smem > 227 * 1024) {
        fprintf(stderr,
                "cuda emulator: bad launch configuration grid (%u,%u,%u) block "
                "(%u,%u,%u) smem %zu\n",
                grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        return set_err(cudaErrorInvalidConfiguration);
    }
    int nt = (int)nthreads;
    if (g_stack_count < (size_t)nt) {
        free(g_stacks);
        g_stacks = (char *)malloc((size_t)nt * STACK_BYTES);
        if (!g_stacks) {
            g_stack_count = 0;
            return set_err(cudaErrorMemoryAllocation);
        }
        g_stack_count = (size_t)nt;
    }
    g_fibers.assign((size_t)nt, fiber());
    int nw = (nt + 31) / 32;
    g_wgen.assign((size_t)nw, 0);
    g_warrived.assign((size_t)nw, 0);
    g_wdone.assign((size_t)nw, 0);
    g_wsize.assign((size_t)nw, 32);
    if (nt % 32) g_wsize[(size_t)nw - 1] = nt % 32;
    g_slots.assign((size_t)nt, 0.0);
    g_fn = &fn;
    for (int i = 0; i < nt; i++) {
        fiber *f = &g_fibers[(size_t)i];
        f->started = 0;
        f->lin = i;
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = g_stacks + (size_t)i * STACK_BYTES;
        f->uc.uc_stack.ss_size = STACK_BYTES;
        f->uc.uc_link = NULL; /* fiber_main never returns */
        makecontext(&f->uc, fiber_main, 0);
    }
    for (unsigned int bz = 0; bz < grid.z; bz++)
        for (unsigned int by = 0; by < grid.y; by++)
            for (unsigned int bx = 0; bx < grid.x; bx++) {
                g_smem.assign(smem ? smem : 1, 0xff);
                g_nthreads = nt;
                g_ndone = 0;
                g_barrived = 0;
                for (int w = 0; w < nw; w++) g_warrived[w] = g_wdone[w] = 0;
                for (int i = 0; i < nt; i++) {
                    fiber *f = &g_fibers[(size_t)i];
                    f->state = F_READY;
                    f->ids.tid.x = (unsigned int)i % block.x;
                    f->ids.tid.y = ((unsigned int)i / block.x) % block.y;
                    f->ids.tid.z = (unsigned int)i / (block.x * block.y);
                    f->ids.bid.x = bx;
                    f->ids.bid.y = by;
                    f->ids.bid.z = bz;
                    f->ids.bdim.x = block.x;
                    f->ids.bdim.y = block.y;
                    f->ids.bdim.z = block.z;
                    f->ids.gdim.x = grid.x;
                    f->ids.gdim.y = grid.y;
                    f->ids.gdim.z = grid.z;
                }
                for (;;) {
                    bool all_done = true, progress = false;
                    for (int i = 0; i < nt; i++) {
                        fiber *f = &g_fibers[(size_t)i];
                        if (f->state == F_DONE) continue;
                        all_done = false;
                        if (!runnable(f)) continue;
                        f->state = F_READY;
                        resume(f);
                        progress = true;
                    }
                    if (all_done) break;
                    if (!progress) {
                        fprintf(stderr,
                                "cuda emulator: deadlock (threads wait at "
                                "different barriers) in block (%u,%u,%u)\n",
                                bx, by, bz);
                        abort();
                    }
                }
            }
    g_fn = NULL;
    return cudaSuccess;
}

/* ------------------------------------------------------------------------- */
/* cuBLAS                                                                     */
/* ------------------------------------------------------------------------- */

struct emu_blas {
    int dummy;
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = (cublasHandle_t)calloc(1, sizeof(emu_blas));
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *ws, size_t bytes) {
    return in_device(ws, bytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    default: return "an internal operation failed";
    }
}

/* Round x to `bits` mantissa bits (round to nearest even), as the tensor
 * cores see fp32 inputs in TF32 (10) or BF16 (7) mode. */
static float round_mantissa(float x, int bits) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf/nan */
    int drop = 23 - bits;
    uint32_t half = 1u << (drop - 1);
    uint32_t lsb = (u >> drop) & 1u;
    u += half - 1 + lsb;
    u &= ~((1u << drop) - 1);
    memcpy(&x, &u, 4);
    return x;
}

/* The extent (elements) a column-major rows x cols matrix with leading
 * dimension ld touches. */
static size_t extent(int rows, int cols, int ld) {
    if (rows <= 0 || cols <= 0) return 0;
    return (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
}

static cublasStatus_t gemm_one(cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                               int k, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc,
                               int bits) {
    int arows = ta == CUBLAS_OP_N ? m : k, acols = ta == CUBLAS_OP_N ? k : m;
    int brows = tb == CUBLAS_OP_N ? k : n, bcols = tb == CUBLAS_OP_N ? n : k;
    if (!in_device(A, extent(arows, acols, lda) * 4) ||
        !in_device(B, extent(brows, bcols, ldb) * 4) ||
        !in_device(C, extent(m, n, ldc) * 4)) {
        fprintf(stderr,
                "cuda emulator: GEMM operand outside a device allocation "
                "(m %d n %d k %d lda %d ldb %d ldc %d)\n",
                m, n, k, lda, ldb, ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++) {
                float a =
                    ta == CUBLAS_OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda];
                float b =
                    tb == CUBLAS_OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb];
                if (bits) {
                    a = round_mantissa(a, bits);
                    b = round_mantissa(b, bits);
                }
                acc += a * b;
            }
            float *c = &C[i + (size_t)j * ldc];
            *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t check_args(cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                 int k, int lda, int ldb, int ldc, cudaDataType at,
                                 cudaDataType bt, cudaDataType ct) {
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

static int compute_bits(cublasComputeType_t c) {
    return c == CUBLAS_COMPUTE_32F_FAST_TF32   ? 10
           : c == CUBLAS_COMPUTE_32F_FAST_16BF ? 7
                                               : 0;
}

static unsigned long long g_gemm_calls = 0;

extern "C" __attribute__((visibility("default"))) unsigned long long
orch_cuda_emu_gemm_calls(void);
extern "C" __attribute__((visibility("default"))) unsigned long long
orch_cuda_emu_gemm_calls(void) {
    return g_gemm_calls;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t s = check_args(ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr,
                "cuda emulator: cublasGemmEx bad arguments (m %d n %d k %d lda %d "
                "ldb %d ldc %d)\n",
                m, n, k, lda, ldb, ldc);
        return s;
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    g_gemm_calls++;
    return gemm_one(ta, tb, m, n, k, *(const float *)alpha, (const float *)A, lda,
                    (const float *)B, ldb, *(const float *)beta, (float *)C, ldc,
                    compute_bits(compute));
}

cublasStatus_t
cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                           int m, int n, int k, const void *alpha, const void *A,
                           cudaDataType at, int lda, long long sA, const void *B,
                           cudaDataType bt, int ldb, long long sB, const void *beta,
                           void *C, cudaDataType ct, int ldc, long long sC, int batch,
                           cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t s = check_args(ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct);
    if (s != CUBLAS_STATUS_SUCCESS || batch < 0) {
        fprintf(stderr, "cuda emulator: cublasGemmStridedBatchedEx bad arguments\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int i = 0; i < batch; i++) {
        s = gemm_one(ta, tb, m, n, k, *(const float *)alpha, (const float *)A + i * sA,
                     lda, (const float *)B + i * sB, ldb, *(const float *)beta,
                     (float *)C + i * sC, ldc, compute_bits(compute));
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}
