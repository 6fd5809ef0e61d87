/*
 * bench.h - the benchmarks behind `orch bench train|infer`: training step
 * speed and inference (prefill, batched decode) speed of an engine, and the
 * machine limits they are judged against, measured in the same process:
 * OpenBLAS sgemm GFLOP/s (for model FLOPs utilisation) and memory bandwidth
 * (for the decode bound).
 *
 * Model FLOPs per training token (forward + backward):
 *     6 * N + 12 * layers * seq_len * width
 * with N = every parameter except the position embedding (the LM head is
 * counted through the tied wte). MFU = model FLOP/s / sgemm peak, the peak
 * being the best of single-threaded OpenBLAS sgemm run on every thread on
 * static column slices (how the CPU engine runs its products) over the
 * model's own training shapes ([B*T, out, in] of c_attn, c_fc, mlp.c_proj
 * and the LM head).
 *
 * Memory bandwidth is the better of a vectorised read-only sum and a STREAM
 * triad (a = b + s*c) over buffers of 128 MiB each, on all benchmark
 * threads, measured right before and right after the single-sequence decode
 * (the better of the two counts: on a shared machine it varies). Decode reads every weight once per step, so
 *     decode_bw_fraction = weight bytes * single-sequence steps/s / bandwidth
 * with weight bytes = 4 * (N + width) (one position-embedding row).
 *
 * Times: each training step and each decode step is timed on its own and the
 * MEDIAN is reported (robust to other processes on a shared machine);
 * tokens/s derive from it.
 *
 * Threads: these functions run one benchmark at a time on the calling thread
 * (plus helper threads they join). Memory: results are plain structs.
 * Errors: 0, or -1 with one line in err (engine failures included).
 */
#ifndef ORCH_BENCH_H
#define ORCH_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/bench/machine_peak.h"
#include "orchestrator/core/engine_loader.h"

typedef struct bench_train_opts {
    uint32_t batch, seq_len;
    uint32_t steps;   /* timed steps */
    uint32_t warmup;  /* untimed steps first */
    uint32_t threads; /* engine threads; 0 = all cores */
    uint64_t seed;
    const char *options;   /* engine options string, may be NULL */
    const char *precision; /* "fp32" or "bf16": the path the options ask for
                              (selects the peak and the best GEMM); NULL = fp32 */
} bench_train_opts;

typedef struct bench_train_result {
    uint32_t batch, seq_len, steps, threads;
    uint64_t params, params_no_wpe;
    double flops_per_token;
    double ms_per_step; /* median */
    double ms_per_step_mean;
    double tokens_per_s; /* batch*seq_len / median step */
    double model_gflops_per_s;
    double sgemm_peak_gflops_per_s; /* 0 when OpenBLAS is not in the process */
    double mfu;                     /* vs sgemm_peak (fp32) or the bf16 GEMM; 0 unknown */
    float first_loss, last_loss;
    /* The honest denominators (see machine_peak.h). */
    char precision[8];             /* "fp32" or "bf16" */
    machine_peak peak;             /* cores, measured clock, per-precision peaks */
    double physical_peak_gflops;   /* peak of the precision's best ISA; 0 unknown */
    double mfu_physical;           /* model FLOP/s / physical_peak_gflops */
    double best_gemm_gflops_per_s; /* best GEMM of the precision in this process */
    const char *best_gemm;         /* "OpenBLAS sgemm" or "oneDNN bf16 matmul" */
    double peak_rss_mb;            /* process peak RSS after the run (MiB) */
} bench_train_result;

int bench_train(const engine_handle *h, const orch_model_desc *model,
                const bench_train_opts *o, bench_train_result *r, char *err,
                size_t err_cap);

typedef struct bench_infer_opts {
    uint32_t prompt_len;    /* prefill benchmark prompt (512) */
    uint32_t decode_prompt; /* prompt of each decoding sequence (32) */
    uint32_t decode_steps;  /* timed decode steps (64) */
    uint32_t block_size;    /* KV block size (16) */
    uint32_t threads;
    uint64_t seed;
    const char *options;
    const char *weights; /* "fp32" or "int8": the weight format the options ask
                            for (bytes per token of the decode bound); NULL = fp32 */
} bench_infer_opts;

#define BENCH_DECODE_BATCHES 3
extern const uint32_t bench_decode_batches[BENCH_DECODE_BATCHES]; /* 1 4 16 */

typedef struct bench_infer_result {
    uint32_t prompt_len, decode_prompt, decode_steps, threads;
    double prefill_tokens_per_s;
    double decode_tokens_per_s[BENCH_DECODE_BATCHES];
    double read_gb_per_s, triad_gb_per_s, mem_bw_gb_per_s;
    double weight_bytes; /* read per decode step in the weight format */
    double decode_bw_fraction;
    char weights[8]; /* "fp32" or "int8" */
} bench_infer_result;

/* Bytes one weight of the matrices takes in the int8 format (Q8_0-like:
 * 32 int8 values and one fp32 scale per block). */
#define BENCH_INT8_BYTES_PER_WEIGHT (1.0 + 4.0 / 32.0)

int bench_infer(const engine_handle *h, const orch_model_desc *model,
                const bench_infer_opts *o, bench_infer_result *r, char *err,
                size_t err_cap);

/* Best GFLOP/s of OpenBLAS sgemm C[M,N] = A[M,K] * B[N,K]^T split by columns
 * over `threads` threads (each calling single-threaded sgemm), found through
 * dlopen of the OpenBLAS the engine loaded; 0 if OpenBLAS is unavailable. */
double bench_sgemm_gflops(int threads, int M, int N, int K);

/* Read-only sum and STREAM triad bandwidth in GB/s on `threads` threads.
 * Returns 0, or -1 with err when the buffers cannot be allocated. */
int bench_mem_bw(int threads, double *read_gbs, double *triad_gbs, char *err,
                 size_t err_cap);

/* Model FLOPs per training token (6 x the matrix parameters + attention) and
 * parameter counts: *params every parameter, *params_no_wpe those a decode
 * step reads (GPT-2: all but the position table; LLaMA: all but the
 * embedding when the head is untied). gpt2 and llama shapes. */
double bench_train_flops_per_token(const orch_model_desc *m, uint32_t seq_len,
                                   uint64_t *params, uint64_t *params_no_wpe);

#endif
