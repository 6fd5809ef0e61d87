/*
 * cpu_train.c - GPT-2 training on the CPU engine: forward pass with saved
 * activations, fused softmax + cross-entropy, backward pass accumulating into
 * the flat gradient buffer, global-norm clipping and AdamW.
 *
 * Model (per layer, pre-LayerNorm):
 *   a = x + c_proj(attn(ln_1(x)));   x' = a + mlp_proj(gelu(c_fc(ln_2(a))))
 * then ln_f and the LM head tied to wte. Attention is causal multi-head with
 * scale 1/sqrt(head size); GELU is the tanh form.
 *
 * Every step is a pool job cut into chunks (rows, columns, (batch, head)
 * pairs, fixed-size pieces of the flat buffers) whose boundaries depend only
 * on the shapes and the thread count; every reduction has a fixed order
 * (per-chunk partials summed in chunk order, the loss summed over rows
 * serially in double). The same inputs and thread count therefore give
 * bit-identical losses and gradients.
 *
 * Memory: activations live in one allocation (ctx->acts) carved for the
 * (batch, seq_len) of the call and kept for the next call. It grows linearly
 * in seq_len: attention saves only the softmax row maximum and 1/sum per
 * (batch, head, query), and the backward pass recomputes the probabilities
 * of one block of ATT_QB queries at a time in per-thread scratch. The MLP
 * saves its pre-activation; GELU is recomputed into one layer's worth of
 * scratch, and so are the LayerNorm outputs (from the saved input; mean and
 * rstd are kept). The LM head and the loss run over LOSS_ROWS rows at a
 * time, so at most [LOSS_ROWS, V] logits exist at once (turned into dlogits
 * in place and consumed by the head's backward right away).
 * cpu_train_act_bytes states the size for a (batch, seq_len).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_internal.h"
#include "engines/cpu/cpu_lora.h"

/* ------------------------------------------------------------------------- */
/* Activation buffers                                                         */
/* ------------------------------------------------------------------------- */

/* Round up to 16 floats so every sub-buffer starts on a cache line. */
static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

typedef struct carver {
    float *base;
    size_t used;
} carver;

static float *carve(carver *c, size_t n) {
    float *p = c->base ? c->base + c->used : NULL;
    c->used += al16(n);
    return p;
}

/* Query rows per attention block: scores are computed for one block of
 * queries against the keys it may see, so the per-thread scratch is
 * 2 * ATT_QB * T floats and the masked upper triangle is mostly skipped. */
#define ATT_QB 128

/* Logits rows per loss chunk: the [rows, V] logits of one chunk are all that
 * exists of the LM head's output at any time. */
#define LOSS_ROWS 1024

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Lay the activation buffers out for (B, T) into a (NULL: only count; base
 * may then be NULL too). Returns the floats needed. */
static size_t acts_carve(const orch_engine_ctx *ctx, cpu_train_acts *a, float *base,
                         uint32_t B, uint32_t T) {
    const size_t BT = (size_t)B * T, C = ctx->C, M = ctx->M;
    const size_t qb = T < ATT_QB ? T : ATT_QB;
    const size_t loss_rows = BT < LOSS_ROWS ? BT : LOSS_ROWS;
    cpu_train_acts count_only;
    cpu_layer_acts dummy;
    memset(&dummy, 0, sizeof dummy);
    if (!a) {
        memset(&count_only, 0, sizeof count_only);
        a = &count_only;
        base = NULL;
    }
    carver cv = { base, 0 };
    for (uint32_t l = 0; l < ctx->L; l++) {
        cpu_layer_acts *la = a == &count_only ? &dummy : &a->layer[l];
        la->res_in = carve(&cv, BT * C);
        la->ln1_mean = carve(&cv, BT);
        la->ln1_rstd = carve(&cv, BT);
        la->qkv = carve(&cv, BT * 3 * C);
        la->att_max = carve(&cv, (size_t)B * ctx->NH * T);
        la->att_isum = carve(&cv, (size_t)B * ctx->NH * T);
        la->atty = carve(&cv, BT * C);
        la->res_mid = carve(&cv, BT * C);
        la->ln2_mean = carve(&cv, BT);
        la->ln2_rstd = carve(&cv, BT);
        la->fc = carve(&cv, BT * M);
    }
    a->res_out = carve(&cv, BT * C);
    a->lnf = carve(&cv, BT * C);
    a->lnf_mean = carve(&cv, BT);
    a->lnf_rstd = carve(&cv, BT);
    a->row_loss = carve(&cv, BT);
    const size_t gelu_floats = al16(BT * M);
    const size_t work =
        max_sz(max_sz(2 * gelu_floats, al16(BT * C) + BT * 3 * C), loss_rows * ctx->V);
    a->work = carve(&cv, work);
    a->gelu_tanh = a->work;
    a->gelu = a->work ? a->work + gelu_floats : NULL;
    a->logits = a->work;
    a->datty = a->work;
    a->ln = a->work;
    a->dqkv = a->work ? a->work + al16(BT * C) : NULL;
    a->dres = carve(&cv, BT * C);
    a->dtmp = carve(&cv, BT * C);
    a->dfc = carve(&cv, BT * M);
    a->att_scratch = carve(&cv, (size_t)ctx->threads * 2 * qb * T);
    return cv.used;
}

size_t cpu_train_act_bytes(const orch_engine_ctx *ctx, uint32_t B, uint32_t T) {
    return acts_carve(ctx, NULL, NULL, B, T) * sizeof(float);
}

static int32_t acts_ensure(orch_engine_ctx *ctx, uint32_t B, uint32_t T) {
    cpu_train_acts *a = &ctx->acts;
    if (a->base && a->B == B && a->T == T) return ORCH_OK;
    if (!a->layer) {
        a->layer = calloc(ctx->L, sizeof *a->layer);
        if (!a->layer)
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "cannot allocate activation tables");
    }
    size_t need = acts_carve(ctx, NULL, NULL, B, T);
    if (need > a->floats) {
        free(a->base);
        a->base = NULL;
        a->floats = 0;
        a->B = a->T = 0;
        void *p = NULL;
        if (need > SIZE_MAX / sizeof(float) ||
            posix_memalign(&p, 64, need * sizeof(float)) != 0)
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "cannot allocate %zu MiB of activations for batch "
                            "%u x seq_len %u",
                            need * sizeof(float) >> 20, B, T);
        a->base = p;
        a->floats = need;
    }
    acts_carve(ctx, a, a->base, B, T);
    a->B = B;
    a->T = T;
    return ORCH_OK;
}

void cpu_train_free(orch_engine_ctx *ctx) {
    free(ctx->acts.base);
    free(ctx->acts.layer);
    memset(&ctx->acts, 0, sizeof ctx->acts);
}

/* ------------------------------------------------------------------------- */
/* Row kernels                                                                */
/* ------------------------------------------------------------------------- */

void cpu_layernorm_rows(int isa, const float *x, float *out, float *mean, float *rstd,
                        const float *w, const float *b, size_t r0, size_t r1, uint32_t C,
                        float eps) {
    for (size_t r = r0; r < r1; r++)
        cpu_layernorm(isa, x + r * C, out + r * C, w, b, C, eps, mean ? mean + r : NULL,
                      rstd ? rstd + r : NULL);
}

/* Rows per chunk: at least ROW_MIN rows, ROW_CHUNKS chunks per thread. */
#define ROW_MIN    4
#define ROW_CHUNKS 4

typedef struct ln_job {
    const float *x;
    float *out, *mean, *rstd;
    const float *w, *b;
    size_t rows, chunks;
    uint32_t C;
    float eps;
    int isa;
} ln_job;

static void ln_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const ln_job *j = arg;
    size_t r0, r1;
    cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &r0, &r1);
    cpu_layernorm_rows(j->isa, j->x, j->out, j->mean, j->rstd, j->w, j->b, r0, r1, j->C,
                       j->eps);
}

static void layernorm(orch_engine_ctx *ctx, const float *x, float *out, float *mean,
                      float *rstd, const float *w, const float *b, size_t rows) {
    ln_job j = {
        x,      out,      mean,    rstd,
        w,      b,        rows,    cpu_pool_chunks(ctx->pool, rows, ROW_MIN, ROW_CHUNKS),
        ctx->C, ctx->eps, ctx->isa
    };
    cpu_pool_for(ctx->pool, j.chunks, ln_chunk, &j);
}

/* LayerNorm backward: dx += ..., dw += ..., db += ... (dy = upstream grad).
 * Rows of dx and columns of dw/db are split independently. */
typedef struct lnb_job {
    const float *dy, *x, *mean, *rstd, *w;
    float *dx, *dw, *db;
    size_t rows;
    uint32_t C;
    int isa;
    size_t kr, kc; /* chunks of dx rows, then of dw/db columns */
} lnb_job;

static void lnb_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const lnb_job *j = arg;
    const uint32_t C = j->C;
    size_t a, b;
    if (c < j->kr) {
        cpu_pool_range(j->rows, (int)c, (int)j->kr, 1, &a, &b);
        for (size_t r = a; r < b; r++)
            cpu_layernorm_backward(j->isa, j->dy + r * C, j->x + r * C, j->w, j->mean[r],
                                   j->rstd[r], j->dx + r * C, C);
        return;
    }
    cpu_pool_range(C, (int)(c - j->kr), (int)j->kc, 16, &a, &b);
    for (size_t r = 0; r < j->rows; r++) {
        const float *dy = j->dy + r * C, *x = j->x + r * C;
        const float m = j->mean[r], rs = j->rstd[r];
        for (size_t k = a; k < b; k++) {
            j->dw[k] += dy[k] * ((x[k] - m) * rs);
            j->db[k] += dy[k];
        }
    }
}

static void layernorm_backward(orch_engine_ctx *ctx, const float *dy, const float *x,
                               const float *mean, const float *rstd, const float *w,
                               float *dx, float *dw, float *db, size_t rows) {
    lnb_job j = { dy,
                  x,
                  mean,
                  rstd,
                  w,
                  dx,
                  dw,
                  db,
                  rows,
                  ctx->C,
                  ctx->isa,
                  cpu_pool_chunks(ctx->pool, rows, ROW_MIN, ROW_CHUNKS),
                  dw ? cpu_pool_chunks(ctx->pool, ctx->C, 64, 2) : 0 };
    cpu_pool_for(ctx->pool, j.kr + j.kc, lnb_chunk, &j);
}

/* ------------------------------------------------------------------------- */
/* Embeddings                                                                 */
/* ------------------------------------------------------------------------- */

typedef struct embed_job {
    orch_engine_ctx *ctx;
    const int32_t *tokens;
    uint32_t T;
    size_t rows;
    float *out;
    const float *dres; /* backward when set */
    size_t chunks;
} embed_job;

static void embed_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const embed_job *j = arg;
    const orch_engine_ctx *ctx = j->ctx;
    const size_t C = ctx->C;
    size_t a, b;
    if (!j->dres) {
        cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &a, &b);
        for (size_t r = a; r < b; r++)
            cpu_add(ctx->isa, ctx->pv.wte + (size_t)j->tokens[r] * C,
                    ctx->pv.wpe + (r % j->T) * C, j->out + r * C, C);
        return;
    }
    /* Backward by columns: no two chunks add to the same element. */
    cpu_pool_range(C, (int)c, (int)j->chunks, 16, &a, &b);
    for (size_t r = 0; r < j->rows; r++) {
        float *te = ctx->gv.wte + (size_t)j->tokens[r] * C;
        float *pe = ctx->gv.wpe + (r % j->T) * C;
        const float *d = j->dres + r * C;
        for (size_t k = a; k < b; k++) {
            te[k] += d[k];
            pe[k] += d[k];
        }
    }
}

static void embed(orch_engine_ctx *ctx, const int32_t *tokens, uint32_t T, size_t rows,
                  float *out, const float *dres) {
    embed_job j = { ctx,
                    tokens,
                    T,
                    rows,
                    out,
                    dres,
                    dres ? cpu_pool_chunks(ctx->pool, ctx->C, 64, 2)
                         : cpu_pool_chunks(ctx->pool, rows, ROW_MIN, ROW_CHUNKS) };
    cpu_pool_for(ctx->pool, j.chunks, embed_chunk, &j);
}

/* ------------------------------------------------------------------------- */
/* Attention                                                                  */
/* ------------------------------------------------------------------------- */

typedef struct attn_job {
    orch_engine_ctx *ctx;
    cpu_layer_acts *la;
    uint32_t B, T;
    const float *datty; /* backward when set */
    float *dqkv;
    float *scratch; /* [threads][2 * ATT_QB * T] */
} attn_job;

void cpu_attn_probs(const orch_engine_ctx *ctx, const float *q, const float *k, size_t ld,
                    int i0, int nq, float scale, float *mx, float *isum, int save,
                    float *P) {
    const int HS = (int)ctx->HS, nk = i0 + nq;
    cpu_sgemm1(0, 1, nq, nk, HS, scale, q + (size_t)i0 * ld, (int)ld, k, (int)ld, 0.0f, P,
               nk);
    for (int r = 0; r < nq; r++) {
        float *row = P + (size_t)r * nk;
        const size_t n = (size_t)i0 + r + 1;
        if (save) {
            const float m = cpu_max(ctx->isa, row, n);
            const float sum = cpu_exp_sum(ctx->isa, row, m, n);
            mx[i0 + r] = m;
            isum[i0 + r] = 1.0f / sum;
        } else {
            (void)cpu_exp_sum(ctx->isa, row, mx[i0 + r], n);
        }
        cpu_scale(ctx->isa, row, isum[i0 + r], n);
        if (n < (size_t)nk) memset(row + n, 0, ((size_t)nk - n) * sizeof(float));
    }
}

static void attn_fwd_task(const attn_job *j, uint32_t b, uint32_t h, float *P) {
    const orch_engine_ctx *ctx = j->ctx;
    const int T = (int)j->T, C = (int)ctx->C, HS = (int)ctx->HS;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *q = j->la->qkv + (size_t)b * T * 3 * C + (size_t)h * HS;
    const float *v = q + 2 * C;
    const size_t st = ((size_t)b * ctx->NH + h) * T;
    float *out = j->la->atty + (size_t)b * T * C + (size_t)h * HS;
    for (int i0 = 0; i0 < T; i0 += ATT_QB) {
        const int nq = T - i0 < ATT_QB ? T - i0 : ATT_QB, nk = i0 + nq;
        cpu_attn_probs(ctx, q, q + C, 3 * (size_t)C, i0, nq, scale, j->la->att_max + st,
                       j->la->att_isum + st, 1, P);
        cpu_sgemm1(0, 0, nq, HS, nk, 1.0f, P, nk, v, 3 * C, 0.0f, out + (size_t)i0 * C,
                   C);
    }
}

/* Backward of one (batch, head), query block by query block. The blocks run
 * last to first: the last one sees every key, so it initialises dk and dv
 * (beta 0) and the earlier ones add to a prefix of them, in a fixed order. */
static void attn_bwd_task(const attn_job *j, uint32_t b, uint32_t h, float *P,
                          float *dS) {
    const orch_engine_ctx *ctx = j->ctx;
    const int T = (int)j->T, C = (int)ctx->C, HS = (int)ctx->HS;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t off = (size_t)b * T * 3 * C + (size_t)h * HS;
    const float *q = j->la->qkv + off, *k = q + C, *v = q + 2 * C;
    float *dq = j->dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
    const size_t st = ((size_t)b * ctx->NH + h) * T;
    const float *dy = j->datty + (size_t)b * T * C + (size_t)h * HS;
    const int nblocks = (T + ATT_QB - 1) / ATT_QB;
    for (int bi = nblocks; bi-- > 0;) {
        const int i0 = bi * ATT_QB;
        const int nq = T - i0 < ATT_QB ? T - i0 : ATT_QB, nk = i0 + nq;
        const float beta = bi == nblocks - 1 ? 0.0f : 1.0f;
        const float *dyb = dy + (size_t)i0 * C;
        cpu_attn_probs(ctx, q, k, 3 * (size_t)C, i0, nq, scale, j->la->att_max + st,
                       j->la->att_isum + st, 0, P);
        cpu_sgemm1(0, 1, nq, nk, HS, 1.0f, dyb, C, v, 3 * C, 0.0f, dS, nk);
        cpu_sgemm1(1, 0, nk, HS, nq, 1.0f, P, nk, dyb, C, beta, dv, 3 * C);
        for (int r = 0; r < nq; r++) {
            const float *p = P + (size_t)r * nk;
            float *d = dS + (size_t)r * nk;
            const int n = i0 + r + 1;
            float dot = 0.0f;
            for (int jj = 0; jj < n; jj++) dot += p[jj] * d[jj];
            for (int jj = 0; jj < n; jj++) d[jj] = p[jj] * (d[jj] - dot) * scale;
            for (int jj = n; jj < nk; jj++) d[jj] = 0.0f;
        }
        cpu_sgemm1(0, 0, nq, HS, nk, 1.0f, dS, nk, k, 3 * C, 0.0f,
                   dq + (size_t)i0 * 3 * C, 3 * C);
        cpu_sgemm1(1, 0, nk, HS, nq, 1.0f, dS, nk, q + (size_t)i0 * 3 * C, 3 * C, beta,
                   dk, 3 * C);
    }
}

/* One chunk = one (batch row, head) task; scratch belongs to the thread. */
static void attn_chunk(void *arg, size_t t, int tid) {
    const attn_job *j = arg;
    const uint32_t NH = j->ctx->NH;
    const size_t qb = j->T < ATT_QB ? j->T : ATT_QB;
    float *P = j->scratch + (size_t)tid * 2 * qb * j->T;
    if (j->datty)
        attn_bwd_task(j, (uint32_t)(t / NH), (uint32_t)(t % NH), P, P + qb * j->T);
    else
        attn_fwd_task(j, (uint32_t)(t / NH), (uint32_t)(t % NH), P);
}

/* GELU of fc, recomputed for the backward pass: tanh term and output. */
typedef struct gelu_job {
    const float *x;
    float *th, *out;
    size_t rows, chunks;
    uint32_t M;
    int isa;
} gelu_job;

static void gelu_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const gelu_job *j = arg;
    size_t r0, r1;
    cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &r0, &r1);
    const size_t M = j->M;
    /* Row by row, like the forward pass (whose column chunks start at
     * multiples of 16), so the vector lanes and the tail see the same
     * elements and the values equal the forward's bit for bit. */
    for (size_t r = r0; r < r1; r++)
        cpu_gelu(j->isa, j->x + r * M, j->th + r * M, j->out + r * M, M);
}

/* ------------------------------------------------------------------------- */
/* Softmax + cross-entropy                                                    */
/* ------------------------------------------------------------------------- */

typedef struct ce_job {
    float *logits;
    const int32_t *targets;
    float *row_loss;
    size_t rows;
    uint32_t V;
    float dscale; /* grad_scale / counted targets; 0: loss only */
    int backward;
    int isa;
    size_t chunks;
} ce_job;

/* Per row: loss = logsumexp(l) - l[y]; with backward the row becomes
 * dscale * (softmax(l) - onehot(y)) (zero for ignored rows). */
static void ce_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const ce_job *j = arg;
    const uint32_t V = j->V;
    size_t r0, r1;
    cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        float *l = j->logits + r * V;
        int32_t y = j->targets[r];
        if (y < 0) {
            j->row_loss[r] = 0.0f;
            if (j->backward) memset(l, 0, V * sizeof(float));
            continue;
        }
        const float mx = cpu_max(j->isa, l, V);
        const float ly = l[y];
        const float sum = cpu_exp_sum(j->isa, l, mx, V);
        if (j->backward) {
            cpu_scale(j->isa, l, j->dscale / sum, V);
            l[y] -= j->dscale;
        }
        j->row_loss[r] = logf(sum) + mx - ly;
    }
}

void cpu_train_ce_rows(orch_engine_ctx *ctx, float *logits, const int32_t *targets,
                       float *row_loss, size_t rows, float dscale, int backward) {
    ce_job cj = { logits,   targets,  row_loss,
                  rows,     ctx->V,   dscale,
                  backward, ctx->isa, cpu_pool_chunks(ctx->pool, rows, 1, ROW_CHUNKS) };
    cpu_pool_for(ctx->pool, cj.chunks, ce_chunk, &cj);
}

/* ------------------------------------------------------------------------- */
/* Forward / backward                                                         */
/* ------------------------------------------------------------------------- */

/* Flat offset of layer l's first gradient (l = L: ln_f.weight). */
static uint64_t layer_offset(const orch_engine_ctx *ctx, uint32_t l) {
    return ctx->tensors[2 + (size_t)l * L_COUNT].offset;
}

int32_t cpu_train_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                   const int32_t *targets, uint32_t B, uint32_t T,
                                   float grad_scale, int backward, float *out_loss,
                                   const cpu_grad_notify *notify) {
    const size_t BT = (size_t)B * T;
    const int C = (int)ctx->C, M = (int)ctx->M, V = (int)ctx->V;
    size_t counted = 0;
    for (size_t i = 0; i < BT; i++) counted += targets[i] != -1;
    if (counted == 0) { /* nothing to learn from; no gradient */
        *out_loss = 0.0f;
        if (backward) cpu_grad_notify_range(ctx, notify, 0, ctx->n_params);
        return ORCH_OK;
    }
    /* Under an adapter (ctx->lora_cur) the base is frozen: no base gradients. */
    cpu_lora *lo = ctx->lora_cur;
    int32_t st = acts_ensure(ctx, B, T);
    if (st != ORCH_OK) return st;
    if ((st = cpu_lora_prepare(ctx, lo, BT)) != ORCH_OK) return st;
    if (backward && !lo && (st = cpu_ensure_train_state(ctx)) != ORCH_OK) return st;
    cpu_train_acts *a = &ctx->acts;
    const cpu_view *P = &ctx->pv;

    embed(ctx, tokens, T, BT, a->layer[0].res_in, NULL);

    for (uint32_t l = 0; l < ctx->L; l++) {
        cpu_layer_acts *la = &a->layer[l];
        const cpu_layer_view *w = &P->layer[l];
        float *res_out = l + 1 < ctx->L ? a->layer[l + 1].res_in : a->res_out;
        /* The LayerNorm outputs go to dtmp (free until the backward pass). */
        layernorm(ctx, la->res_in, a->dtmp, la->ln1_mean, la->ln1_rstd, w->ln1_w,
                  w->ln1_b, BT);
        cpu_linear_fwd f = { .R = (int)BT,
                             .N = 3 * C,
                             .K = C,
                             .in = a->dtmp,
                             .ldin = C,
                             .W = w->qkv_w,
                             .bias = w->qkv_b,
                             .out = la->qkv,
                             .ldout = 3 * C };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_QKV, BT, a->dtmp, C, la->qkv,
                         3 * C);
        attn_job aj = { ctx, la, B, T, NULL, NULL, a->att_scratch };
        cpu_pool_for(ctx->pool, (size_t)B * ctx->NH, attn_chunk, &aj);
        f = (cpu_linear_fwd){ .R = (int)BT,
                              .N = C,
                              .K = C,
                              .in = la->atty,
                              .ldin = C,
                              .W = w->ap_w,
                              .bias = w->ap_b,
                              .resid = la->res_in,
                              .ldresid = C,
                              .out = la->res_mid,
                              .ldout = C };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_OUT, BT, la->atty, C,
                         la->res_mid, C);
        layernorm(ctx, la->res_mid, a->dtmp, la->ln2_mean, la->ln2_rstd, w->ln2_w,
                  w->ln2_b, BT);
        f = (cpu_linear_fwd){ .R = (int)BT,
                              .N = M,
                              .K = C,
                              .in = a->dtmp,
                              .ldin = C,
                              .W = w->fc_w,
                              .bias = w->fc_b,
                              .out = la->fc,
                              .ldout = M,
                              .gelu_tanh = a->gelu_tanh,
                              .gelu_out = a->gelu };
        cpu_linear_forward(ctx, &f);
        if (cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_UP, BT, a->dtmp, C, la->fc,
                             M)) { /* GELU again, of the adapted pre-activation */
            gelu_job gj = { la->fc,
                            a->gelu_tanh,
                            a->gelu,
                            BT,
                            cpu_pool_chunks(ctx->pool, BT, ROW_MIN, ROW_CHUNKS),
                            ctx->M,
                            ctx->isa };
            cpu_pool_for(ctx->pool, gj.chunks, gelu_chunk, &gj);
        }
        f = (cpu_linear_fwd){ .R = (int)BT,
                              .N = C,
                              .K = M,
                              .in = a->gelu,
                              .ldin = M,
                              .W = w->mp_w,
                              .bias = w->mp_b,
                              .resid = la->res_mid,
                              .ldresid = C,
                              .out = res_out,
                              .ldout = C };
        cpu_linear_forward(ctx, &f);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_DOWN, BT, a->gelu, M, res_out,
                         C);
    }
    layernorm(ctx, a->res_out, a->lnf, a->lnf_mean, a->lnf_rstd, P->lnf_w, P->lnf_b, BT);

    /* LM head, loss and (with backward) the head's gradients, LOSS_ROWS rows
     * at a time: logits of the chunk, its row losses and dlogits in place,
     * then at once d(lnf) of its rows and its part of dwte (chunks added in
     * row order). */
    const cpu_view *G = lo ? cpu_lora_frozen_grads(ctx) : &ctx->gv;
    const float dscale = grad_scale / (float)counted;
    for (size_t r0 = 0; r0 < BT; r0 += LOSS_ROWS) {
        const size_t R = BT - r0 < LOSS_ROWS ? BT - r0 : LOSS_ROWS;
        cpu_linear_fwd head = { .R = (int)R,
                                .N = V,
                                .K = C,
                                .in = a->lnf + r0 * C,
                                .ldin = C,
                                .W = P->wte,
                                .out = a->logits,
                                .ldout = V };
        cpu_linear_forward(ctx, &head);
        ce_job cj = {
            a->logits, targets + r0, a->row_loss + r0,
            R,         ctx->V,       dscale,
            backward,  ctx->isa,     cpu_pool_chunks(ctx->pool, R, 1, ROW_CHUNKS)
        };
        cpu_pool_for(ctx->pool, cj.chunks, ce_chunk, &cj);
        if (!backward) continue;
        cpu_linear_bwd hb = { .R = (int)R,
                              .N = V,
                              .K = C,
                              .dout = a->logits,
                              .lddout = V,
                              .in = a->lnf + r0 * C,
                              .ldin = C,
                              .W = P->wte,
                              .din = a->dtmp + r0 * C,
                              .lddin = C,
                              .dW = G->wte };
        cpu_linear_backward(ctx, &hb);
    }
    double total = 0.0;
    for (size_t r = 0; r < BT; r++) total += a->row_loss[r];
    *out_loss = (float)(total / (double)counted);
    if (!backward) return ORCH_OK;

    /* ---- backward ---- */
    memset(a->dres, 0, BT * C * sizeof(float));
    layernorm_backward(ctx, a->dtmp, a->res_out, a->lnf_mean, a->lnf_rstd, P->lnf_w,
                       a->dres, G->lnf_w, G->lnf_b, BT);
    cpu_grad_notify_range(ctx, notify, layer_offset(ctx, ctx->L),
                          ctx->n_params - layer_offset(ctx, ctx->L));
    for (uint32_t li = ctx->L; li-- > 0;) {
        cpu_layer_acts *la = &a->layer[li];
        const cpu_layer_view *w = &P->layer[li];
        const cpu_layer_view *g = &G->layer[li];
        /* MLP: dres is the gradient of the layer output; GELU again. */
        gelu_job gj = { la->fc,
                        a->gelu_tanh,
                        a->gelu,
                        BT,
                        cpu_pool_chunks(ctx->pool, BT, ROW_MIN, ROW_CHUNKS),
                        ctx->M,
                        ctx->isa };
        cpu_pool_for(ctx->pool, gj.chunks, gelu_chunk, &gj);
        int acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_MLP_DOWN, BT, a->gelu,
                                    M, a->dres, C, a->dfc, M);
        cpu_linear_bwd b = { .R = (int)BT,
                             .N = C,
                             .K = M,
                             .dout = a->dres,
                             .lddout = C,
                             .in = a->gelu,
                             .ldin = M,
                             .W = w->mp_w,
                             .din = a->dfc,
                             .lddin = M,
                             .din_accumulate = acc,
                             .gelu_x = la->fc,
                             .gelu_tanh = a->gelu_tanh,
                             .dW = g->mp_w,
                             .dbias = g->mp_b };
        cpu_linear_backward(ctx, &b);
        /* ln_2 again, into work (GELU is no longer needed). */
        layernorm(ctx, la->res_mid, a->ln, NULL, NULL, w->ln2_w, w->ln2_b, BT);
        acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_MLP_UP, BT, a->ln, C,
                                a->dfc, M, a->dtmp, C);
        b = (cpu_linear_bwd){ .R = (int)BT,
                              .N = M,
                              .K = C,
                              .dout = a->dfc,
                              .lddout = M,
                              .in = a->ln,
                              .ldin = C,
                              .W = w->fc_w,
                              .din = a->dtmp,
                              .lddin = C,
                              .din_accumulate = acc,
                              .dW = g->fc_w,
                              .dbias = g->fc_b };
        cpu_linear_backward(ctx, &b);
        layernorm_backward(ctx, a->dtmp, la->res_mid, la->ln2_mean, la->ln2_rstd,
                           w->ln2_w, a->dres, g->ln2_w, g->ln2_b, BT);
        /* Attention: dres is now the gradient of res_mid. */
        acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_ATTN_OUT, BT, la->atty, C,
                                a->dres, C, a->datty, C);
        b = (cpu_linear_bwd){ .R = (int)BT,
                              .N = C,
                              .K = C,
                              .dout = a->dres,
                              .lddout = C,
                              .in = la->atty,
                              .ldin = C,
                              .W = w->ap_w,
                              .din = a->datty,
                              .lddin = C,
                              .din_accumulate = acc,
                              .dW = g->ap_w,
                              .dbias = g->ap_b };
        cpu_linear_backward(ctx, &b);
        attn_job aj = { ctx, la, B, T, a->datty, a->dqkv, a->att_scratch };
        cpu_pool_for(ctx->pool, (size_t)B * ctx->NH, attn_chunk, &aj);
        /* ln_1 again, where datty was. */
        layernorm(ctx, la->res_in, a->ln, NULL, NULL, w->ln1_w, w->ln1_b, BT);
        acc = cpu_lora_backward(ctx, lo, li, ORCH_LORA_TARGET_ATTN_QKV, BT, a->ln, C,
                                a->dqkv, 3 * C, a->dtmp, C);
        b = (cpu_linear_bwd){ .R = (int)BT,
                              .N = 3 * C,
                              .K = C,
                              .dout = a->dqkv,
                              .lddout = 3 * C,
                              .in = a->ln,
                              .ldin = C,
                              .W = w->qkv_w,
                              .din = a->dtmp,
                              .lddin = C,
                              .din_accumulate = acc,
                              .dW = g->qkv_w,
                              .dbias = g->qkv_b };
        cpu_linear_backward(ctx, &b);
        layernorm_backward(ctx, a->dtmp, la->res_in, la->ln1_mean, la->ln1_rstd, w->ln1_w,
                           a->dres, g->ln1_w, g->ln1_b, BT);
        cpu_grad_notify_range(ctx, notify, layer_offset(ctx, li),
                              layer_offset(ctx, li + 1) - layer_offset(ctx, li));
    }
    if (!lo) embed(ctx, tokens, T, BT, NULL, a->dres);
    cpu_grad_notify_range(ctx, notify, 0, layer_offset(ctx, 0));
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Optimizer                                                                  */
/* ------------------------------------------------------------------------- */

/* Fixed-size chunks of the flat buffers: the gradient norm is a sum of
 * per-chunk partial sums in chunk order, the same for every thread count. */
#define OPT_CHUNK ((size_t)1 << 18)

typedef struct opt_job {
    orch_engine_ctx *ctx;
    size_t lo, hi;   /* flat range AdamW updates */
    double *partial; /* [chunks] */
    const orch_adamw_params *p;
    cpu_adamw_consts base;
} opt_job;

static void sumsq_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    opt_job *j = arg;
    size_t a = c * OPT_CHUNK, b = a + OPT_CHUNK;
    if (b > j->ctx->n_params) b = j->ctx->n_params;
    j->partial[c] = cpu_sumsq(j->ctx->isa, j->ctx->grads + a, b - a);
}

static void adamw_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    opt_job *j = arg;
    orch_engine_ctx *ctx = j->ctx;
    const size_t lo = j->lo + c * OPT_CHUNK;
    const size_t hi = lo + OPT_CHUNK < j->hi ? lo + OPT_CHUNK : j->hi;
    const size_t m0 = (size_t)ctx->sh_off; /* moments start at the shard */
    for (uint32_t t = 0; t < ctx->n_tensors; t++) {
        const cpu_tensor *ti = &ctx->tensors[t];
        size_t a = ti->offset > lo ? ti->offset : lo;
        size_t b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
        if (a >= b) continue;
        cpu_adamw_consts k = j->base;
        k.decay = engine_adamw_decay(j->p, ti->flags);
        cpu_adamw(ctx->isa, ctx->params + a, ctx->grads + a, ctx->adam_m + (a - m0),
                  ctx->adam_v + (a - m0), b - a, &k);
    }
}

int32_t cpu_train_optimizer_step(orch_engine_ctx *ctx, const orch_adamw_params *p,
                                 float *out_norm) {
    int32_t st = cpu_ensure_train_state(ctx);
    if (st != ORCH_OK) return st;
    const size_t chunks = (ctx->n_params + OPT_CHUNK - 1) / OPT_CHUNK;
    opt_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.partial = calloc(chunks ? chunks : 1, sizeof(double));
    if (!j.partial)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "optimizer_step: out of memory");
    cpu_pool_for(ctx->pool, chunks, sumsq_chunk, &j);
    double sq = 0.0;
    for (size_t c = 0; c < chunks; c++) sq += j.partial[c];
    free(j.partial);
    double norm = sqrt(sq);
    if (!isfinite(norm)) return engine_fail_nonfinite_norm(ENGINE_ERRBUF(ctx));
    j.p = p;
    j.lo = 0;
    j.hi = ctx->n_params;
    engine_adamw_consts_init(p, &j.base);
    j.base.gscale = engine_grad_clip_scale(p, norm);
    cpu_pool_for(ctx->pool, chunks, adamw_chunk, &j);
    cpu_params_changed(ctx);
    if (out_norm) *out_norm = (float)norm;
    return ORCH_OK;
}

int32_t cpu_train_optimizer_step_range(orch_engine_ctx *ctx, const orch_adamw_params *p,
                                       uint64_t off, uint64_t count, double norm) {
    int32_t st = cpu_ensure_train_state(ctx);
    if (st != ORCH_OK) return st;
    if (count == 0) return ORCH_OK;
    opt_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.p = p;
    j.lo = (size_t)off;
    j.hi = (size_t)(off + count);
    engine_adamw_consts_init(p, &j.base);
    j.base.gscale = engine_grad_clip_scale(p, norm);
    cpu_pool_for(ctx->pool, ((size_t)count + OPT_CHUNK - 1) / OPT_CHUNK, adamw_chunk, &j);
    cpu_params_changed(ctx);
    return ORCH_OK;
}
