/*
 * cuda_lora.cu - LoRA adapters of the CUDA engine (ABI 1.4, ORCH_CAP_LORA):
 * per-context adapter storage, creation and validation (the CPU engine's
 * rules and messages, engines/cpu/cpu_lora.c), the adapter tensor table,
 * the forward/backward hooks the training passes of cuda_model.cu (GPT-2)
 * and cuda_llama.cu (LLaMA) call around each target product, the hook of
 * the inference forward (orch_seq_input.adapter_id, mixed adapters per
 * batch), and the adapter's AdamW step.
 *
 * One "module" is one adapted matrix W [out, in]: GPT-2 has one per target
 * (c_attn is one [3C, C] matrix); LLaMA's ATTN_QKV target is three modules
 * (q, k, v: column ranges of the fused q|k|v product) and MLP_UP two (gate,
 * up: column ranges of the fused gate|up product).
 *
 * The hooks, on the context's stream, all products through cu_gemm (the
 * context's math mode):
 *   forward:  u = x A^T [R, rank]; out[:, col0 .. col0+out) += s u B^T
 *   backward: du = s dout B; din += du A (onto the base product the caller
 *             wrote first); dB += s dout^T u; dA += du^T x
 * with s = alpha / rank, module after module through one scratch of
 * 2 x R x rank floats (u, du), so stream order makes reuse safe.
 *
 * Initialisation (the header's rule, the CPU engine's stream): B is zero;
 * element e of A of a module with `in` inputs, at flat offset k of the
 * adapter's buffer, is (2u - 1) / sqrt(in), u = (x >> 11) / 2^53, x =
 * engine_splitmix64_at(desc->seed, k): computed on the host exactly as
 * cpu_lora.c does, so a seed gives the CPU engine's A bits.
 *
 * Memory: each adapter holds one cudaMalloc (params | grads | m | v, each
 * 64-float aligned) and a host table; the set holds the hook scratch
 * (device, grown by cu_lora_prepare before a pass so the hooks never
 * allocate) and the inference runs (host). cu_lora_free_all releases all of
 * it (context_destroy). Threads: the context's (one caller at a time).
 * Errors: status + message in ctx->last_error; nothing exits or prints.
 */
#include "engines/cuda/cuda_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Target bits in table order. */
static const uint32_t target_bits[4] = { ORCH_LORA_TARGET_ATTN_QKV,
                                         ORCH_LORA_TARGET_ATTN_OUT,
                                         ORCH_LORA_TARGET_MLP_UP,
                                         ORCH_LORA_TARGET_MLP_DOWN };

static int target_index(uint32_t bit) {
    for (int t = 0; t < 4; t++)
        if (target_bits[t] == bit) return t;
    return -1;
}

static uint64_t al64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }

/* ------------------------------------------------------------------------- */
/* The set                                                                    */
/* ------------------------------------------------------------------------- */

static cu_lora_set *set_get(orch_engine_ctx *ctx) {
    if (ctx->lora) return ctx->lora;
    cu_lora_set *s = (cu_lora_set *)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->next_id = 1;
    ctx->lora = s;
    return s;
}

static void lora_free(cu_lora *lo) {
    if (!lo) return;
    if (lo->d_base) cudaFree(lo->d_base);
    free(lo->tensors);
    free(lo->mods);
    free(lo->first);
    free(lo);
}

void cu_lora_free_all(orch_engine_ctx *ctx) {
    cu_lora_set *s = ctx->lora;
    if (!s) return;
    for (uint32_t i = 0; i < s->n; i++) lora_free(s->items[i]);
    free(s->items);
    if (s->d_scratch) cudaFree(s->d_scratch);
    free(s->runs);
    free(s);
    ctx->lora = NULL;
    ctx->lora_cur = NULL;
}

cu_lora *cu_lora_find(orch_engine_ctx *ctx, const char *fn, uint32_t id) {
    cu_lora_set *s = ctx->lora;
    for (uint32_t i = 0; s && i < s->n; i++)
        if (s->items[i]->id == id) return s->items[i];
    cu_set_error(ctx, ORCH_ERR_INVALID_ARGUMENT,
                 "%s: adapter_id %u is not an adapter of this context%s", fn, id,
                 id == 0 ? " (0 is the base model)" : "");
    return NULL;
}

int cu_lora_known(const void *c, uint32_t id) {
    const cu_lora_set *s = ((const orch_engine_ctx *)c)->lora;
    for (uint32_t i = 0; s && i < s->n; i++)
        if (s->items[i]->id == id) return 1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Creation                                                                   */
/* ------------------------------------------------------------------------- */

/* The modules of the model for `targets`, in table order, into mods (NULL:
 * count only); returns their number. */
static uint32_t mods_list(const orch_engine_ctx *ctx, uint32_t targets,
                          cu_lora_mod *mods) {
    /* engine_lora_role -> the weight's index within a layer's tensors */
    static const uint32_t in_layer[ENGINE_LORA_ROLE_COUNT] = {
        CU_ATTN_W, CU_PROJ_W, CU_FC_W, CU_FCPROJ_W, CL_Q,   CL_K,
        CL_V,      CL_O,      CL_GATE, CL_UP,       CL_DOWN
    };
    const uint32_t n =
        engine_lora_mods(ctx->arch, ctx->L, ctx->C, ctx->M, ctx->kvC, targets, mods);
    for (uint32_t i = 0; mods && i < n; i++) {
        const uint32_t w = in_layer[mods[i].role];
        mods[i].base_idx = ctx->arch == ORCH_ARCH_GPT2
                               ? CU_LAYER_TENSOR(mods[i].layer, w)
                               : CL_LAYER_TENSOR(mods[i].layer, w);
    }
    return n;
}

/* Upload the initial parameters (A from the seed, B zero) and zero the
 * gradients and moments of lo. Synchronous. */
static int32_t lora_init(orch_engine_ctx *ctx, cu_lora *lo) {
    float *h = (float *)calloc(lo->n_params ? lo->n_params : 1, sizeof(float));
    if (!h)
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "adapter_create: out of host memory");
    for (uint32_t i = 0; i < lo->n_mods; i++) {
        const cu_lora_mod *m = &lo->mods[i];
        const double bound = 1.0 / sqrt((double)m->in);
        const uint64_t na = (uint64_t)lo->rank * m->in;
        for (uint64_t e = 0; e < na; e++) {
            const uint64_t x = engine_splitmix64_at(lo->seed, m->a_off + e);
            const double u = (double)(x >> 11) * (1.0 / 9007199254740992.0);
            h[m->a_off + e] = (float)((2.0 * u - 1.0) * bound);
        }
    }
    cudaError_t e =
        cudaMemsetAsync(lo->d_base, 0, 4 * lo->stride * sizeof(float), ctx->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(lo->d_params, h, lo->n_params * sizeof(float),
                            cudaMemcpyHostToDevice, ctx->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    free(h);
    if (e != cudaSuccess) return cu_cuda_error(ctx, e, "adapter_create: upload");
    return ORCH_OK;
}

int32_t cu_lora_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                       uint32_t *out_id) {
    orch_lora_desc d;
    CU_TRY(engine_check_lora_desc(desc, out_id, &d, ENGINE_ERRBUF(ctx)));
    const uint32_t n_mods = mods_list(ctx, d.targets, NULL);
    cu_lora_mod *mods = (cu_lora_mod *)calloc(n_mods ? n_mods : 1, sizeof *mods);
    if (!mods)
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "adapter_create: out of memory");
    mods_list(ctx, d.targets, mods);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_mods; i++) {
        cu_lora_mod *m = &mods[i];
        const uint32_t lim = m->in < m->out ? m->in : m->out;
        if (d.rank > lim) {
            const cu_tensor *bt = &ctx->tensors[m->base_idx];
            int32_t st = cu_set_error(ctx, ORCH_ERR_INVALID_ARGUMENT,
                                      "adapter_create: rank %u exceeds min(in, out) = %u "
                                      "of %s [%u, %u]",
                                      d.rank, lim, bt->name, m->out, m->in);
            free(mods);
            return st;
        }
        m->a_off = total;
        total += (uint64_t)d.rank * m->in;
        m->b_off = total;
        total += (uint64_t)m->out * d.rank;
    }
    cu_lora_set *s = set_get(ctx);
    if (s && s->next_id == 0) { /* 2^32 - 1 adapters made: ids are never reused */
        free(mods);
        return cu_set_error(ctx, ORCH_ERR_CAPACITY,
                            "adapter_create: this context has used every adapter id");
    }
    cu_lora *lo = (cu_lora *)calloc(1, sizeof *lo);
    if (lo) {
        lo->mods = mods;
        lo->tensors = (cu_tensor *)calloc(2 * (size_t)n_mods, sizeof *lo->tensors);
        lo->first = (uint32_t *)calloc((size_t)ctx->L * 4 + 1, sizeof *lo->first);
    } else {
        free(mods);
    }
    if (s && s->n == s->cap) {
        uint32_t cap = s->cap ? 2 * s->cap : 4;
        cu_lora **n = (cu_lora **)realloc(s->items, cap * sizeof *n);
        if (n) {
            s->items = n;
            s->cap = cap;
        }
    }
    if (!s || !lo || !lo->tensors || !lo->first || s->n == s->cap) {
        lora_free(lo);
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "adapter_create: out of memory");
    }
    lo->rank = d.rank;
    lo->alpha = d.alpha;
    lo->scale = d.alpha / (float)d.rank;
    lo->targets = d.targets;
    lo->seed = d.seed;
    lo->n_mods = n_mods;
    lo->n_params = total;
    lo->n_tensors = 2 * n_mods;
    lo->stride = al64(total);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 4 * lo->stride * sizeof(float));
    if (e != cudaSuccess) {
        lora_free(lo);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "adapter_create: out of device memory: the adapter needs "
                                "%.1f MiB",
                                (double)(4 * total * sizeof(float)) / (1024.0 * 1024.0));
        }
        return cu_cuda_error(ctx, e, "cudaMalloc(adapter)");
    }
    lo->d_base = (float *)p;
    lo->d_params = lo->d_base;
    lo->d_grads = lo->d_params + lo->stride;
    lo->d_m = lo->d_grads + lo->stride;
    lo->d_v = lo->d_m + lo->stride;
    /* first[]: module ranges per (layer, target); mods are in that order. */
    uint32_t mi = 0;
    for (uint32_t k = 0; k < ctx->L * 4; k++) {
        lo->first[k] = mi;
        const uint32_t l = k / 4, bit = target_bits[k % 4];
        while (mi < n_mods && mods[mi].layer == l && mods[mi].target == bit) mi++;
    }
    lo->first[ctx->L * 4] = mi;
    for (uint32_t i = 0; i < n_mods; i++) {
        const cu_lora_mod *m = &mods[i];
        const char *bn = ctx->tensors[m->base_idx].name;
        engine_lora_tensor(&lo->tensors[2 * i], bn, "lora_A", d.rank, m->in, m->a_off);
        engine_lora_tensor(&lo->tensors[2 * i + 1], bn, "lora_B", m->out, d.rank,
                           m->b_off);
    }
    int32_t st = lora_init(ctx, lo);
    if (st != ORCH_OK) {
        lora_free(lo);
        return st;
    }
    lo->id = s->next_id++;
    s->items[s->n++] = lo;
    *out_id = lo->id;
    return ORCH_OK;
}

int32_t cu_lora_destroy(orch_engine_ctx *ctx, uint32_t id) {
    cu_lora *lo = cu_lora_find(ctx, "adapter_destroy", id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    cu_lora_set *s = ctx->lora;
    uint32_t i = 0;
    while (s->items[i] != lo) i++;
    memmove(&s->items[i], &s->items[i + 1], (s->n - i - 1) * sizeof *s->items);
    s->n--;
    if (ctx->lora_cur == lo) ctx->lora_cur = NULL;
    (void)cudaStreamSynchronize(ctx->stream); /* idle between calls; be sure */
    lora_free(lo);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Hooks                                                                      */
/* ------------------------------------------------------------------------- */

int32_t cu_lora_prepare(orch_engine_ctx *ctx, uint32_t rank, uint64_t rows) {
    cu_lora_set *s = ctx->lora;
    if (!s || rank == 0) return ORCH_OK;
    const uint64_t need = 2 * al64(rows * rank);
    if (need <= s->scratch_floats) return ORCH_OK;
    if (s->d_scratch) cudaFree(s->d_scratch); /* the stream is idle between calls */
    s->d_scratch = NULL;
    s->scratch_floats = 0;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, need * sizeof(float));
    if (e != cudaSuccess) {
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "out of device memory allocating %.1f MiB of adapter "
                                "scratch for %llu rows",
                                (double)(need * sizeof(float)) / (1024.0 * 1024.0),
                                (unsigned long long)rows);
        }
        return cu_cuda_error(ctx, e, "cudaMalloc(adapter scratch)");
    }
    s->d_scratch = (float *)p;
    s->scratch_floats = need;
    return ORCH_OK;
}

static const cu_lora_mod *mods_of(const cu_lora *lo, uint32_t layer, uint32_t target,
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

/* out[R rows] += s (x A^T) B^T for every module of (layer, target) of lo. */
static int32_t fwd_rows(orch_engine_ctx *ctx, const cu_lora *lo, uint32_t layer,
                        uint32_t target, uint32_t R, const float *x, int ldx, float *out,
                        int ldout) {
    uint32_t n;
    const cu_lora_mod *mods = mods_of(lo, layer, target, &n);
    if (n == 0 || R == 0) return ORCH_OK;
    const int rank = (int)lo->rank;
    float *u = ctx->lora->d_scratch;
    for (uint32_t i = 0; i < n; i++) {
        const cu_lora_mod *m = &mods[i];
        CU_TRY(cu_gemm(ctx, 0, 1, (int)R, rank, (int)m->in, 1.0f, x, ldx,
                       lo->d_params + m->a_off, (int)m->in, 0.0f, u, rank));
        CU_TRY(cu_gemm(ctx, 0, 1, (int)R, (int)m->out, rank, lo->scale, u, rank,
                       lo->d_params + m->b_off, rank, 1.0f, out + m->col0, ldout));
    }
    return ORCH_OK;
}

int32_t cu_lora_stack_forward(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t layer,
                              uint32_t target, const float *x, int ldx, float *out,
                              int ldout) {
    /* the inference rows come first: the runs' rows are rows of the stack */
    const cu_lora_set *s = f->dp ? ctx->lora : NULL;
    for (uint32_t i = 0; s && i < s->n_runs; i++) {
        const cu_lora_run *r = &s->runs[i];
        CU_TRY(fwd_rows(ctx, r->lo, layer, target, r->rows, x + (size_t)r->row0 * ldx,
                        ldx, out + (size_t)r->row0 * ldout, ldout));
    }
    for (uint32_t k = 0; k < f->n_parts; k++) {
        const cu_fwd_part *p = &f->parts[k];
        CU_TRY(fwd_rows(ctx, p->lo, layer, target, p->B * p->T, x + (size_t)p->r0 * ldx,
                        ldx, out + (size_t)p->r0 * ldout, ldout));
    }
    return ORCH_OK;
}

int32_t cu_lora_backward(orch_engine_ctx *ctx, const cu_lora *lo, uint32_t layer,
                         uint32_t target, uint32_t R, const float *x, int ldx,
                         const float *dout, int lddout, float *din, int lddin) {
    uint32_t n;
    const cu_lora_mod *mods = mods_of(lo, layer, target, &n);
    if (n == 0 || R == 0) return ORCH_OK;
    const int rank = (int)lo->rank, r = (int)R;
    float *u = ctx->lora->d_scratch;
    float *du = u + al64((uint64_t)R * lo->rank);
    for (uint32_t i = 0; i < n; i++) {
        const cu_lora_mod *m = &mods[i];
        const float *A = lo->d_params + m->a_off, *B = lo->d_params + m->b_off;
        const float *dy = dout + m->col0;
        const int in = (int)m->in, out = (int)m->out;
        /* u = x A^T; du = s dy B */
        CU_TRY(cu_gemm(ctx, 0, 1, r, rank, in, 1.0f, x, ldx, A, in, 0.0f, u, rank));
        CU_TRY(cu_gemm(ctx, 0, 0, r, rank, out, lo->scale, dy, lddout, B, rank, 0.0f, du,
                       rank));
        /* dB += s dy^T u; dA += du^T x */
        CU_TRY(cu_gemm(ctx, 1, 0, out, rank, r, lo->scale, dy, lddout, u, rank, 1.0f,
                       lo->d_grads + m->b_off, rank));
        CU_TRY(cu_gemm(ctx, 1, 0, rank, in, r, 1.0f, du, rank, x, ldx, 1.0f,
                       lo->d_grads + m->a_off, in));
        /* din += du A */
        if (din)
            CU_TRY(
                cu_gemm(ctx, 0, 0, r, in, rank, 1.0f, du, rank, A, in, 1.0f, din, lddin));
    }
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Inference                                                                  */
/* ------------------------------------------------------------------------- */

int32_t cu_lora_infer_begin(orch_engine_ctx *ctx, const orch_infer_batch *batch) {
    cu_lora_set *s = ctx->lora;
    if (s) s->n_runs = 0;
    int any = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++)
        any |= engine_batch_seq(batch, i)->adapter_id != 0;
    if (!any) return ORCH_OK;
    /* validated: the set exists and every id is live */
    if (s->runs_cap < batch->n_seqs) {
        cu_lora_run *r = (cu_lora_run *)realloc(s->runs, batch->n_seqs * sizeof *r);
        if (!r)
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "infer_forward: out of host memory");
        s->runs = r;
        s->runs_cap = batch->n_seqs;
    }
    /* consecutive sequences on the same adapter form one run of rows */
    uint32_t row = 0, rank = 0, most = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *q = engine_batch_seq(batch, i);
        const uint32_t r0 = row;
        row += q->n_tokens;
        if (q->adapter_id == 0) continue;
        cu_lora *lo = NULL;
        for (uint32_t k = 0; k < s->n && !lo; k++)
            if (s->items[k]->id == q->adapter_id) lo = s->items[k];
        cu_lora_run *last = s->n_runs ? &s->runs[s->n_runs - 1] : NULL;
        if (last && last->lo == lo && last->row0 + last->rows == r0) {
            last->rows += q->n_tokens;
        } else {
            cu_lora_run *nr = &s->runs[s->n_runs++];
            nr->lo = lo;
            nr->row0 = r0;
            nr->rows = q->n_tokens;
            last = nr;
        }
        if (last->rows > most) most = last->rows;
        if (lo->rank > rank) rank = lo->rank;
    }
    int32_t st = cu_lora_prepare(ctx, rank, most);
    if (st != ORCH_OK) s->n_runs = 0;
    return st;
}

void cu_lora_infer_end(orch_engine_ctx *ctx) {
    if (ctx->lora) ctx->lora->n_runs = 0;
}

/* ------------------------------------------------------------------------- */
/* AdamW                                                                      */
/* ------------------------------------------------------------------------- */

#define KCHECK(ctx, call)                                                  \
    do {                                                                   \
        cudaError_t k_e_ = (call);                                         \
        if (k_e_ != cudaSuccess) return cu_cuda_error((ctx), k_e_, #call); \
    } while (0)

int32_t cu_lora_optimizer_step(orch_engine_ctx *ctx, cu_lora *lo,
                               const orch_adamw_params *p, float *out_norm) {
    cudaStream_t s = ctx->stream;
    KCHECK(ctx, k_grad_norm(s, lo->d_grads, lo->n_params, ctx->d_red, ctx->d_norm,
                            p->grad_clip));
    cu_adamw_consts c;
    engine_adamw_consts_init(p, &c);
    c.decay = engine_adamw_decay(p, 0); /* adapter tensors carry no flags */
    KCHECK(ctx, k_adamw(s, lo->d_params, lo->d_grads, lo->d_m, lo->d_v, lo->n_params,
                        ctx->d_norm, &c));
    KCHECK(ctx, cudaMemcpyAsync(ctx->h_norm, ctx->d_norm, 2 * sizeof(float),
                                cudaMemcpyDeviceToHost, s));
    KCHECK(ctx, cudaStreamSynchronize(s));
    const float nrm = ctx->h_norm[0];
    if (!isfinite(ctx->h_norm[1])) return engine_fail_nonfinite_norm(ENGINE_ERRBUF(ctx));
    if (out_norm) *out_norm = nrm;
    return ORCH_OK;
}
