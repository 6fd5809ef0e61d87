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

int32_t cu_llama_train_step(orch_engine_ctx *ctx, const int32_t *tokens,
                            const int32_t *targets, uint32_t B, uint32_t T,
                            uint64_t n_valid, float grad_scale, int grad, float *out_loss,
                            const cu_grad_notify *notify) {
    cudaStream_t s = ctx->stream;
    const uint32_t C = ctx->C, L = ctx->L, H = ctx->H, D = ctx->hs, M = ctx->M,
                   V = ctx->V, KVH = ctx->KVH;
    const uint32_t G = H / KVH;    /* query heads per K/V head */
    const uint32_t KW = ctx->kvC;  /* K/V width KVH*D */
    const uint32_t W = C + 2 * KW; /* q | k | v row width */
    const uint32_t N = B * T;
    const uint32_t BG = B * KVH; /* attention groups */
    const uint64_t NC = (uint64_t)N * C, NK = (uint64_t)N * KW;
    const uint64_t A = (uint64_t)B * H * T * T; /* attention elements per layer */
    const long long sGTT = (long long)G * T * T, sGTD = (long long)G * T * D;
    const long long sTD = (long long)T * D;
    const int GT = (int)(G * T);
    const float scale = 1.0f / sqrtf((float)D);
    const float eps = ctx->eps;
    const float *freq = ctx->d_inv_freq;

    if (n_valid == 0) { /* nothing to learn from (as the GPT-2 path): no work */
        *out_loss = 0.0f;
        return grad ? cu_grad_ready(ctx, notify, 0, ctx->n_params) : ORCH_OK;
    }
    /* flat offset of layer l's first gradient (l = L: model.norm.weight) */
#define LOFF(l) (ctx->tensors[1u + (uint32_t)(l)*CL_PER_LAYER].offset)
    /* under an adapter (ABI 1.4) the base is frozen: no base gradients */
    const int frozen = ctx->lora_cur != NULL;
    if (frozen) CU_TRY(cu_lora_prepare(ctx, ctx->lora_cur->rank, N));
    CU_TRY(cu_acts_reserve(ctx, N, A));
    CU_TRY(cu_stage_reserve(ctx, (6 * (size_t)N + 1) * sizeof(int32_t)));
    cu_acts *a = &ctx->acts;

    /* host staging: tokens | targets | uniq | start (N+1) | rows | cursor */
    int32_t *h = (int32_t *)ctx->h_stage;
    memcpy(h, tokens, (size_t)N * sizeof(int32_t));
    memcpy(h + N, targets, (size_t)N * sizeof(int32_t));
    uint32_t n_uniq = 0;
    if (grad)
        n_uniq =
            cu_token_csr(ctx->h_tok_map, tokens, N, h + 2 * (size_t)N, h + 3 * (size_t)N,
                         h + 4 * (size_t)N + 1, h + 5 * (size_t)N + 1);
    size_t up = grad ? 5 * (size_t)N + 1 : 2 * (size_t)N;
    KCHECK(ctx, cudaMemcpyAsync(a->i_base, h, up * sizeof(int32_t),
                                cudaMemcpyHostToDevice, s));
    const int32_t *d_tok = a->i_base;
    const int32_t *d_tgt = a->i_base + N;
    const int32_t *d_uniq = a->i_base + 2 * (size_t)N;
    const int32_t *d_start = a->i_base + 3 * (size_t)N;
    const int32_t *d_rows = a->i_base + 4 * (size_t)N + 1;

    float *P = ctx->d_params, *Gr = ctx->d_grads;
#define PW(l, w) cu_tp(ctx, P, CL_LAYER_TENSOR(l, w))
#define GW(l, w) cu_tp(ctx, Gr, CL_LAYER_TENSOR(l, w))
    const float *emb = cu_tp(ctx, P, 0);
    const float *head = cu_tp(ctx, P, head_index(ctx));
    const float *norm_w = cu_tp(ctx, P, norm_index(ctx));

#define RES(l)  (a->res + (uint64_t)(l)*NC)
#define LN1(l)  (a->ln1 + (uint64_t)(l)*NC)
#define LN1R(l) (a->ln1_rstd + (uint64_t)(l)*N)
#define QH(l)   (a->qkvh + (uint64_t)(l)*3 * NC)
#define KH(l)   (QH(l) + NC)
#define VH(l)   (QH(l) + NC + NK)
#define ATT(l)  (a->att + (uint64_t)(l)*A)
#define YY(l)   (a->y + (uint64_t)(l)*NC)
#define X2(l)   (a->x2 + (uint64_t)(l)*NC)
#define LN2(l)  (a->ln2 + (uint64_t)(l)*NC)
#define LN2R(l) (a->ln2_rstd + (uint64_t)(l)*N)
#define GU(l)   (a->fch + (uint64_t)(l)*N * 2 * M)
#define ACT(l)  (a->fcg + (uint64_t)(l)*N * M)

    /* ---- forward ---- */
    KCHECK(ctx, k_gather_rows(s, emb, d_tok, RES(0), N, C));
    KCHECK(ctx, k_rmsnorm(s, RES(0), PW(0, CL_IN_NORM), LN1(0), LN1R(0), N, C, eps));
    for (uint32_t l = 0; l < L; l++) {
        /* q | k | v = n1 [Wq; Wk; Wv]^T, then RoPE and the head layout */
        CU_TRY(cu_gemm(ctx, 0, 1, N, W, C, 1.0f, LN1(l), C, PW(l, CL_Q), C, 0.0f,
                       a->s_big, W));
        CU_TRY(cu_lora_forward(ctx, l, ORCH_LORA_TARGET_ATTN_QKV, N, LN1(l), C, a->s_big,
                               (int)W));
        KCHECK(ctx, k_llama_split_heads(s, a->s_big, QH(l), KH(l), VH(l), freq, B, T, H,
                                        KVH, D));
        /* per group: scores [G*T, T] = scale q k^T; causal softmax; y = att v */
        CU_TRY(cu_gemm_batched(ctx, 0, 1, GT, T, D, scale, QH(l), D, sGTD, KH(l), D, sTD,
                               0.0f, ATT(l), T, sGTT, BG));
        KCHECK(ctx, k_softmax_causal(s, ATT(l), (uint64_t)B * H * T, T, T));
        CU_TRY(cu_gemm_batched(ctx, 0, 0, GT, D, T, 1.0f, ATT(l), T, sGTT, VH(l), D, sTD,
                               0.0f, a->s_heads, D, sGTD, BG));
        KCHECK(ctx, k_merge_heads(s, a->s_heads, YY(l), B, T, H, D, 1));
        /* h = x + y Wo^T; n2 = RMSNorm(h) * post_attention_layernorm */
        CU_TRY(cu_gemm(ctx, 0, 1, N, C, C, 1.0f, YY(l), C, PW(l, CL_O), C, 0.0f, a->s_c0,
                       C));
        CU_TRY(
            cu_lora_forward(ctx, l, ORCH_LORA_TARGET_ATTN_OUT, N, YY(l), C, a->s_c0, C));
        KCHECK(ctx, k_residual_rmsnorm(s, RES(l), a->s_c0, X2(l), PW(l, CL_POST_NORM),
                                       LN2(l), LN2R(l), N, C, eps));
        /* gate | up = n2 [Wg; Wu]^T; act = silu(gate) * up */
        CU_TRY(cu_gemm(ctx, 0, 1, N, 2 * M, C, 1.0f, LN2(l), C, PW(l, CL_GATE), C, 0.0f,
                       GU(l), 2 * M));
        CU_TRY(cu_lora_forward(ctx, l, ORCH_LORA_TARGET_MLP_UP, N, LN2(l), C, GU(l),
                               (int)(2 * M)));
        KCHECK(ctx, k_swiglu(s, GU(l), ACT(l), N, M, M));
        /* res[l+1] = h + act Wd^T; the next RMSNorm */
        CU_TRY(cu_gemm(ctx, 0, 1, N, C, M, 1.0f, ACT(l), M, PW(l, CL_DOWN), M, 0.0f,
                       a->s_c0, C));
        CU_TRY(
            cu_lora_forward(ctx, l, ORCH_LORA_TARGET_MLP_DOWN, N, ACT(l), M, a->s_c0, C));
        const float *nw = l + 1 < L ? PW(l + 1, CL_IN_NORM) : norm_w;
        float *nout = l + 1 < L ? LN1(l + 1) : a->lnf;
        float *nr = l + 1 < L ? LN1R(l + 1) : a->lnf_rstd;
        KCHECK(ctx, k_residual_rmsnorm(s, X2(l), a->s_c0, RES(l + 1), nw, nout, nr, N, C,
                                       eps));
    }
    /* logits = lnf head^T; cross-entropy (and d logits in place) */
    CU_TRY(cu_gemm(ctx, 0, 1, N, V, C, 1.0f, a->lnf, C, head, C, 0.0f, a->logits, V));
    float dscale = grad_scale / (float)n_valid;
    KCHECK(ctx, k_cross_entropy(s, a->logits, d_tgt, a->losses, N, V, dscale, grad));
    KCHECK(ctx, k_sum_to_double(s, a->losses, N, ctx->d_red + CU_NORM_BLOCKS));
    KCHECK(ctx, cudaMemcpyAsync(ctx->h_red, ctx->d_red + CU_NORM_BLOCKS, sizeof(double),
                                cudaMemcpyDeviceToHost, s));

    if (grad) {
        float *dres = a->s_c1; /* running d(residual) */
        float *dln = a->s_c0;  /* d(norm output) / d(y) */
        float *dlogits = a->logits;
        float *part = a->s_part;
        /* LM head: dlnf = dlogits head; dhead += dlogits^T lnf */
        CU_TRY(cu_gemm(ctx, 0, 0, N, C, V, 1.0f, dlogits, V, head, C, 0.0f, dln, C));
        if (!frozen)
            CU_TRY(cu_gemm(ctx, 1, 0, V, C, N, 1.0f, dlogits, V, a->lnf, C, 1.0f,
                           cu_tp(ctx, Gr, head_index(ctx)), C));
        KCHECK(ctx, k_rmsnorm_bwd_dx(s, dln, RES(L), a->lnf_rstd, norm_w, dres, N, C, 0));
        if (!frozen)
            KCHECK(ctx, k_rmsnorm_bwd_w(s, dln, RES(L), a->lnf_rstd,
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
            CU_TRY(cu_lora_backward(ctx, l, ORCH_LORA_TARGET_MLP_DOWN, N, ACT(l), M, dres,
                                    C, dact, M));
            /* SwiGLU, then gate | up */
            KCHECK(ctx, k_swiglu_bwd(s, GU(l), dact, dgu, N, M));
            if (!frozen)
                CU_TRY(cu_gemm(ctx, 1, 0, 2 * M, C, N, 1.0f, dgu, 2 * M, LN2(l), C, 1.0f,
                               GW(l, CL_GATE), C));
            CU_TRY(cu_gemm(ctx, 0, 0, N, C, 2 * M, 1.0f, dgu, 2 * M, PW(l, CL_GATE), C,
                           0.0f, dln, C));
            CU_TRY(cu_lora_backward(ctx, l, ORCH_LORA_TARGET_MLP_UP, N, LN2(l), C, dgu,
                                    (int)(2 * M), dln, C));
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
            CU_TRY(cu_lora_backward(ctx, l, ORCH_LORA_TARGET_ATTN_OUT, N, YY(l), C, dres,
                                    C, dln, C));
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
            CU_TRY(cu_lora_backward(ctx, l, ORCH_LORA_TARGET_ATTN_QKV, N, LN1(l), C, dqkv,
                                    (int)W, dln, C));
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
            KCHECK(ctx, k_embed_bwd_wte(s, dres, cu_tp(ctx, Gr, 0), d_uniq, d_start,
                                        d_rows, n_uniq, C));
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

    KCHECK(ctx, cudaStreamSynchronize(s));
    *out_loss = (float)(*ctx->h_red / (double)n_valid);
    return ORCH_OK;
}

int32_t cu_llama_infer(orch_engine_ctx *ctx, const cu_infer_plan *plan,
                       float *logits_out) {
    cudaStream_t s = ctx->stream;
    const uint32_t C = ctx->C, L = ctx->L, H = ctx->H, M = ctx->M, V = ctx->V,
                   D = ctx->hs, KVH = ctx->KVH;
    const uint32_t W = C + 2 * ctx->kvC;
    const uint32_t n = plan->n_tokens, R = plan->n_rows;
    const float eps = ctx->eps;
    cu_plan_dev dp;
    CU_TRY(cu_infer_upload_plan(ctx, plan, &dp));
    cu_infer_bufs *b = &ctx->inf;
    const int32_t *d_tok = dp.tok, *d_pos = dp.pos, *d_seq = dp.seq, *d_rows = dp.rows;
    const int32_t *d_btoff = dp.btoff, *d_bt = dp.bt;

    float *P = ctx->d_params;
#define PW(l, w) cu_tp(ctx, P, CL_LAYER_TENSOR(l, w))
    const float *emb = cu_tp(ctx, P, 0);
    const float *head = cu_tp(ctx, P, head_index(ctx));
    const float *norm_w = cu_tp(ctx, P, norm_index(ctx));
    const uint32_t bs = ctx->kv_block_size;
    const size_t smem = (size_t)ctx->T * sizeof(float);

    KCHECK(ctx, k_gather_rows(s, emb, d_tok, b->x, n, C));
    KCHECK(ctx, k_rmsnorm(s, b->x, PW(0, CL_IN_NORM), b->ln, NULL, n, C, eps));
    for (uint32_t l = 0; l < L; l++) {
        CU_TRY(
            cu_gemm(ctx, 0, 1, n, W, C, 1.0f, b->ln, C, PW(l, CL_Q), C, 0.0f, b->qkv, W));
        CU_TRY(cu_lora_infer_forward(ctx, l, ORCH_LORA_TARGET_ATTN_QKV, b->ln, C, b->qkv,
                                     (int)W));
        KCHECK(ctx, k_llama_kv_write(s, b->qkv, b->q, ctx->d_kv, ctx->d_inv_freq, d_pos,
                                     d_seq, d_btoff, d_bt, n, H, KVH, D, bs, L, l));
        KCHECK(ctx, k_paged_attention(s, b->q, ctx->d_kv, d_pos, d_seq, d_btoff, d_bt,
                                      b->y, n, C, H, KVH, bs, L, l, smem));
        CU_TRY(
            cu_gemm(ctx, 0, 1, n, C, C, 1.0f, b->y, C, PW(l, CL_O), C, 0.0f, b->tmp, C));
        CU_TRY(
            cu_lora_infer_forward(ctx, l, ORCH_LORA_TARGET_ATTN_OUT, b->y, C, b->tmp, C));
        KCHECK(ctx, k_residual_rmsnorm(s, b->x, b->tmp, b->x2, PW(l, CL_POST_NORM), b->ln,
                                       NULL, n, C, eps));
        /* gate | up, then silu(gate)*up in place over the gate half (ld 2M) */
        CU_TRY(cu_gemm(ctx, 0, 1, n, 2 * M, C, 1.0f, b->ln, C, PW(l, CL_GATE), C, 0.0f,
                       b->fc, 2 * M));
        CU_TRY(cu_lora_infer_forward(ctx, l, ORCH_LORA_TARGET_MLP_UP, b->ln, C, b->fc,
                                     (int)(2 * M)));
        KCHECK(ctx, k_swiglu(s, b->fc, b->fc, n, M, 2 * M));
        CU_TRY(cu_gemm(ctx, 0, 1, n, C, M, 1.0f, b->fc, 2 * M, PW(l, CL_DOWN), M, 0.0f,
                       b->tmp, C));
        CU_TRY(cu_lora_infer_forward(ctx, l, ORCH_LORA_TARGET_MLP_DOWN, b->fc,
                                     (int)(2 * M), b->tmp, C));
        const float *nw = l + 1 < L ? PW(l + 1, CL_IN_NORM) : norm_w;
        KCHECK(ctx,
               k_residual_rmsnorm(s, b->x2, b->tmp, b->x, nw, b->ln, NULL, n, C, eps));
    }
#undef PW
    if (R) {
        KCHECK(ctx, k_gather_rows(s, b->ln, d_rows, b->sel, R, C));
        CU_TRY(cu_gemm(ctx, 0, 1, R, V, C, 1.0f, b->sel, C, head, C, 0.0f, b->logits, V));
        KCHECK(ctx, cudaMemcpyAsync(logits_out, b->logits, (size_t)R * V * sizeof(float),
                                    cudaMemcpyDeviceToHost, s));
    }
    KCHECK(ctx, cudaStreamSynchronize(s));
    return ORCH_OK;
}
