/*
 * cpu_lora.c - LoRA adapters of the CPU engine (see cpu_lora.h): creation
 * and validation, the adapter tensor table, initialisation, the forward and
 * backward hooks of the training code, and the adapter's AdamW step.
 *
 * Initialisation (the header's rule, PEFT's default): B is zero; element e
 * of A of a module with `in` inputs, at flat offset k of the adapter's
 * buffer, is (2u - 1) / sqrt(in) with u = (x >> 11) / 2^53 in [0, 1) and x =
 * engine_splitmix64_at(desc->seed, k) (the engines' common stream), so A is
 * uniform in [-1/sqrt(in), 1/sqrt(in)) and the same for every thread count.
 */
#include "engines/cpu/cpu_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engines/common/engine_lora.h"
#include "engines/cpu/cpu_llama.h"

/* Target bits in table order, and their names in messages. */
static const uint32_t target_bits[4] = { ORCH_LORA_TARGET_ATTN_QKV,
                                         ORCH_LORA_TARGET_ATTN_OUT,
                                         ORCH_LORA_TARGET_MLP_UP,
                                         ORCH_LORA_TARGET_MLP_DOWN };

static int target_index(uint32_t bit) {
    for (int t = 0; t < 4; t++)
        if (target_bits[t] == bit) return t;
    return -1;
}

/* ------------------------------------------------------------------------- */
/* The set                                                                    */
/* ------------------------------------------------------------------------- */

static cpu_lora_set *set_get(orch_engine_ctx *ctx) {
    if (ctx->lora) return ctx->lora;
    cpu_lora_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->gv_none.layer = calloc(ctx->L ? ctx->L : 1, sizeof *s->gv_none.layer);
    if (!s->gv_none.layer) {
        free(s);
        return NULL;
    }
    s->next_id = 1;
    ctx->lora = s;
    return s;
}

static void lora_free(cpu_lora *lo) {
    if (!lo) return;
    free(lo->tensors);
    free(lo->params);
    free(lo->mods);
    free(lo->first);
    free(lo);
}

void cpu_lora_free_all(orch_engine_ctx *ctx) {
    cpu_lora_set *s = ctx->lora;
    if (!s) return;
    for (uint32_t i = 0; i < s->n; i++) lora_free(s->items[i]);
    free(s->items);
    free(s->scratch);
    free(s->gv_none.layer);
    free(s);
    ctx->lora = NULL;
    ctx->lora_cur = NULL;
}

cpu_lora *cpu_lora_find(orch_engine_ctx *ctx, const char *fn, uint32_t id) {
    cpu_lora_set *s = ctx->lora;
    for (uint32_t i = 0; s && i < s->n; i++)
        if (s->items[i]->id == id) return s->items[i];
    cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
             "%s: adapter_id %u is not an adapter of this context%s", fn, id,
             id == 0 ? " (0 is the base model)" : "");
    return NULL;
}

const cpu_view *cpu_lora_frozen_grads(const orch_engine_ctx *ctx) {
    return &ctx->lora->gv_none;
}

/* ------------------------------------------------------------------------- */
/* Creation                                                                   */
/* ------------------------------------------------------------------------- */

/* The modules of the model for `targets`, in table order, into mods (NULL:
 * count only); returns their number. */
static uint32_t mods_list(const orch_engine_ctx *ctx, uint32_t targets,
                          cpu_lora_mod *mods) {
    /* engine_lora_role -> the weight's index within a layer's tensors */
    static const uint32_t in_layer[ENGINE_LORA_ROLE_COUNT] = {
        L_QKV_W, L_AP_W, L_FC_W, L_MP_W, LL_Q, LL_K, LL_V, LL_O, LL_GATE, LL_UP, LL_DOWN
    };
    const uint32_t n =
        engine_lora_mods(ctx->arch, ctx->L, ctx->C, ctx->M, ctx->KVD, targets, mods);
    for (uint32_t i = 0; mods && i < n; i++)
        mods[i].base_idx = (ctx->arch == ORCH_ARCH_GPT2 ? 2 + mods[i].layer * L_COUNT
                                                        : 1 + mods[i].layer * LL_COUNT) +
                           in_layer[mods[i].role];
    return n;
}

int32_t cpu_lora_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                        uint32_t *out_id) {
    orch_lora_desc d;
    int32_t cst = engine_check_lora_desc(desc, out_id, &d, ENGINE_ERRBUF(ctx));
    if (cst != ORCH_OK) return cst;
    const uint32_t n_mods = mods_list(ctx, d.targets, NULL);
    cpu_lora_mod *mods = calloc(n_mods ? n_mods : 1, sizeof *mods);
    if (!mods)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "adapter_create: out of memory");
    mods_list(ctx, d.targets, mods);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_mods; i++) {
        cpu_lora_mod *m = &mods[i];
        const uint32_t lim = m->in < m->out ? m->in : m->out;
        if (d.rank > lim) {
            const cpu_tensor *bt = &ctx->tensors[m->base_idx];
            int32_t st = cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                                  "adapter_create: rank %u exceeds min(in, out) = %u of "
                                  "%s [%u, %u]",
                                  d.rank, lim, bt->name, m->out, m->in);
            free(mods);
            return st;
        }
        m->a_off = (size_t)total;
        total += (uint64_t)d.rank * m->in;
        m->b_off = (size_t)total;
        total += (uint64_t)m->out * d.rank;
    }
    cpu_lora_set *s = set_get(ctx);
    if (s && s->next_id == 0) { /* 2^32 - 1 adapters made: ids are never reused */
        free(mods);
        return cpu_fail(ctx, ORCH_ERR_CAPACITY,
                        "adapter_create: this context has used every adapter id");
    }
    cpu_lora *lo = calloc(1, sizeof *lo);
    if (lo) {
        lo->tensors = calloc(2 * (size_t)n_mods, sizeof *lo->tensors);
        lo->first = calloc((size_t)ctx->L * 4 + 1, sizeof *lo->first);
        if (total <= SIZE_MAX / 4 / sizeof(float))
            lo->params = calloc((size_t)total * 4, sizeof(float));
    }
    if (s && s->n == s->cap) {
        uint32_t cap = s->cap ? 2 * s->cap : 4;
        cpu_lora **n = realloc(s->items, cap * sizeof *n);
        if (n) {
            s->items = n;
            s->cap = cap;
        }
    }
    if (!s || !lo || !lo->tensors || !lo->first || !lo->params || s->n == s->cap) {
        if (lo)
            lo->mods = mods;
        else
            free(mods);
        lora_free(lo);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "adapter_create: cannot allocate %llu MiB for the adapter",
                        (unsigned long long)(total * 16 >> 20));
    }
    lo->rank = d.rank;
    lo->alpha = d.alpha;
    lo->scale = d.alpha / (float)d.rank;
    lo->targets = d.targets;
    lo->seed = d.seed;
    lo->mods = mods;
    lo->n_mods = n_mods;
    lo->n_params = total;
    lo->n_tensors = 2 * n_mods;
    lo->grads = lo->params + total;
    lo->adam_m = lo->grads + total;
    lo->adam_v = lo->adam_m + total;
    /* first[]: module ranges per (layer, target); mods are in that order. */
    uint32_t mi = 0;
    for (uint32_t k = 0; k < ctx->L * 4; k++) {
        lo->first[k] = mi;
        const uint32_t l = k / 4, bit = target_bits[k % 4];
        while (mi < n_mods && mods[mi].layer == l && mods[mi].target == bit) mi++;
    }
    lo->first[ctx->L * 4] = mi;
    for (uint32_t i = 0; i < n_mods; i++) {
        const cpu_lora_mod *m = &mods[i];
        const char *bn = ctx->tensors[m->base_idx].name;
        engine_lora_tensor(&lo->tensors[2 * i], bn, "lora_A", d.rank, m->in, m->a_off);
        engine_lora_tensor(&lo->tensors[2 * i + 1], bn, "lora_B", m->out, d.rank,
                           m->b_off);
        const double bound = 1.0 / sqrt((double)m->in);
        const size_t na = (size_t)d.rank * m->in;
        for (size_t e = 0; e < na; e++) {
            const uint64_t x = engine_splitmix64_at(d.seed, (uint64_t)(m->a_off + e));
            const double u = (double)(x >> 11) * (1.0 / 9007199254740992.0);
            lo->params[m->a_off + e] = (float)((2.0 * u - 1.0) * bound);
        }
    }
    lo->id = s->next_id++;
    s->items[s->n++] = lo;
    *out_id = lo->id;
    return ORCH_OK;
}

int32_t cpu_lora_destroy(orch_engine_ctx *ctx, uint32_t id) {
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_destroy", id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    cpu_lora_set *s = ctx->lora;
    uint32_t i = 0;
    while (s->items[i] != lo) i++;
    memmove(&s->items[i], &s->items[i + 1], (s->n - i - 1) * sizeof *s->items);
    s->n--;
    if (ctx->lora_cur == lo) ctx->lora_cur = NULL;
    lora_free(lo);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Hooks                                                                      */
/* ------------------------------------------------------------------------- */

/* Modules per (layer, target) at most (llama's q, k, v). */
#define MAX_MODS 3

int32_t cpu_lora_prepare(orch_engine_ctx *ctx, const cpu_lora *lo, size_t rows) {
    if (!lo) return ORCH_OK;
    cpu_lora_set *s = ctx->lora;
    const size_t need = 2 * MAX_MODS * rows * lo->rank;
    if (need <= s->scratch_floats) return ORCH_OK;
    void *p = NULL;
    if (posix_memalign(&p, 64, need * sizeof(float)) != 0)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate %zu MiB of adapter scratch for %zu rows",
                        need * sizeof(float) >> 20, rows);
    free(s->scratch);
    s->scratch = p;
    s->scratch_floats = need;
    return ORCH_OK;
}

typedef struct hook_job {
    const cpu_lora *lo;
    const cpu_lora_mod *mods; /* of this (layer, target) */
    uint32_t n_mods;
    size_t R;
    const float *x;
    size_t ldx;
    float *out; /* forward */
    size_t ldout;
    const float *dout; /* backward */
    size_t lddout;
    float *din;
    size_t lddin;
    float *dA_dB;  /* lo->grads */
    float *u, *du; /* [n_mods][R, rank] each, in the scratch */
    size_t row_chunks;
    size_t kb[MAX_MODS], ka[MAX_MODS]; /* output chunks of dB rows, dA columns */
} hook_job;

static const cpu_lora_mod *mods_of(const cpu_lora *lo, uint32_t layer, uint32_t target,
                                   uint32_t *n) {
    const int t = target_index(target);
    if (!lo || t < 0) {
        *n = 0;
        return NULL;
    }
    const uint32_t k = layer * 4 + (uint32_t)t;
    *n = lo->first[k + 1] - lo->first[k];
    return lo->mods + lo->first[k];
}

static void fwd_rows(void *arg, size_t c, int tid) {
    (void)tid;
    const hook_job *j = arg;
    size_t r0, r1;
    cpu_pool_range(j->R, (int)c, (int)j->row_chunks, 1, &r0, &r1);
    if (r0 >= r1) return;
    const int rows = (int)(r1 - r0), rank = (int)j->lo->rank;
    for (uint32_t i = 0; i < j->n_mods; i++) {
        const cpu_lora_mod *m = &j->mods[i];
        float *u = j->u + (size_t)i * j->R * rank + r0 * rank;
        cpu_sgemm1(0, 1, rows, rank, (int)m->in, 1.0f, j->x + r0 * j->ldx, (int)j->ldx,
                   j->lo->params + m->a_off, (int)m->in, 0.0f, u, rank);
        cpu_sgemm1(0, 1, rows, (int)m->out, rank, j->lo->scale, u, rank,
                   j->lo->params + m->b_off, rank, 1.0f, j->out + r0 * j->ldout + m->col0,
                   (int)j->ldout);
    }
}

static size_t row_chunks(orch_engine_ctx *ctx, size_t R) {
    return cpu_pool_chunks(ctx->pool, R, 8, 1);
}

int cpu_lora_forward(orch_engine_ctx *ctx, const cpu_lora *lo, uint32_t layer,
                     uint32_t target, size_t R, const float *x, size_t ldx, float *out,
                     size_t ldout) {
    uint32_t n;
    const cpu_lora_mod *mods = mods_of(lo, layer, target, &n);
    if (n == 0 || R == 0) return 0;
    hook_job j;
    memset(&j, 0, sizeof j);
    j.lo = lo;
    j.mods = mods;
    j.n_mods = n;
    j.R = R;
    j.x = x;
    j.ldx = ldx;
    j.out = out;
    j.ldout = ldout;
    j.u = ctx->lora->scratch;
    j.row_chunks = row_chunks(ctx, R);
    cpu_pool_for(ctx->pool, j.row_chunks, fwd_rows, &j);
    return 1;
}

/* Rows: u = x A^T, du = s dout B, din (+)= du A (modules in order). */
static void bwd_rows(void *arg, size_t c, int tid) {
    (void)tid;
    const hook_job *j = arg;
    size_t r0, r1;
    cpu_pool_range(j->R, (int)c, (int)j->row_chunks, 1, &r0, &r1);
    if (r0 >= r1) return;
    const int rows = (int)(r1 - r0), rank = (int)j->lo->rank;
    for (uint32_t i = 0; i < j->n_mods; i++) {
        const cpu_lora_mod *m = &j->mods[i];
        float *u = j->u + (size_t)i * j->R * rank + r0 * rank;
        float *du = j->du + (size_t)i * j->R * rank + r0 * rank;
        const float *A = j->lo->params + m->a_off, *B = j->lo->params + m->b_off;
        cpu_sgemm1(0, 1, rows, rank, (int)m->in, 1.0f, j->x + r0 * j->ldx, (int)j->ldx, A,
                   (int)m->in, 0.0f, u, rank);
        cpu_sgemm1(0, 0, rows, rank, (int)m->out, j->lo->scale,
                   j->dout + r0 * j->lddout + m->col0, (int)j->lddout, B, rank, 0.0f, du,
                   rank);
        if (j->din)
            cpu_sgemm1(0, 0, rows, (int)m->in, rank, 1.0f, du, rank, A, (int)m->in,
                       i == 0 ? 0.0f : 1.0f, j->din + r0 * j->lddin, (int)j->lddin);
    }
}

/* Outputs: chunks of dB rows then dA columns, module by module. */
static void bwd_grads(void *arg, size_t c, int tid) {
    (void)tid;
    const hook_job *j = arg;
    const int rank = (int)j->lo->rank, R = (int)j->R;
    for (uint32_t i = 0; i < j->n_mods; i++) {
        const cpu_lora_mod *m = &j->mods[i];
        const float *u = j->u + (size_t)i * j->R * rank;
        const float *du = j->du + (size_t)i * j->R * rank;
        size_t a, b;
        if (c < j->kb[i]) { /* dB rows [a, b) += s dout[:, a..b)^T u */
            cpu_pool_range(m->out, (int)c, (int)j->kb[i], 8, &a, &b);
            if (a < b)
                cpu_sgemm1(1, 0, (int)(b - a), rank, R, j->lo->scale,
                           j->dout + m->col0 + a, (int)j->lddout, u, rank, 1.0f,
                           j->dA_dB + m->b_off + a * rank, rank);
            return;
        }
        c -= j->kb[i];
        if (c < j->ka[i]) { /* dA columns [a, b) += du^T x[:, a..b) */
            cpu_pool_range(m->in, (int)c, (int)j->ka[i], 16, &a, &b);
            if (a < b)
                cpu_sgemm1(1, 0, rank, (int)(b - a), R, 1.0f, du, rank, j->x + a,
                           (int)j->ldx, 1.0f, j->dA_dB + m->a_off + a, (int)m->in);
            return;
        }
        c -= j->ka[i];
    }
}

int cpu_lora_backward(orch_engine_ctx *ctx, cpu_lora *lo, uint32_t layer, uint32_t target,
                      size_t R, const float *x, size_t ldx, const float *dout,
                      size_t lddout, float *din, size_t lddin) {
    return cpu_lora_backward_to(ctx, lo, lo ? lo->grads : NULL, layer, target, R, x, ldx,
                                dout, lddout, din, lddin);
}

int cpu_lora_backward_to(orch_engine_ctx *ctx, const cpu_lora *lo, float *grads,
                         uint32_t layer, uint32_t target, size_t R, const float *x,
                         size_t ldx, const float *dout, size_t lddout, float *din,
                         size_t lddin) {
    uint32_t n;
    const cpu_lora_mod *mods = mods_of(lo, layer, target, &n);
    if (n == 0 || R == 0) return 0;
    hook_job j;
    memset(&j, 0, sizeof j);
    j.lo = lo;
    j.mods = mods;
    j.n_mods = n;
    j.R = R;
    j.x = x;
    j.ldx = ldx;
    j.dout = dout;
    j.lddout = lddout;
    j.din = din;
    j.lddin = lddin;
    j.dA_dB = grads;
    j.u = ctx->lora->scratch;
    j.du = j.u + MAX_MODS * R * lo->rank;
    j.row_chunks = row_chunks(ctx, R);
    cpu_pool_for(ctx->pool, j.row_chunks, bwd_rows, &j);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        j.kb[i] = cpu_pool_chunks(ctx->pool, mods[i].out, 32, 1);
        j.ka[i] = cpu_pool_chunks(ctx->pool, mods[i].in, 64, 1);
        total += j.kb[i] + j.ka[i];
    }
    cpu_pool_for(ctx->pool, total, bwd_grads, &j);
    return din != NULL;
}

/* ------------------------------------------------------------------------- */
/* Inference                                                                  */
/* ------------------------------------------------------------------------- */

int cpu_lora_known(const void *c, uint32_t id) {
    const cpu_lora_set *s = ((const orch_engine_ctx *)c)->lora;
    for (uint32_t i = 0; s && i < s->n; i++)
        if (s->items[i]->id == id) return 1;
    return 0;
}

int32_t cpu_lora_batch_begin(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                             cpu_lora_batch *lb) {
    memset(lb, 0, sizeof *lb);
    int any = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++)
        any |= engine_batch_seq(batch, i)->adapter_id != 0;
    if (!any) return ORCH_OK;
    lb->lo = calloc(batch->n_seqs, sizeof *lb->lo);
    lb->row0 = calloc((size_t)batch->n_seqs + 1, sizeof *lb->row0);
    if (!lb->lo || !lb->row0) {
        cpu_lora_batch_end(lb);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    }
    lb->n_seqs = batch->n_seqs;
    uint32_t rank = 0, rows = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *sq = engine_batch_seq(batch, i);
        lb->row0[i] = rows;
        rows += sq->n_tokens;
        if (sq->adapter_id == 0) continue;
        for (uint32_t k = 0; k < ctx->lora->n; k++)
            if (ctx->lora->items[k]->id == sq->adapter_id)
                lb->lo[i] = ctx->lora->items[k];
        lb->targets |= lb->lo[i]->targets; /* validated: it exists */
        if (lb->lo[i]->rank > rank) rank = lb->lo[i]->rank;
    }
    lb->row0[batch->n_seqs] = rows;
    lb->rank_max = rank;
    cpu_lora_set *s = ctx->lora;
    const size_t need = MAX_MODS * (size_t)rows * rank;
    if (need > s->scratch_floats) {
        void *p = NULL;
        if (posix_memalign(&p, 64, need * sizeof(float)) != 0) {
            cpu_lora_batch_end(lb);
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "infer_forward: cannot allocate %zu MiB of adapter scratch",
                            need * sizeof(float) >> 20);
        }
        free(s->scratch);
        s->scratch = p;
        s->scratch_floats = need;
    }
    return ORCH_OK;
}

void cpu_lora_batch_end(cpu_lora_batch *lb) {
    free(lb->lo);
    free(lb->row0);
    memset(lb, 0, sizeof *lb);
}

typedef struct batch_job {
    const cpu_lora_batch *lb;
    uint32_t layer, target;
    const float *x;
    size_t ldx;
    float *out;
    size_t ldout;
    float *scratch;
} batch_job;

/* One sequence: its rows through its adapter's modules of (layer, target);
 * u of row r at scratch + (module * N + r) * rank_max (N rows in all): the
 * batch's largest rank, so that sequences of different ranks, run on
 * different threads, use disjoint rows of the scratch. */
static void batch_seq(void *arg, size_t i, int tid) {
    (void)tid;
    const batch_job *j = arg;
    const cpu_lora *lo = j->lb->lo[i];
    uint32_t n;
    const cpu_lora_mod *mods = mods_of(lo, j->layer, j->target, &n);
    const size_t r0 = j->lb->row0[i], rows = j->lb->row0[i + 1] - r0;
    const size_t N = j->lb->row0[j->lb->n_seqs];
    if (n == 0 || rows == 0) return;
    const int rank = (int)lo->rank;
    for (uint32_t k = 0; k < n; k++) {
        const cpu_lora_mod *m = &mods[k];
        float *u = j->scratch + ((size_t)k * N + r0) * (size_t)j->lb->rank_max;
        cpu_sgemm1(0, 1, (int)rows, rank, (int)m->in, 1.0f, j->x + r0 * j->ldx,
                   (int)j->ldx, lo->params + m->a_off, (int)m->in, 0.0f, u, rank);
        cpu_sgemm1(0, 1, (int)rows, (int)m->out, rank, lo->scale, u, rank,
                   lo->params + m->b_off, rank, 1.0f, j->out + r0 * j->ldout + m->col0,
                   (int)j->ldout);
    }
}

int cpu_lora_batch_forward(orch_engine_ctx *ctx, const cpu_lora_batch *lb, uint32_t layer,
                           uint32_t target, const float *x, size_t ldx, float *out,
                           size_t ldout) {
    if (!(lb->targets & target)) return 0;
    batch_job j = { lb, layer, target, x, ldx, out, ldout, ctx->lora->scratch };
    cpu_pool_for(ctx->pool, lb->n_seqs, batch_seq, &j);
    return 1;
}

typedef struct gelu_job {
    float *x;
    size_t rows, cols, chunks;
    int isa;
} gelu_job;

static void gelu_rows(void *arg, size_t c, int tid) {
    (void)tid;
    const gelu_job *j = arg;
    size_t r0, r1;
    cpu_pool_range(j->rows, (int)c, (int)j->chunks, 1, &r0, &r1);
    for (size_t r = r0; r < r1; r++)
        cpu_gelu(j->isa, j->x + r * j->cols, NULL, j->x + r * j->cols, j->cols);
}

void cpu_lora_gelu_rows(orch_engine_ctx *ctx, float *x, size_t rows, size_t cols) {
    gelu_job j = { x, rows, cols, cpu_pool_chunks(ctx->pool, rows, 4, 4), ctx->isa };
    cpu_pool_for(ctx->pool, j.chunks, gelu_rows, &j);
}

/* ------------------------------------------------------------------------- */
/* AdamW                                                                      */
/* ------------------------------------------------------------------------- */

#define NORM_CHUNK ((size_t)1 << 16)

int32_t cpu_lora_optimizer_step(orch_engine_ctx *ctx, cpu_lora *lo,
                                const orch_adamw_params *p, float *out_norm) {
    const size_t n = (size_t)lo->n_params;
    double sq = 0.0;
    for (size_t a = 0; a < n; a += NORM_CHUNK) /* fixed order of fixed chunks */
        sq += cpu_sumsq(ctx->isa, lo->grads + a, n - a < NORM_CHUNK ? n - a : NORM_CHUNK);
    const double norm = sqrt(sq);
    if (!isfinite(norm)) return engine_fail_nonfinite_norm(ENGINE_ERRBUF(ctx));
    cpu_adamw_consts k;
    engine_adamw_consts_init(p, &k);
    k.gscale = engine_grad_clip_scale(p, norm);
    k.decay = engine_adamw_decay(p, 0); /* adapter tensors carry no flags */
    cpu_adamw(ctx->isa, lo->params, lo->grads, lo->adam_m, lo->adam_v, n, &k);
    if (out_norm) *out_norm = (float)norm;
    return ORCH_OK;
}
