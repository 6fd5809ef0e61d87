/*
 * cpu_ft_stream.c - token-level fine-tuning streams (see cpu_ft_stream.h):
 * the stream set, the saved activations, the forward and backward chunks of
 * GPT-2 and LLaMA, ft_stream_open / ft_stream_close / coserve_step.
 */
#include "engines/cpu/cpu_ft_stream.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engines/cpu/cpu_coserve.h"
#include "engines/cpu/cpu_llama.h"
#include "engines/cpu/cpu_llama_infer.h"
#include "engines/cpu/cpu_lora.h"

/* Rows of one chunk at most (a step with more rows runs several chunks);
 * query rows per attention block (as the training paths); logits rows of
 * one head product. */
#define FT_CHUNK_ROWS 256
#define ATT_QB        128
#define FT_HEAD_ROWS  128
/* Rows per row-job chunk at least: a chunk of a few rows (the usual step)
 * runs on the calling thread instead of waking the pool for microseconds of
 * work. */
#define ROW_MIN    32
#define ROW_CHUNKS 4
/* Open streams of one context at most. */
#define FT_MAX_STREAMS 1024u

/* ------------------------------------------------------------------------- */
/* The stream                                                                 */
/* ------------------------------------------------------------------------- */

typedef struct ft_layer {
    float *res_in, *mean1, *rstd1; /* [BT,C], [BT] x 2 (mean: GPT-2 only) */
    float *qkv;                    /* [BT,QS] q|k|v (LLaMA: after RoPE) */
    float *amax, *aisum;           /* [B,NH,T] softmax statistics */
    float *atty, *res_mid;         /* [BT,C] */
    float *mean2, *rstd2;          /* [BT] */
    float *mlp;                    /* [BT,MW]: GPT-2 c_fc before GELU, LLaMA gate|up */
    float *dkv;                    /* [BT,2*KVD]: dK|dV accumulators */
} ft_layer;

typedef struct cpu_ft_stream {
    uint32_t id, adapter_id;
    cpu_lora *lo;
    uint32_t B, T;
    size_t BT, counted;
    float grad_scale;
    int32_t *tokens, *targets; /* copies [BT] */
    size_t fwd, bwd;           /* rows done */
    int finished, broken;
    float loss;
    size_t bytes; /* of mem (0 once released) */
    float *mem;
    ft_layer *layer; /* [L] */
    float *res_out, *meanf, *rstdf, *dlnf, *row_loss;
    size_t SR; /* chunk scratch rows */
    float *xn, *g1, *g2, *logits, *dres, *dx, *dmlp, *dh, *datty, *dqkv, *att;
    float *grads; /* [lo->n_params] */
} cpu_ft_stream;

typedef struct cpu_ft_set {
    cpu_ft_stream **items;
    uint32_t n, cap;
    uint32_t next_id;
    size_t bytes; /* of the open streams */
} cpu_ft_set;

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

typedef struct dims {
    size_t C, M, V, NH, KVH, HS, KVD, QS, DKV, MW;
    int llama;
} dims;

static dims dims_of(const orch_engine_ctx *ctx) {
    dims d;
    d.llama = ctx->arch == ORCH_ARCH_LLAMA;
    d.C = ctx->C;
    d.M = ctx->M;
    d.V = ctx->V;
    d.NH = ctx->NH;
    d.KVH = ctx->KVH;
    d.HS = ctx->HS;
    d.KVD = ctx->KVD;
    d.QS = d.C + 2 * d.KVD;
    d.DKV = 2 * d.KVD;
    d.MW = d.llama ? 2 * d.M : d.M;
    return d;
}

/* Lay the stream's buffers out from base (NULL: count only); returns floats. */
static size_t carve(const orch_engine_ctx *ctx, cpu_ft_stream *s, float *base, uint32_t B,
                    uint32_t T, uint64_t n_params) {
    const dims d = dims_of(ctx);
    const size_t BT = (size_t)B * T, NHT = (size_t)B * d.NH * T;
    const size_t SR = BT < FT_CHUNK_ROWS ? BT : FT_CHUNK_ROWS;
    const size_t HR = SR < FT_HEAD_ROWS ? SR : FT_HEAD_ROWS;
    const size_t qb = T < ATT_QB ? T : ATT_QB;
    size_t used = 0;
#define CARVE(n) (used += al16(n), base ? base + used - al16(n) : NULL)
    for (uint32_t l = 0; l < ctx->L; l++) {
        ft_layer la;
        la.res_in = CARVE(BT * d.C);
        la.mean1 = CARVE(BT);
        la.rstd1 = CARVE(BT);
        la.qkv = CARVE(BT * d.QS);
        la.amax = CARVE(NHT);
        la.aisum = CARVE(NHT);
        la.atty = CARVE(BT * d.C);
        la.res_mid = CARVE(BT * d.C);
        la.mean2 = CARVE(BT);
        la.rstd2 = CARVE(BT);
        la.mlp = CARVE(BT * d.MW);
        la.dkv = CARVE(BT * d.DKV);
        if (s) s->layer[l] = la;
    }
    float *res_out = CARVE(BT * d.C), *meanf = CARVE(BT), *rstdf = CARVE(BT);
    float *dlnf = CARVE(BT * d.C), *row_loss = CARVE(BT);
    float *xn = CARVE(SR * d.C), *g1 = CARVE(SR * d.M), *g2 = CARVE(SR * d.M);
    float *logits = CARVE(HR * d.V), *dres = CARVE(SR * d.C), *dx = CARVE(SR * d.C);
    float *dmlp = CARVE(SR * d.MW), *dh = CARVE(SR * d.M), *datty = CARVE(SR * d.C);
    float *dqkv = CARVE(SR * d.QS);
    float *att = CARVE((size_t)ctx->threads * 2 * qb * T);
    float *grads = CARVE((size_t)n_params);
#undef CARVE
    if (s) {
        s->res_out = res_out;
        s->meanf = meanf;
        s->rstdf = rstdf;
        s->dlnf = dlnf;
        s->row_loss = row_loss;
        s->SR = SR;
        s->xn = xn;
        s->g1 = g1;
        s->g2 = g2;
        s->logits = logits;
        s->dres = dres;
        s->dx = dx;
        s->dmlp = dmlp;
        s->dh = dh;
        s->datty = datty;
        s->dqkv = dqkv;
        s->att = att;
        s->grads = grads;
    }
    return used;
}

size_t cpu_ft_stream_bytes(const orch_engine_ctx *ctx, uint32_t B, uint32_t T,
                           uint64_t n_params) {
    return carve(ctx, NULL, NULL, B, T, n_params) * sizeof(float) +
           2 * (size_t)B * T * sizeof(int32_t) + ctx->L * sizeof(ft_layer);
}

/* Release the activations (a finished stream keeps only its state). */
static void stream_release(orch_engine_ctx *ctx, cpu_ft_stream *s) {
    if (ctx->ft) ctx->ft->bytes -= s->bytes;
    s->bytes = 0;
    free(s->mem);
    free(s->layer);
    free(s->tokens);
    free(s->targets);
    s->mem = NULL;
    s->layer = NULL;
    s->tokens = s->targets = NULL;
}

static void stream_free(orch_engine_ctx *ctx, cpu_ft_stream *s) {
    if (!s) return;
    stream_release(ctx, s);
    free(s);
}

void cpu_ft_free_all(orch_engine_ctx *ctx) {
    cpu_ft_set *set = ctx->ft;
    if (!set) return;
    for (uint32_t i = 0; i < set->n; i++) stream_free(ctx, set->items[i]);
    free(set->items);
    free(set);
    ctx->ft = NULL;
}

static cpu_ft_stream *stream_find(orch_engine_ctx *ctx, uint32_t id, uint32_t *index) {
    const cpu_ft_set *set = ctx->ft;
    for (uint32_t i = 0; set && i < set->n; i++)
        if (set->items[i]->id == id) {
            if (index) *index = i;
            return set->items[i];
        }
    return NULL;
}

uint32_t cpu_ft_adapter_stream(const orch_engine_ctx *ctx, uint32_t adapter_id) {
    const cpu_ft_set *set = ctx->ft;
    for (uint32_t i = 0; set && i < set->n; i++)
        if (set->items[i]->adapter_id == adapter_id) return set->items[i]->id;
    return 0;
}

/* Half of the physical memory (8 GiB where it cannot be read). */
static size_t stream_budget(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return (size_t)8 << 30;
    return (size_t)pages / 2 * (size_t)page;
}

/* ------------------------------------------------------------------------- */
/* Row jobs                                                                   */
/* ------------------------------------------------------------------------- */

enum {
    R_LN,
    R_LN_BWD,
    R_RMS,
    R_RMS_BWD,
    R_GELU,
    R_SWIGLU,
    R_SWIGLU_BWD,
    R_ROPE,
    R_EMBED
};

/* Local row i of a job is global row r0 + i (its position (r0 + i) % T). */
typedef struct row_job {
    orch_engine_ctx *ctx;
    int op, inverse;
    size_t rows, chunks, r0;
    uint32_t T;
    const float *x, *w, *b, *dy;
    float *out, *mean, *rstd, *th;
    const int32_t *tokens; /* of row r0 */
} row_job;

static void row_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const row_job *j = arg;
    const orch_engine_ctx *ctx = j->ctx;
    const dims d = dims_of(ctx);
    size_t a, e;
    cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &a, &e);
    for (size_t i = a; i < e; i++) {
        const uint32_t pos = (uint32_t)((j->r0 + i) % j->T);
        switch (j->op) {
        case R_LN:
            cpu_layernorm(ctx->isa, j->x + i * d.C, j->out + i * d.C, j->w, j->b, d.C,
                          ctx->eps, j->mean ? j->mean + i : NULL,
                          j->rstd ? j->rstd + i : NULL);
            break;
        case R_LN_BWD:
            cpu_layernorm_backward(ctx->isa, j->dy + i * d.C, j->x + i * d.C, j->w,
                                   j->mean[i], j->rstd[i], j->out + i * d.C, d.C);
            break;
        case R_RMS:
            cpu_llama_rmsnorm(j->x + i * d.C, j->out + i * d.C, j->w, d.C, ctx->eps,
                              j->rstd ? j->rstd + i : NULL);
            break;
        case R_RMS_BWD:
            cpu_llama_rmsnorm_backward(j->dy + i * d.C, j->x + i * d.C, j->w, j->rstd[i],
                                       j->out + i * d.C, d.C);
            break;
        case R_GELU:
            cpu_gelu(ctx->isa, j->x + i * d.M, j->th + i * d.M, j->out + i * d.M, d.M);
            break;
        case R_SWIGLU: cpu_llama_swiglu(j->x + i * 2 * d.M, j->out + i * d.M, d.M); break;
        case R_SWIGLU_BWD:
            cpu_llama_swiglu_backward(j->x + i * 2 * d.M, j->dy + i * d.M,
                                      j->out + i * 2 * d.M, d.M);
            break;
        case R_ROPE: { /* q heads, then k heads of row i (qkv or dqkv) */
            float *row = j->out + i * d.QS;
            cpu_llama_rope(ctx->llama, row, d.NH, d.HS, pos, j->inverse);
            cpu_llama_rope(ctx->llama, row + d.C, d.KVH, d.HS, pos, j->inverse);
            break;
        }
        case R_EMBED: {
            const size_t tok = (size_t)j->tokens[i];
            if (d.llama)
                memcpy(j->out + i * d.C, j->w + tok * d.C, d.C * sizeof(float));
            else
                cpu_add(ctx->isa, j->w + tok * d.C, j->b + pos * d.C, j->out + i * d.C,
                        d.C);
            break;
        }
        default: break;
        }
    }
}

static void run_rows(orch_engine_ctx *ctx, row_job *j) {
    j->ctx = ctx;
    j->chunks = cpu_pool_chunks(ctx->pool, j->rows, ROW_MIN, ROW_CHUNKS);
    cpu_pool_for(ctx->pool, j->chunks, row_chunk, j);
}

/* Norm of rows (LayerNorm for GPT-2, RMSNorm for LLaMA), stats saved when
 * mean/rstd are set (LLaMA ignores mean). */
static void norm_rows(orch_engine_ctx *ctx, const float *x, float *out, float *mean,
                      float *rstd, const float *w, const float *b, size_t rows) {
    row_job j = { .op = ctx->arch == ORCH_ARCH_LLAMA ? R_RMS : R_LN,
                  .rows = rows,
                  .T = 1,
                  .x = x,
                  .w = w,
                  .b = b,
                  .out = out,
                  .mean = mean,
                  .rstd = rstd };
    run_rows(ctx, &j);
}

/* dx += the norm's backward of dy. */
static void norm_bwd_rows(orch_engine_ctx *ctx, const float *dy, const float *x,
                          float *mean, float *rstd, const float *w, float *dx,
                          size_t rows) {
    row_job j = { .op = ctx->arch == ORCH_ARCH_LLAMA ? R_RMS_BWD : R_LN_BWD,
                  .rows = rows,
                  .T = 1,
                  .x = x,
                  .w = w,
                  .dy = dy,
                  .out = dx,
                  .mean = mean,
                  .rstd = rstd };
    run_rows(ctx, &j);
}

/* ------------------------------------------------------------------------- */
/* Weights                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct ft_weights {
    const float *n1w, *n1b, *qkv, *qkvb, *o, *ob, *n2w, *n2b, *up, *upb, *down, *downb;
} ft_weights;

static ft_weights weights_of(const orch_engine_ctx *ctx, uint32_t l) {
    ft_weights w;
    memset(&w, 0, sizeof w);
    if (ctx->arch == ORCH_ARCH_LLAMA) {
        float *P = ctx->params;
        w.n1w = cpu_llama_tensor(ctx, P, l, LL_IN_NORM);
        w.qkv = cpu_llama_tensor(ctx, P, l, LL_Q);
        w.o = cpu_llama_tensor(ctx, P, l, LL_O);
        w.n2w = cpu_llama_tensor(ctx, P, l, LL_POST_NORM);
        w.up = cpu_llama_tensor(ctx, P, l, LL_GATE);
        w.down = cpu_llama_tensor(ctx, P, l, LL_DOWN);
        return w;
    }
    const cpu_layer_view *v = &ctx->pv.layer[l];
    w.n1w = v->ln1_w;
    w.n1b = v->ln1_b;
    w.qkv = v->qkv_w;
    w.qkvb = v->qkv_b;
    w.o = v->ap_w;
    w.ob = v->ap_b;
    w.n2w = v->ln2_w;
    w.n2b = v->ln2_b;
    w.up = v->fc_w;
    w.upb = v->fc_b;
    w.down = v->mp_w;
    w.downb = v->mp_b;
    return w;
}

static const float *head_of(const orch_engine_ctx *ctx) {
    return ctx->arch == ORCH_ARCH_LLAMA ? cpu_llama_head(ctx, ctx->params) : ctx->pv.wte;
}

static const float *normf_w(const orch_engine_ctx *ctx) {
    return ctx->arch == ORCH_ARCH_LLAMA ? cpu_llama_norm(ctx, ctx->params)
                                        : ctx->pv.lnf_w;
}

static const float *normf_b(const orch_engine_ctx *ctx) {
    return ctx->arch == ORCH_ARCH_LLAMA ? NULL : ctx->pv.lnf_b;
}

/* ------------------------------------------------------------------------- */
/* Attention of a chunk                                                       */
/* ------------------------------------------------------------------------- */

/* The chunk's rows of one sequence b: positions [ta, tb), local rows from row0. */
typedef struct seg {
    uint32_t b, ta, tb;
    size_t row0;
} seg;

static uint32_t segments(const cpu_ft_stream *s, size_t r0, size_t r1, seg *out) {
    uint32_t n = 0;
    for (size_t r = r0; r < r1;) {
        const uint32_t b = (uint32_t)(r / s->T), ta = (uint32_t)(r % s->T);
        const size_t end = (size_t)(b + 1) * s->T < r1 ? (size_t)(b + 1) * s->T : r1;
        out[n].b = b;
        out[n].ta = ta;
        out[n].tb = (uint32_t)(end - (size_t)b * s->T);
        out[n].row0 = r - r0;
        n++;
        r = end;
    }
    return n;
}

typedef struct att_job {
    const orch_engine_ctx *ctx;
    const cpu_ft_stream *s;
    const ft_layer *la;
    const seg *segs;
    const float *datty; /* backward when set: [chunk rows, C] */
    float *dqkv;        /* [chunk rows, QS] */
    size_t tasks, chunks;
} att_job;

/* Forward of the chunk's queries of (segment, query head h). */
static void att_fwd(const att_job *j, const seg *sg, uint32_t h, float *P) {
    const orch_engine_ctx *ctx = j->ctx;
    const dims d = dims_of(ctx);
    const size_t T = j->s->T;
    const uint32_t kvh = h / (uint32_t)(d.NH / d.KVH);
    const float scale = 1.0f / sqrtf((float)d.HS);
    const float *base = j->la->qkv + sg->b * T * d.QS;
    const float *q = base + h * d.HS, *k = base + d.C + kvh * d.HS, *v = k + d.KVD;
    const size_t st = (sg->b * d.NH + h) * T;
    float *out = j->la->atty + sg->b * T * d.C + h * d.HS;
    for (uint32_t i0 = sg->ta; i0 < sg->tb; i0 += ATT_QB) {
        const int nq = (int)(sg->tb - i0 < ATT_QB ? sg->tb - i0 : ATT_QB);
        const int nk = (int)i0 + nq;
        cpu_attn_probs(ctx, q, k, d.QS, (int)i0, nq, scale, j->la->amax + st,
                       j->la->aisum + st, 1, P);
        cpu_sgemm1(0, 0, nq, (int)d.HS, nk, 1.0f, P, nk, v, (int)d.QS, 0.0f,
                   out + (size_t)i0 * d.C, (int)d.C);
    }
}

/* Backward of the chunk's queries of (segment, key/value head kvh): dq of
 * the chunk's rows; dK and dV of keys 0 .. tb-1 added to the accumulators. */
static void att_bwd(const att_job *j, const seg *sg, uint32_t kvh, float *P, float *dS) {
    const orch_engine_ctx *ctx = j->ctx;
    const dims d = dims_of(ctx);
    const size_t T = j->s->T;
    const size_t G = d.NH / d.KVH;
    const float scale = 1.0f / sqrtf((float)d.HS);
    const float *base = j->la->qkv + sg->b * T * d.QS;
    const float *k = base + d.C + kvh * d.HS, *v = k + d.KVD;
    float *dk = j->la->dkv + sg->b * T * d.DKV + kvh * d.HS, *dv = dk + d.KVD;
    for (size_t g = 0; g < G; g++) {
        const size_t h = kvh * G + g;
        const float *q = base + h * d.HS;
        const size_t st = (sg->b * d.NH + h) * T;
        const float *dy = j->datty + sg->row0 * d.C + h * d.HS;
        float *dq = j->dqkv + sg->row0 * d.QS + h * d.HS;
        for (uint32_t i0 = sg->ta; i0 < sg->tb; i0 += ATT_QB) {
            const int nq = (int)(sg->tb - i0 < ATT_QB ? sg->tb - i0 : ATT_QB);
            const int nk = (int)i0 + nq;
            const float *dyb = dy + (size_t)(i0 - sg->ta) * d.C;
            cpu_attn_probs(ctx, q, k, d.QS, (int)i0, nq, scale, j->la->amax + st,
                           j->la->aisum + st, 0, P);
            cpu_sgemm1(0, 1, nq, nk, (int)d.HS, 1.0f, dyb, (int)d.C, v, (int)d.QS, 0.0f,
                       dS, nk);
            cpu_sgemm1(1, 0, nk, (int)d.HS, nq, 1.0f, P, nk, dyb, (int)d.C, 1.0f, dv,
                       (int)d.DKV);
            for (int r = 0; r < nq; r++) {
                const float *p = P + (size_t)r * nk;
                float *dd = dS + (size_t)r * nk;
                const int n = (int)i0 + r + 1;
                float dot = 0.0f;
                for (int jj = 0; jj < n; jj++) dot += p[jj] * dd[jj];
                for (int jj = 0; jj < n; jj++) dd[jj] = p[jj] * (dd[jj] - dot) * scale;
                for (int jj = n; jj < nk; jj++) dd[jj] = 0.0f;
            }
            cpu_sgemm1(0, 0, nq, (int)d.HS, nk, 1.0f, dS, nk, k, (int)d.QS, 0.0f,
                       dq + (size_t)(i0 - sg->ta) * d.QS, (int)d.QS);
            cpu_sgemm1(1, 0, nk, (int)d.HS, nq, 1.0f, dS, nk, q + (size_t)i0 * d.QS,
                       (int)d.QS, 1.0f, dk, (int)d.DKV);
        }
    }
}

/* One chunk = a range of (segment, head) tasks; scratch belongs to the thread. */
static void att_chunk(void *arg, size_t c, int tid) {
    const att_job *j = arg;
    const size_t T = j->s->T, qb = T < ATT_QB ? T : ATT_QB;
    float *P = j->s->att + (size_t)tid * 2 * qb * T;
    size_t a, e;
    cpu_pool_range(j->tasks, (int)c, (int)j->chunks, 1, &a, &e);
    for (size_t t = a; t < e; t++) {
        if (j->datty) {
            const uint32_t KVH = j->ctx->KVH;
            att_bwd(j, &j->segs[t / KVH], (uint32_t)(t % KVH), P, P + qb * T);
        } else {
            const uint32_t NH = j->ctx->NH;
            att_fwd(j, &j->segs[t / NH], (uint32_t)(t % NH), P);
        }
    }
}

/* The attention of a chunk of R rows: (segment, head) tasks, several per
 * pool chunk when they are small (about 32k query-key pairs per chunk at
 * least), so a step of a few rows does not wake the pool for microseconds. */
static void run_att(orch_engine_ctx *ctx, att_job *j, uint32_t nseg, size_t heads,
                    size_t R) {
    j->tasks = (size_t)nseg * heads;
    const size_t per = ((size_t)1 << 15) / (R * j->s->T * (heads ? heads : 1)) + 1;
    j->chunks = cpu_pool_chunks(ctx->pool, j->tasks, per, 1);
    cpu_pool_for(ctx->pool, j->chunks, att_chunk, j);
}

/* ------------------------------------------------------------------------- */
/* Forward and backward chunks                                                */
/* ------------------------------------------------------------------------- */

static void linear(orch_engine_ctx *ctx, size_t R, size_t N, size_t K, const float *in,
                   const float *W, const float *bias, const float *resid, float *out,
                   float *gelu_tanh, float *gelu_out) {
    cpu_linear_fwd f = { .R = (int)R,
                         .N = (int)N,
                         .K = (int)K,
                         .in = in,
                         .ldin = (int)K,
                         .W = W,
                         .bias = bias,
                         .resid = resid,
                         .ldresid = (int)N,
                         .out = out,
                         .ldout = (int)N,
                         .gelu_tanh = gelu_tanh,
                         .gelu_out = gelu_out };
    cpu_linear_forward(ctx, &f);
}

/* din (+= with acc) = dout W (GELU'(gelu_x) applied when set); no dW. */
static void linear_bwd(orch_engine_ctx *ctx, size_t R, size_t N, size_t K,
                       const float *dout, const float *in, const float *W, float *din,
                       int acc, const float *gelu_x, const float *gelu_tanh) {
    cpu_linear_bwd b = { .R = (int)R,
                         .N = (int)N,
                         .K = (int)K,
                         .dout = dout,
                         .lddout = (int)N,
                         .in = in,
                         .ldin = (int)K,
                         .W = W,
                         .din = din,
                         .lddin = (int)K,
                         .din_accumulate = acc,
                         .gelu_x = gelu_x,
                         .gelu_tanh = gelu_tanh };
    cpu_linear_backward(ctx, &b);
}

/* Forward of rows [r0, r1) (r1 - r0 <= SR): every layer, the head, the row
 * losses and d(final norm output) of the rows. */
static void fwd_chunk(orch_engine_ctx *ctx, cpu_ft_stream *s, size_t r0, size_t r1) {
    const dims d = dims_of(ctx);
    const size_t R = r1 - r0;
    const cpu_lora *lo = s->lo;
    seg segs[FT_CHUNK_ROWS + 1];
    const uint32_t nseg = segments(s, r0, r1, segs);
    row_job ej = { .op = R_EMBED,
                   .rows = R,
                   .r0 = r0,
                   .T = s->T,
                   .w = d.llama ? cpu_llama_embed(ctx, ctx->params) : ctx->pv.wte,
                   .b = d.llama ? NULL : ctx->pv.wpe,
                   .out = s->layer[0].res_in + r0 * d.C,
                   .tokens = s->tokens + r0 };
    run_rows(ctx, &ej);
    for (uint32_t l = 0; l < ctx->L; l++) {
        const ft_layer *la = &s->layer[l];
        const ft_weights w = weights_of(ctx, l);
        const float *x = la->res_in + r0 * d.C;
        float *mid = la->res_mid + r0 * d.C, *qkv = la->qkv + r0 * d.QS;
        float *atty = la->atty + r0 * d.C, *mlp = la->mlp + r0 * d.MW;
        float *out = (l + 1 < ctx->L ? s->layer[l + 1].res_in : s->res_out) + r0 * d.C;
        norm_rows(ctx, x, s->xn, la->mean1 + r0, la->rstd1 + r0, w.n1w, w.n1b, R);
        linear(ctx, R, d.QS, d.C, s->xn, w.qkv, w.qkvb, NULL, qkv, NULL, NULL);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_QKV, R, s->xn, d.C, qkv, d.QS);
        if (d.llama) {
            row_job rj = { .op = R_ROPE, .rows = R, .r0 = r0, .T = s->T, .out = qkv };
            run_rows(ctx, &rj);
        }
        att_job aj = { ctx, s, la, segs, NULL, NULL, 0, 0 };
        run_att(ctx, &aj, nseg, d.NH, R);
        linear(ctx, R, d.C, d.C, atty, w.o, w.ob, x, mid, NULL, NULL);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_OUT, R, atty, d.C, mid, d.C);
        norm_rows(ctx, mid, s->xn, la->mean2 + r0, la->rstd2 + r0, w.n2w, w.n2b, R);
        if (d.llama) {
            linear(ctx, R, d.MW, d.C, s->xn, w.up, NULL, NULL, mlp, NULL, NULL);
            cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_UP, R, s->xn, d.C, mlp,
                             d.MW);
            row_job sj = { .op = R_SWIGLU, .rows = R, .T = 1, .x = mlp, .out = s->g2 };
            run_rows(ctx, &sj);
        } else {
            linear(ctx, R, d.M, d.C, s->xn, w.up, w.upb, NULL, mlp, s->g1, s->g2);
            if (cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_UP, R, s->xn, d.C, mlp,
                                 d.M)) { /* GELU again, of the adapted pre-activation */
                row_job gj = {
                    .op = R_GELU, .rows = R, .T = 1, .x = mlp, .th = s->g1, .out = s->g2
                };
                run_rows(ctx, &gj);
            }
        }
        linear(ctx, R, d.C, d.M, s->g2, w.down, w.downb, mid, out, NULL, NULL);
        cpu_lora_forward(ctx, lo, l, ORCH_LORA_TARGET_MLP_DOWN, R, s->g2, d.M, out, d.C);
    }
    norm_rows(ctx, s->res_out + r0 * d.C, s->xn, s->meanf + r0, s->rstdf + r0,
              normf_w(ctx), normf_b(ctx), R);
    const float dscale = s->grad_scale / (float)s->counted;
    const size_t HR = s->SR < FT_HEAD_ROWS ? s->SR : FT_HEAD_ROWS;
    for (size_t h0 = 0; h0 < R; h0 += HR) {
        const size_t n = R - h0 < HR ? R - h0 : HR;
        linear(ctx, n, d.V, d.C, s->xn + h0 * d.C, head_of(ctx), NULL, NULL, s->logits,
               NULL, NULL);
        cpu_train_ce_rows(ctx, s->logits, s->targets + r0 + h0, s->row_loss + r0 + h0, n,
                          dscale, 1);
        linear_bwd(ctx, n, d.V, d.C, s->logits, s->xn + h0 * d.C, head_of(ctx),
                   s->dlnf + (r0 + h0) * d.C, 0, NULL, NULL);
    }
}

/* Backward of rows [r0, r1), every row above r1 done already. */
static void bwd_chunk(orch_engine_ctx *ctx, cpu_ft_stream *s, size_t r0, size_t r1) {
    const dims d = dims_of(ctx);
    const size_t R = r1 - r0;
    const cpu_lora *lo = s->lo;
    seg segs[FT_CHUNK_ROWS + 1];
    const uint32_t nseg = segments(s, r0, r1, segs);
    memset(s->dres, 0, R * d.C * sizeof(float));
    norm_bwd_rows(ctx, s->dlnf + r0 * d.C, s->res_out + r0 * d.C, s->meanf + r0,
                  s->rstdf + r0, normf_w(ctx), s->dres, R);
    for (uint32_t l = ctx->L; l-- > 0;) {
        const ft_layer *la = &s->layer[l];
        const ft_weights w = weights_of(ctx, l);
        const float *x = la->res_in + r0 * d.C, *mid = la->res_mid + r0 * d.C;
        const float *atty = la->atty + r0 * d.C, *mlp = la->mlp + r0 * d.MW;
        int acc;
        /* MLP: dres is the gradient of the layer output. */
        if (d.llama) {
            norm_rows(ctx, mid, s->xn, NULL, NULL, w.n2w, NULL, R);
            row_job sj = { .op = R_SWIGLU, .rows = R, .T = 1, .x = mlp, .out = s->g2 };
            run_rows(ctx, &sj);
            acc = cpu_lora_backward_to(ctx, lo, s->grads, l, ORCH_LORA_TARGET_MLP_DOWN, R,
                                       s->g2, d.M, s->dres, d.C, s->dh, d.M);
            linear_bwd(ctx, R, d.C, d.M, s->dres, s->g2, w.down, s->dh, acc, NULL, NULL);
            row_job sb = { .op = R_SWIGLU_BWD,
                           .rows = R,
                           .T = 1,
                           .x = mlp,
                           .dy = s->dh,
                           .out = s->dmlp };
            run_rows(ctx, &sb);
        } else {
            row_job gj = {
                .op = R_GELU, .rows = R, .T = 1, .x = mlp, .th = s->g1, .out = s->g2
            };
            run_rows(ctx, &gj);
            acc = cpu_lora_backward_to(ctx, lo, s->grads, l, ORCH_LORA_TARGET_MLP_DOWN, R,
                                       s->g2, d.M, s->dres, d.C, s->dmlp, d.M);
            linear_bwd(ctx, R, d.C, d.M, s->dres, s->g2, w.down, s->dmlp, acc, mlp,
                       s->g1);
            norm_rows(ctx, mid, s->xn, NULL, NULL, w.n2w, w.n2b, R);
        }
        acc = cpu_lora_backward_to(ctx, lo, s->grads, l, ORCH_LORA_TARGET_MLP_UP, R,
                                   s->xn, d.C, s->dmlp, d.MW, s->dx, d.C);
        linear_bwd(ctx, R, d.MW, d.C, s->dmlp, s->xn, w.up, s->dx, acc, NULL, NULL);
        norm_bwd_rows(ctx, s->dx, mid, la->mean2 + r0, la->rstd2 + r0, w.n2w, s->dres, R);
        /* Attention: dres is now the gradient of res_mid. */
        acc = cpu_lora_backward_to(ctx, lo, s->grads, l, ORCH_LORA_TARGET_ATTN_OUT, R,
                                   atty, d.C, s->dres, d.C, s->datty, d.C);
        linear_bwd(ctx, R, d.C, d.C, s->dres, atty, w.o, s->datty, acc, NULL, NULL);
        att_job aj = { ctx, s, la, segs, s->datty, s->dqkv, 0, 0 };
        run_att(ctx, &aj, nseg, d.KVH, R);
        /* The chunk's dK|dV rows are complete now. */
        for (size_t i = 0; i < R; i++)
            memcpy(s->dqkv + i * d.QS + d.C, la->dkv + (r0 + i) * d.DKV,
                   d.DKV * sizeof(float));
        if (d.llama) {
            row_job rj = {
                .op = R_ROPE, .rows = R, .r0 = r0, .T = s->T, .out = s->dqkv, .inverse = 1
            };
            run_rows(ctx, &rj);
        }
        norm_rows(ctx, x, s->xn, NULL, NULL, w.n1w, w.n1b, R);
        acc = cpu_lora_backward_to(ctx, lo, s->grads, l, ORCH_LORA_TARGET_ATTN_QKV, R,
                                   s->xn, d.C, s->dqkv, d.QS, s->dx, d.C);
        linear_bwd(ctx, R, d.QS, d.C, s->dqkv, s->xn, w.qkv, s->dx, acc, NULL, NULL);
        norm_bwd_rows(ctx, s->dx, x, la->mean1 + r0, la->rstd1 + r0, w.n1w, s->dres, R);
    }
    /* The embedding is frozen: nothing below layer 0. */
}

/* ------------------------------------------------------------------------- */
/* Steps                                                                      */
/* ------------------------------------------------------------------------- */

typedef struct step_job {
    cpu_ft_stream *s;
    size_t rows, done;
} step_job;

/* Up to j->rows rows of the stream's work (the driver of cpu_coserve_run). */
static int32_t step_run(orch_engine_ctx *ctx, void *arg) {
    step_job *j = arg;
    cpu_ft_stream *s = j->s;
    size_t left = j->rows;
    while (left > 0 && s->fwd < s->BT) {
        size_t n = s->BT - s->fwd;
        if (n > left) n = left;
        if (n > s->SR) n = s->SR;
        if (s->counted > 0) fwd_chunk(ctx, s, s->fwd, s->fwd + n);
        s->fwd += n;
        left -= n;
        j->done += n;
        if (s->fwd == s->BT && s->counted > 0) {
            double total = 0.0;
            for (size_t r = 0; r < s->BT; r++) total += s->row_loss[r];
            s->loss = (float)(total / (double)s->counted);
        }
    }
    while (left > 0 && s->fwd == s->BT && s->bwd < s->BT) {
        size_t n = s->BT - s->bwd;
        if (n > left) n = left;
        if (n > s->SR) n = s->SR;
        const size_t hi = s->BT - s->bwd;
        if (s->counted > 0) bwd_chunk(ctx, s, hi - n, hi);
        s->bwd += n;
        left -= n;
        j->done += n;
    }
    if (s->bwd == s->BT && !s->finished) {
        if (s->counted > 0) /* out may alias a */
            cpu_add(ctx->isa, s->lo->grads, s->grads, s->lo->grads,
                    (size_t)s->lo->n_params);
        s->finished = 1;
        stream_release(ctx, s);
    }
    return ORCH_OK;
}

static void fill_progress(const cpu_ft_stream *s, uint64_t rows, orch_ft_progress *p) {
    if (s)
        engine_ft_progress_fill(p, 1, s->finished, s->BT, s->fwd, s->bwd, rows, s->loss);
    else
        engine_ft_progress_fill(p, 0, 0, 0, 0, 0, 0, 0.0f);
}

/* ------------------------------------------------------------------------- */
/* The ABI calls                                                              */
/* ------------------------------------------------------------------------- */

int32_t cpu_ft_stream_open(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                           uint32_t *out_stream) {
    const char *fn = "ft_stream_open";
    if (!ft) return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: ft is NULL", fn);
    if (!out_stream)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: out_stream is NULL", fn);
    cpu_lora *lo = NULL;
    int32_t st = cpu_coserve_check_ft(ctx, fn, ft, &lo);
    if (st != ORCH_OK) return st;
    if (!ctx->ft) {
        ctx->ft = calloc(1, sizeof *ctx->ft);
        if (!ctx->ft)
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        ctx->ft->next_id = 1;
    }
    cpu_ft_set *set = ctx->ft;
    if (set->n >= FT_MAX_STREAMS)
        return cpu_fail(ctx, ORCH_ERR_CAPACITY, "%s: %u streams are open (the most)", fn,
                        set->n);
    if (set->next_id == 0)
        return cpu_fail(ctx, ORCH_ERR_CAPACITY, "%s: stream ids are exhausted", fn);
    const uint32_t B = ft->batch, T = ft->seq_len;
    const size_t bytes = cpu_ft_stream_bytes(ctx, B, T, lo->n_params);
    const size_t budget = stream_budget();
    if (bytes > budget || set->bytes > budget - bytes)
        return cpu_fail(
            ctx, ORCH_ERR_CAPACITY,
            "%s: a stream of batch %u x seq_len %u needs %zu MiB; with the %zu "
            "MiB of the %u open streams that exceeds the %zu MiB limit (half "
            "of the physical memory)",
            fn, B, T, bytes >> 20, set->bytes >> 20, set->n, budget >> 20);
    if (set->n == set->cap) {
        const uint32_t cap = set->cap ? 2 * set->cap : 4;
        cpu_ft_stream **items = realloc(set->items, cap * sizeof *items);
        if (!items) return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        set->items = items;
        set->cap = cap;
    }
    cpu_ft_stream *s = calloc(1, sizeof *s);
    const size_t BT = (size_t)B * T;
    const size_t floats = carve(ctx, NULL, NULL, B, T, lo->n_params);
    void *mem = NULL;
    if (s) {
        s->tokens = malloc(BT * sizeof(int32_t));
        s->targets = malloc(BT * sizeof(int32_t));
        s->layer = calloc(ctx->L, sizeof *s->layer);
        if (posix_memalign(&mem, 64, floats * sizeof(float)) != 0) mem = NULL;
    }
    if (!s || !s->tokens || !s->targets || !s->layer || !mem) {
        if (s) {
            free(s->tokens);
            free(s->targets);
            free(s->layer);
        }
        free(s);
        free(mem);
        return cpu_fail(
            ctx, ORCH_ERR_OUT_OF_MEMORY,
            "%s: cannot allocate %zu MiB for a stream of batch %u x seq_len %u", fn,
            bytes >> 20, B, T);
    }
    s->mem = mem;
    memset(s->mem, 0, floats * sizeof(float)); /* the dK|dV accumulators, gradients */
    carve(ctx, s, s->mem, B, T, lo->n_params);
    memcpy(s->tokens, ft->tokens, BT * sizeof(int32_t));
    memcpy(s->targets, ft->targets, BT * sizeof(int32_t));
    s->id = set->next_id++;
    s->adapter_id = ft->adapter_id;
    s->lo = lo;
    s->B = B;
    s->T = T;
    s->BT = BT;
    for (size_t i = 0; i < BT; i++) s->counted += s->targets[i] != -1;
    s->grad_scale = ft->grad_scale;
    s->bytes = bytes;
    set->bytes += bytes;
    set->items[set->n++] = s;
    *out_stream = s->id;
    return ORCH_OK;
}

int32_t cpu_ft_stream_close(orch_engine_ctx *ctx, uint32_t stream) {
    uint32_t i = 0;
    cpu_ft_stream *s = stream_find(ctx, stream, &i);
    if (!s)
        return cpu_fail(
            ctx, ORCH_ERR_INVALID_ARGUMENT,
            "ft_stream_close: stream %u is not an open stream of this context", stream);
    cpu_ft_set *set = ctx->ft;
    memmove(&set->items[i], &set->items[i + 1], (set->n - i - 1) * sizeof *set->items);
    set->n--;
    stream_free(ctx, s);
    return ORCH_OK;
}

int32_t cpu_ft_coserve_step(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                            float *logits, uint64_t logits_cap, uint32_t stream,
                            uint32_t ft_rows, orch_ft_progress *progress) {
    /* ---- validation: nothing runs before all of it passes ---- */
    if (progress && progress->struct_size < sizeof *progress)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "coserve_step: progress->struct_size %u is smaller than "
                        "sizeof(orch_ft_progress) %zu",
                        progress->struct_size, sizeof *progress);
    cpu_ft_stream *s = NULL;
    if (stream != 0) {
        s = stream_find(ctx, stream, NULL);
        if (!s)
            return cpu_fail(
                ctx, ORCH_ERR_INVALID_ARGUMENT,
                "coserve_step: stream %u is not an open stream of this context", stream);
        if (s->broken)
            return cpu_fail(ctx, ORCH_ERR_STATE,
                            "coserve_step: stream %u failed in an earlier step; close it",
                            stream);
    }
    int infer = 0;
    int32_t st = cpu_coserve_check_infer(ctx, batch, logits, logits_cap, &infer);
    if (st != ORCH_OK) return st;
    step_job j = { s, 0, 0 };
    if (s && !s->finished) j.rows = ft_rows;
    if (j.rows > 0 && s->counted > 0 &&
        (st = cpu_lora_prepare(ctx, s->lo, s->SR)) != ORCH_OK)
        return st;

    /* ---- the pass ---- */
    if (j.rows > 0 && infer && s->fwd < s->BT) { /* forward rows pair with inference */
        st = cpu_coserve_run(ctx, batch, logits, logits_cap, step_run, &j);
    } else {
        if (infer)
            st = ctx->arch == ORCH_ARCH_LLAMA
                     ? cpu_llama_infer_forward(ctx, batch, logits, logits_cap)
                     : cpu_infer_forward(ctx, batch, logits, logits_cap);
        if (st == ORCH_OK && j.rows > 0) st = step_run(ctx, &j);
    }
    if (st != ORCH_OK) {
        if (s && j.done > 0) s->broken = 1; /* the stream moved: it cannot be resumed */
        return st;
    }
    fill_progress(s, j.done, progress);
    return ORCH_OK;
}
