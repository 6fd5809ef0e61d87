/*
 * cpu_kernels.h - vector kernels of the CPU engine that plain C does not make
 * fast at -O2: the skinny (few-row) matrix product used by decoding, the
 * AdamW update, sums of squares, and the memory-bandwidth probes of the
 * benchmark. Each has an AVX-512, an AVX2+FMA and a portable C version,
 * chosen once at run time from the CPU's features (cpu_kernels_isa).
 *
 * Skinny products read weights from a packed copy: the rows of a row-major
 * [N, K] matrix W are grouped in panels of CPU_PANEL rows, each panel stored
 * k-major ([K][CPU_PANEL], zero-padded past N). A product of a few
 * activation rows (decoding, short prefill chunks) then streams every weight
 * once, contiguously, with broadcast FMAs and no horizontal sums: one row
 * runs at the read bandwidth of the machine, 16 rows near the FMA peak.
 * Measured on this machine: OpenBLAS sgemv reaches ~44% of the bandwidth,
 * and OpenBLAS sgemm (which packs W on every call, AVX2 kernel) reaches
 * about half this kernel's speed at 16-64 rows. Training and long prefills
 * stay on OpenBLAS.
 *
 * Threads: every function is reentrant; callers split work by panel or
 * element range. Memory: callers own all buffers. Errors: none (callers
 * validate sizes).
 */
#ifndef ORCH_CPU_KERNELS_H
#define ORCH_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "engines/common/engine_common.h"

#define CPU_PANEL 16
/* Activation rows one tile of the packed kernel handles at once. */
#define CPU_PACKED_TILE_ROWS 6

enum { CPU_ISA_GENERIC = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2 };

/* The best instruction set this CPU and OS support. Thread-safe. Every
 * kernel below takes the ISA to use (at most this one) as its first
 * argument, so an engine option can lower it (tests run all three). */
int cpu_kernels_isa(void);
const char *cpu_kernels_isa_name(int isa);

/* Floats of the packed copy of an [N, K] matrix. */
size_t cpu_packed_floats(size_t N, size_t K);
size_t cpu_panel_count(size_t N);

/* Pack panels [p0, p1) of the row-major [N, K] matrix w into wp. */
void cpu_pack_panels(size_t N, size_t K, const float *w, float *wp, size_t p0, size_t p1);

/* y[m, n] = (accumulate ? y[m, n] : 0) + bias[n] + sum_k x[m, k] W[n, k]
 * for m < M and the rows n of panels [p0, p1); wp is W packed; bias may be
 * NULL. The sum order per element depends only on K, so results do not
 * depend on M, the panel split or the thread count. */
void cpu_packed_matmul(int isa, int M, size_t N, size_t K, const float *x, size_t ldx,
                       const float *wp, const float *bias, float *y, size_t ldy,
                       int accumulate, size_t p0, size_t p1);

/* AdamW over n elements (see engine_adamw_consts); g is multiplied by
 * gscale (clipping) and the scaled value written back when gscale != 1. */
typedef engine_adamw_consts cpu_adamw_consts;
void cpu_adamw(int isa, float *p, float *g, float *m, float *v, size_t n,
               const cpu_adamw_consts *c);

/* Sum of squares of n floats, accumulated in double (fixed order). */
double cpu_sumsq(int isa, const float *a, size_t n);

/* Bandwidth probes: the sum of n floats (vectorised, read only) and
 * a[i] = b[i] + s*c[i]. */
float cpu_read_sum(int isa, const float *a, size_t n);
void cpu_triad(int isa, float *a, const float *b, const float *c, float s, size_t n);

/* GELU (tanh form) of n values: gelu[i] = 0.5 x (1 + tanh(u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). th (may be NULL) receives tanh(u);
 * gelu may alias x. */
void cpu_gelu(int isa, const float *x, float *th, float *gelu, size_t n);

/* d[i] *= GELU'(x[i]) given th[i] = tanh(u) from the forward. */
void cpu_gelu_backward(int isa, float *d, const float *x, const float *th, size_t n);

/* out[i] = a[i] + b[i] (b may be NULL: a copy). out may alias a. */
void cpu_add(int isa, const float *a, const float *b, float *out, size_t n);

/* LayerNorm of one row of n values: two passes (mean, then variance of
 * x - mean), out = (x - mean) * rstd * w + b; mean/rstd may be NULL. */
void cpu_layernorm(int isa, const float *x, float *out, const float *w, const float *b,
                   size_t n, float eps, float *mean, float *rstd);

/* LayerNorm backward of one row: dx += rstd * (dy*w - mean(dy*w)
 * - xhat * mean(dy*w*xhat)), xhat = (x - mean) * rstd. */
void cpu_layernorm_backward(int isa, const float *dy, const float *x, const float *w,
                            float mean, float rstd, float *dx, size_t n);

/* Softmax helpers over one row: the maximum; x[i] = exp(x[i] - shift)
 * returning the sum (fixed order); x[i] *= a. */
float cpu_max(int isa, const float *x, size_t n);
float cpu_exp_sum(int isa, float *x, float shift, size_t n);
void cpu_scale(int isa, float *x, float a, size_t n);

/* Attention of one query over n positions whose head vectors (hs floats)
 * are reached through pointers (KV blocks are not contiguous):
 * scores: out[p] = scale * dot(q, k[p]);  mix: out = sum_p w[p] * v[p]. */
void cpu_attn_scores(int isa, const float *q, const float *const *k, size_t n, size_t hs,
                     float scale, float *out);
void cpu_attn_mix(int isa, const float *w, const float *const *v, size_t n, size_t hs,
                  float *out);

/* Dot product of n floats (fixed order for a given n). */
float cpu_dot(int isa, const float *a, const float *b, size_t n);
/* y[i] += a * x[i]. */
void cpu_axpy(int isa, float a, const float *x, float *y, size_t n);

#endif
