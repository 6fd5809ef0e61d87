/*
 * cpu_linear.c - the CPU engine's threaded matrix products: the forward and
 * backward of a linear layer (bias, residual and GELU fused in), on OpenBLAS
 * sgemm, for a few rows on the packed skinny kernel, or with precision=bf16
 * on oneDNN's bf16 matmul (cpu_bf16.c).
 *
 * Threading: OpenBLAS runs single-threaded; the output is cut into chunks
 * (columns of the forward and of dX, rows of dW) that pool threads take one
 * at a time and compute with their own sgemm call. No two chunks touch the
 * same output element and the cut depends only on the shapes and the thread
 * count, so results are bit-identical run to run. The bf16 products are
 * one oneDNN call each on its OpenMP threads (see the bf16 section).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_bf16.h"
#include "engines/cpu/cpu_blas.h"
#include "engines/cpu/cpu_internal.h"

void cpu_sgemm1(int trans_a, int trans_b, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C,
                int ldc) {
    cpu_blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* GELU, tanh form, as torch.nn.functional.gelu(approximate='tanh'). */
/* Columns [c0, c1) of rows [0, R): GELU of out. */
static void gelu_cols(int isa, const cpu_linear_fwd *op, size_t c0, size_t c1) {
    for (int r = 0; r < op->R; r++) {
        float *o = op->out + (size_t)r * (size_t)op->ldout;
        if (op->gelu_inplace) {
            cpu_gelu(isa, o + c0, NULL, o + c0, c1 - c0);
        } else {
            float *t = op->gelu_tanh + (size_t)r * (size_t)op->N;
            float *g = op->gelu_out + (size_t)r * (size_t)op->N;
            cpu_gelu(isa, o + c0, t + c0, g + c0, c1 - c0);
        }
    }
}

/* Chunks per thread for the sgemm paths. Every chunk re-packs the shared
 * operand inside OpenBLAS, so one chunk per thread is fastest here (2 per
 * thread measured 2-3% slower on an idle machine and no faster with a
 * competing process). Packed products have no such cost: more chunks than
 * threads let a running thread take over from one the OS has descheduled,
 * which matters for decoding on a shared machine. */
#define SGEMM_CHUNKS_PER_THREAD  1
#define SGEMM_MIN_COLS           64
#define PACKED_CHUNKS_PER_THREAD 8
#define PACKED_MIN_PANELS        8
/* With more rows than one tile holds, the kernel prefetches the next panel
 * group while computing; long chunks keep that pipeline full. */
#define PACKED_WIDE_CHUNKS_PER_THREAD 2
#define PACKED_WIDE_MIN_PANELS        32

typedef struct linfwd_job {
    orch_engine_ctx *ctx;
    const cpu_linear_fwd *op;
    int packed;
    size_t chunks;
} linfwd_job;

static void linfwd_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const linfwd_job *j = arg;
    const cpu_linear_fwd *op = j->op;
    const int has_gelu = op->gelu_inplace || op->gelu_out;
    size_t c0, c1;
    if (j->packed) {
        size_t p0, p1, np = cpu_panel_count((size_t)op->N);
        cpu_pool_range(np, (int)chunk, (int)j->chunks, 4, &p0, &p1);
        if (p0 >= p1) return;
        c0 = p0 * CPU_PANEL;
        c1 = p1 * CPU_PANEL < (size_t)op->N ? p1 * CPU_PANEL : (size_t)op->N;
        int acc = 0;
        if (op->resid) {
            if (op->resid != op->out)
                for (int r = 0; r < op->R; r++)
                    memcpy(op->out + (size_t)r * op->ldout + c0,
                           op->resid + (size_t)r * op->ldresid + c0,
                           (c1 - c0) * sizeof(float));
            acc = 1;
        }
        cpu_packed_matmul(j->ctx->isa, op->R, (size_t)op->N, (size_t)op->K, op->in,
                          (size_t)op->ldin, op->packed, op->bias, op->out,
                          (size_t)op->ldout, acc, p0, p1);
    } else {
        cpu_pool_range((size_t)op->N, (int)chunk, (int)j->chunks, 16, &c0, &c1);
        if (c0 >= c1) return;
        float beta = 0.0f;
        if (op->bias || op->resid) {
            for (int r = 0; r < op->R; r++) {
                float *o = op->out + (size_t)r * op->ldout + c0;
                if (op->resid)
                    cpu_add(j->ctx->isa, op->resid + (size_t)r * op->ldresid + c0,
                            op->bias ? op->bias + c0 : NULL, o, c1 - c0);
                else
                    memcpy(o, op->bias + c0, (c1 - c0) * sizeof(float));
            }
            beta = 1.0f;
        }
        cpu_sgemm1(0, 1, op->R, (int)(c1 - c0), op->K, 1.0f, op->in, op->ldin,
                   op->W + c0 * (size_t)op->K, op->K, beta, op->out + c0, op->ldout);
    }
    if (has_gelu) gelu_cols(j->ctx->isa, op, c0, c1);
}

static int bf16_forward(orch_engine_ctx *ctx, const cpu_linear_fwd *op);
static int bf16_backward(orch_engine_ctx *ctx, const cpu_linear_bwd *op);

void cpu_linear_forward(orch_engine_ctx *ctx, const cpu_linear_fwd *op) {
    /* coserve_forward: the product may be shared with the other pass. */
    if (ctx->coserve && cpu_coserve_linear(ctx, op)) return;
    cpu_linear_forward_solo(ctx, op);
}

void cpu_linear_forward_solo(orch_engine_ctx *ctx, const cpu_linear_fwd *op) {
    if (ctx->precision == CPU_PREC_BF16 &&
        !(op->packed != NULL && (uint32_t)op->R <= ctx->skinny_max) &&
        bf16_forward(ctx, op))
        return;
    linfwd_job j = { ctx, op, op->packed != NULL && (uint32_t)op->R <= ctx->skinny_max,
                     1 };
    if (!j.packed)
        j.chunks = cpu_pool_chunks(ctx->pool, (size_t)op->N, SGEMM_MIN_COLS,
                                   SGEMM_CHUNKS_PER_THREAD);
    else if (op->R > CPU_PACKED_TILE_ROWS)
        j.chunks = cpu_pool_chunks(ctx->pool, cpu_panel_count((size_t)op->N),
                                   PACKED_WIDE_MIN_PANELS, PACKED_WIDE_CHUNKS_PER_THREAD);
    else
        j.chunks = cpu_pool_chunks(ctx->pool, cpu_panel_count((size_t)op->N),
                                   PACKED_MIN_PANELS, PACKED_CHUNKS_PER_THREAD);
    cpu_pool_for(ctx->pool, j.chunks, linfwd_chunk, &j);
}

/* Two products of the same weight (coserve_forward): each pool chunk takes a
 * range of output columns and walks it in blocks of PAIR_BLOCK_BYTES of W
 * (half of the 2 MB L2 per core), running a's rows and then b's rows on the
 * block while it is in the core's cache. A part of at most skinny_max rows
 * runs on the packed kernel when a packed copy of W exists (the decoding
 * rows; also the fine-tuning rows when they are that few, so both read the
 * one packed copy), a larger part on sgemm against W (then the weights are
 * read from two copies, each by the kernel that is fastest for its rows, so
 * the two products simply run one after the other: measured here, sgemm on
 * 16 decoding rows and short sgemm blocks of the large part cost more than
 * the second read).
 * Bias, residual and GELU of each op as cpu_linear_forward does them. */
#define PAIR_BLOCK_BYTES ((size_t)1 << 20)

typedef struct pair_job {
    orch_engine_ctx *ctx;
    const cpu_linear_fwd *op[2];
    const float *packed; /* the packed copy of W, if either op has it */
    size_t chunks, block_cols;
} pair_job;

static void pair_part(const orch_engine_ctx *ctx, const cpu_linear_fwd *op,
                      const float *packed, size_t c0, size_t c1) {
    const int isa = ctx->isa;
    float beta = 0.0f;
    if (op->R == 0) return;
    if (packed && (uint32_t)op->R <= ctx->skinny_max) { /* few rows: packed kernel */
        int acc = 0;
        if (op->resid) {
            if (op->resid != op->out)
                for (int r = 0; r < op->R; r++)
                    memcpy(op->out + (size_t)r * op->ldout + c0,
                           op->resid + (size_t)r * op->ldresid + c0,
                           (c1 - c0) * sizeof(float));
            acc = 1;
        }
        cpu_packed_matmul(isa, op->R, (size_t)op->N, (size_t)op->K, op->in,
                          (size_t)op->ldin, packed, op->bias, op->out, (size_t)op->ldout,
                          acc, c0 / CPU_PANEL, (c1 + CPU_PANEL - 1) / CPU_PANEL);
        if (op->gelu_inplace || op->gelu_out) gelu_cols(isa, op, c0, c1);
        return;
    }
    if (op->bias || op->resid) {
        for (int r = 0; r < op->R; r++) {
            float *o = op->out + (size_t)r * op->ldout + c0;
            if (op->resid)
                cpu_add(isa, op->resid + (size_t)r * op->ldresid + c0,
                        op->bias ? op->bias + c0 : NULL, o, c1 - c0);
            else
                memcpy(o, op->bias + c0, (c1 - c0) * sizeof(float));
        }
        beta = 1.0f;
    }
    cpu_sgemm1(0, 1, op->R, (int)(c1 - c0), op->K, 1.0f, op->in, op->ldin,
               op->W + c0 * (size_t)op->K, op->K, beta, op->out + c0, op->ldout);
    if (op->gelu_inplace || op->gelu_out) gelu_cols(isa, op, c0, c1);
}

static void pair_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const pair_job *j = arg;
    const size_t N = (size_t)j->op[0]->N;
    size_t c0, c1;
    cpu_pool_range(N, (int)chunk, (int)j->chunks, 16, &c0, &c1);
    for (size_t a = c0; a < c1; a += j->block_cols) {
        const size_t b = a + j->block_cols < c1 ? a + j->block_cols : c1;
        pair_part(j->ctx, j->op[0], j->packed, a, b);
        pair_part(j->ctx, j->op[1], j->packed, a, b);
    }
}

int cpu_linear_forward_pair_ok(const cpu_linear_fwd *a, const cpu_linear_fwd *b) {
    return a->W == b->W && a->N == b->N && a->K == b->K && a->bias == b->bias;
}

void cpu_linear_forward_pair(orch_engine_ctx *ctx, const cpu_linear_fwd *a,
                             const cpu_linear_fwd *b) {
    /* Parts that would read different copies of W (the packed one for few
     * rows, W itself for sgemm) share nothing: each runs as it would alone. */
    const float *pk = a->packed ? a->packed : b->packed;
    const int pa = pk && (uint32_t)a->R <= ctx->skinny_max;
    const int pb = pk && (uint32_t)b->R <= ctx->skinny_max;
    if (ctx->precision == CPU_PREC_BF16 || pa != pb) { /* one after the other */
        cpu_linear_forward_solo(ctx, a);
        cpu_linear_forward_solo(ctx, b);
        return;
    }
    pair_job j = { ctx, { a, b }, a->packed ? a->packed : b->packed, 1, 16 };
    size_t cols = PAIR_BLOCK_BYTES / ((size_t)a->K * sizeof(float));
    cols = cols < 16 ? 16 : cols / 16 * 16;
    j.block_cols = cols;
    j.chunks =
        cpu_pool_chunks(ctx->pool, (size_t)a->N, SGEMM_MIN_COLS, SGEMM_CHUNKS_PER_THREAD);
    cpu_pool_for(ctx->pool, j.chunks, pair_chunk, &j);
}

typedef struct linbwd_job {
    const cpu_linear_bwd *op;
    int isa;
    size_t kx, kw; /* chunks of dX columns, then of dW rows */
} linbwd_job;

static void linbwd_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const linbwd_job *j = arg;
    const cpu_linear_bwd *op = j->op;
    const int isa = j->isa;
    const int R = op->R, N = op->N, K = op->K;
    size_t a, b;
    if (chunk < j->kx) { /* dX columns [a, b) */
        cpu_pool_range((size_t)K, (int)chunk, (int)j->kx, 16, &a, &b);
        if (a >= b) return;
        cpu_sgemm1(0, 0, R, (int)(b - a), N, 1.0f, op->dout, op->lddout, op->W + a, K,
                   op->din_accumulate ? 1.0f : 0.0f, op->din + a, op->lddin);
        if (op->gelu_x)
            for (int r = 0; r < R; r++)
                cpu_gelu_backward(isa, op->din + (size_t)r * op->lddin + a,
                                  op->gelu_x + (size_t)r * K + a,
                                  op->gelu_tanh + (size_t)r * K + a, b - a);
        return;
    }
    /* dW rows [a, b) and their bias. */
    cpu_pool_range((size_t)N, (int)(chunk - j->kx), (int)j->kw, 16, &a, &b);
    if (a >= b) return;
    cpu_sgemm1(1, 0, (int)(b - a), K, R, 1.0f, op->dout + a, op->lddout, op->in, op->ldin,
               1.0f, op->dW + a * (size_t)K, K);
    if (op->dbias)
        for (int r = 0; r < R; r++)
            cpu_add(isa, op->dbias + a, op->dout + (size_t)r * op->lddout + a,
                    op->dbias + a, b - a);
}

void cpu_linear_backward(orch_engine_ctx *ctx, const cpu_linear_bwd *op) {
    if (ctx->precision == CPU_PREC_BF16 && bf16_backward(ctx, op)) return;
    linbwd_job j = { op, ctx->isa, 0, 0 };
    if (op->din)
        j.kx = cpu_pool_chunks(ctx->pool, (size_t)op->K, SGEMM_MIN_COLS,
                               SGEMM_CHUNKS_PER_THREAD);
    if (op->dW)
        j.kw = cpu_pool_chunks(ctx->pool, (size_t)op->N, SGEMM_MIN_COLS,
                               SGEMM_CHUNKS_PER_THREAD);
    cpu_pool_for(ctx->pool, j.kx + j.kw, linbwd_chunk, &j);
}

/* ------------------------------------------------------------------------- */
/* precision=bf16: oneDNN bf16 x bf16 -> fp32                                 */
/* ------------------------------------------------------------------------- */

/* What runs in bf16: the forward of every product that does not take the
 * packed skinny kernel, dX = bf16(dout)*bf16(W) and dW += bf16(dout)^T *
 * bf16(in). Bias, residual, GELU, dbias and GELU' stay fp32, around the
 * product; so do the master weights, gradients and AdamW (cpu_train.c).
 *
 * Bias and residual are oneDNN post-ops of the product (no extra pass over
 * the output); GELU is a pass after it; dbias is summed while dout is
 * converted. Activations are converted on the pool (cpu_bf16_convert:
 * vcvtne2ps2bf16, ~4.8 G floats/s per core here).
 *
 * Weights: one bf16 copy of the parameter buffer (same offsets; only the
 * matrices used in products are filled), refreshed per matrix when
 * ctx->params_version moves. The forward reads it as W^T through strides,
 * dX as W. oneDNN's blocked ("packed") layout for AMX was measured too
 * (cpu_bf16_pack): 0-2x faster per product depending on the shape, but it
 * needs one reorder per layout (forward and dX differ) after every step,
 * 4-16 ms per layer matrix and 50-90 ms for the LM head on 2 cores, ~1 s
 * per GPT-2 124M step, more than it saves; so training uses the plain copy.
 *
 * Threading: each product is ONE oneDNN call from the caller thread with
 * ctx->threads OpenMP threads (the pool is idle meanwhile; cpu_bf16_load
 * makes OpenMP threads sleep instead of spin after a product), rather than
 * one oneDNN call per pool chunk (halves of the columns) with 1 OpenMP
 * thread each. Measured on the 2-core Xeon with AMX-BF16 (best of 12 runs,
 * the machine shared with other jobs), GFLOP/s, one call / per chunk:
 * 2048x768x3072 1187 / 1100, 2048x768x2304 1225 / 1228, 2048x3072x768
 * 704 / 896, LM head 2048x768x50257 318 / 200 (the LM head is a third of
 * a step's FLOPs). oneDNN cuts the output into blocks by a fixed rule for
 * a shape and thread count and reduces K inside a block, so the result is
 * the same bits run to run for a given thread count (tested:
 * tests/test_cpu_bf16.c); another thread count may round differently.
 *
 * Failures: cpu_linear_forward/backward return nothing, so a bf16 product
 * that oneDNN cannot plan or run is done in fp32 instead (the forward on
 * the usual path, a backward product single-threaded) and counted
 * (ctx->bf16->fallbacks, the message in ctx->bf16->err); none is expected
 * once context_create has loaded oneDNN. */

typedef struct bf16_mat {
    size_t off, numel;
    uint64_t version;
} bf16_mat;

struct cpu_bf16_state {
    cpu_bf16_cache *cache;
    uint16_t *w;    /* [n_params] bf16 copy of the parameters (matrices only) */
    bf16_mat *mats; /* matrices the copy holds, and of which version */
    size_t n_mats, cap_mats;
    uint16_t *a, *b; /* converted activations */
    size_t a_cap, b_cap;
    void *scratch;
    size_t scratch_cap;
    uint64_t products, fallbacks;
    char err[256];
};

void cpu_linear_bf16_free(orch_engine_ctx *ctx) {
    cpu_bf16_state *st = ctx->bf16;
    if (!st) return;
    cpu_bf16_cache_destroy(st->cache);
    free(st->w);
    free(st->mats);
    free(st->a);
    free(st->b);
    free(st->scratch);
    free(st);
    ctx->bf16 = NULL;
}

static cpu_bf16_state *bf16_state(orch_engine_ctx *ctx) {
    if (ctx->bf16) return ctx->bf16;
    cpu_bf16_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->cache = cpu_bf16_cache_create();
    /* calloc of this size is mmap'd: pages of tensors never used stay free. */
    st->w = calloc(ctx->n_params ? ctx->n_params : 1, sizeof(uint16_t));
    if (!st->cache || !st->w) {
        cpu_bf16_cache_destroy(st->cache);
        free(st->w);
        free(st);
        return NULL;
    }
    ctx->bf16 = st;
    return st;
}

static int grow(void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 1;
    void *n = NULL;
    if (posix_memalign(&n, 64, bytes) != 0) return 0;
    free(*p);
    *p = n;
    *cap = bytes;
    return 1;
}

/* dst[r*cols + c] = bf16(src[r*ld + c]) on the pool. */
typedef struct cvt_job {
    const float *src;
    size_t ld, rows, cols, chunks;
    uint16_t *dst;
} cvt_job;

static void cvt_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const cvt_job *j = arg;
    size_t r0, r1;
    cpu_pool_range(j->rows, (int)chunk, (int)j->chunks, 1, &r0, &r1);
    if (j->ld == j->cols) {
        cpu_bf16_convert(j->src + r0 * j->ld, j->dst + r0 * j->cols, (r1 - r0) * j->cols);
        return;
    }
    for (size_t r = r0; r < r1; r++)
        cpu_bf16_convert(j->src + r * j->ld, j->dst + r * j->cols, j->cols);
}

static void convert_rows(orch_engine_ctx *ctx, const float *src, size_t ld, size_t rows,
                         size_t cols, uint16_t *dst) {
    cvt_job j = { src, ld, rows, cols, 0, dst };
    const size_t min_rows = cols ? (16384 + cols - 1) / cols : rows;
    j.chunks = cpu_pool_chunks(ctx->pool, rows, min_rows ? min_rows : 1, 4);
    cpu_pool_for(ctx->pool, j.chunks, cvt_chunk, &j);
}

/* The bf16 copy of the matrix W (numel floats inside ctx->params), current
 * for ctx->params_version; NULL if W is not a parameter or out of memory. */
static const uint16_t *bf16_weights(orch_engine_ctx *ctx, cpu_bf16_state *st,
                                    const float *W, size_t numel) {
    if (W < ctx->params || W + numel > ctx->params + ctx->n_params) return NULL;
    const size_t off = (size_t)(W - ctx->params);
    bf16_mat *m = NULL;
    for (size_t i = 0; i < st->n_mats; i++)
        if (st->mats[i].off == off && st->mats[i].numel == numel) m = &st->mats[i];
    if (!m) {
        if (st->n_mats == st->cap_mats) {
            size_t cap = st->cap_mats ? 2 * st->cap_mats : 64;
            bf16_mat *n = realloc(st->mats, cap * sizeof *n);
            if (!n) return NULL;
            st->mats = n;
            st->cap_mats = cap;
        }
        m = &st->mats[st->n_mats++];
        *m = (bf16_mat){ off, numel, ctx->params_version + 1 };
    }
    if (m->version != ctx->params_version) {
        convert_rows(ctx, W, numel, 1, numel, st->w + off);
        m->version = ctx->params_version;
    }
    return st->w + off;
}

/* Plan and scratch for shape s; NULL (fallback) with the reason in st->err. */
static const cpu_bf16_plan *bf16_plan(cpu_bf16_state *st, const cpu_bf16_shape *s) {
    cpu_bf16_plan *p = cpu_bf16_plan_get(st->cache, s, st->err, sizeof st->err);
    if (!p) return NULL;
    if (!grow(&st->scratch, &st->scratch_cap, cpu_bf16_scratch_bytes(p))) {
        snprintf(st->err, sizeof st->err, "out of memory for oneDNN scratch");
        return NULL;
    }
    return p;
}

static int bf16_run(cpu_bf16_state *st, const cpu_bf16_plan *p, const uint16_t *A,
                    const uint16_t *B, float *C, const float *bias, const float *R) {
    cpu_bf16_args a = { A, B, C, bias, R, st->scratch };
    if (cpu_bf16_run(st->cache, p, &a, st->err, sizeof st->err) != ORCH_OK) {
        st->fallbacks++;
        return 0;
    }
    st->products++;
    return 1;
}

/* GELU after the product: columns [c0, c1) per chunk. */
typedef struct bf16_fwd_job {
    orch_engine_ctx *ctx;
    const cpu_linear_fwd *op;
    size_t chunks;
} bf16_fwd_job;

static void bf16_fwd_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const bf16_fwd_job *j = arg;
    size_t c0, c1;
    cpu_pool_range((size_t)j->op->N, (int)chunk, (int)j->chunks, 16, &c0, &c1);
    if (c0 < c1) gelu_cols(j->ctx->isa, j->op, c0, c1);
}

static void bf16_fail(cpu_bf16_state *st) {
    if (st) st->fallbacks++;
}

/* 1 if done in bf16; 0: the caller runs the fp32 path (nothing written). */
static int bf16_forward(orch_engine_ctx *ctx, const cpu_linear_fwd *op) {
    cpu_bf16_state *st = bf16_state(ctx);
    if (!st) return 0;
    const size_t R = (size_t)op->R, N = (size_t)op->N, K = (size_t)op->K;
    if (R == 0 || N == 0) return 1;
    /* bias and residual are fused into the product (oneDNN post-ops): an
     * in-place residual (resid == out, inference) as accumulation, another
     * one as an added fp32 tensor. */
    const int inplace = op->resid && op->resid == op->out;
    cpu_bf16_shape s = {
        op->R,       op->N,   op->K,         op->K,
        1,           1,       op->K,         0,
        op->ldout,   inplace, op->bias != 0, op->resid && !inplace ? op->ldresid : 0,
        ctx->threads
    };
    const cpu_bf16_plan *p = bf16_plan(st, &s);
    const uint16_t *w = p ? bf16_weights(ctx, st, op->W, N * K) : NULL;
    if (!w || !grow((void **)&st->a, &st->a_cap, R * K * sizeof(uint16_t))) {
        bf16_fail(st);
        return 0;
    }
    convert_rows(ctx, op->in, (size_t)op->ldin, R, K, st->a);
    if (!bf16_run(st, p, st->a, w, op->out, op->bias, op->resid))
        return 0; /* nothing written: the fp32 path runs instead */
    if (op->gelu_inplace || op->gelu_out) {
        bf16_fwd_job j = { ctx, op, cpu_pool_chunks(ctx->pool, N, SGEMM_MIN_COLS, 1) };
        cpu_pool_for(ctx->pool, j.chunks, bf16_fwd_chunk, &j);
    }
    return 1;
}

/* Before the products, by columns: dout -> bf16 [R,N] (A of dX, and of dW
 * through a transposed view) and dbias += column sums of dout (each chunk
 * adds its rows in order, as the fp32 path does). A transposed bf16 copy
 * for dW (oneDNN's dW is 10-40% faster with a row-major A on most shapes)
 * cost more in the transpose than it saved, measured on GPT-2 124M steps. */
typedef struct bf16_dout_job {
    const cpu_linear_bwd *op;
    int isa;
    size_t chunks;
    uint16_t *dst; /* [R,N] */
} bf16_dout_job;

static void bf16_dout_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const bf16_dout_job *j = arg;
    const cpu_linear_bwd *op = j->op;
    size_t a, b;
    cpu_pool_range((size_t)op->N, (int)chunk, (int)j->chunks, 32, &a, &b);
    for (int r = 0; a < b && r < op->R; r++) {
        const float *d = op->dout + (size_t)r * op->lddout;
        cpu_bf16_convert(d + a, j->dst + (size_t)r * op->N + a, b - a);
        if (op->dbias) cpu_add(j->isa, op->dbias + a, d + a, op->dbias + a, b - a);
    }
}

/* After the products: GELU' on din, by rows. */
typedef struct bf16_bwd_job {
    const cpu_linear_bwd *op;
    int isa;
    size_t chunks;
} bf16_bwd_job;

static void bf16_bwd_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const bf16_bwd_job *j = arg;
    const cpu_linear_bwd *op = j->op;
    size_t a, b;
    cpu_pool_range((size_t)op->R, (int)chunk, (int)j->chunks, 1, &a, &b);
    for (size_t r = a; r < b; r++)
        cpu_gelu_backward(j->isa, op->din + r * op->lddin, op->gelu_x + r * (size_t)op->K,
                          op->gelu_tanh + r * (size_t)op->K, (size_t)op->K);
}

static int bf16_backward(orch_engine_ctx *ctx, const cpu_linear_bwd *op) {
    cpu_bf16_state *st = bf16_state(ctx);
    if (!st) return 0;
    const size_t R = (size_t)op->R, N = (size_t)op->N, K = (size_t)op->K;
    if (R == 0 || N == 0 || K == 0) return 0;
    /* dX[R,K] = dout[R,N] * W[N,K]; dW[N,K] += dout^T[N,R] * in[R,K] */
    cpu_bf16_shape sx = { op->R, op->K, op->N,       op->N,     1,
                          op->K, 1,     0,           op->lddin, op->din_accumulate,
                          0,     0,     ctx->threads };
    cpu_bf16_shape sw = { op->N, op->K, op->R, 1, op->N, op->K,       1,
                          0,     op->K, 1,     0, 0,     ctx->threads };
    const cpu_bf16_plan *px = op->din ? bf16_plan(st, &sx) : NULL;
    const cpu_bf16_plan *pw = op->dW ? bf16_plan(st, &sw) : NULL;
    const uint16_t *w = op->din && px ? bf16_weights(ctx, st, op->W, N * K) : NULL;
    if ((op->dW && !pw) || (op->din && !w) ||
        !grow((void **)&st->a, &st->a_cap, R * N * sizeof(uint16_t)) ||
        !grow((void **)&st->b, &st->b_cap, R * K * sizeof(uint16_t))) {
        bf16_fail(st);
        return 0;
    }
    bf16_dout_job dj = { op, ctx->isa, cpu_pool_chunks(ctx->pool, N, SGEMM_MIN_COLS, 4),
                         st->a };
    cpu_pool_for(ctx->pool, dj.chunks, bf16_dout_chunk, &dj);
    convert_rows(ctx, op->in, (size_t)op->ldin, R, K, st->b);
    /* dbias is already added: a failed product is redone in fp32 alone. */
    if (op->din && !bf16_run(st, px, st->a, w, op->din, NULL, NULL))
        cpu_sgemm1(0, 0, op->R, op->K, op->N, 1.0f, op->dout, op->lddout, op->W, op->K,
                   op->din_accumulate ? 1.0f : 0.0f, op->din, op->lddin);
    if (op->dW && !bf16_run(st, pw, st->a, st->b, op->dW, NULL, NULL))
        cpu_sgemm1(1, 0, op->N, op->K, op->R, 1.0f, op->dout, op->lddout, op->in,
                   op->ldin, 1.0f, op->dW, op->K);
    if (op->din && op->gelu_x) {
        bf16_bwd_job j = { op, ctx->isa, cpu_pool_chunks(ctx->pool, R, 16, 1) };
        cpu_pool_for(ctx->pool, j.chunks, bf16_bwd_chunk, &j);
    }
    return 1;
}
