/*
 * dnnl_gemm.h - the best bf16 matrix product of this process: oneDNN's
 * matmul (bf16 inputs, fp32 output) on the shape given, through the oneDNN
 * library an engine already loaded (dlopen RTLD_NOLOAD of libdnnl.so.2; the
 * orchestrator never loads it itself). This is the "best GEMM of the
 * precision" that `orch bench` divides by next to the physical peak.
 *
 * Threads: oneDNN runs on its OpenMP threads; the count is set to `threads`
 * through the omp_set_num_threads oneDNN's OpenMP exports. Call from one
 * thread at a time. Memory: buffers are allocated and freed inside.
 * Errors: returns 0.0 when oneDNN is not loaded in this process or any call
 * fails (callers print n/a); never aborts.
 */
#ifndef ORCH_DNNL_GEMM_H
#define ORCH_DNNL_GEMM_H

/* GFLOP/s of C[M,N] = A[M,K] * B[K,N] in bf16 (best of a few runs). */
double dnnl_gemm_bf16_gflops(int threads, int M, int N, int K);

#endif
