/*
 * cpu_linear.c - the CPU engine's threaded matrix products: the forward and
 * backward of a linear layer (bias, residual and GELU fused in), on OpenBLAS
 * sgemm or, for a few rows, on the packed skinny kernel.
 *
 * Threading: OpenBLAS runs single-threaded; the output is cut into chunks
 * (columns of the forward and of dX, rows of dW) that pool threads take one
 * at a time and compute with their own sgemm call. No two chunks touch the
 * same output element and the cut depends only on the shapes and the thread
 * count, so results are bit-identical run to run.
 */
#include <string.h>

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

void cpu_linear_forward(orch_engine_ctx *ctx, const cpu_linear_fwd *op) {
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
    linbwd_job j = { op, ctx->isa, 0, 0 };
    if (op->din)
        j.kx = cpu_pool_chunks(ctx->pool, (size_t)op->K, SGEMM_MIN_COLS,
                               SGEMM_CHUNKS_PER_THREAD);
    j.kw = cpu_pool_chunks(ctx->pool, (size_t)op->N, SGEMM_MIN_COLS,
                           SGEMM_CHUNKS_PER_THREAD);
    cpu_pool_for(ctx->pool, j.kx + j.kw, linbwd_chunk, &j);
}
