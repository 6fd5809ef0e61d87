/*
 * cuda_llama.cu - LLaMA (ORCH_ARCH_LLAMA, ABI 1.1) on the device: the
 * training forward/backward pass and the paged-KV inference forward, built
 * from cuBLAS GEMMs (cu_gemm / cu_gemm_batched) and the kernels of
 * cuda_kernels.cu. Initialisation and AdamW are cuda_model.cu's (they walk
 * the tensor table, whatever the architecture).
 *
 * The block (engine_api/orch_engine.h): h = x + o_proj(attn(rope(q),
 * rope(k), v)) on n1 = RMSNorm(x)*input_layernorm; out = h +
 * down_proj(silu(gate_proj(n2)) * up_proj(n2)), n2 = RMSNorm(h) *
 * post_attention_layernorm; no biases; query head j attends with K/V head
 * j / G, G = H/KV. RoPE is the rotate-half form at position t with the
 * frequencies of engine_rope_inv_freq (uploaded once, ctx->d_inv_freq).
 *
 * Layout tricks:
 *   - q_proj, k_proj, v_proj are adjacent in the flat buffers, so they are one
 *     [(H+2KV)*D, C] matrix: one GEMM gives q | k | v per row, one GEMM
 *     accumulates all three weight gradients. gate_proj and up_proj likewise
 *     form one [2M, C] matrix.
 *   - Grouped-query attention without copying K/V: in the [B,H,T,D] head
 *     layout the G query heads of one K/V head are consecutive, so they form
 *     one [G*T, D] matrix. Every attention product is one batched GEMM over
 *     the B*KV groups (scores [G*T, T] per group land exactly in the [B*H,T,T]
 *     score layout), and dK, dV sum over the G heads inside the GEMM. The
 *     scores are the full T x T square masked by the causal softmax (the
 *     GPT-2 path's per-query-chunk products need one batch entry per head,
 *     which the grouped layout does not have).
 * Every reduction has a fixed order (no atomics), as in cuda_model.cu.
 * LoRA adapters (ABI 1.4) hook in as in cuda_model.cu: the q/k/v modules
 * are column ranges of the fused q | k | v product, gate and up of the
 * fused gate | up product; under an adapter no base gradient is computed.
 */
#include "engines/cuda/cuda_internal.h"

#include <math.h>
#include <string.h>

#define KCHECK(ctx, call)                                                  \
    do {                                                                   \
        cudaError_t k_e_ = (call);                                         \
        if (k_e_ != cudaSuccess) return cu_cuda_error((ctx), k_e_, #call); \
    } while (0)

/* Index of the head matrix: lm_head.weight (untied, last) or the embedding. */
static uint32_t head_index(const orch_engine_ctx *ctx) {
    return ctx->untied ? ctx->n_tensors - 1 : 0;
}

/* Index of model.norm.weight. */
static uint32_t norm_index(const orch_engine_ctx *ctx) {
    return 1u + ctx->L * CL_PER_LAYER;
}

/* Attention of layer l for every part of the stack (cuda_model.cu's
 * gpt2_attention with RoPE and GQA): paged for the inference rows, causal
 * within each sequence of a fine-tuning part. Reads f->qkv, writes f->y. */
static int32_t llama_attention(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t l) {
    cudaStream_t s = ctx->stream;
    const uint32_t C = ctx->C, L = ctx->L, H = ctx->H, D = ctx->hs, KVH = ctx->KVH;
    const uint32_t G = H / KVH, KW = ctx->kvC, W = C + 2 * KW;
    const float *freq = ctx->d_inv_freq;
    float *y = cu_lb(f->y, l);
    if (f->dp && f->n_inf) {
        const cu_plan_dev *d = f->dp;
        KCHECK(ctx, k_llama_kv_write(s, f->qkv, f->qi, ctx->d_kv, freq, d->pos, d->seq,
                                     d->btoff, d->bt, f->n_inf, H, KVH, D,
                                     ctx->kv_block_size, L, l));
        KCHECK(ctx, k_paged_attention(s, f->qi, ctx->d_kv, d->pos, d->seq, d->btoff,
                                      d->bt, y, f->n_inf, C, H, KVH, ctx->kv_block_size,
                                      L, l, (size_t)ctx->T * sizeof(float)));
    }
    const float scale = 1.0f / sqrtf((float)D);
    for (uint32_t k = 0; k < f->n_parts; k++) {
        const cu_fwd_part *p = &f->parts[k];
        if (p->ft) { /* a fine-tuning stream's chunk (cuda_ft_stream.cu) */
            CU_TRY(cu_ft_attention(ctx, p, l, f->qkv + (uint64_t)p->r0 * W, NULL,
                                   y + (uint64_t)p->r0 * C));
            continue;
        }
        const uint32_t B = p->B, T = p->T, BG = B * KVH;
        const uint64_t NC = (uint64_t)B * T * C, NK = (uint64_t)B * T * KW;
        const long long sGTT = (long long)G * T * T, sGTD = (long long)G * T * D;
        const long long sTD = (long long)T * D;
        const int GT = (int)(G * T);
        float *qh = cu_lb(f->qkvh, l) + 3 * (uint64_t)p->r0 * C, *kh = qh + NC,
              *vh = qh + NC + NK;
        float *att = cu_lb(f->att, l) + p->att0;
        /* RoPE and the head layout */
        KCHECK(ctx, k_llama_split_heads(s, f->qkv + (uint64_t)p->r0 * W, qh, kh, vh, freq,
                                        B, T, H, KVH, D));
        /* per group: scores [G*T, T] = scale q k^T; causal softmax; y = att v */
        CU_TRY(cu_gemm_batched(ctx, 0, 1, GT, T, D, scale, qh, D, sGTD, kh, D, sTD, 0.0f,
                               att, T, sGTT, BG));
        KCHECK(ctx, k_softmax_causal(s, att, (uint64_t)B * H * T, T, T));
        CU_TRY(cu_gemm_batched(ctx, 0, 0, GT, D, T, 1.0f, att, T, sGTT, vh, D, sTD, 0.0f,
                               f->heads, D, sGTD, BG));
        KCHECK(ctx, k_merge_heads(s, f->heads, y + (uint64_t)p->r0 * C, B, T, H, D, 1));
    }
    return ORCH_OK;
}

int32_t cu_llama_forward(orch_engine_ctx *ctx, const cu_fwd *f) {
    cudaStream_t s = ctx->stream;
    const uint32_t C = ctx->C, L = ctx->L, M = ctx->M, n = f->n;
    const uint32_t W = C + 2 * ctx->kvC; /* q | k | v row width */
    const float eps = ctx->eps;
    float *P = ctx->d_params;
#define PW(l, w) cu_tp(ctx, P, CL_LAYER_TENSOR(l, w))
    const float *emb = cu_tp(ctx, P, 0);
    const float *norm_w = cu_tp(ctx, P, norm_index(ctx));
    /* the inference pass writes silu(gate)*up over the gate half (ld 2M) */
    const int in_place = f->fcg.p == f->fch.p;
    const uint32_t ald = in_place ? 2 * M : M;
    KCHECK(ctx, k_gather_rows(s, emb, f->d_tok, cu_lb(f->res, 0), n, C));
    KCHECK(ctx, k_rmsnorm(s, cu_lb(f->res, 0), PW(0, CL_IN_NORM), cu_lb(f->ln1, 0),
                          cu_lb(f->ln1r, 0), n, C, eps));
    for (uint32_t l = 0; l < L; l++) {
        float *ln1 = cu_lb(f->ln1, l), *y = cu_lb(f->y, l), *x2 = cu_lb(f->x2, l);
        float *ln2 = cu_lb(f->ln2, l), *gu = cu_lb(f->fch, l);
        float *act = in_place ? gu : cu_lb(f->fcg, l);
        /* q | k | v = n1 [Wq; Wk; Wv]^T */
        CU_TRY(
            cu_gemm(ctx, 0, 1, n, W, C, 1.0f, ln1, C, PW(l, CL_Q), C, 0.0f, f->qkv, W));
        CU_TRY(cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_ATTN_QKV, ln1, C, f->qkv,
                                     (int)W));
        CU_TRY(llama_attention(ctx, f, l));
        /* h = x + y Wo^T; n2 = RMSNorm(h) * post_attention_layernorm */
        CU_TRY(cu_gemm(ctx, 0, 1, n, C, C, 1.0f, y, C, PW(l, CL_O), C, 0.0f, f->tmp, C));
        CU_TRY(
            cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_ATTN_OUT, y, C, f->tmp, C));
        KCHECK(ctx,
               k_residual_rmsnorm(s, cu_lb(f->res, l), f->tmp, x2, PW(l, CL_POST_NORM),
                                  ln2, cu_lb(f->ln2r, l), n, C, eps));
        /* gate | up = n2 [Wg; Wu]^T; act = silu(gate) * up */
        CU_TRY(cu_gemm(ctx, 0, 1, n, 2 * M, C, 1.0f, ln2, C, PW(l, CL_GATE), C, 0.0f, gu,
                       2 * M));
        CU_TRY(cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_MLP_UP, ln2, C, gu,
                                     (int)(2 * M)));
        KCHECK(ctx, k_swiglu(s, gu, act, n, M, ald));
        /* res[l+1] = h + act Wd^T; the next RMSNorm */
        CU_TRY(cu_gemm(ctx, 0, 1, n, C, M, 1.0f, act, ald, PW(l, CL_DOWN), M, 0.0f,
                       f->tmp, C));
        CU_TRY(cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_MLP_DOWN, act, (int)ald,
                                     f->tmp, C));
        const int last = l + 1 == L;
        KCHECK(ctx,
               k_residual_rmsnorm(s, x2, f->tmp, cu_lb(f->res, l + 1),
                                  last ? norm_w : PW(l + 1, CL_IN_NORM),
                                  last ? f->lnf : cu_lb(f->ln1, l + 1),
                                  last ? f->lnfr : cu_lb(f->ln1r, l + 1), n, C, eps));
    }
#undef PW
    return cu_lm_head(ctx, f, cu_tp(ctx, P, head_index(ctx)));
}

int32_t cu_llama_part_loss(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t k,
                           const int32_t *d_tgt, uint64_t n_valid, float grad_scale,
                           int grad, const cu_emb_csr *emb, const cu_grad_notify *notify,
                           float *out_loss) {
    cudaStream_t s = ctx->stream;
    const cu_fwd_part *pt = &f->parts[k];
    const uint32_t C = ctx->C, L = ctx->L, H = ctx->H, D = ctx->hs, M = ctx->M,
                   V = ctx->V, KVH = ctx->KVH;
    const uint32_t G = H / KVH;    /* query heads per K/V head */
    const uint32_t KW = ctx->kvC;  /* K/V width KVH*D */
    const uint32_t W = C + 2 * KW; /* q | k | v row width */
    const uint32_t B = pt->B, T = pt->T, N = B * T, r0 = pt->r0;
    const uint32_t BG = B * KVH; /* attention groups */
    const uint64_t NC = (uint64_t)N * C, NK = (uint64_t)N * KW, RO = (uint64_t)r0 * C;
    const long long sGTT = (long long)G * T * T, sGTD = (long long)G * T * D;
    const long long sTD = (long long)T * D;
    const int GT = (int)(G * T);
    const float scale = 1.0f / sqrtf((float)D);
    const float *freq = ctx->d_inv_freq;
    cu_acts *a = &ctx->acts;
    cu_lora *lo = pt->lo;
    const int frozen = lo != NULL;
    float *P = ctx->d_params, *Gr = ctx->d_grads;
    const float *head = cu_tp(ctx, P, head_index(ctx));
    const float *norm_w = cu_tp(ctx, P, norm_index(ctx));
    float *lnf = f->lnf + RO, *lnf_rstd = f->lnfr + r0;
    float *logits = f->logits + (uint64_t)pt->lrow0 * V;
    CU_TRY(cu_part_ce(ctx, f, k, d_tgt, n_valid, grad_scale, grad));
    /* flat offset of layer l's first gradient (l = L: model.norm.weight) */
#define LOFF(l)  (ctx->tensors[1u + (uint32_t)(l)*CL_PER_LAYER].offset)
#define PW(l, w) cu_tp(ctx, P, CL_LAYER_TENSOR(l, w))
#define GW(l, w) cu_tp(ctx, Gr, CL_LAYER_TENSOR(l, w))
#define RES(l)   (cu_lb(f->res, l) + RO)
#define LN1(l)   (cu_lb(f->ln1, l) + RO)
#define LN1R(l)  (cu_lb(f->ln1r, l) + r0)
#define QH(l)    (cu_lb(f->qkvh, l) + 3 * RO)
#define KH(l)    (QH(l) + NC)
#define VH(l)    (QH(l) + NC + NK)
#define ATT(l)   (cu_lb(f->att, l) + pt->att0)
#define YY(l)    (cu_lb(f->y, l) + RO)
#define X2(l)    (cu_lb(f->x2, l) + RO)
#define LN2(l)   (cu_lb(f->ln2, l) + RO)
#define LN2R(l)  (cu_lb(f->ln2r, l) + r0)
#define GU(l)    (cu_lb(f->fch, l) + (uint64_t)r0 * 2 * M)
#define ACT(l)   (cu_lb(f->fcg, l) + (uint64_t)r0 * M)

    if (grad) {
        float *dres = a->s_c1; /* running d(residual) */
        float *dln = a->s_c0;  /* d(norm output) / d(y) */
        float *dlogits = logits;
        float *part = a->s_part;
        /* LM head: dlnf = dlogits head; dhead += dlogits^T lnf */
        CU_TRY(cu_gemm(ctx, 0, 0, N, C, V, 1.0f, dlogits, V, head, C, 0.0f, dln, C));
        if (!frozen)
            CU_TRY(cu_gemm(ctx, 1, 0, V, C, N, 1.0f, dlogits, V, lnf, C, 1.0f,
                           cu_tp(ctx, Gr, head_index(ctx)), C));
        KCHECK(ctx, k_rmsnorm_bwd_dx(s, dln, RES(L), lnf_rstd, norm_w, dres, N, C, 0));
        if (!frozen)
            KCHECK(ctx, k_rmsnorm_bwd_w(s, dln, RES(L), lnf_rstd,
                                        cu_tp(ctx, Gr, norm_index(ctx)), N, C, part));
        /* model.norm and an untied lm_head end the buffer */
        CU_TRY(cu_grad_ready(ctx, notify, LOFF(L), ctx->n_params - LOFF(L)));
        for (uint32_t li = L; li-- > 0;) {
            const uint32_t l = li;
            float *dgu = a->s_big;    /* [N, 2M] */
            float *dact = a->s_heads; /* [N, M]: s_heads is sized for it */
            /* down_proj */
            if (!frozen)
                CU_TRY(cu_gemm(ctx, 1, 0, C, M, N, 1.0f, dres, C, ACT(l), M, 1.0f,
                               GW(l, CL_DOWN), M));
            CU_TRY(cu_gemm(ctx, 0, 0, N, M, C, 1.0f, dres, C, PW(l, CL_DOWN), M, 0.0f,
                           dact, M));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_MLP_DOWN, N, ACT(l), M,
                                    dres, C, dact, M));
            /* SwiGLU, then gate | up */
            KCHECK(ctx, k_swiglu_bwd(s, GU(l), dact, dgu, N, M));
            if (!frozen)
                CU_TRY(cu_gemm(ctx, 1, 0, 2 * M, C, N, 1.0f, dgu, 2 * M, LN2(l), C, 1.0f,
                               GW(l, CL_GATE), C));
            CU_TRY(cu_gemm(ctx, 0, 0, N, C, 2 * M, 1.0f, dgu, 2 * M, PW(l, CL_GATE), C,
                           0.0f, dln, C));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_MLP_UP, N, LN2(l), C,
                                    dgu, (int)(2 * M), dln, C));
            /* post_attention_layernorm: d(h) = dres + RMSNorm backward */
            KCHECK(ctx, k_rmsnorm_bwd_dx(s, dln, X2(l), LN2R(l), PW(l, CL_POST_NORM),
                                         dres, N, C, 1));
            if (!frozen)
                KCHECK(ctx, k_rmsnorm_bwd_w(s, dln, X2(l), LN2R(l), GW(l, CL_POST_NORM),
                                            N, C, part));
            /* o_proj */
            if (!frozen)
                CU_TRY(cu_gemm(ctx, 1, 0, C, C, N, 1.0f, dres, C, YY(l), C, 1.0f,
                               GW(l, CL_O), C));
            CU_TRY(
                cu_gemm(ctx, 0, 0, N, C, C, 1.0f, dres, C, PW(l, CL_O), C, 0.0f, dln, C));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_OUT, N, YY(l), C,
                                    dres, C, dln, C));
            /* attention core: dyh in s_big[0..NC); dq, dk, dv in s_heads */
            float *dyh = a->s_big;
            float *dqh = a->s_heads, *dkh = a->s_heads + NC, *dvh = a->s_heads + NC + NK;
            KCHECK(ctx, k_to_heads(s, dln, dyh, B, T, H, D));
            /* d(att) = dyh v^T; softmax backward; dq = scale d(pre) k */
            CU_TRY(cu_gemm_batched(ctx, 0, 1, GT, T, D, 1.0f, dyh, D, sGTD, VH(l), D, sTD,
                                   0.0f, a->s_att, T, sGTT, BG));
            KCHECK(ctx,
                   k_softmax_causal_bwd(s, ATT(l), a->s_att, (uint64_t)B * H * T, T, T));
            CU_TRY(cu_gemm_batched(ctx, 0, 0, GT, D, T, scale, a->s_att, T, sGTT, KH(l),
                                   D, sTD, 0.0f, dqh, D, sGTD, BG));
            /* dv = att^T dyh and dk = scale d(pre)^T q: the sums over the G
             * query heads of a group are the inner dimension of the GEMM */
            CU_TRY(cu_gemm_batched(ctx, 1, 0, T, D, GT, 1.0f, ATT(l), T, sGTT, dyh, D,
                                   sGTD, 0.0f, dvh, D, sTD, BG));
            CU_TRY(cu_gemm_batched(ctx, 1, 0, T, D, GT, scale, a->s_att, T, sGTT, QH(l),
                                   D, sGTD, 0.0f, dkh, D, sTD, BG));
            float *dqkv = a->s_big; /* [N, W]; dyh is no longer needed */
            KCHECK(ctx,
                   k_llama_merge_heads(s, dqh, dkh, dvh, dqkv, freq, B, T, H, KVH, D));
            /* q | k | v projections */
            if (!frozen)
                CU_TRY(cu_gemm(ctx, 1, 0, W, C, N, 1.0f, dqkv, W, LN1(l), C, 1.0f,
                               GW(l, CL_Q), C));
            CU_TRY(
                cu_gemm(ctx, 0, 0, N, C, W, 1.0f, dqkv, W, PW(l, CL_Q), C, 0.0f, dln, C));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_QKV, N, LN1(l), C,
                                    dqkv, (int)W, dln, C));
            /* input_layernorm: d(res[l]) = dres + RMSNorm backward */
            KCHECK(ctx, k_rmsnorm_bwd_dx(s, dln, RES(l), LN1R(l), PW(l, CL_IN_NORM), dres,
                                         N, C, 1));
            if (!frozen)
                KCHECK(ctx, k_rmsnorm_bwd_w(s, dln, RES(l), LN1R(l), GW(l, CL_IN_NORM), N,
                                            C, part));
            CU_TRY(cu_grad_ready(ctx, notify, LOFF(l), LOFF(l + 1) - LOFF(l)));
        }
        /* the embedding (rows grouped by token: no atomics) */
        if (!frozen)
            KCHECK(ctx, k_embed_bwd_wte(s, dres, cu_tp(ctx, Gr, 0), emb->uniq, emb->start,
                                        emb->rows, emb->n_uniq, C));
        CU_TRY(cu_grad_ready(ctx, notify, 0, LOFF(0)));
    }
#undef LOFF
#undef PW
#undef GW
#undef RES
#undef LN1
#undef LN1R
#undef QH
#undef KH
#undef VH
#undef ATT
#undef YY
#undef X2
#undef LN2
#undef LN2R
#undef GU
#undef ACT

    return cu_part_loss_end(ctx, n_valid, out_loss);
}
