/*
 * cpu_blas.h - the CPU engine's OpenBLAS, loaded at run time so the engine
 * decides which kernels it runs. OpenBLAS picks its kernels from a table of
 * CPU model numbers when it is loaded; on a CPU the table does not know (a
 * new Xeon, a VM that reports a generic model) Debian's 0.3.21 falls back to
 * SSE3 "Prescott" kernels, 4-5x slower than the AVX-512 ones on the same
 * machine. So the engine does not link OpenBLAS: cpu_blas_load() sets
 * OPENBLAS_CORETYPE from the cpuid features (SkylakeX where AVX-512F/BW/VL/DQ
 * are present, Haswell or Zen with AVX2+FMA) unless the user set it, dlopens
 * libopenblas.so.0, restores the environment, and keeps OpenBLAS
 * single-threaded (the engine's pool does the threading).
 *
 * Threads: cpu_blas_load is safe from any thread (pthread_once); it calls
 * setenv/unsetenv once, so call it before the process starts threads that
 * read the environment (the engine does it in context_create). The sgemm is
 * reentrant. Errors: cpu_blas_load returns ORCH_OK or ORCH_ERR_INTERNAL with
 * a message in err (libopenblas.so.0 missing or without cblas_sgemm).
 */
#ifndef ORCH_CPU_BLAS_H
#define ORCH_CPU_BLAS_H

#include <stddef.h>
#include <stdint.h>

int32_t cpu_blas_load(char *err, size_t err_cap);

/* C = alpha*op(A)*op(B) + beta*C, row-major, single-threaded. Only after a
 * successful cpu_blas_load. */
void cpu_blas_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc);

/* After cpu_blas_load: the kernel OpenBLAS runs ("SkylakeX"), the core type
 * the engine asked for ("" when it asked for none), and how it was chosen
 * ("chosen from cpuid", "set by the user", "fixed by an earlier load", "OpenBLAS's
 * own detection"). Static strings. */
const char *cpu_blas_kernel(void);
const char *cpu_blas_requested(void);
const char *cpu_blas_choice(void);

/* The OPENBLAS_CORETYPE the engine would choose on this CPU ("" = none). */
const char *cpu_blas_coretype_for_cpu(void);

#endif
