/*
 * cpu_linear.c - the CPU engine's threaded matrix products: the forward and
 * backward of a linear layer (bias, residual and GELU fused in), on OpenBLAS
 * sgemm or, for a few rows, on the packed skinny kernel.
 *
 * Threading: OpenBLAS runs single-threaded; each pool thread calls sgemm on
 * its own static slice of the output (columns of the forward and of dX, rows
 * of dW), so no two threads touch the same output element and the split
 * depends only on the thread count (bit-identical results run to run).
 */
#include <cblas.h>
#include <string.h>

#include "engines/cpu/cpu_internal.h"

void cpu_blas_init(void) { openblas_set_num_threads(1); }

const char *cpu_blas_name(void) { return openblas_get_corename(); }

void cpu_sgemm1(int trans_a, int trans_b, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta,
                float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, C, ldc);
}

/* GELU, tanh form, as torch.nn.functional.gelu(approximate='tanh'). */
#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

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

typedef struct linfwd_job {
    orch_engine_ctx *ctx;
    const cpu_linear_fwd *op;
    int packed;
} linfwd_job;

static void linfwd_run(void *arg, int tid, int nth) {
    const linfwd_job *j = arg;
    const cpu_linear_fwd *op = j->op;
    const int has_gelu = op->gelu_inplace || op->gelu_out;
    size_t c0, c1;
    if (j->packed) {
        size_t p0, p1, np = cpu_panel_count((size_t)op->N);
        cpu_pool_range(np, tid, nth, 4, &p0, &p1);
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
        cpu_packed_matmul(j->ctx->isa, op->R, (size_t)op->N, (size_t)op->K,
                          op->in, (size_t)op->ldin, op->packed, op->bias,
                          op->out, (size_t)op->ldout, acc, p0, p1);
    } else {
        cpu_pool_range((size_t)op->N, tid, nth, 16, &c0, &c1);
        if (c0 >= c1) return;
        float beta = 0.0f;
        if (op->bias || op->resid) {
            for (int r = 0; r < op->R; r++) {
                float *o = op->out + (size_t)r * op->ldout;
                const float *rs =
                    op->resid ? op->resid + (size_t)r * op->ldresid : NULL;
                for (size_t c = c0; c < c1; c++)
                    o[c] = (rs ? rs[c] : 0.0f) + (op->bias ? op->bias[c] : 0.0f);
            }
            beta = 1.0f;
        }
        cpu_sgemm1(0, 1, op->R, (int)(c1 - c0), op->K, 1.0f, op->in, op->ldin,
                   op->W + c0 * (size_t)op->K, op->K, beta, op->out + c0,
                   op->ldout);
    }
    if (has_gelu) gelu_cols(j->ctx->isa, op, c0, c1);
}

void cpu_linear_forward(orch_engine_ctx *ctx, const cpu_linear_fwd *op) {
    linfwd_job j = {ctx, op,
                    op->packed != NULL && (uint32_t)op->R <= ctx->skinny_max};
    cpu_pool_run(ctx->pool, linfwd_run, &j);
}

typedef struct linbwd_job {
    const cpu_linear_bwd *op;
} linbwd_job;

static void linbwd_run(void *arg, int tid, int nth) {
    const cpu_linear_bwd *op = ((const linbwd_job *)arg)->op;
    const int R = op->R, N = op->N, K = op->K;
    size_t a, b;
    /* dX columns [a, b). */
    if (op->din) {
        cpu_pool_range((size_t)K, tid, nth, 16, &a, &b);
        if (a < b) {
            cpu_sgemm1(0, 0, R, (int)(b - a), N, 1.0f, op->dout, op->lddout,
                       op->W + a, K, op->din_accumulate ? 1.0f : 0.0f,
                       op->din + a, op->lddin);
            if (op->gelu_x) {
                for (int r = 0; r < R; r++) {
                    float *d = op->din + (size_t)r * op->lddin;
                    const float *x = op->gelu_x + (size_t)r * K;
                    const float *t = op->gelu_tanh + (size_t)r * K;
                    for (size_t c = a; c < b; c++) {
                        float xv = x[c], th = t[c];
                        float dg = 0.5f * (1.0f + th) +
                                   0.5f * xv * (1.0f - th * th) * GELU_S *
                                       (1.0f + 3.0f * GELU_C * xv * xv);
                        d[c] *= dg;
                    }
                }
            }
        }
    }
    /* dW rows [a, b) and their bias. */
    cpu_pool_range((size_t)N, tid, nth, 16, &a, &b);
    if (a >= b) return;
    cpu_sgemm1(1, 0, (int)(b - a), K, R, 1.0f, op->dout + a, op->lddout, op->in,
               op->ldin, 1.0f, op->dW + a * (size_t)K, K);
    if (op->dbias) {
        for (int r = 0; r < R; r++) {
            const float *d = op->dout + (size_t)r * op->lddout;
            for (size_t c = a; c < b; c++) op->dbias[c] += d[c];
        }
    }
}

void cpu_linear_backward(orch_engine_ctx *ctx, const cpu_linear_bwd *op) {
    linbwd_job j = {op};
    cpu_pool_run(ctx->pool, linbwd_run, &j);
}
