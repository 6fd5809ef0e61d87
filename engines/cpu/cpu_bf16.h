/*
 * cpu_bf16.h - bf16 matrix products for the CPU engine: oneDNN's matmul
 * (AMX-BF16 or AVX512_BF16 kernels, fp32 accumulation and fp32 output) behind
 * a small shape-keyed plan cache, and fp32 -> bf16 conversion kernels.
 *
 * oneDNN is not linked: cpu_bf16_load() dlopens libdnnl.so.2 (Debian
 * libdnnl2, the OpenMP build) on first use, so the engine loads and runs fp32
 * on a machine without it; a bf16 request there is a one-line error naming
 * the library. The module is compiled against <oneapi/dnnl/dnnl.h> when the
 * header is present (libdnnl-dev); without it cpu_bf16_load() says so.
 *
 * A plan is one oneDNN matmul primitive for one shape:
 *   C[M,N] (fp32, row stride ldc) = (accumulate ? C : 0) + A[M,K] * B[K,N]
 *                                   (+ bias[N]) (+ R[M,N], fp32, row stride ldr)
 * A is bf16 with the element strides given (so A can be a transposed view);
 * B is bf16 with strides, or "packed": a copy made once by cpu_bf16_pack()
 * from fp32 in the layout the primitive prefers (blocked for AMX).
 *
 * ISA: cpu_bf16_cap_isa() caps oneDNN below AMX (the AVX512_BF16 kernels).
 * oneDNN's cap is process-global and only takes effect before the first
 * primitive is created, so it is set once per process; the environment
 * variable ONEDNN_MAX_CPU_ISA (read by oneDNN itself) does the same.
 *
 * OpenMP: oneDNN brings libgomp; cpu_bf16_load sets OMP_WAIT_POLICY=PASSIVE
 * while it loads the library (unless the user set OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT), so OpenMP threads sleep between products instead of
 * spinning on the cores the engine's pool needs next. Like cpu_blas_load it
 * calls setenv/unsetenv once: call it before threads that read the
 * environment start (the engine does it in context_create).
 *
 * Threads: cpu_bf16_load/cap_isa are safe from any thread. A cache (and its
 * plans) is driven by one thread at a time; oneDNN runs each product with
 * the number of OpenMP threads the plan was made for, set on the calling
 * thread. The conversion kernels are reentrant.
 * Memory: a cache owns its plans (cpu_bf16_cache_destroy frees them); the
 * caller owns A, B, C, packed buffers and scratch.
 * Errors: functions return ORCH_OK or a status with a one-line message in
 * err (which may be NULL).
 */
#ifndef ORCH_CPU_BF16_H
#define ORCH_CPU_BF16_H

#include <stddef.h>
#include <stdint.h>

/* ISA caps of cpu_bf16_cap_isa (engine option bf16_isa=). */
enum { CPU_BF16_ISA_AMX = 0, CPU_BF16_ISA_AVX512 = 1 };

/* Load libdnnl.so.2 (once per process) and make its CPU engine. */
int32_t cpu_bf16_load(char *err, size_t err_cap);

/* Cap oneDNN at `which` (CPU_BF16_ISA_*). Process-global and only possible
 * before the first primitive: later calls asking for a different cap than
 * the one in force fail with ORCH_ERR_UNSUPPORTED. Loads oneDNN. */
int32_t cpu_bf16_cap_isa(int which, char *err, size_t err_cap);

/* What context_create does for precision=bf16: load oneDNN, then, with
 * which >= 0 (engine option bf16_isa=), check that the CPU has that ISA
 * (one-line error naming what it lacks) and cap oneDNN at it. */
int32_t cpu_bf16_setup(int which, char *err, size_t err_cap);

/* The ISA oneDNN dispatches to ("avx512_core_amx", "avx512_core_bf16", ...);
 * "not loaded" before cpu_bf16_load. */
const char *cpu_bf16_isa_name(void);

/* 1 when oneDNN's kernels here are AMX ones. */
int cpu_bf16_uses_amx(void);

/* fp32 -> bf16, round to nearest even (NaN stays NaN): scalar reference. */
static inline uint16_t cpu_bf16_round(float f) {
    union {
        float f;
        uint32_t u;
    } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float cpu_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = { (uint32_t)h << 16 };
    return v.f;
}

/* Conversion kernels: which one cpu_bf16_convert uses (vcvtne2ps2bf16 where
 * AVX512_BF16 is present, else integer rounding in AVX-512, else C). */
enum { CPU_BF16_CVT_C = 0, CPU_BF16_CVT_AVX512 = 1, CPU_BF16_CVT_AVX512BF16 = 2 };
int cpu_bf16_convert_best(void);
/* dst[i] = bf16(src[i]) for i < n with kernel `kernel` (at most
 * cpu_bf16_convert_best()); every kernel gives the same bits. */
void cpu_bf16_convert_with(int kernel, const float *src, uint16_t *dst, size_t n);
void cpu_bf16_convert(const float *src, uint16_t *dst, size_t n);

/* Shape of a plan. Strides are in elements. */
typedef struct cpu_bf16_shape {
    int M, N, K;
    long a_rs, a_cs; /* A[m,k] at A + m*a_rs + k*a_cs */
    long b_rs, b_cs; /* B[k,n] at B + k*b_rs + n*b_cs (plain B only) */
    int b_packed;    /* B is given packed (cpu_bf16_pack) */
    int ldc;         /* C[m,n] at C + m*ldc + n */
    int accumulate;  /* C += A*B (else C = A*B) */
    int bias;        /* + bias[n] (fp32) */
    int ldr;         /* > 0: + R[m*ldr + n] (fp32; R may not alias C) */
    int threads;     /* OpenMP threads of the product (>= 1) */
} cpu_bf16_shape;

typedef struct cpu_bf16_cache cpu_bf16_cache;
typedef struct cpu_bf16_plan cpu_bf16_plan;

/* A cache of plans (NULL when out of memory or oneDNN is not loaded). */
cpu_bf16_cache *cpu_bf16_cache_create(void);
/* Frees the cache and every plan; NULL is a no-op. */
void cpu_bf16_cache_destroy(cpu_bf16_cache *c);
/* Number of plans in the cache. */
size_t cpu_bf16_cache_size(const cpu_bf16_cache *c);

/* The plan of shape s, made on first use (the pointer stays valid until the
 * cache is destroyed). NULL with a message on failure. */
cpu_bf16_plan *cpu_bf16_plan_get(cpu_bf16_cache *c, const cpu_bf16_shape *s, char *err,
                                 size_t err_cap);
/* Bytes of B packed for plan p (0 for a plan with plain B). */
size_t cpu_bf16_packed_bytes(const cpu_bf16_plan *p);
/* 1 if B packed for plan a is valid for plan b too (same layout). */
int cpu_bf16_packed_compatible(const cpu_bf16_plan *a, const cpu_bf16_plan *b);
/* Bytes of scratch memory cpu_bf16_run needs for p. */
size_t cpu_bf16_scratch_bytes(const cpu_bf16_plan *p);

/* Pack the fp32 B[k,n] = B[k*b_rs + n*b_cs] into dst (packed_bytes(p)
 * bytes, 64-byte aligned) for plan p, rounding to bf16 (nearest even), on
 * p's thread count. */
int32_t cpu_bf16_pack(cpu_bf16_cache *c, const cpu_bf16_plan *p, const float *B,
                      long b_rs, long b_cs, void *dst, char *err, size_t err_cap);

/* Run plan p: A and B (plain bf16 or packed) as its shape says, C fp32;
 * bias and R as the shape says (else NULL); scratch:
 * cpu_bf16_scratch_bytes(p) bytes (NULL when 0). */
typedef struct cpu_bf16_args {
    const uint16_t *A;
    const void *B;
    float *C;
    const float *bias, *R;
    void *scratch;
} cpu_bf16_args;
int32_t cpu_bf16_run(cpu_bf16_cache *c, const cpu_bf16_plan *p, const cpu_bf16_args *a,
                     char *err, size_t err_cap);

#endif
