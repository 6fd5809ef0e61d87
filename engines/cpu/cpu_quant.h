/*
 * cpu_quant.h - weight-only int8 for inference on the CPU engine (engine
 * option weights=int8), in the manner of llama.cpp's Q8_0: every weight row
 * of K elements is cut into blocks of CPU_Q8_BLOCK = 32 consecutive elements
 * along K, each with one fp32 scale s = max|w| / 127 and values
 * q = round(w / s) in [-127, 127] (symmetric, no zero point).
 *
 * What it holds:
 *   - quantize / dequantize of a block and the in-place rounding of a weight
 *     matrix through the int8 grid (tensor_write stores those values in
 *     ctx->params, so training-style paths and tensor_read see exactly the
 *     weights the int8 kernels use). Rounding is idempotent: rounding values
 *     already on the grid returns them unchanged, bit for bit;
 *   - the packed int8 copy the few-row products read: the rows of a [N, K]
 *     matrix in panels of CPU_PANEL (16) rows; per panel and K block, 16 fp32
 *     scales (64 bytes) then 8 groups of 4 k: each group is 16 lanes (rows) x
 *     4 int8 (k..k+3), 64 bytes, one zmm register (two ymm), the operand
 *     layout of vpdpbusd. 576 bytes per 512 weights: 1.125 bytes a weight
 *     (fp32: 4);
 *   - the few-row product y[m, n] = bias[n] + sum_k x[m, k] W[n, k]: the
 *     activation rows are quantized to int8 per 32-block too (Q8_0 x Q8_0),
 *     integer dot products per block (exact), then y += isum * (sx * sw) in
 *     fp32 with one fused multiply-add per block in k order. Every kernel
 *     (AMX-INT8, AVX512-VNNI, AVX-VNNI, AVX2, portable C) computes the same
 *     integers and the same fp32 operations in the same order, so all give
 *     bit-identical results, independent of M, the panel split and the
 *     thread count. Activations are rounded to int8 as well, so the result
 *     differs from an fp32 product with the dequantized weights by at most
 *     sum_k |w| sx/2 (sx: the activation block's scale);
 *   - the engine glue: the lazily built packed copy of every weight matrix
 *     (rebuilt when ctx->params_version changes) and the threaded linear
 *     layer cpu_infer.c and cpu_llama_infer.c call for products of at most
 *     ctx->skinny_max rows.
 *
 * Threads: the kernels are reentrant (callers split by panel range); the
 * ctx functions follow the context rule (one caller thread, work on the
 * context's pool). Memory: callers own buffers passed in; the packed copy and
 * activation scratch belong to ctx and are freed by cpu_q8_free. Errors:
 * kernels have none (callers validate sizes); ctx functions return ORCH_*
 * with the message recorded on ctx.
 */
#ifndef ORCH_CPU_QUANT_H
#define ORCH_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define CPU_Q8_BLOCK 32
/* Bytes of one (panel, K block) of the packed copy: 16 scales + 16x32 int8. */
#define CPU_Q8_PANEL_BLOCK_BYTES (16 * 4 + 16 * CPU_Q8_BLOCK)

/* Kernel versions (engine option int8_kernel=). */
#ifndef CPU_Q8_AMX_MIN_ROWS
#define CPU_Q8_AMX_MIN_ROWS 4
#endif
enum {
    CPU_Q8_GENERIC = 0,
    CPU_Q8_AVX2 = 1,       /* vpmaddubsw + vpmaddwd on ymm */
    CPU_Q8_AVXVNNI = 2,    /* vpdpbusd on ymm (AVX-VNNI) */
    CPU_Q8_AVX512VNNI = 3, /* vpdpbusd on zmm (AVX512_VNNI) */
    CPU_Q8_AMX = 4,        /* tdpbssd (AMX-INT8) from CPU_Q8_AMX_MIN_ROWS rows,
                              else as CPU_Q8_AVX512VNNI */
    CPU_Q8_KERNELS
};
const char *cpu_q8_kernel_name(int kernel);

/* The kernel to use under the vector ISA cap `isa` (CPU_ISA_*): `want` is
 * -1 (best available) or a CPU_Q8_*; a kernel this CPU or the cap lacks is
 * refused: returns -1 with one line in why ("int8_kernel=avx512vnni: ..."). */
int cpu_q8_select(int isa, int want, char *why, size_t why_cap);

/* ---- quantization ---- */

/* Quantize n <= 32 values: q[i] = round(w[i] / s), returns s (0 for an all
 * zero block; q then 0). */
float cpu_q8_quantize_block(const float *w, size_t n, int8_t *q);

/* Round every row of the row-major [N, K] matrix w in place through the
 * grid: w = s * round(w / s) per 32-block of each row. */
void cpu_q8_round_rows(float *w, size_t N, size_t K);

/* ---- packed copy ---- */
size_t cpu_q8_blocks(size_t K); /* ceil(K / 32) */
size_t cpu_q8_packed_bytes(size_t N, size_t K);
/* Quantize and pack panels [p0, p1) of the row-major [N, K] matrix w into wp
 * (rows past N and k past K are zero). */
void cpu_q8_pack_panels(size_t N, size_t K, const float *w, uint8_t *wp, size_t p0,
                        size_t p1);

/* ---- activations ---- */
/* Bytes of M quantized activation rows of K values. */
size_t cpu_q8_act_bytes(size_t M, size_t K);
/* Quantize M rows of x (row stride ldx) for `kernel` into xq. */
void cpu_q8_quantize_act(int kernel, size_t M, size_t K, const float *x, size_t ldx,
                         uint8_t *xq);

/* y[m, n] = (accumulate ? y[m, n] : 0) + bias[n] + sum_k x[m, k] W[n, k] for
 * m < M and the rows n of panels [p0, p1); xq from cpu_q8_quantize_act with
 * the same kernel, wp from cpu_q8_pack_panels; bias may be NULL. */
void cpu_q8_matmul(int kernel, int M, size_t N, size_t K, const uint8_t *xq,
                   const uint8_t *wp, const float *bias, float *y, size_t ldy,
                   int accumulate, size_t p0, size_t p1);

/* ---- engine glue (ctx: orch_engine_ctx of cpu_internal.h) ---- */
struct orch_engine_ctx;
struct cpu_linear_fwd;

/* Whether table entry `index` is a weight matrix stored as int8 (wte, qkv,
 * attn proj, fc, mlp proj; not wpe, biases, LayerNorm; llama: every 2-D
 * tensor). */
int cpu_q8_is_quantized(const struct orch_engine_ctx *ctx, uint32_t index);
/* With weights=int8: round tensor `index` in ctx->params through the grid
 * (no-op for other tensors or weights=fp32). */
void cpu_q8_round_tensor(struct orch_engine_ctx *ctx, uint32_t index);
/* Round every weight matrix (context creation's random init). */
void cpu_q8_round_all(struct orch_engine_ctx *ctx);
/* Build the packed int8 copy if ctx->params changed since the last build,
 * and activation scratch for products of up to `rows` rows. */
int32_t cpu_q8_ensure(struct orch_engine_ctx *ctx, size_t rows);
/* op (as cpu_linear_forward: bias, residual, GELU; op->packed and op->W
 * ignored) on the packed int8 matrix wq, across ctx's pool; op->R at most
 * the rows of the last cpu_q8_ensure. */
void cpu_q8_linear(struct orch_engine_ctx *ctx, const struct cpu_linear_fwd *op,
                   const uint8_t *wq);
void cpu_q8_free(struct orch_engine_ctx *ctx);

#endif
