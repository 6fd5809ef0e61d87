/*
 * cpu_llama.c - LLaMA (ORCH_ARCH_LLAMA) training on the CPU engine: the
 * per-context state, the RMSNorm and RoPE row kernels, forward pass with
 * saved activations, loss (cpu_train_ce_rows), backward pass accumulating
 * into the flat gradient buffer. AdamW, clipping and the gradient buffer
 * are the architecture-free code of cpu_train.c / cpu_engine.c.
 *
 * Saved per layer: the layer input, the two RMSNorm 1/rms, q|k|v after RoPE,
 * the softmax row maximum and 1/sum per (batch, head, query), the attention
 * output, the mid-layer residual and gate|up before SwiGLU. Recomputed by
 * the backward pass: the RMSNorm outputs (from the input and the saved
 * 1/rms), SwiGLU, the attention probabilities (per block of ATT_QB queries).
 * Matrix products run on cpu_linear (OpenBLAS per chunk, or oneDNN bf16 with
 * precision=bf16), so every product of the GPT-2 path's speed applies.
 *
 * Determinism: chunk boundaries depend on shapes and the thread count only;
 * the attention backward runs one task per (batch, key/value head) and adds
 * the query heads of the group to dk/dv in head order; the loss is summed
 * serially in double.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_llama.h"
#include "engines/cpu/cpu_lora.h"

/* Query rows per attention block (as cpu_train.c) and logits rows per loss
 * chunk. */
#define ATT_QB     128
#define LOSS_ROWS  1024
#define ROW_MIN    4
#define ROW_CHUNKS 4

/* ------------------------------------------------------------------------- */
/* State, tensors, row kernels                                                */
/* ------------------------------------------------------------------------- */

int32_t cpu_llama_setup(orch_engine_ctx *ctx, const orch_model_desc *m, char *err,
                        size_t cap) {
    const size_t half = ctx->HS / 2, T = ctx->T;
    cpu_llama_state *st = calloc(1, sizeof *st);
    float *inv = malloc((half ? half : 1) * sizeof(float));
    const size_t n = T * half > 0 ? T * half : 1;
    if (st) {
        st->rope_cos = malloc(n * sizeof(float));
        st->rope_sin = malloc(n * sizeof(float));
    }
    if (!st || !inv || !st->rope_cos || !st->rope_sin) {
        if (st) {
            free(st->rope_cos);
            free(st->rope_sin);
        }
        free(st);
        free(inv);
        return engine_fail_buf(err, cap, ORCH_ERR_OUT_OF_MEMORY,
                               "cannot allocate the RoPE tables (%zu positions)", T);
    }
    engine_rope_inv_freq(m, inv);
    /* The angle in double from the float frequency (the header's values). */
    for (size_t p = 0; p < T; p++)
        for (size_t d = 0; d < half; d++) {
            const double a = (double)p * (double)inv[d];
            st->rope_cos[p * half + d] = (float)cos(a);
            st->rope_sin[p * half + d] = (float)sin(a);
        }
    free(inv);
    ctx->llama = st;
    return ORCH_OK;
}

void cpu_llama_free(orch_engine_ctx *ctx) {
    cpu_llama_state *st = ctx->llama;
    if (!st) return;
    free(st->rope_cos);
    free(st->rope_sin);
    free(st->acts);
    free(st->inf);
    free(st);
    ctx->llama = NULL;
}

float *cpu_llama_tensor(const orch_engine_ctx *ctx, float *base, uint32_t l, int k) {
    if (!base) return NULL; /* a frozen base has no gradient table */
    return base + ctx->tensors[1 + (size_t)l * LL_COUNT + (size_t)k].offset;
}

float *cpu_llama_embed(const orch_engine_ctx *ctx, float *base) {
    if (!base) return NULL;
    return base + ctx->tensors[0].offset;
}

float *cpu_llama_norm(const orch_engine_ctx *ctx, float *base) {
    if (!base) return NULL;
    return base + ctx->tensors[1 + (size_t)ctx->L * LL_COUNT].offset;
}

float *cpu_llama_head(const orch_engine_ctx *ctx, float *base) {
    if (ctx->desc.flags & ORCH_MODEL_FLAG_UNTIED_HEAD)
        return base + ctx->tensors[2 + (size_t)ctx->L * LL_COUNT].offset;
    return cpu_llama_embed(ctx, base);
}

void cpu_llama_rmsnorm(const float *x, float *out, const float *w, size_t n, float eps,
                       float *rstd_out) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (size_t i = 0; i < n; i++) out[i] = (x[i] * r) * w[i];
    if (rstd_out) *rstd_out = r;
}

void cpu_llama_rope(const cpu_llama_state *st, float *x, size_t nh, size_t hs,
                    uint32_t pos, int inverse) {
    const size_t half = hs / 2;
    const float *c = st->rope_cos + (size_t)pos * half;
    const float *s = st->rope_sin + (size_t)pos * half;
    for (size_t h = 0; h < nh; h++) {
        float *a = x + h * hs, *b = a + half;
        for (size_t d = 0; d < half; d++) {
            const float x1 = a[d], x2 = b[d];
            const float sn = inverse ? -s[d] : s[d];
            a[d] = x1 * c[d] - x2 * sn;
            b[d] = x2 * c[d] + x1 * sn;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Activations                                                                */
/* ------------------------------------------------------------------------- */

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

typedef struct layer_acts {
    float *res_in, *rstd1, *qkv, *att_max, *att_isum, *atty, *res_mid, *rstd2, *gu;
} layer_acts;

typedef struct acts {
    layer_acts *layer; /* [L] */
    float *res_out, *lnf, *rstdf, *row_loss;
    float *xn, *h, *logits;                     /* forward scratch */
    float *dres, *dx, *dh, *dgu, *datty, *dqkv; /* backward scratch */
    float *att_scratch;                         /* [threads][2 * qb * T] */
} acts;

/* Carve the buffers for (B, T) from base (NULL: count only); returns floats. */
static size_t acts_carve(const orch_engine_ctx *ctx, acts *a, float *base, uint32_t B,
                         uint32_t T) {
    const size_t BT = (size_t)B * T, C = ctx->C, M = ctx->M;
    const size_t QS = C + 2 * (size_t)ctx->KVD, NHT = (size_t)B * ctx->NH * T;
    const size_t qb = T < ATT_QB ? T : ATT_QB;
    const size_t loss_rows = BT < LOSS_ROWS ? BT : LOSS_ROWS;
    size_t used = 0;
#define CARVE(n) (used += al16(n), base ? base + used - al16(n) : NULL)
    for (uint32_t l = 0; l < ctx->L; l++) {
        layer_acts la;
        la.res_in = CARVE(BT * C);
        la.rstd1 = CARVE(BT);
        la.qkv = CARVE(BT * QS);
        la.att_max = CARVE(NHT);
        la.att_isum = CARVE(NHT);
        la.atty = CARVE(BT * C);
        la.res_mid = CARVE(BT * C);
        la.rstd2 = CARVE(BT);
        la.gu = CARVE(BT * 2 * M);
        if (a) a->layer[l] = la;
    }
    float *res_out = CARVE(BT * C), *lnf = CARVE(BT * C), *rstdf = CARVE(BT);
    float *row_loss = CARVE(BT), *xn = CARVE(BT * C), *h = CARVE(BT * M);
    float *logits = CARVE(loss_rows * ctx->V), *dres = CARVE(BT * C);
    float *dx = CARVE(BT * C), *dh = CARVE(BT * M), *dgu = CARVE(BT * 2 * M);
    float *datty = CARVE(BT * C), *dqkv = CARVE(BT * QS);
    float *att = CARVE((size_t)ctx->threads * 2 * qb * T);
#undef CARVE
    if (a) {
        a->res_out = res_out;
        a->lnf = lnf;
        a->rstdf = rstdf;
        a->row_loss = row_loss;
        a->xn = xn;
        a->h = h;
        a->logits = logits;
        a->dres = dres;
        a->dx = dx;
        a->dh = dh;
        a->dgu = dgu;
        a->datty = datty;
        a->dqkv = dqkv;
        a->att_scratch = att;
    }
    return used;
}

static int32_t acts_ensure(orch_engine_ctx *ctx, acts *a, uint32_t B, uint32_t T) {
    cpu_llama_state *st = ctx->llama;
    const size_t need = acts_carve(ctx, NULL, NULL, B, T);
    if (need > st->acts_floats) {
        free(st->acts);
        st->acts = NULL;
        st->acts_floats = 0;
        void *p = NULL;
        if (need > SIZE_MAX / sizeof(float) ||
            posix_memalign(&p, 64, need * sizeof(float)) != 0)
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "cannot allocate %zu MiB of activations for batch "
                            "%u x seq_len %u",
                            need * sizeof(float) >> 20, B, T);
        st->acts = p;
        st->acts_floats = need;
    }
    a->layer = calloc(ctx->L, sizeof *a->layer);
    if (!a->layer)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "cannot allocate activation tables");
    acts_carve(ctx, a, st->acts, B, T);
    st->acts_B = B;
    st->acts_T = T;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Row jobs: RMSNorm, RoPE, SwiGLU, embedding                                 */
/* ------------------------------------------------------------------------- */

typedef struct rows_job {
    orch_engine_ctx *ctx;
    int op;
    size_t rows, chunks;
    const float *x, *w, *dy;
    float *out, *rstd, *dx, *dw;
    const int32_t *tokens;
    uint32_t T;
    int inverse;
    size_t kc; /* column chunks of the rmsnorm weight gradient */
} rows_job;

enum { OP_RMS, OP_RMS_BWD, OP_ROPE, OP_SWIGLU, OP_SWIGLU_BWD, OP_EMBED, OP_EMBED_BWD };

void cpu_llama_rmsnorm_backward(const float *dy, const float *x, const float *w, float r,
                                float *dx, size_t n) {
    double dot = 0.0;
    for (size_t i = 0; i < n; i++) dot += (double)(dy[i] * w[i]) * (double)(x[i] * r);
    const float m = (float)(dot / (double)n);
    for (size_t i = 0; i < n; i++) dx[i] += r * (dy[i] * w[i] - (x[i] * r) * m);
}

static inline float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

void cpu_llama_swiglu(const float *gu, float *h, size_t M) {
    const float *g = gu, *u = g + M;
    for (size_t i = 0; i < M; i++) h[i] = g[i] * sigmoidf(g[i]) * u[i];
}

void cpu_llama_swiglu_backward(const float *gu, const float *dh, float *dgu, size_t M) {
    const float *g = gu, *u = g + M;
    float *dg = dgu, *du = dg + M;
    for (size_t i = 0; i < M; i++) {
        const float s = sigmoidf(g[i]), silu = g[i] * s;
        du[i] = dh[i] * silu;
        dg[i] = dh[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
    }
}

static void rows_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const rows_job *j = arg;
    const orch_engine_ctx *ctx = j->ctx;
    const size_t C = ctx->C, M = ctx->M, QS = C + 2 * (size_t)ctx->KVD;
    size_t a, b;
    if (j->op == OP_EMBED_BWD || (j->op == OP_RMS_BWD && c >= j->chunks)) {
        /* By columns: no two chunks add to the same element. */
        const size_t k = j->op == OP_EMBED_BWD ? c : c - j->chunks;
        const size_t nk = j->op == OP_EMBED_BWD ? j->chunks : j->kc;
        cpu_pool_range(C, (int)k, (int)nk, 16, &a, &b);
        for (size_t r = 0; r < j->rows; r++) {
            const float *d = j->dy + r * C;
            if (j->op == OP_EMBED_BWD) {
                float *te = j->dw + (size_t)j->tokens[r] * C;
                for (size_t i = a; i < b; i++) te[i] += d[i];
            } else {
                const float *x = j->x + r * C, rs = j->rstd[r];
                for (size_t i = a; i < b; i++) j->dw[i] += d[i] * (x[i] * rs);
            }
        }
        return;
    }
    cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &a, &b);
    for (size_t r = a; r < b; r++) {
        switch (j->op) {
        case OP_RMS:
            cpu_llama_rmsnorm(j->x + r * C, j->out + r * C, j->w, C, ctx->eps,
                              j->rstd ? j->rstd + r : NULL);
            break;
        case OP_RMS_BWD:
            cpu_llama_rmsnorm_backward(j->dy + r * C, j->x + r * C, j->w, j->rstd[r],
                                       j->dx + r * C, C);
            break;
        case OP_ROPE: { /* q heads, then k heads of row r (qkv or dqkv) */
            float *row = j->out + r * QS;
            const uint32_t pos = (uint32_t)(r % j->T);
            cpu_llama_rope(ctx->llama, row, ctx->NH, ctx->HS, pos, j->inverse);
            cpu_llama_rope(ctx->llama, row + C, ctx->KVH, ctx->HS, pos, j->inverse);
            break;
        }
        case OP_SWIGLU: /* h = silu(gate) * up */
            cpu_llama_swiglu(j->x + r * 2 * M, j->out + r * M, M);
            break;
        case OP_SWIGLU_BWD: /* dgate, dup from dh */
            cpu_llama_swiglu_backward(j->x + r * 2 * M, j->dy + r * M, j->out + r * 2 * M,
                                      M);
            break;
        case OP_EMBED:
            memcpy(j->out + r * C, j->w + (size_t)j->tokens[r] * C, C * sizeof(float));
            break;
        default: break;
        }
    }
}

static void run_rows(orch_engine_ctx *ctx, rows_job *j) {
    j->ctx = ctx;
    if (j->op == OP_EMBED_BWD) {
        j->chunks = cpu_pool_chunks(ctx->pool, ctx->C, 64, 2);
        cpu_pool_for(ctx->pool, j->chunks, rows_chunk, j);
        return;
    }
    j->chunks = cpu_pool_chunks(ctx->pool, j->rows, ROW_MIN, ROW_CHUNKS);
    j->kc = j->op == OP_RMS_BWD && j->dw ? cpu_pool_chunks(ctx->pool, ctx->C, 64, 2) : 0;
    cpu_pool_for(ctx->pool, j->chunks + j->kc, rows_chunk, j);
}

/* RMSNorm of rows [0, rows) of x into out with weight w (rstd saved if set). */
static void rmsnorm(orch_engine_ctx *ctx, const float *x, float *out, float *rstd,
                    const float *w, size_t rows) {
    rows_job j = { .op = OP_RMS, .rows = rows, .x = x, .w = w, .out = out, .rstd = rstd };
    run_rows(ctx, &j);
}

/* dx += RMSNorm backward of dy; dw += its weight gradient. */
static void rmsnorm_backward(orch_engine_ctx *ctx, const float *dy, const float *x,
                             const float *rstd, const float *w, float *dx, float *dw,
                             size_t rows) {
    rows_job j = { .op = OP_RMS_BWD,
                   .rows = rows,
                   .x = x,
                   .w = w,
                   .dy = dy,
                   .rstd = (float *)rstd,
                   .dx = dx,
                   .dw = dw };
    run_rows(ctx, &j);
}

/* ------------------------------------------------------------------------- */
/* Grouped-query attention                                                    */
/* ------------------------------------------------------------------------- */

typedef struct attn_job {
    orch_engine_ctx *ctx;
    const layer_acts *la;
    uint32_t B, T;
    const float *datty; /* backward when set */
    float *dqkv;
    float *scratch;
} attn_job;

/* Forward of (batch b, query head h). */
static void attn_fwd_task(const attn_job *j, uint32_t b, uint32_t h, float *P) {
    const orch_engine_ctx *ctx = j->ctx;
    const int T = (int)j->T, HS = (int)ctx->HS;
    const size_t C = ctx->C, QS = C + 2 * (size_t)ctx->KVD;
    const uint32_t kvh = h / (ctx->NH / ctx->KVH);
    const float scale = 1.0f / sqrtf((float)HS);
    const float *base = j->la->qkv + (size_t)b * T * QS;
    const float *q = base + (size_t)h * HS, *k = base + C + (size_t)kvh * HS;
    const float *v = k + ctx->KVD;
    const size_t st = ((size_t)b * ctx->NH + h) * T;
    float *out = j->la->atty + (size_t)b * T * C + (size_t)h * HS;
    for (int i0 = 0; i0 < T; i0 += ATT_QB) {
        const int nq = T - i0 < ATT_QB ? T - i0 : ATT_QB, nk = i0 + nq;
        cpu_attn_probs(ctx, q, k, QS, i0, nq, scale, j->la->att_max + st,
                       j->la->att_isum + st, 1, P);
        cpu_sgemm1(0, 0, nq, HS, nk, 1.0f, P, nk, v, (int)QS, 0.0f, out + (size_t)i0 * C,
                   (int)C);
    }
}

/* Backward of (batch b, key/value head kvh): its query heads in order, each
 * block by block from the last; the first head's last block initialises dk
 * and dv (it sees every key), everything else adds to them. */
static void attn_bwd_task(const attn_job *j, uint32_t b, uint32_t kvh, float *P,
                          float *dS) {
    const orch_engine_ctx *ctx = j->ctx;
    const int T = (int)j->T, HS = (int)ctx->HS;
    const size_t C = ctx->C, QS = C + 2 * (size_t)ctx->KVD;
    const uint32_t G = ctx->NH / ctx->KVH;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t off = (size_t)b * T * QS;
    const float *k = j->la->qkv + off + C + (size_t)kvh * HS, *v = k + ctx->KVD;
    float *dk = j->dqkv + off + C + (size_t)kvh * HS, *dv = dk + ctx->KVD;
    const int nblocks = (T + ATT_QB - 1) / ATT_QB;
    for (uint32_t g = 0; g < G; g++) {
        const uint32_t h = kvh * G + g;
        const float *q = j->la->qkv + off + (size_t)h * HS;
        float *dq = j->dqkv + off + (size_t)h * HS;
        const size_t st = ((size_t)b * ctx->NH + h) * T;
        const float *dy = j->datty + (size_t)b * T * C + (size_t)h * HS;
        for (int bi = nblocks; bi-- > 0;) {
            const int i0 = bi * ATT_QB;
            const int nq = T - i0 < ATT_QB ? T - i0 : ATT_QB, nk = i0 + nq;
            const float beta = g == 0 && bi == nblocks - 1 ? 0.0f : 1.0f;
            const float *dyb = dy + (size_t)i0 * C;
            cpu_attn_probs(ctx, q, k, QS, i0, nq, scale, j->la->att_max + st,
                           j->la->att_isum + st, 0, P);
            cpu_sgemm1(0, 1, nq, nk, HS, 1.0f, dyb, (int)C, v, (int)QS, 0.0f, dS, nk);
            cpu_sgemm1(1, 0, nk, HS, nq, 1.0f, P, nk, dyb, (int)C, beta, dv, (int)QS);
            for (int r = 0; r < nq; r++) {
                const float *p = P + (size_t)r * nk;
                float *d = dS + (size_t)r * nk;
                const int n = i0 + r + 1;
                float dot = 0.0f;
                for (int jj = 0; jj < n; jj++) dot += p[jj] * d[jj];
                for (int jj = 0; jj < n; jj++) d[jj] = p[jj] * (d[jj] - dot) * scale;
                for (int jj = n; jj < nk; jj++) d[jj] = 0.0f;
            }
            cpu_sgemm1(0, 0, nq, HS, nk, 1.0f, dS, nk, k, (int)QS, 0.0f,
                       dq + (size_t)i0 * QS, (int)QS);
            cpu_sgemm1(1, 0, nk, HS, nq, 1.0f, dS, nk, q + (size_t)i0 * QS, (int)QS, beta,
                       dk, (int)QS);
        }
    }
}

static void attn_chunk(void *arg, size_t t, int tid) {
    const attn_job *j = arg;
    const size_t qb = j->T < ATT_QB ? j->T : ATT_QB;
    float *P = j->scratch + (size_t)tid * 2 * qb * j->T;
    if (j->datty) {
        const uint32_t KVH = j->ctx->KVH;
        attn_bwd_task(j, (uint32_t)(t / KVH), (uint32_t)(t % KVH), P, P + qb * j->T);
    } else {
        const uint32_t NH = j->ctx->NH;
        attn_fwd_task(j, (uint32_t)(t / NH), (uint32_t)(t % NH), P);
    }
}

/* ------------------------------------------------------------------------- */
/* Forward / backward                                                         */
/* ------------------------------------------------------------------------- */

/* The backward of one weight of layer li (rows of BT tokens, contiguous
 * [BT, N] gradient and [BT, K] input): d(input) into din, dW added into the
 * gradient table G. */
static void weight_bwd(orch_engine_ctx *ctx, size_t BT, int N, int K, const float *dout,
                       const float *in, float *din, float *P, float *G, uint32_t li,
                       int w, int din_accumulate) {
    cpu_linear_bwd b = { .R = (int)BT,
                         .N = N,
                         .K = K,
                         .dout = dout,
                         .lddout = N,
                         .in = in,
                         .ldin = K,
                         .W = cpu_llama_tensor(ctx, P, li, w),
                         .din = din,
                         .lddin = K,
                         .din_accumulate = din_accumulate,
                         .dW = cpu_llama_tensor(ctx, G, li, w) };
    cpu_linear_backward(ctx, &b);
}

int32_t cpu_llama_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                   const int32_t *targets, uint32_t B, uint32_t T,
                                   float grad_scale, int backward, float *out_loss,
                                   const cpu_grad_notify *notify) {
    const size_t BT = (size_t)B * T;
    const int C = (int)ctx->C, M = (int)ctx->M, V = (int)ctx->V;
    const int QS = C + 2 * (int)ctx->KVD;
    size_t counted = 0;
    for (size_t i = 0; i < BT; i++) counted += targets[i] != -1;
    if (counted == 0) { /* nothing to learn from; no gradient */
        *out_loss = 0.0f;
        if (backward) cpu_grad_notify_range(ctx, notify, 0, ctx->n_params);
        return ORCH_OK;
    }
    /* Under an adapter (ctx->lora_cur) the base is frozen: G is NULL and
     * every base gradient pointer with it. */
    cpu_lora *lo = ctx->lora_cur;
    acts a;
    int32_t st = acts_ensure(ctx, &a, B, T);
    if (st != ORCH_OK) return st;
    if ((st = cpu_lora_prepare(ctx, lo, BT)) != ORCH_OK ||
        (backward && !lo && (st = cpu_ensure_train_state(ctx)) != ORCH_OK)) {
        free(a.layer);
        return st;
    }
    float *P = ctx->params, *G = lo ? NULL : ctx->grads;

    rows_job ej = { .op = OP_EMBED,
                    .rows = BT,
                    .w = cpu_llama_embed(ctx, P),
                    .out = a.layer[0].res_in,
                    .tokens = tokens };
    run_rows(ctx, &ej);
    for (uint32_t l = 0; l < ctx->L; l++) {
        layer_acts *la = &a.layer[l];
        float *res_out = l + 1 < ctx->L ? a.layer[l + 1].res_in : a.res_out;
        rmsnorm(ctx, la->res_in, a.xn, la->rstd1, cpu_llama_tensor(ctx, P, l, LL_IN_NORM),
                BT);
        cpu_linear_fwd f = { .R = (int)BT,
                             .N = QS,
                             .K = C,
                             .in = a.xn,
                             .ldin = C,
                             .W = cpu_llama_tensor(ctx, P, l, LL_Q),
                             .out = la->qkv,
                             .ldout = QS };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_QKV, BT, a.xn, C, la->qkv, QS);
        rows_job rj = { .op = OP_ROPE, .rows = BT, .out = la->qkv, .T = T };
        run_rows(ctx, &rj);
        attn_job aj = { ctx, la, B, T, NULL, NULL, a.att_scratch };
        cpu_pool_for(ctx->pool, (size_t)B * ctx->NH, attn_chunk, &aj);
        f = (cpu_linear_fwd){ .R = (int)BT,
                              .N = C,
                              .K = C,
                              .in = la->atty,
                              .ldin = C,
                              .W = cpu_llama_tensor(ctx, P, l, LL_O),
                              .resid = la->res_in,
                              .ldresid = C,
                              .out = la->res_mid,
                              .ldout = C };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_OUT, BT, la->atty, C,
                         la->res_mid, C);
        rmsnorm(ctx, la->res_mid, a.xn, la->rstd2,
                cpu_llama_tensor(ctx, P, l, LL_POST_NORM), BT);
        f = (cpu_linear_fwd){ .R = (int)BT,
                              .N = 2 * M,
                              .K = C,
                              .in = a.xn,
                              .ldin = C,
                              .W = cpu_llama_tensor(ctx, P, l, LL_GATE),
                              .out = la->gu,
                              .ldout = 2 * M };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_UP, BT, a.xn, C, la->gu, 2 * M);
        rows_job sj = { .op = OP_SWIGLU, .rows = BT, .x = la->gu, .out = a.h };
        run_rows(ctx, &sj);
        f = (cpu_linear_fwd){ .R = (int)BT,
                              .N = C,
                              .K = M,
                              .in = a.h,
                              .ldin = M,
                              .W = cpu_llama_tensor(ctx, P, l, LL_DOWN),
                              .resid = la->res_mid,
                              .ldresid = C,
                              .out = res_out,
                              .ldout = C };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_DOWN, BT, a.h, M, res_out, C);
    }
    rmsnorm(ctx, a.res_out, a.lnf, a.rstdf, cpu_llama_norm(ctx, P), BT);

    /* Head and loss LOSS_ROWS rows at a time; with backward, d(lnf) of the
     * chunk's rows into dx and its part of the head's gradient at once. */
    const float dscale = grad_scale / (float)counted;
    for (size_t r0 = 0; r0 < BT; r0 += LOSS_ROWS) {
        const size_t R = BT - r0 < LOSS_ROWS ? BT - r0 : LOSS_ROWS;
        cpu_linear_fwd head = { .R = (int)R,
                                .N = V,
                                .K = C,
                                .in = a.lnf + r0 * C,
                                .ldin = C,
                                .W = cpu_llama_head(ctx, P),
                                .out = a.logits,
                                .ldout = V };
        cpu_linear_forward(ctx, &head);
        cpu_train_ce_rows(ctx, a.logits, targets + r0, a.row_loss + r0, R, dscale,
                          backward);
        if (!backward) continue;
        cpu_linear_bwd hb = { .R = (int)R,
                              .N = V,
                              .K = C,
                              .dout = a.logits,
                              .lddout = V,
                              .in = a.lnf + r0 * C,
                              .ldin = C,
                              .W = cpu_llama_head(ctx, P),
                              .din = a.dx + r0 * C,
                              .lddin = C,
                              .dW = G ? cpu_llama_head(ctx, G) : NULL };
        cpu_linear_backward(ctx, &hb);
    }
    double total = 0.0;
    for (size_t r = 0; r < BT; r++) total += a.row_loss[r];
    *out_loss = (float)(total / (double)counted);
    if (!backward) {
        free(a.layer);
        return ORCH_OK;
    }

    /* ---- backward ---- */
    memset(a.dres, 0, BT * C * sizeof(float));
    rmsnorm_backward(ctx, a.dx, a.res_out, a.rstdf, cpu_llama_norm(ctx, P), a.dres,
                     cpu_llama_norm(ctx, G), BT);
    /* Flat offset of layer l's first gradient (l = L: model.norm). */
#define LAYER_OFF(l) (ctx->tensors[1 + (size_t)(l)*LL_COUNT].offset)
    cpu_grad_notify_range(ctx, notify, LAYER_OFF(ctx->L),
                          ctx->n_params - LAYER_OFF(ctx->L));
    for (uint32_t li = ctx->L; li-- > 0;) {
        layer_acts *la = &a.layer[li];
        /* MLP: recompute n = RMSNorm(res_mid) and h = SwiGLU(gate|up). */
        rmsnorm(ctx, la->res_mid, a.xn, NULL, cpu_llama_tensor(ctx, P, li, LL_POST_NORM),
                BT);
        rows_job sj = { .op = OP_SWIGLU, .rows = BT, .x = la->gu, .out = a.h };
        run_rows(ctx, &sj);
        int acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_MLP_DOWN, BT, a.h, M,
                                    a.dres, C, a.dh, M);
        weight_bwd(ctx, BT, C, M, a.dres, a.h, a.dh, P, G, li, LL_DOWN, acc);
        rows_job sb = {
            .op = OP_SWIGLU_BWD, .rows = BT, .x = la->gu, .dy = a.dh, .out = a.dgu
        };
        run_rows(ctx, &sb);
        acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_MLP_UP, BT, a.xn, C, a.dgu,
                                2 * M, a.dx, C);
        weight_bwd(ctx, BT, 2 * M, C, a.dgu, a.xn, a.dx, P, G, li, LL_GATE, acc);
        rmsnorm_backward(ctx, a.dx, la->res_mid, la->rstd2,
                         cpu_llama_tensor(ctx, P, li, LL_POST_NORM), a.dres,
                         cpu_llama_tensor(ctx, G, li, LL_POST_NORM), BT);
        /* Attention: dres is now the gradient of res_mid. */
        acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_ATTN_OUT, BT, la->atty, C,
                                a.dres, C, a.datty, C);
        weight_bwd(ctx, BT, C, C, a.dres, la->atty, a.datty, P, G, li, LL_O, acc);
        attn_job aj = { ctx, la, B, T, a.datty, a.dqkv, a.att_scratch };
        cpu_pool_for(ctx->pool, (size_t)B * ctx->KVH, attn_chunk, &aj);
        rows_job rj = { .op = OP_ROPE, .rows = BT, .out = a.dqkv, .T = T, .inverse = 1 };
        run_rows(ctx, &rj);
        rmsnorm(ctx, la->res_in, a.xn, NULL, cpu_llama_tensor(ctx, P, li, LL_IN_NORM),
                BT);
        acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_ATTN_QKV, BT, a.xn, C,
                                a.dqkv, QS, a.dx, C);
        weight_bwd(ctx, BT, QS, C, a.dqkv, a.xn, a.dx, P, G, li, LL_Q, acc);
        rmsnorm_backward(ctx, a.dx, la->res_in, la->rstd1,
                         cpu_llama_tensor(ctx, P, li, LL_IN_NORM), a.dres,
                         cpu_llama_tensor(ctx, G, li, LL_IN_NORM), BT);
        cpu_grad_notify_range(ctx, notify, LAYER_OFF(li),
                              LAYER_OFF(li + 1) - LAYER_OFF(li));
    }
    rows_job eb = { .op = OP_EMBED_BWD,
                    .rows = BT,
                    .dy = a.dres,
                    .dw = cpu_llama_embed(ctx, G),
                    .tokens = tokens };
    if (G) run_rows(ctx, &eb);
    cpu_grad_notify_range(ctx, notify, 0, LAYER_OFF(0));
#undef LAYER_OFF
    free(a.layer);
    return ORCH_OK;
}
