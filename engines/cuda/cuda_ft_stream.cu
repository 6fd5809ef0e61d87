/*
 * cuda_ft_stream.cu - token-level fine-tuning streams of the CUDA engine
 * (ABI 1.5, ORCH_CAP_FT_STREAM): ft_stream_open / ft_stream_close /
 * coserve_step, the stream set, the saved activations on the device and the
 * forward and backward chunks of a LoRA micro-batch run a few rows at a
 * time (FlexLLM's token-level fine-tuning), GPT-2 and LLaMA (GQA, RoPE,
 * untied head).
 *
 * Rows are r = b * T + t. A forward chunk of rows [r0, r1) is one
 * fine-tuning part of the shared forward (cu_gpt2_forward / cu_llama_forward
 * over a cu_fwd stack, cuda_model.cu / cuda_llama.cu) beside the step's
 * inference rows, so each base
 * product and the LM head stay ONE GEMM over inference + chunk rows; the
 * part's attention (cu_ft_attention, called by the stack's attention)
 * writes the chunk's q|k|v (GPT-2: bias added; LLaMA: RoPE on q and k at
 * the rows' positions) into the stream's saved
 * activations and attends, like a chunked prefill, over the K/V of the
 * earlier rows of the same sequence kept there. The chunk's rows of every
 * per-layer activation are then copied from the stack into the stream, and
 * the chunk's head and loss (cross-entropy, d(logits), d(ln_f output))
 * computed as the CPU engine does (engines/cpu/cpu_ft_stream.c). Backward
 * chunks run in decreasing r, layers top-down: per layer a dK|dV
 * accumulator over the whole sequence receives every query row's
 * contribution, so a chunk's own dK|dV rows are complete when the chunk has
 * run (every row above it is done) - exact under causal attention (GQA:
 * the G query heads of a K/V head add to its accumulator in head order;
 * LLaMA's d(q), d(k) then take RoPE's inverse). The
 * adapter's gradients go to the stream's own buffer and are ADDED to the
 * adapter's once the last backward row is done.
 *
 * Validation follows the CPU engine's order, statuses and messages. On a
 * failed step a stream that has not moved is left as it was (a forward
 * chunk only writes rows at or above its first); one that moved, or whose
 * backward chunk failed (its accumulators are partly updated), reports
 * ORCH_ERR_STATE on its next step.
 *
 * Memory: each stream owns one cudaMalloc of activations and gradients (and
 * one of its token ids), freed when its last backward row is done or at
 * ft_stream_close; a cudaMalloc that fails gives ORCH_ERR_CAPACITY (the
 * device cannot hold another stream). The stack's buffers are ctx->acts
 * (shared, grown on demand). Threads: the context's.
 */
#include "engines/cuda/cuda_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KCHECK(ctx, call)                                                  \
    do {                                                                   \
        cudaError_t k_e_ = (call);                                         \
        if (k_e_ != cudaSuccess) return cu_cuda_error((ctx), k_e_, #call); \
    } while (0)

/* Rows of one chunk at most (a step with more rows runs several chunks);
 * query rows per attention block. */
#define FT_CHUNK_ROWS 256u
#define FT_QB         64u
/* Open streams of one context at most. */
#define FT_MAX_STREAMS 1024u

typedef struct cu_ft_stream {
    uint32_t id, adapter_id;
    cu_lora *lo;
    uint32_t B, T;
    uint64_t BT, counted;
    float grad_scale;
    uint64_t fwd, bwd; /* rows done */
    int finished, broken;
    float loss;
    uint64_t SR; /* chunk rows at most */
    size_t bytes;
    float *d_mem;
    int32_t *d_tok, *d_tgt; /* [BT] each, one cudaMalloc at d_tok */
    /* per layer l: p + l * BT * width */
    float *res, *ln1, *ln1m, *ln1r, *qkv, *y, *x2, *ln2, *ln2m, *ln2r, *fch, *fcg, *dkv;
    float *resL, *lnf, *lnfm, *lnfr, *dlnf, *row_loss, *grads;
    /* chunk scratch */
    float *dres, *dln, *dfc, *dact, *dqkv, *dqkv2, *sc, *dp;
} cu_ft_stream;

typedef struct cu_ft_set {
    cu_ft_stream **items;
    uint32_t n, cap;
    uint32_t next_id;
} cu_ft_set;

static uint64_t al64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }
static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Row widths of the saved activations: q|k|v (W), dK|dV (DKV), the MLP's
 * pre-activation (MW: GPT-2 c_fc, LLaMA gate|up). */
typedef struct ft_dims {
    uint64_t C, M, L, H, W, KW, DKV, MW;
    int llama;
} ft_dims;

static ft_dims dims_of(const orch_engine_ctx *ctx) {
    ft_dims d;
    d.llama = ctx->arch == ORCH_ARCH_LLAMA;
    d.C = ctx->C;
    d.M = ctx->M;
    d.L = ctx->L;
    d.H = ctx->H;
    d.KW = ctx->kvC;
    d.W = d.C + 2 * d.KW;
    d.DKV = 2 * d.KW;
    d.MW = d.llama ? 2 * d.M : d.M;
    return d;
}

/* Lay the stream's float buffers out from base (NULL: count only); returns
 * the floats. */
static uint64_t carve(const orch_engine_ctx *ctx, cu_ft_stream *s, float *base,
                      uint64_t BT, uint32_t T, uint64_t n_params) {
    const ft_dims d = dims_of(ctx);
    const uint64_t C = d.C, M = d.M, L = d.L, H = d.H;
    const uint64_t SR = min_u64(BT, FT_CHUNK_ROWS), qb = min_u64(T, FT_QB);
    uint64_t used = 0;
#define CARVE(n) (used += al64(n), base ? base + used - al64(n) : NULL)
    float *res = CARVE(L * BT * C), *ln1 = CARVE(L * BT * C), *ln1m = CARVE(L * BT);
    float *ln1r = CARVE(L * BT), *qkv = CARVE(L * BT * d.W), *y = CARVE(L * BT * C);
    float *x2 = CARVE(L * BT * C), *ln2 = CARVE(L * BT * C), *ln2m = CARVE(L * BT);
    float *ln2r = CARVE(L * BT), *fch = CARVE(L * BT * d.MW), *fcg = CARVE(L * BT * M);
    float *dkv = CARVE(L * BT * d.DKV);
    float *resL = CARVE(BT * C), *lnf = CARVE(BT * C), *lnfm = CARVE(BT);
    float *lnfr = CARVE(BT), *dlnf = CARVE(BT * C), *row_loss = CARVE(BT);
    float *grads = CARVE(n_params);
    float *dres = CARVE(SR * C), *dln = CARVE(SR * C), *dfc = CARVE(SR * d.MW);
    float *dact = CARVE(SR * M), *dqkv = CARVE(SR * d.W), *dqkv2 = CARVE(SR * d.W);
    float *sc = CARVE(H * qb * T), *dp = CARVE(H * qb * T);
#undef CARVE
    if (s) {
        s->res = res;
        s->ln1 = ln1;
        s->ln1m = ln1m;
        s->ln1r = ln1r;
        s->qkv = qkv;
        s->y = y;
        s->x2 = x2;
        s->ln2 = ln2;
        s->ln2m = ln2m;
        s->ln2r = ln2r;
        s->fch = fch;
        s->fcg = fcg;
        s->dkv = dkv;
        s->resL = resL;
        s->lnf = lnf;
        s->lnfm = lnfm;
        s->lnfr = lnfr;
        s->dlnf = dlnf;
        s->row_loss = row_loss;
        s->grads = grads;
        s->dres = dres;
        s->dln = dln;
        s->dfc = dfc;
        s->dact = dact;
        s->dqkv = dqkv;
        s->dqkv2 = dqkv2;
        s->sc = sc;
        s->dp = dp;
        s->SR = SR;
    }
    return used;
}

/* Release the device memory (a finished stream keeps only its state). */
static void stream_release(cu_ft_stream *s) {
    if (s->d_mem) cudaFree(s->d_mem);
    if (s->d_tok) cudaFree(s->d_tok);
    s->d_mem = NULL;
    s->d_tok = s->d_tgt = NULL;
    s->bytes = 0;
}

static void stream_free(cu_ft_stream *s) {
    if (!s) return;
    stream_release(s);
    free(s);
}

void cu_ft_free_all(orch_engine_ctx *ctx) {
    cu_ft_set *set = ctx->ft;
    if (!set) return;
    for (uint32_t i = 0; i < set->n; i++) stream_free(set->items[i]);
    free(set->items);
    free(set);
    ctx->ft = NULL;
}

static cu_ft_stream *stream_find(orch_engine_ctx *ctx, uint32_t id, uint32_t *index) {
    const cu_ft_set *set = ctx->ft;
    for (uint32_t i = 0; set && i < set->n; i++)
        if (set->items[i]->id == id) {
            if (index) *index = i;
            return set->items[i];
        }
    return NULL;
}

uint32_t cu_ft_adapter_stream(const orch_engine_ctx *ctx, uint32_t adapter_id) {
    const cu_ft_set *set = ctx->ft;
    for (uint32_t i = 0; set && i < set->n; i++)
        if (set->items[i]->adapter_id == adapter_id) return set->items[i]->id;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Attention of a chunk                                                       */
/* ------------------------------------------------------------------------- */

/* Runs the body for each query block of rows [r0, r1): sequence b,
 * positions i0 .. i0+nq-1 (in order). */
#define FOR_BLOCKS(s, r0, r1, ...)                                                       \
    for (uint64_t r_ = (r0); r_ < (r1);) {                                               \
        const uint32_t b = (uint32_t)(r_ / (s)->T), ta_ = (uint32_t)(r_ % (s)->T);       \
        const uint64_t end_ = min_u64((uint64_t)(b + 1) * (s)->T, (r1));                 \
        const uint32_t tb_ = (uint32_t)(end_ - (uint64_t)b * (s)->T);                    \
        for (uint32_t i0 = ta_; i0 < tb_; i0 += FT_QB) {                                 \
            const uint32_t nq = tb_ - i0 < FT_QB ? tb_ - i0 : FT_QB, nk = i0 + nq;       \
            const uint64_t loc = (uint64_t)b * (s)->T + i0 - (r0); /* chunk-local row */ \
            __VA_ARGS__                                                                  \
        }                                                                                \
        r_ = end_;                                                                       \
    }

int32_t cu_ft_attention(orch_engine_ctx *ctx, const cu_fwd_part *p, uint32_t l,
                        const float *qkv, const float *bias, float *y) {
    cu_ft_stream *s = p->ft;
    cudaStream_t cs = ctx->stream;
    const ft_dims dm = dims_of(ctx);
    const uint32_t C = ctx->C, H = ctx->H, hs = ctx->hs, R = p->B * p->T;
    const uint32_t KVH = ctx->KVH, G = H / KVH, W = (uint32_t)dm.W, KW = ctx->kvC;
    const uint64_t r0 = p->ft_r0, r1 = r0 + R, BT = s->BT;
    const float scale = 1.0f / sqrtf((float)hs);
    float *Q = s->qkv + (uint64_t)l * BT * W;
    /* the rows' q | k | v into the stream: GPT-2 with the bias, LLaMA with
     * RoPE on q and k at the rows' positions */
    KCHECK(ctx, k_ft_copy_cols(cs, qkv, W, bias, Q + r0 * W, W, R, W));
    if (dm.llama) {
        KCHECK(ctx, k_ft_rope(cs, qkv, W, Q + r0 * W, W, R, H, hs, r0, s->T,
                              ctx->d_inv_freq, 1.0f));
        KCHECK(ctx, k_ft_rope(cs, qkv + C, W, Q + r0 * W + C, W, R, KVH, hs, r0, s->T,
                              ctx->d_inv_freq, 1.0f));
    }
    /* per K/V head g its G query heads; GPT-2 (G = 1): all heads in one
     * batched product (K/V stride hs) */
    const uint32_t ng = G == 1 ? 1 : KVH, nb = G == 1 ? H : G;
    const long long skv = G == 1 ? (long long)hs : 0;
    FOR_BLOCKS(s, r0, r1, {
        const float *base = Q + (uint64_t)b * s->T * W;
        const long long sS = (long long)nq * nk;
        for (uint32_t g = 0; g < ng; g++) {
            const float *k = base + C + (uint64_t)g * hs, *v = k + KW;
            const uint64_t q0 = (uint64_t)g * G * hs;
            CU_TRY(cu_gemm_batched(ctx, 0, 1, (int)nq, (int)nk, (int)hs, scale,
                                   base + (uint64_t)i0 * W + q0, (int)W, hs, k, (int)W,
                                   skv, 0.0f, s->sc, (int)nk, sS, (int)nb));
            KCHECK(ctx, k_ft_softmax(cs, s->sc, (uint64_t)nb * nq, nq, nk, i0));
            CU_TRY(cu_gemm_batched(ctx, 0, 0, (int)nq, (int)hs, (int)nk, 1.0f, s->sc,
                                   (int)nk, sS, v, (int)W, skv, 0.0f, y + loc * C + q0,
                                   (int)C, hs, (int)nb));
        }
    })
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Forward chunk (with the step's inference rows)                             */
/* ------------------------------------------------------------------------- */

/* The LM head's matrix (LLaMA: lm_head.weight when untied) and the final
 * norm's weight. */
static uint32_t head_index(const orch_engine_ctx *ctx) {
    return ctx->arch == ORCH_ARCH_LLAMA && ctx->untied ? ctx->n_tensors - 1 : 0;
}
static uint32_t normf_index(const orch_engine_ctx *ctx) {
    return ctx->arch == ORCH_ARCH_LLAMA ? 1u + ctx->L * CL_PER_LAYER : ctx->n_tensors - 2;
}

static int32_t copy_rows(orch_engine_ctx *ctx, float *dst, const float *src,
                         uint64_t floats) {
    KCHECK(ctx, cudaMemcpyAsync(dst, src, floats * sizeof(float),
                                cudaMemcpyDeviceToDevice, ctx->stream));
    return ORCH_OK;
}

/* Forward rows [r0, r1) of s stacked after the inference rows of plan (NULL:
 * none; then batch and logits are unused). */
static int32_t fwd_chunk(orch_engine_ctx *ctx, cu_ft_stream *s, uint64_t r0, uint64_t r1,
                         const orch_infer_batch *batch, const cu_infer_plan *plan,
                         float *logits) {
    cudaStream_t cs = ctx->stream;
    const uint32_t C = ctx->C, M = ctx->M, L = ctx->L, V = ctx->V;
    const uint32_t R = (uint32_t)(r1 - r0);
    const uint32_t n_inf = plan ? plan->n_tokens : 0, RI = plan ? plan->n_rows : 0;
    const uint32_t n = n_inf + R, n_head = RI + R;
    cu_plan_dev dp;
    int32_t st = ORCH_OK;
    if (plan) {
        st = cu_lora_infer_begin(ctx, batch);
        if (st == ORCH_OK) st = cu_infer_upload_plan(ctx, plan, &dp);
        if (st == ORCH_OK) {
            cudaError_t e = cudaStreamSynchronize(cs);
            if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "cudaStreamSynchronize");
        }
    }
    if (st == ORCH_OK) st = cu_lora_prepare(ctx, s->lo->rank, R);
    if (st == ORCH_OK) st = cu_acts_reserve(ctx, n, 0);
    /* the stack's integer arrays: tokens [n] | positions [n] | head rows */
    const size_t n_ints = 2 * (size_t)n + n_head;
    if (st == ORCH_OK) st = cu_stage_reserve(ctx, n_ints * sizeof(int32_t));
    cu_fwd f;
    if (st == ORCH_OK) {
        int32_t *h = (int32_t *)ctx->h_stage;
        int32_t *tok = h, *pos = h + n, *hr = h + 2 * (size_t)n;
        if (plan) {
            memcpy(tok, plan->tokens, (size_t)n_inf * sizeof(int32_t));
            memcpy(pos, plan->pos, (size_t)n_inf * sizeof(int32_t));
            memcpy(hr, plan->rows, (size_t)RI * sizeof(int32_t));
        }
        for (uint32_t i = 0; i < R; i++) {
            tok[n_inf + i] = 0; /* from the stream's device copy below */
            pos[n_inf + i] = (int32_t)((r0 + i) % s->T);
            hr[RI + i] = (int32_t)(n_inf + i);
        }
        cudaError_t e = cudaMemcpyAsync(ctx->acts.i_base, h, n_ints * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, cs);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(ctx->acts.i_base + n_inf, s->d_tok + r0,
                                (size_t)R * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                cs);
        if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "cudaMemcpyAsync(stream rows)");
    }
    cu_fwd_part part;
    memset(&part, 0, sizeof part);
    part.B = 1;
    part.T = R;
    part.r0 = n_inf;
    part.lo = s->lo;
    part.lrow0 = RI;
    part.ft = s;
    part.ft_r0 = r0;
    if (st == ORCH_OK) {
        const int32_t *d = ctx->acts.i_base;
        cu_fwd_on_acts(ctx, &f, n, 0);
        f.n_inf = n_inf;
        f.dp = plan ? &dp : NULL;
        f.parts = &part;
        f.n_parts = 1;
        f.d_tok = d;
        f.d_pos = d + n;
        f.d_head_rows = d + 2 * (size_t)n;
        f.n_head = n_head;
        st = ctx->arch == ORCH_ARCH_LLAMA ? cu_llama_forward(ctx, &f)
                                          : cu_gpt2_forward(ctx, &f);
        if (st == ORCH_OK && RI) {
            cudaError_t e =
                cudaMemcpyAsync(logits, f.logits, (size_t)RI * V * sizeof(float),
                                cudaMemcpyDeviceToHost, cs);
            if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "cudaMemcpyAsync(logits)");
        }
    }
    if (plan) cu_lora_infer_end(ctx);
    if (st == ORCH_OK && plan) {
        const engine_kv_view kv = cu_kv_view(ctx);
        engine_kv_mark_written(batch, &kv);
    }
    if (st != ORCH_OK) return st;
    /* the chunk's rows of the stack into the stream */
    const ft_dims dm = dims_of(ctx);
    const uint64_t BT = s->BT, RC = (uint64_t)R * C, RM = (uint64_t)R * M;
    const uint64_t oC = r0 * C, oM = r0 * M, sC = (uint64_t)n_inf * C;
    const uint64_t sM = (uint64_t)n_inf * M, MW = dm.MW;
    for (uint32_t l = 0; l < L; l++) {
        const uint64_t lC = (uint64_t)l * BT * C, lM = (uint64_t)l * BT * M,
                       l1 = (uint64_t)l * BT;
        CU_TRY(copy_rows(ctx, s->res + lC + oC, cu_lb(f.res, l) + sC, RC));
        CU_TRY(copy_rows(ctx, s->ln1 + lC + oC, cu_lb(f.ln1, l) + sC, RC));
        if (!dm.llama) /* RMSNorm keeps no mean */
            CU_TRY(copy_rows(ctx, s->ln1m + l1 + r0, cu_lb(f.ln1m, l) + n_inf, R));
        CU_TRY(copy_rows(ctx, s->ln1r + l1 + r0, cu_lb(f.ln1r, l) + n_inf, R));
        CU_TRY(copy_rows(ctx, s->y + lC + oC, cu_lb(f.y, l) + sC, RC));
        CU_TRY(copy_rows(ctx, s->x2 + lC + oC, cu_lb(f.x2, l) + sC, RC));
        CU_TRY(copy_rows(ctx, s->ln2 + lC + oC, cu_lb(f.ln2, l) + sC, RC));
        if (!dm.llama)
            CU_TRY(copy_rows(ctx, s->ln2m + l1 + r0, cu_lb(f.ln2m, l) + n_inf, R));
        CU_TRY(copy_rows(ctx, s->ln2r + l1 + r0, cu_lb(f.ln2r, l) + n_inf, R));
        CU_TRY(copy_rows(ctx, s->fch + l1 * MW + r0 * MW, cu_lb(f.fch, l) + n_inf * MW,
                         R * MW));
        CU_TRY(copy_rows(ctx, s->fcg + lM + oM, cu_lb(f.fcg, l) + sM, RM));
    }
    CU_TRY(copy_rows(ctx, s->resL + oC, cu_lb(f.res, L) + sC, RC));
    CU_TRY(copy_rows(ctx, s->lnf + oC, f.lnf + sC, RC));
    if (!dm.llama) CU_TRY(copy_rows(ctx, s->lnfm + r0, f.lnfm + n_inf, R));
    CU_TRY(copy_rows(ctx, s->lnfr + r0, f.lnfr + n_inf, R));
    /* the head's loss and backward of the chunk's rows: d(logits) in place,
     * then d(ln_f output) = d(logits) wte (tied head) */
    float *dlogits = f.logits + (uint64_t)RI * V;
    const float dscale = s->grad_scale / (float)s->counted;
    KCHECK(ctx, k_cross_entropy(cs, dlogits, s->d_tgt + r0, s->row_loss + r0, R, V,
                                dscale, 1));
    CU_TRY(cu_gemm(ctx, 0, 0, (int)R, (int)C, (int)V, 1.0f, dlogits, (int)V,
                   cu_tp(ctx, ctx->d_params, head_index(ctx)), (int)C, 0.0f, s->dlnf + oC,
                   (int)C));
    /* the pinned staging buffer's upload and the logits' download are done
     * before the next chunk or call reuses them */
    KCHECK(ctx, cudaStreamSynchronize(cs));
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Backward chunk                                                             */
/* ------------------------------------------------------------------------- */

/* The attention backward of layer l for rows [r0, r1): d(y) in s->dln;
 * d(q) (before RoPE's inverse) into s->dqkv's q columns, every query row's
 * dK|dV added to the layer's accumulators, then the chunk's own (complete)
 * dK|dV rows into s->dqkv's k|v columns. */
static int32_t att_bwd(orch_engine_ctx *ctx, cu_ft_stream *s, uint32_t l, uint64_t r0,
                       uint64_t r1) {
    cudaStream_t cs = ctx->stream;
    const ft_dims dm = dims_of(ctx);
    const uint32_t C = ctx->C, H = ctx->H, hs = ctx->hs, KVH = ctx->KVH, G = H / KVH;
    const uint32_t W = (uint32_t)dm.W, KW = ctx->kvC, DKV = (uint32_t)dm.DKV;
    const uint64_t BT = s->BT;
    const float scale = 1.0f / sqrtf((float)hs);
    const float *Q = s->qkv + (uint64_t)l * BT * W;
    float *dkv = s->dkv + (uint64_t)l * BT * DKV;
    const uint32_t ng = G == 1 ? 1 : KVH, nb = G == 1 ? H : G;
    const long long skv = G == 1 ? (long long)hs : 0;
    const int c = (int)C, w = (int)W, ih = (int)hs, ldk = (int)DKV;
    FOR_BLOCKS(s, r0, r1, {
        const float *base = Q + (uint64_t)b * s->T * W, *q = base + (uint64_t)i0 * W;
        float *acc = dkv + (uint64_t)b * s->T * DKV;
        const long long sS = (long long)nq * nk;
        const int iq = (int)nq, ik = (int)nk;
        for (uint32_t g = 0; g < ng; g++) {
            const float *k = base + C + (uint64_t)g * hs, *v = k + KW;
            const uint64_t q0 = (uint64_t)g * G * hs;
            const float *dy = s->dln + loc * C + q0;
            float *dk = acc + (uint64_t)g * hs, *dv = dk + KW;
            /* the probabilities again, d(att) = dy v^T, then d(scores) */
            CU_TRY(cu_gemm_batched(ctx, 0, 1, iq, ik, ih, scale, q + q0, w, hs, k, w, skv,
                                   0.0f, s->sc, ik, sS, (int)nb));
            KCHECK(ctx, k_ft_softmax(cs, s->sc, (uint64_t)nb * nq, nq, nk, i0));
            CU_TRY(cu_gemm_batched(ctx, 0, 1, iq, ik, ih, 1.0f, dy, c, hs, v, w, skv,
                                   0.0f, s->dp, ik, sS, (int)nb));
            KCHECK(ctx,
                   k_ft_softmax_bwd(cs, s->sc, s->dp, (uint64_t)nb * nq, nq, nk, i0));
            /* dq = scale d(scores) k */
            CU_TRY(cu_gemm_batched(ctx, 0, 0, iq, ih, ik, scale, s->dp, ik, sS, k, w, skv,
                                   0.0f, s->dqkv + loc * W + q0, w, hs, (int)nb));
            if (G == 1) { /* dk += scale d(scores)^T q; dv += att^T dy, every head */
                CU_TRY(cu_gemm_batched(ctx, 1, 0, ik, ih, iq, scale, s->dp, ik, sS, q, w,
                                       hs, 1.0f, dk, ldk, hs, (int)H));
                CU_TRY(cu_gemm_batched(ctx, 1, 0, ik, ih, iq, 1.0f, s->sc, ik, sS, dy, c,
                                       hs, 1.0f, dv, ldk, hs, (int)H));
                continue;
            }
            for (uint32_t j = 0; j < G; j++) { /* the group's heads, in order */
                const uint64_t hj = (uint64_t)j * hs;
                CU_TRY(cu_gemm(ctx, 1, 0, ik, ih, iq, scale, s->dp + j * sS, ik,
                               q + q0 + hj, w, 1.0f, dk, ldk));
                CU_TRY(cu_gemm(ctx, 1, 0, ik, ih, iq, 1.0f, s->sc + j * sS, ik, dy + hj,
                               c, 1.0f, dv, ldk));
            }
        }
    })
    /* the chunk's dK|dV rows are complete now */
    KCHECK(ctx, k_ft_copy_cols(cs, dkv + r0 * DKV, DKV, NULL, s->dqkv + C, W,
                               (uint32_t)(r1 - r0), DKV));
    return ORCH_OK;
}

/* Backward of rows [r0, r1), every row at or above r1 done already. */
static int32_t bwd_chunk(orch_engine_ctx *ctx, cu_ft_stream *s, uint64_t r0,
                         uint64_t r1) {
    cudaStream_t cs = ctx->stream;
    const ft_dims dm = dims_of(ctx);
    const int llama = dm.llama;
    const uint32_t C = ctx->C, M = ctx->M, L = ctx->L, H = ctx->H, hs = ctx->hs;
    const uint32_t W = (uint32_t)dm.W, MW = (uint32_t)dm.MW;
    const int R = (int)(r1 - r0), c = (int)C, m = (int)M, w = (int)W, mw = (int)MW;
    const uint32_t ur = (uint32_t)R;
    const uint64_t BT = s->BT, oC = r0 * C, oM = r0 * M, oMW = r0 * MW, oW = r0 * W;
    float *P = ctx->d_params;
    /* the adapter with its gradients redirected to the stream's buffer */
    CU_TRY(cu_lora_prepare(ctx, s->lo->rank, ur)); /* the hooks' scratch for R rows */
    cu_lora lo = *s->lo;
    lo.d_grads = s->grads;
    const float *nfw = cu_tp(ctx, P, normf_index(ctx));
    if (llama)
        KCHECK(ctx, k_rmsnorm_bwd_dx(cs, s->dlnf + oC, s->resL + oC, s->lnfr + r0, nfw,
                                     s->dres, ur, C, 0));
    else
        KCHECK(ctx, k_layernorm_bwd_dx(cs, s->dlnf + oC, s->resL + oC, s->lnfm + r0,
                                       s->lnfr + r0, nfw, s->dres, ur, C, 0));
#define PW(l, w) cu_tp(ctx, P, CU_LAYER_TENSOR(l, w))
#define LW(l, w) cu_tp(ctx, P, CL_LAYER_TENSOR(l, w))
    for (uint32_t l = L; l-- > 0;) {
        const uint64_t lC = (uint64_t)l * BT * C, lM = (uint64_t)l * BT * M,
                       lMW = (uint64_t)l * BT * MW, l1 = (uint64_t)l * BT;
        const float *x = s->res + lC + oC, *n1 = s->ln1 + lC + oC, *x2 = s->x2 + lC + oC;
        const float *n2 = s->ln2 + lC + oC, *act = s->fcg + lM + oM;
        const float *pre = s->fch + lMW + oMW;
        /* MLP: dres is the gradient of the layer output */
        if (llama) {
            CU_TRY(cu_gemm(ctx, 0, 0, R, m, c, 1.0f, s->dres, c, LW(l, CL_DOWN), m, 0.0f,
                           s->dact, m));
            CU_TRY(cu_lora_backward(ctx, &lo, l, ORCH_LORA_TARGET_MLP_DOWN, ur, act, m,
                                    s->dres, c, s->dact, m));
            KCHECK(ctx, k_swiglu_bwd(cs, pre, s->dact, s->dfc, ur, M));
            CU_TRY(cu_gemm(ctx, 0, 0, R, c, mw, 1.0f, s->dfc, mw, LW(l, CL_GATE), c, 0.0f,
                           s->dln, c));
        } else {
            CU_TRY(cu_gemm(ctx, 0, 0, R, m, c, 1.0f, s->dres, c, PW(l, CU_FCPROJ_W), m,
                           0.0f, s->dfc, m));
            CU_TRY(cu_lora_backward(ctx, &lo, l, ORCH_LORA_TARGET_MLP_DOWN, ur, act, m,
                                    s->dres, c, s->dfc, m));
            KCHECK(ctx, k_gelu_bwd(cs, pre, s->dfc, ur, M));
            CU_TRY(cu_gemm(ctx, 0, 0, R, c, m, 1.0f, s->dfc, m, PW(l, CU_FC_W), c, 0.0f,
                           s->dln, c));
        }
        CU_TRY(cu_lora_backward(ctx, &lo, l, ORCH_LORA_TARGET_MLP_UP, ur, n2, c, s->dfc,
                                mw, s->dln, c));
        if (llama)
            KCHECK(ctx, k_rmsnorm_bwd_dx(cs, s->dln, x2, s->ln2r + l1 + r0,
                                         LW(l, CL_POST_NORM), s->dres, ur, C, 1));
        else
            KCHECK(ctx, k_layernorm_bwd_dx(cs, s->dln, x2, s->ln2m + l1 + r0,
                                           s->ln2r + l1 + r0, PW(l, CU_LN2_W), s->dres,
                                           ur, C, 1));
        /* attention output projection: dln = d(y) */
        CU_TRY(cu_gemm(ctx, 0, 0, R, c, c, 1.0f, s->dres, c,
                       llama ? LW(l, CL_O) : PW(l, CU_PROJ_W), c, 0.0f, s->dln, c));
        CU_TRY(cu_lora_backward(ctx, &lo, l, ORCH_LORA_TARGET_ATTN_OUT, ur,
                                s->y + lC + oC, c, s->dres, c, s->dln, c));
        CU_TRY(att_bwd(ctx, s, l, r0, r1));
        /* LLaMA: RoPE's inverse on d(q) and d(k), d(v) as it is */
        float *dqkv = s->dqkv;
        if (llama) {
            const uint32_t KVH = ctx->KVH, KW = ctx->kvC;
            KCHECK(ctx, k_ft_rope(cs, s->dqkv, W, s->dqkv2, W, ur, H, hs, r0, s->T,
                                  ctx->d_inv_freq, -1.0f));
            KCHECK(ctx, k_ft_rope(cs, s->dqkv + C, W, s->dqkv2 + C, W, ur, KVH, hs, r0,
                                  s->T, ctx->d_inv_freq, -1.0f));
            KCHECK(ctx, k_ft_copy_cols(cs, s->dqkv + C + KW, W, NULL, s->dqkv2 + C + KW,
                                       W, ur, KW));
            dqkv = s->dqkv2;
        }
        (void)oW;
        /* q | k | v projection and the first norm */
        CU_TRY(cu_gemm(ctx, 0, 0, R, c, w, 1.0f, dqkv, w,
                       llama ? LW(l, CL_Q) : PW(l, CU_ATTN_W), c, 0.0f, s->dln, c));
        CU_TRY(cu_lora_backward(ctx, &lo, l, ORCH_LORA_TARGET_ATTN_QKV, ur, n1, c, dqkv,
                                w, s->dln, c));
        if (llama)
            KCHECK(ctx, k_rmsnorm_bwd_dx(cs, s->dln, x, s->ln1r + l1 + r0,
                                         LW(l, CL_IN_NORM), s->dres, ur, C, 1));
        else
            KCHECK(ctx,
                   k_layernorm_bwd_dx(cs, s->dln, x, s->ln1m + l1 + r0, s->ln1r + l1 + r0,
                                      PW(l, CU_LN1_W), s->dres, ur, C, 1));
    }
#undef PW
#undef LW
    /* the embedding is frozen: nothing below layer 0 */
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Steps                                                                      */
/* ------------------------------------------------------------------------- */

/* The mean loss once every forward row is done (synchronises). */
static int32_t finish_forward(orch_engine_ctx *ctx, cu_ft_stream *s) {
    KCHECK(ctx,
           k_sum_to_double(ctx->stream, s->row_loss, s->BT, ctx->d_red + CU_NORM_BLOCKS));
    KCHECK(ctx, cudaMemcpyAsync(ctx->h_red, ctx->d_red + CU_NORM_BLOCKS, sizeof(double),
                                cudaMemcpyDeviceToHost, ctx->stream));
    KCHECK(ctx, cudaStreamSynchronize(ctx->stream));
    s->loss = (float)(*ctx->h_red / (double)s->counted);
    return ORCH_OK;
}

/* Up to `rows` rows of the stream's work; the first forward chunk carries
 * the inference batch (plan, when set), which otherwise runs first alone.
 * *done counts the rows done; *moved is set once the stream's saved state
 * changed in a way a retry could not repeat. */
static int32_t step_run(orch_engine_ctx *ctx, cu_ft_stream *s, uint64_t rows,
                        const orch_infer_batch *batch, const cu_infer_plan *plan,
                        float *logits, uint64_t *done, int *moved) {
    uint64_t left = rows;
    const uint64_t stack_max = plan ? CU_MAX_TOKENS - (uint64_t)plan->n_tokens : 0;
    if (plan && (!(left > 0 && s->fwd < s->BT && s->counted > 0) ||
                 min_u64(min_u64(s->BT - s->fwd, left), s->SR) > stack_max)) {
        CU_TRY(cu_infer_planned(ctx, batch, plan, logits)); /* nothing to pair with */
        plan = NULL;
    }
    while (left > 0 && s->fwd < s->BT) {
        const uint64_t n = min_u64(min_u64(s->BT - s->fwd, left), s->SR);
        if (s->counted > 0)
            CU_TRY(fwd_chunk(ctx, s, s->fwd, s->fwd + n, batch, plan, logits));
        plan = NULL;
        s->fwd += n;
        left -= n;
        *done += n;
        if (s->fwd == s->BT && s->counted > 0) CU_TRY(finish_forward(ctx, s));
    }
    while (left > 0 && s->fwd == s->BT && s->bwd < s->BT) {
        const uint64_t n = min_u64(min_u64(s->BT - s->bwd, left), s->SR);
        const uint64_t hi = s->BT - s->bwd;
        if (s->counted > 0) {
            *moved = 1; /* the dK|dV accumulators change */
            CU_TRY(bwd_chunk(ctx, s, hi - n, hi));
        }
        s->bwd += n;
        left -= n;
        *done += n;
    }
    if (s->bwd == s->BT && !s->finished) {
        if (s->counted > 0) {
            *moved = 1;
            KCHECK(ctx, k_ft_add(ctx->stream, s->lo->d_grads, s->grads, s->lo->n_params));
            KCHECK(ctx, cudaStreamSynchronize(ctx->stream));
        }
        s->finished = 1;
        stream_release(s);
    }
    return ORCH_OK;
}

static void fill_progress(const cu_ft_stream *s, uint64_t rows, orch_ft_progress *p) {
    if (s)
        engine_ft_progress_fill(p, 1, s->finished, s->BT, s->fwd, s->bwd, rows, s->loss);
    else
        engine_ft_progress_fill(p, 0, 0, 0, 0, 0, 0, 0.0f);
}

/* ------------------------------------------------------------------------- */
/* The ABI calls                                                              */
/* ------------------------------------------------------------------------- */

int32_t cu_ft_stream_open(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                          uint32_t *out_stream) {
    const char *fn = "ft_stream_open";
    if (!ft) return cu_set_error(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: ft is NULL", fn);
    if (!out_stream)
        return cu_set_error(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: out_stream is NULL", fn);
    /* the checks of coserve_forward's ft[i] (the CPU engine's words) */
    uint64_t counted = 0;
    CU_TRY(engine_check_ft_batch(fn, ft, &ctx->train_lim, &counted, ENGINE_ERRBUF(ctx)));
    cu_lora *lo = cu_lora_find(ctx, fn, ft->adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    if (!ctx->ft) {
        ctx->ft = (cu_ft_set *)calloc(1, sizeof *ctx->ft);
        if (!ctx->ft)
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        ctx->ft->next_id = 1;
    }
    cu_ft_set *set = ctx->ft;
    if (set->n >= FT_MAX_STREAMS)
        return cu_set_error(ctx, ORCH_ERR_CAPACITY, "%s: %u streams are open (the most)",
                            fn, set->n);
    if (set->next_id == 0)
        return cu_set_error(ctx, ORCH_ERR_CAPACITY, "%s: stream ids are exhausted", fn);
    if (set->n == set->cap) {
        const uint32_t cap = set->cap ? 2 * set->cap : 4;
        cu_ft_stream **items = (cu_ft_stream **)realloc(set->items, cap * sizeof *items);
        if (!items)
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        set->items = items;
        set->cap = cap;
    }
    const uint32_t B = ft->batch, T = ft->seq_len;
    const uint64_t BT = (uint64_t)B * T;
    const uint64_t floats = carve(ctx, NULL, NULL, BT, T, lo->n_params);
    const size_t bytes = floats * sizeof(float) + 2 * BT * sizeof(int32_t);
    cu_ft_stream *s = (cu_ft_stream *)calloc(1, sizeof *s);
    if (!s) return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    void *mem = NULL, *ints = NULL;
    cudaError_t e = cudaMalloc(&mem, floats * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc(&ints, 2 * BT * sizeof(int32_t));
    if (e != cudaSuccess) {
        if (mem) cudaFree(mem);
        free(s);
        if (e != cudaErrorMemoryAllocation)
            return cu_cuda_error(ctx, e, "cudaMalloc(stream)");
        (void)cudaGetLastError(); /* clear the allocation failure */
        return cu_set_error(
            ctx, ORCH_ERR_CAPACITY,
            "%s: the device cannot hold a stream of batch %u x seq_len %u "
            "(%.1f MiB of activations) beside the %u open streams",
            fn, B, T, (double)bytes / (1024.0 * 1024.0), set->n);
    }
    s->d_mem = (float *)mem;
    s->d_tok = (int32_t *)ints;
    s->d_tgt = s->d_tok + BT;
    carve(ctx, s, s->d_mem, BT, T, lo->n_params);
    cudaStream_t cs = ctx->stream;
    int32_t st = ORCH_OK;
    /* the dK|dV accumulators and the gradients start at 0 */
    e = cudaMemsetAsync(s->d_mem, 0, floats * sizeof(float), cs);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(s->d_tok, ft->tokens, BT * sizeof(int32_t),
                            cudaMemcpyHostToDevice, cs);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(s->d_tgt, ft->targets, BT * sizeof(int32_t),
                            cudaMemcpyHostToDevice, cs);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cs); /* the caller's arrays are copied */
    if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "ft_stream_open: upload");
    if (st != ORCH_OK) {
        stream_free(s);
        return st;
    }
    s->id = set->next_id++;
    s->adapter_id = ft->adapter_id;
    s->lo = lo;
    s->B = B;
    s->T = T;
    s->BT = BT;
    s->counted = counted;
    s->grad_scale = ft->grad_scale;
    s->bytes = bytes;
    set->items[set->n++] = s;
    *out_stream = s->id;
    return ORCH_OK;
}

int32_t cu_ft_stream_close(orch_engine_ctx *ctx, uint32_t stream) {
    uint32_t i = 0;
    cu_ft_stream *s = stream_find(ctx, stream, &i);
    if (!s)
        return cu_set_error(
            ctx, ORCH_ERR_INVALID_ARGUMENT,
            "ft_stream_close: stream %u is not an open stream of this context", stream);
    cu_ft_set *set = ctx->ft;
    memmove(&set->items[i], &set->items[i + 1], (set->n - i - 1) * sizeof *set->items);
    set->n--;
    /* kernels of the stream's last step may still read its buffers */
    const cudaError_t e = cudaStreamSynchronize(ctx->stream);
    stream_free(s);
    if (e != cudaSuccess) return cu_cuda_error(ctx, e, "ft_stream_close");
    return ORCH_OK;
}

int32_t cu_ft_coserve_step(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                           float *logits, uint64_t logits_cap, uint32_t stream,
                           uint32_t ft_rows, orch_ft_progress *progress) {
    /* ---- validation: nothing runs before all of it passes ---- */
    if (progress && progress->struct_size < sizeof *progress)
        return cu_set_error(ctx, ORCH_ERR_INVALID_ARGUMENT,
                            "coserve_step: progress->struct_size %u is smaller than "
                            "sizeof(orch_ft_progress) %zu",
                            progress->struct_size, sizeof *progress);
    cu_ft_stream *s = NULL;
    if (stream != 0) {
        s = stream_find(ctx, stream, NULL);
        if (!s)
            return cu_set_error(
                ctx, ORCH_ERR_INVALID_ARGUMENT,
                "coserve_step: stream %u is not an open stream of this context", stream);
        if (s->broken)
            return cu_set_error(
                ctx, ORCH_ERR_STATE,
                "coserve_step: stream %u failed in an earlier step; close it", stream);
    }
    const int infer = batch && (batch->struct_size < offsetof(orch_infer_batch, n_seqs) +
                                                         sizeof batch->n_seqs ||
                                batch->n_seqs > 0);
    cu_infer_plan plan;
    int32_t *mem = NULL;
    if (infer) CU_TRY(cu_plan_batch(ctx, batch, logits, logits_cap, &plan, &mem));
    const uint64_t rows = s && !s->finished ? ft_rows : 0;

    /* ---- the pass ---- */
    int32_t st = ORCH_OK;
    uint64_t done = 0;
    int moved = 0;
    if (rows > 0)
        st = step_run(ctx, s, rows, batch, infer ? &plan : NULL, logits, &done, &moved);
    else if (infer)
        st = cu_infer_planned(ctx, batch, &plan, logits);
    free(mem);
    if (st != ORCH_OK) {
        if (s && (done > 0 || moved)) s->broken = 1; /* it cannot be resumed */
        return st;
    }
    fill_progress(s, done, progress);
    return ORCH_OK;
}
