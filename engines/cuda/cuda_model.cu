/*
 * cuda_model.cu - GPT-2 on the device: parameter initialisation, the training
 * forward/backward pass, the global-norm clip + AdamW step, and the paged-KV
 * inference forward. Initialisation, AdamW and the scratch buffers serve
 * LLaMA too; its passes are in cuda_llama.cu (the two entry points here
 * dispatch on the architecture). Matrix products go through cuBLAS (cu_gemm /
 * cu_gemm_batched); everything else through the kernels of cuda_kernels.cu.
 *
 * Every function here takes a validated request (cuda_engine.cu checks the
 * inputs), works on the context's stream, and synchronises at most once, at
 * the end, to hand a scalar or the logits back to the host.
 *
 * Training data flow per layer l (N = B*T rows, row-major):
 *   res[l] -LN1-> ln1 -c_attn-> qkv -split-> q,k,v [B,H,T,hs]
 *   att = softmax_causal(q k^T / sqrt(hs)); yh = att v -merge-> y
 *   x2 = res[l] + y W_proj^T + b_proj -LN2-> ln2 -c_fc-> fch -GELU-> fcg
 *   res[l+1] = x2 + fcg W_fcproj^T + b_fcproj   (fused with the next LN)
 * The backward pass walks the same steps in reverse with one running residual
 * gradient (dres) and adds every parameter gradient into ctx->d_grads.
 * Under a LoRA adapter (ctx->lora_cur, ABI 1.4) the base is frozen: no base
 * gradient is computed, and the hooks of cuda_lora.cu add the adapter's term
 * after each target product (forward) and its gradients and d(input) part
 * after each target's d(input) product (backward); inference adds each
 * sequence's adapter term the same way.
 * One forward serves inference, training and co-serving (cu_gpt2_forward
 * over a cu_fwd stack, cuda_internal.h): the inference pass is a stack of
 * inference rows on ctx->inf's buffers (one per role, reused by every
 * layer), the training pass a stack of one fine-tuning part on ctx->acts,
 * coserve_forward (cuda_coserve.cu) both kinds of rows at once; the loss and
 * backward run per part (cu_gpt2_part_loss).
 * The T x T attention products run per query chunk (attn_chunk), skipping the
 * keys no row of the chunk can see; dK and dV run per key chunk over the
 * query rows at or below it.
 */
#include "engines/cuda/cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------- */
/* GEMM                                                                       */
/* ------------------------------------------------------------------------- */
/* cuBLAS is column-major: a row-major [r,c] matrix is, to cuBLAS, its own
 * transpose. So row-major C = op(A) op(B) is computed as the column-major
 * C^T = op(B)^T op(A)^T: the operands swap places and keep their op flags. */

int32_t cu_gemm(orch_engine_ctx *ctx, int transA, int transB, int M, int N, int K,
                float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                float *C, int ldc) {
    CU_BLAS(ctx, cublasGemmEx(ctx->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                              transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                              CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F,
                              ldc, ctx->compute, CUBLAS_GEMM_DEFAULT));
    return ORCH_OK;
}

int32_t cu_gemm_batched(orch_engine_ctx *ctx, int transA, int transB, int M, int N, int K,
                        float alpha, const float *A, int lda, long long sA,
                        const float *B, int ldb, long long sB, float beta, float *C,
                        int ldc, long long sC, int batch) {
    CU_BLAS(ctx, cublasGemmStridedBatchedEx(ctx->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                                            &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F,
                                            lda, sA, &beta, C, CUDA_R_32F, ldc, sC, batch,
                                            ctx->compute, CUBLAS_GEMM_DEFAULT));
    return ORCH_OK;
}

#define KCHECK(ctx, call)                                                  \
    do {                                                                   \
        cudaError_t k_e_ = (call);                                         \
        if (k_e_ != cudaSuccess) return cu_cuda_error((ctx), k_e_, #call); \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------- */

/* Round an element count up to 64 (256-byte alignment of carved views). */
static uint64_t al64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }

/* Allocate with cudaMalloc; out of memory becomes ORCH_ERR_OUT_OF_MEMORY with
 * the size in the message. */
static int32_t dev_alloc(orch_engine_ctx *ctx, void **p, size_t bytes, const char *what) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaSuccess) return ORCH_OK;
    *p = NULL;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "out of device memory allocating %.1f MiB for %s",
                            (double)bytes / (1024.0 * 1024.0), what);
    }
    return cu_cuda_error(ctx, e, what);
}

int32_t cu_stage_reserve(orch_engine_ctx *ctx, size_t bytes) {
    if (bytes <= ctx->h_stage_bytes) return ORCH_OK;
    /* The stream is idle between API calls (every call ends synchronised),
     * so the old buffer is not in use. */
    if (ctx->h_stage) cudaFreeHost(ctx->h_stage);
    ctx->h_stage = NULL;
    ctx->h_stage_bytes = 0;
    size_t want = bytes + bytes / 4 + 4096;
    cudaError_t e = cudaMallocHost(&ctx->h_stage, want);
    if (e != cudaSuccess) {
        ctx->h_stage = NULL;
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "out of pinned host memory (%zu bytes)", want);
        }
        return cu_cuda_error(ctx, e, "cudaMallocHost");
    }
    ctx->h_stage_bytes = want;
    return ORCH_OK;
}

void cu_acts_free(orch_engine_ctx *ctx) {
    if (ctx->acts.base) cudaFree(ctx->acts.base);
    if (ctx->acts.i_base) cudaFree(ctx->acts.i_base);
    memset(&ctx->acts, 0, sizeof ctx->acts);
}

void cu_infer_free(orch_engine_ctx *ctx) {
    if (ctx->inf.base) cudaFree(ctx->inf.base);
    if (ctx->inf.i_base) cudaFree(ctx->inf.i_base);
    memset(&ctx->inf, 0, sizeof ctx->inf);
}

static uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

int32_t cu_acts_reserve(orch_engine_ctx *ctx, uint64_t N, uint64_t att) {
    cu_acts *a = &ctx->acts;
    if (a->base && N <= a->cap_tokens && att <= a->cap_att) return ORCH_OK;
    if (a->base) {
        N = N > a->cap_tokens ? N : a->cap_tokens;
        att = att > a->cap_att ? att : a->cap_att;
    }
    cu_acts_free(ctx);
    uint64_t L = ctx->L, C = ctx->C, M = ctx->M, V = ctx->V;
    /* llama: the MLP keeps gate | up ([N,2M]) for the backward */
    const int llama = ctx->arch == ORCH_ARCH_LLAMA;
    const uint64_t Mh = llama ? 2 * M : M;
    uint64_t wide = max_u32(3 * ctx->C, (uint32_t)Mh);
    uint64_t NC = al64(N * C), Nr = al64(N);
    /* llama: s_heads also holds d(act) [N,M] */
    uint64_t heads = llama ? al64(N * max_u32(3 * ctx->C, ctx->M)) : 3 * NC;
    uint64_t sizes[32];
    int k = 0;
    sizes[k++] = (L + 1) * NC;                         /* res */
    sizes[k++] = L * NC;                               /* ln1 */
    sizes[k++] = L * Nr;                               /* ln1_mean */
    sizes[k++] = L * Nr;                               /* ln1_rstd */
    sizes[k++] = L * 3 * NC;                           /* qkvh */
    sizes[k++] = L * al64(att);                        /* att */
    sizes[k++] = L * NC;                               /* y */
    sizes[k++] = L * NC;                               /* x2 */
    sizes[k++] = L * NC;                               /* ln2 */
    sizes[k++] = L * Nr;                               /* ln2_mean */
    sizes[k++] = L * Nr;                               /* ln2_rstd */
    sizes[k++] = L * al64(N * Mh);                     /* fch */
    sizes[k++] = L * al64(N * M);                      /* fcg */
    sizes[k++] = NC;                                   /* lnf */
    sizes[k++] = Nr;                                   /* lnf_mean */
    sizes[k++] = Nr;                                   /* lnf_rstd */
    sizes[k++] = al64(N * V);                          /* logits */
    sizes[k++] = Nr;                                   /* losses */
    sizes[k++] = al64(N * wide);                       /* s_big */
    sizes[k++] = NC;                                   /* s_c0 */
    sizes[k++] = NC;                                   /* s_c1 */
    sizes[k++] = heads;                                /* s_heads */
    sizes[k++] = al64(att);                            /* s_att */
    sizes[k++] = al64(2ull * CU_COLSUM_CHUNKS * wide); /* s_part */
    uint64_t total = 0;
    for (int i = 0; i < k; i++) total += sizes[i];
    void *p = NULL;
    CU_TRY(dev_alloc(ctx, &p, total * sizeof(float), "training activations"));
    a->base = (float *)p;
    float *cur = a->base;
    float **views[] = { &a->res,    &a->ln1,      &a->ln1_mean, &a->ln1_rstd,
                        &a->qkvh,   &a->att,      &a->y,        &a->x2,
                        &a->ln2,    &a->ln2_mean, &a->ln2_rstd, &a->fch,
                        &a->fcg,    &a->lnf,      &a->lnf_mean, &a->lnf_rstd,
                        &a->logits, &a->losses,   &a->s_big,    &a->s_c0,
                        &a->s_c1,   &a->s_heads,  &a->s_att,    &a->s_part };
    for (int i = 0; i < k; i++) {
        *views[i] = cur;
        cur += sizes[i];
    }
    /* int staging on the device: tokens, targets, uniq, start (N+1), rows */
    p = NULL;
    int32_t st =
        dev_alloc(ctx, &p, (5 * N + 1) * sizeof(int32_t), "training token buffers");
    if (st != ORCH_OK) {
        cu_acts_free(ctx);
        return st;
    }
    a->i_base = (int32_t *)p;
    a->cap_tokens = N;
    a->cap_att = att;
    return ORCH_OK;
}

int32_t cu_infer_reserve(orch_engine_ctx *ctx, uint64_t n, uint64_t rows, uint64_t seqs,
                         uint64_t table) {
    cu_infer_bufs *b = &ctx->inf;
    if (b->base && n <= b->cap_tokens && rows <= b->cap_rows && seqs <= b->cap_seqs &&
        table <= b->cap_table)
        return ORCH_OK;
    if (b->base) {
        n = n > b->cap_tokens ? n : b->cap_tokens;
        rows = rows > b->cap_rows ? rows : b->cap_rows;
        seqs = seqs > b->cap_seqs ? seqs : b->cap_seqs;
        table = table > b->cap_table ? table : b->cap_table;
    }
    cu_infer_free(ctx);
    uint64_t C = ctx->C, M = ctx->M, V = ctx->V;
    uint64_t fc_w = ctx->arch == ORCH_ARCH_LLAMA ? 2 * M : M; /* llama: gate | up */
    uint64_t sizes[16];
    int k = 0;
    sizes[k++] = al64(n * C);     /* x */
    sizes[k++] = al64(n * C);     /* x2 */
    sizes[k++] = al64(n * C);     /* ln */
    sizes[k++] = al64(n * 3 * C); /* qkv */
    sizes[k++] = al64(n * C);     /* q */
    sizes[k++] = al64(n * C);     /* y */
    sizes[k++] = al64(n * C);     /* tmp */
    sizes[k++] = al64(n * fc_w);  /* fc */
    sizes[k++] = al64(rows * C);  /* sel */
    sizes[k++] = al64(rows * V);  /* logits */
    uint64_t total = 0;
    for (int i = 0; i < k; i++) total += sizes[i];
    void *p = NULL;
    CU_TRY(dev_alloc(ctx, &p, total * sizeof(float), "inference activations"));
    b->base = (float *)p;
    float *cur = b->base;
    float **views[] = { &b->x, &b->x2,  &b->ln, &b->qkv, &b->q,
                        &b->y, &b->tmp, &b->fc, &b->sel, &b->logits };
    for (int i = 0; i < k; i++) {
        *views[i] = cur;
        cur += sizes[i];
    }
    p = NULL;
    int32_t st = dev_alloc(ctx, &p, (3 * n + rows + seqs + table + 1) * sizeof(int32_t),
                           "inference index buffers");
    if (st != ORCH_OK) {
        cu_infer_free(ctx);
        return st;
    }
    b->i_base = (int32_t *)p;
    b->cap_tokens = n;
    b->cap_rows = rows;
    b->cap_seqs = seqs;
    b->cap_table = table;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Initialisation                                                             */
/* ------------------------------------------------------------------------- */

/* As the CPU engine: matrices and embeddings N(0, 0.02), the residual
 * projections (gpt2 attn.c_proj, mlp.c_proj; llama o_proj, down_proj)
 * N(0, 0.02/sqrt(2*layers)), drawn from one splitmix64 stream in table order
 * (each matrix takes an even number of outputs); norm weights 1, biases 0.
 * The engines/common rule serves both architectures. */
int32_t cu_model_init(orch_engine_ctx *ctx, uint64_t seed) {
    cudaStream_t s = ctx->stream;
    uint64_t stream_pos = 0;
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        const cu_tensor *t = &ctx->tensors[i];
        float *p = ctx->d_params + t->offset;
        if (t->ndim == 2) {
            KCHECK(ctx, k_init_normal(s, p, t->numel, seed, stream_pos,
                                      engine_gpt2_init_std(t, ctx->L)));
            stream_pos += 2 * ((t->numel + 1) / 2);
        } else {
            KCHECK(ctx, k_fill(s, p, t->numel, engine_gpt2_init_value(t)));
        }
    }
    size_t bytes = ctx->n_params * sizeof(float);
    KCHECK(ctx, cudaMemsetAsync(ctx->d_grads, 0, bytes, s));
    KCHECK(ctx, cudaMemsetAsync(ctx->d_m, 0, ctx->sh_count * sizeof(float), s));
    KCHECK(ctx, cudaMemsetAsync(ctx->d_v, 0, ctx->sh_count * sizeof(float), s));
    KCHECK(ctx, cudaStreamSynchronize(s));
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Training                                                                   */
/* ------------------------------------------------------------------------- */

/* Build the CSR that groups rows by token id for the deterministic wte
 * gradient: uniq[u] distinct ids (first-seen order), start[u]..start[u+1]
 * index rows[], which lists each token's rows in ascending order. `cursor`
 * is scratch of n ints; map is ctx->h_tok_map (all -1 on entry and exit). */
uint32_t cu_token_csr(int32_t *map, const int32_t *tok, uint32_t n, int32_t *uniq,
                      int32_t *start, int32_t *rows, int32_t *cursor) {
    uint32_t nu = 0;
    for (uint32_t i = 0; i < n; i++) {
        int32_t t = tok[i];
        if (map[t] < 0) {
            map[t] = (int32_t)nu;
            uniq[nu] = t;
            cursor[nu] = 0;
            nu++;
        }
        cursor[map[t]]++;
    }
    start[0] = 0;
    for (uint32_t u = 0; u < nu; u++) {
        start[u + 1] = start[u] + cursor[u];
        cursor[u] = start[u];
    }
    for (uint32_t i = 0; i < n; i++) rows[cursor[map[tok[i]]]++] = (int32_t)i;
    for (uint32_t u = 0; u < nu; u++) map[uniq[u]] = -1;
    return nu;
}

/* Query rows per attention chunk: a quarter of T rounded up to 16, at most T.
 * Chunk r multiplies only against keys below its last row, so with 4 chunks
 * the T x T products and the softmax touch 5/8 of the full square. */
static uint32_t attn_chunk(uint32_t T) {
    uint32_t tc = ((T + 3) / 4 + 15) / 16 * 16;
    return tc < T ? tc : T;
}

int32_t cu_grad_ready(orch_engine_ctx *ctx, const cu_grad_notify *n, uint64_t offset,
                      uint64_t count) {
    if (!n || !n->ready || count == 0) return ORCH_OK;
    KCHECK(ctx, cudaStreamSynchronize(ctx->stream));
    n->ready(n->user, offset, count);
    return ORCH_OK;
}

void cu_fwd_on_acts(orch_engine_ctx *ctx, cu_fwd *f, uint32_t n, uint64_t att) {
    cu_acts *a = &ctx->acts;
    const uint64_t C = ctx->C, M = ctx->M, NC = (uint64_t)n * C;
    const uint64_t Mh = ctx->arch == ORCH_ARCH_LLAMA ? 2 * M : M;
    memset(f, 0, sizeof *f);
    f->n = n;
    f->res = cu_lbuf{ a->res, NC };
    f->ln1 = cu_lbuf{ a->ln1, NC };
    f->ln1m = cu_lbuf{ a->ln1_mean, n };
    f->ln1r = cu_lbuf{ a->ln1_rstd, n };
    f->qkvh = cu_lbuf{ a->qkvh, 3 * NC };
    f->att = cu_lbuf{ a->att, att };
    f->y = cu_lbuf{ a->y, NC };
    f->x2 = cu_lbuf{ a->x2, NC };
    f->ln2 = cu_lbuf{ a->ln2, NC };
    f->ln2m = cu_lbuf{ a->ln2_mean, n };
    f->ln2r = cu_lbuf{ a->ln2_rstd, n };
    f->fch = cu_lbuf{ a->fch, n * Mh };
    f->fcg = cu_lbuf{ a->fcg, n * M };
    f->lnf = a->lnf;
    f->lnfm = a->lnf_mean;
    f->lnfr = a->lnf_rstd;
    f->qkv = a->s_big;
    f->tmp = a->s_c0;
    f->qi = a->s_heads; /* the inference queries, then the parts' heads */
    f->heads = a->s_heads;
    f->n_head = n;
    f->head_in = a->s_c1; /* free until the backward */
    f->logits = a->logits;
}

int32_t cu_lm_head(orch_engine_ctx *ctx, const cu_fwd *f, const float *head) {
    if (f->n_head == 0) return ORCH_OK;
    const float *in = f->lnf;
    if (f->d_head_rows) {
        KCHECK(ctx, k_gather_rows(ctx->stream, f->lnf, f->d_head_rows, f->head_in,
                                  f->n_head, ctx->C));
        in = f->head_in;
    }
    return cu_gemm(ctx, 0, 1, (int)f->n_head, (int)ctx->V, (int)ctx->C, 1.0f, in,
                   (int)ctx->C, head, (int)ctx->C, 0.0f, f->logits, (int)ctx->V);
}

/* Attention of layer l for every part of the stack: paged for the inference
 * rows (K/V written to the pool), causal within each sequence of a
 * fine-tuning part (q, k, v and the scores kept for the backward). Reads
 * f->qkv (no bias), writes f->y. */
static int32_t gpt2_attention(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t l) {
    cudaStream_t s = ctx->stream;
    const uint32_t C = ctx->C, L = ctx->L, H = ctx->H, hs = ctx->hs;
    const float *bias = cu_tp(ctx, ctx->d_params, CU_LAYER_TENSOR(l, CU_ATTN_B));
    float *y = cu_lb(f->y, l);
    if (f->dp && f->n_inf) {
        const cu_plan_dev *d = f->dp;
        KCHECK(ctx, k_kv_write(s, f->qkv, bias, f->qi, ctx->d_kv, d->pos, d->seq,
                               d->btoff, d->bt, f->n_inf, C, ctx->kv_block_size, L, l));
        KCHECK(ctx, k_paged_attention(s, f->qi, ctx->d_kv, d->pos, d->seq, d->btoff,
                                      d->bt, y, f->n_inf, C, H, H, ctx->kv_block_size, L,
                                      l, (size_t)ctx->T * sizeof(float)));
    }
    const float scale = 1.0f / sqrtf((float)hs);
    for (uint32_t k = 0; k < f->n_parts; k++) {
        const cu_fwd_part *p = &f->parts[k];
        if (p->ft) { /* a fine-tuning stream's chunk (cuda_ft_stream.cu) */
            CU_TRY(cu_ft_attention(ctx, p, l, f->qkv + (uint64_t)p->r0 * 3 * C, bias,
                                   y + (uint64_t)p->r0 * C));
            continue;
        }
        const uint32_t B = p->B, T = p->T, BH = B * H, TC = attn_chunk(T);
        const uint64_t NC = (uint64_t)B * T * C;
        const long long sTT = (long long)T * T, sTh = (long long)T * hs;
        float *qh = cu_lb(f->qkvh, l) + 3 * (uint64_t)p->r0 * C, *kh = qh + NC,
              *vh = qh + 2 * NC;
        float *att = cu_lb(f->att, l) + p->att0;
        KCHECK(ctx,
               k_split_heads(s, f->qkv + (uint64_t)p->r0 * 3 * C, bias, qh, B, T, H, hs));
        /* att = softmax(q k^T * scale), then yh = att v, per query chunk:
         * rows q0..q0+nq-1 need keys 0..q0+nq-1 only (causal) */
        for (uint32_t q0 = 0; q0 < T; q0 += TC) {
            const int nq = (int)(T - q0 < TC ? T - q0 : TC), nk = (int)q0 + nq;
            CU_TRY(cu_gemm_batched(ctx, 0, 1, nq, nk, hs, scale, qh + (size_t)q0 * hs, hs,
                                   sTh, kh, hs, sTh, 0.0f, att + (size_t)q0 * T, T, sTT,
                                   BH));
        }
        KCHECK(ctx, k_softmax_causal(s, att, (uint64_t)BH * T, T, TC));
        for (uint32_t q0 = 0; q0 < T; q0 += TC) {
            const int nq = (int)(T - q0 < TC ? T - q0 : TC), nk = (int)q0 + nq;
            CU_TRY(cu_gemm_batched(ctx, 0, 0, nq, hs, nk, 1.0f, att + (size_t)q0 * T, T,
                                   sTT, vh, hs, sTh, 0.0f, f->heads + (size_t)q0 * hs, hs,
                                   sTh, BH));
        }
        KCHECK(ctx, k_merge_heads(s, f->heads, y + (uint64_t)p->r0 * C, B, T, H, hs, 1));
    }
    return ORCH_OK;
}

int32_t cu_gpt2_forward(orch_engine_ctx *ctx, const cu_fwd *f) {
    cudaStream_t s = ctx->stream;
    const uint32_t C = ctx->C, L = ctx->L, M = ctx->M, n = f->n;
    const float eps = ctx->eps;
    float *P = ctx->d_params;
#define PW(l, w) cu_tp(ctx, P, CU_LAYER_TENSOR(l, w))
    const float *wte = cu_tp(ctx, P, 0), *wpe = cu_tp(ctx, P, 1);
    const float *lnf_w = cu_tp(ctx, P, ctx->n_tensors - 2);
    const float *lnf_b = cu_tp(ctx, P, ctx->n_tensors - 1);
    const uint32_t T0 = f->n_parts ? f->parts[0].T : ctx->T;
    KCHECK(ctx, k_embed(s, cu_lb(f->res, 0), f->d_tok, f->d_pos, wte, wpe, n, T0, C));
    KCHECK(ctx, k_layernorm(s, cu_lb(f->res, 0), PW(0, CU_LN1_W), PW(0, CU_LN1_B),
                            cu_lb(f->ln1, 0), cu_lb(f->ln1m, 0), cu_lb(f->ln1r, 0), n, C,
                            eps));
    for (uint32_t l = 0; l < L; l++) {
        float *ln1 = cu_lb(f->ln1, l), *y = cu_lb(f->y, l), *x2 = cu_lb(f->x2, l);
        float *ln2 = cu_lb(f->ln2, l), *fch = cu_lb(f->fch, l), *fcg = cu_lb(f->fcg, l);
        /* qkv = ln1 W_attn^T (the bias is added by the attention) */
        CU_TRY(cu_gemm(ctx, 0, 1, n, 3 * C, C, 1.0f, ln1, C, PW(l, CU_ATTN_W), C, 0.0f,
                       f->qkv, 3 * C));
        CU_TRY(cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_ATTN_QKV, ln1, C, f->qkv,
                                     3 * C));
        CU_TRY(gpt2_attention(ctx, f, l));
        /* x2 = res + y W_proj^T + b_proj; ln2 = LN(x2) */
        CU_TRY(cu_gemm(ctx, 0, 1, n, C, C, 1.0f, y, C, PW(l, CU_PROJ_W), C, 0.0f, f->tmp,
                       C));
        CU_TRY(
            cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_ATTN_OUT, y, C, f->tmp, C));
        KCHECK(ctx,
               k_residual_layernorm(s, cu_lb(f->res, l), f->tmp, PW(l, CU_PROJ_B), x2,
                                    PW(l, CU_LN2_W), PW(l, CU_LN2_B), ln2,
                                    cu_lb(f->ln2m, l), cu_lb(f->ln2r, l), n, C, eps));
        /* fch = ln2 W_fc^T + b_fc; fcg = gelu(fch) */
        CU_TRY(
            cu_gemm(ctx, 0, 1, n, M, C, 1.0f, ln2, C, PW(l, CU_FC_W), C, 0.0f, fch, M));
        CU_TRY(cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_MLP_UP, ln2, C, fch, M));
        KCHECK(ctx, k_bias_gelu(s, fch, PW(l, CU_FC_B), fcg, n, M));
        /* res[l+1] = x2 + fcg W_fcproj^T + b_fcproj; the next LayerNorm */
        CU_TRY(cu_gemm(ctx, 0, 1, n, C, M, 1.0f, fcg, M, PW(l, CU_FCPROJ_W), M, 0.0f,
                       f->tmp, C));
        CU_TRY(cu_lora_stack_forward(ctx, f, l, ORCH_LORA_TARGET_MLP_DOWN, fcg, M, f->tmp,
                                     C));
        const int last = l + 1 == L;
        KCHECK(ctx,
               k_residual_layernorm(
                   s, x2, f->tmp, PW(l, CU_FCPROJ_B), cu_lb(f->res, l + 1),
                   last ? lnf_w : PW(l + 1, CU_LN1_W), last ? lnf_b : PW(l + 1, CU_LN1_B),
                   last ? f->lnf : cu_lb(f->ln1, l + 1),
                   last ? f->lnfm : cu_lb(f->ln1m, l + 1),
                   last ? f->lnfr : cu_lb(f->ln1r, l + 1), n, C, eps));
    }
#undef PW
    return cu_lm_head(ctx, f, wte);
}

/* Host staging and device copies of a training call's tokens and targets
 * (and with grad the token CSR of the embedding gradient), then the forward
 * and the part's loss: the training pass of both architectures. */
int32_t cu_model_train_step(orch_engine_ctx *ctx, const int32_t *tokens,
                            const int32_t *targets, uint32_t B, uint32_t T,
                            uint64_t n_valid, float grad_scale, int grad, float *out_loss,
                            const cu_grad_notify *notify) {
    cudaStream_t s = ctx->stream;
    const int llama = ctx->arch == ORCH_ARCH_LLAMA;
    const uint32_t N = B * T;
    const uint64_t A = (uint64_t)B * ctx->H * T * T; /* attention elements per layer */

    if (n_valid == 0) { /* nothing to learn from (as the CPU engine): no work */
        *out_loss = 0.0f;
        return grad ? cu_grad_ready(ctx, notify, 0, ctx->n_params) : ORCH_OK;
    }
    /* under an adapter (ABI 1.4) the base is frozen: no base gradients */
    cu_lora *lo = ctx->lora_cur;
    if (lo) CU_TRY(cu_lora_prepare(ctx, lo->rank, N));
    CU_TRY(cu_acts_reserve(ctx, N, A));
    CU_TRY(cu_stage_reserve(ctx, (6 * (size_t)N + 1) * sizeof(int32_t)));
    cu_acts *a = &ctx->acts;

    /* host staging: tokens | targets | uniq | start (N+1) | rows | cursor */
    int32_t *h = (int32_t *)ctx->h_stage;
    memcpy(h, tokens, (size_t)N * sizeof(int32_t));
    memcpy(h + N, targets, (size_t)N * sizeof(int32_t));
    cu_emb_csr emb = { a->i_base + 2 * (size_t)N, a->i_base + 3 * (size_t)N,
                       a->i_base + 4 * (size_t)N + 1, 0 };
    if (grad)
        emb.n_uniq =
            cu_token_csr(ctx->h_tok_map, tokens, N, h + 2 * (size_t)N, h + 3 * (size_t)N,
                         h + 4 * (size_t)N + 1, h + 5 * (size_t)N + 1);
    size_t up = grad ? 5 * (size_t)N + 1 : 2 * (size_t)N;
    KCHECK(ctx, cudaMemcpyAsync(a->i_base, h, up * sizeof(int32_t),
                                cudaMemcpyHostToDevice, s));
    const cu_fwd_part part = { B, T, 0, 0, lo, 0, NULL, 0 };
    cu_fwd f;
    cu_fwd_on_acts(ctx, &f, N, A);
    f.parts = &part;
    f.n_parts = 1;
    f.d_tok = a->i_base;
    const int32_t *d_tgt = a->i_base + N;
    if (llama) {
        CU_TRY(cu_llama_forward(ctx, &f));
        return cu_llama_part_loss(ctx, &f, 0, d_tgt, n_valid, grad_scale, grad, &emb,
                                  notify, out_loss);
    }
    CU_TRY(cu_gpt2_forward(ctx, &f));
    return cu_gpt2_part_loss(ctx, &f, 0, d_tgt, n_valid, grad_scale, grad, &emb, notify,
                             out_loss);
}

int32_t cu_part_ce(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t k,
                   const int32_t *d_tgt, uint64_t n_valid, float grad_scale, int grad) {
    cudaStream_t s = ctx->stream;
    const cu_fwd_part *pt = &f->parts[k];
    const uint32_t V = ctx->V, N = pt->B * pt->T;
    float *logits = f->logits + (uint64_t)pt->lrow0 * V;
    float *losses = ctx->acts.losses + pt->r0;
    const float dscale = grad_scale / (float)n_valid;
    KCHECK(ctx, k_cross_entropy(s, logits, d_tgt, losses, N, V, dscale, grad));
    KCHECK(ctx, k_sum_to_double(s, losses, N, ctx->d_red + CU_NORM_BLOCKS));
    KCHECK(ctx, cudaMemcpyAsync(ctx->h_red, ctx->d_red + CU_NORM_BLOCKS, sizeof(double),
                                cudaMemcpyDeviceToHost, s));
    return ORCH_OK;
}

int32_t cu_part_loss_end(orch_engine_ctx *ctx, uint64_t n_valid, float *out_loss) {
    KCHECK(ctx, cudaStreamSynchronize(ctx->stream));
    *out_loss = (float)(*ctx->h_red / (double)n_valid);
    return ORCH_OK;
}

int32_t cu_gpt2_part_loss(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t k,
                          const int32_t *d_tgt, uint64_t n_valid, float grad_scale,
                          int grad, const cu_emb_csr *emb, const cu_grad_notify *notify,
                          float *out_loss) {
    cudaStream_t s = ctx->stream;
    const cu_fwd_part *pt = &f->parts[k];
    const uint32_t C = ctx->C, L = ctx->L, H = ctx->H, hs = ctx->hs, M = ctx->M,
                   V = ctx->V;
    const uint32_t B = pt->B, T = pt->T, N = B * T, BH = B * H, r0 = pt->r0;
    const uint64_t NC = (uint64_t)N * C, RO = (uint64_t)r0 * C;
    const long long sTT = (long long)T * T, sTh = (long long)T * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    const uint32_t TC = attn_chunk(T);
    cu_acts *a = &ctx->acts;
    cu_lora *lo = pt->lo;
    const int frozen = lo != NULL;
    float *P = ctx->d_params, *G = ctx->d_grads;
    const float *wte = cu_tp(ctx, P, 0);
    const float *lnf_w = cu_tp(ctx, P, ctx->n_tensors - 2);
    float *lnf = f->lnf + RO, *lnf_mean = f->lnfm + r0, *lnf_rstd = f->lnfr + r0;
    float *logits = f->logits + (uint64_t)pt->lrow0 * V;
    CU_TRY(cu_part_ce(ctx, f, k, d_tgt, n_valid, grad_scale, grad));
    /* flat offset of layer l's first gradient (l = L: ln_f.weight) */
#define LOFF(l)  (ctx->tensors[CU_LAYER_TENSOR(l, 0)].offset)
#define PW(l, w) cu_tp(ctx, P, CU_LAYER_TENSOR(l, w))
#define GW(l, w) cu_tp(ctx, G, CU_LAYER_TENSOR(l, w))
#define RES(l)   (cu_lb(f->res, l) + RO)
#define LN1(l)   (cu_lb(f->ln1, l) + RO)
#define LN1M(l)  (cu_lb(f->ln1m, l) + r0)
#define LN1R(l)  (cu_lb(f->ln1r, l) + r0)
#define QH(l)    (cu_lb(f->qkvh, l) + 3 * RO)
#define KH(l)    (QH(l) + NC)
#define VH(l)    (QH(l) + 2 * NC)
#define ATT(l)   (cu_lb(f->att, l) + pt->att0)
#define YY(l)    (cu_lb(f->y, l) + RO)
#define X2(l)    (cu_lb(f->x2, l) + RO)
#define LN2(l)   (cu_lb(f->ln2, l) + RO)
#define LN2M(l)  (cu_lb(f->ln2m, l) + r0)
#define LN2R(l)  (cu_lb(f->ln2r, l) + r0)
#define FCH(l)   (cu_lb(f->fch, l) + (uint64_t)r0 * M)
#define FCG(l)   (cu_lb(f->fcg, l) + (uint64_t)r0 * M)

    if (grad) {
        float *dres = a->s_c1; /* running d(residual) */
        float *dln = a->s_c0;  /* d(LayerNorm output) / d(y) */
        float *dlogits = logits;
        float *part = a->s_part;
        /* LM head (tied): dlnf = dlogits wte; dwte += dlogits^T lnf */
        CU_TRY(cu_gemm(ctx, 0, 0, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dln, C));
        if (!frozen)
            CU_TRY(cu_gemm(ctx, 1, 0, V, C, N, 1.0f, dlogits, V, lnf, C, 1.0f,
                           cu_tp(ctx, G, 0), C));
        KCHECK(ctx, k_layernorm_bwd_dx(s, dln, RES(L), lnf_mean, lnf_rstd, lnf_w, dres, N,
                                       C, 0));
        if (!frozen)
            KCHECK(ctx,
                   k_layernorm_bwd_params(s, dln, RES(L), lnf_mean, lnf_rstd,
                                          cu_tp(ctx, G, ctx->n_tensors - 2),
                                          cu_tp(ctx, G, ctx->n_tensors - 1), N, C, part));
        CU_TRY(cu_grad_ready(ctx, notify, LOFF(L), ctx->n_params - LOFF(L)));
        for (uint32_t li = L; li-- > 0;) {
            const uint32_t l = li;
            float *dfc = a->s_big;
            /* MLP output projection */
            if (!frozen) {
                KCHECK(ctx, k_colsum_add(s, dres, GW(l, CU_FCPROJ_B), N, C, part));
                CU_TRY(cu_gemm(ctx, 1, 0, C, M, N, 1.0f, dres, C, FCG(l), M, 1.0f,
                               GW(l, CU_FCPROJ_W), M));
            }
            CU_TRY(cu_gemm(ctx, 0, 0, N, M, C, 1.0f, dres, C, PW(l, CU_FCPROJ_W), M, 0.0f,
                           dfc, M));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_MLP_DOWN, N, FCG(l), M,
                                    dres, C, dfc, M));
            /* GELU and c_fc */
            KCHECK(ctx, k_gelu_bwd(s, FCH(l), dfc, N, M));
            if (!frozen) {
                KCHECK(ctx, k_colsum_add(s, dfc, GW(l, CU_FC_B), N, M, part));
                CU_TRY(cu_gemm(ctx, 1, 0, M, C, N, 1.0f, dfc, M, LN2(l), C, 1.0f,
                               GW(l, CU_FC_W), C));
            }
            CU_TRY(cu_gemm(ctx, 0, 0, N, C, M, 1.0f, dfc, M, PW(l, CU_FC_W), C, 0.0f, dln,
                           C));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_MLP_UP, N, LN2(l), C,
                                    dfc, M, dln, C));
            /* LN2: d(x2) = dres + LN2 backward */
            KCHECK(ctx, k_layernorm_bwd_dx(s, dln, X2(l), LN2M(l), LN2R(l),
                                           PW(l, CU_LN2_W), dres, N, C, 1));
            if (!frozen)
                KCHECK(ctx, k_layernorm_bwd_params(s, dln, X2(l), LN2M(l), LN2R(l),
                                                   GW(l, CU_LN2_W), GW(l, CU_LN2_B), N, C,
                                                   part));
            /* attention output projection */
            if (!frozen) {
                KCHECK(ctx, k_colsum_add(s, dres, GW(l, CU_PROJ_B), N, C, part));
                CU_TRY(cu_gemm(ctx, 1, 0, C, C, N, 1.0f, dres, C, YY(l), C, 1.0f,
                               GW(l, CU_PROJ_W), C));
            }
            CU_TRY(cu_gemm(ctx, 0, 0, N, C, C, 1.0f, dres, C, PW(l, CU_PROJ_W), C, 0.0f,
                           dln, C));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_OUT, N, YY(l), C,
                                    dres, C, dln, C));
            /* attention core: dyh in s_big[0..NC); dq, dk, dv in s_heads */
            float *dyh = a->s_big;
            float *dqh = a->s_heads, *dkh = a->s_heads + NC, *dvh = a->s_heads + 2 * NC;
            KCHECK(ctx, k_to_heads(s, dln, dyh, B, T, H, hs));
            /* d(att) = dyh v^T and dq = scale * d(pre) k, per query chunk */
            for (uint32_t q0 = 0; q0 < T; q0 += TC) {
                const int nq = (int)(T - q0 < TC ? T - q0 : TC), nk = (int)q0 + nq;
                CU_TRY(cu_gemm_batched(ctx, 0, 1, nq, nk, hs, 1.0f, dyh + (size_t)q0 * hs,
                                       hs, sTh, VH(l), hs, sTh, 0.0f,
                                       a->s_att + (size_t)q0 * T, T, sTT, BH));
            }
            KCHECK(ctx,
                   k_softmax_causal_bwd(s, ATT(l), a->s_att, (uint64_t)BH * T, T, TC));
            for (uint32_t q0 = 0; q0 < T; q0 += TC) {
                const int nq = (int)(T - q0 < TC ? T - q0 : TC), nk = (int)q0 + nq;
                CU_TRY(cu_gemm_batched(ctx, 0, 0, nq, hs, nk, scale,
                                       a->s_att + (size_t)q0 * T, T, sTT, KH(l), hs, sTh,
                                       0.0f, dqh + (size_t)q0 * hs, hs, sTh, BH));
            }
            /* dv = att^T dyh and dk = scale * d(pre)^T q, per key chunk: keys
             * k0..k0+nc-1 are used by query rows k0..T-1 */
            for (uint32_t k0 = 0; k0 < T; k0 += TC) {
                const int nc = (int)(T - k0 < TC ? T - k0 : TC), nr = (int)(T - k0);
                const size_t corner = (size_t)k0 * T + k0;
                CU_TRY(cu_gemm_batched(ctx, 1, 0, nc, hs, nr, 1.0f, ATT(l) + corner, T,
                                       sTT, dyh + (size_t)k0 * hs, hs, sTh, 0.0f,
                                       dvh + (size_t)k0 * hs, hs, sTh, BH));
                CU_TRY(cu_gemm_batched(ctx, 1, 0, nc, hs, nr, scale, a->s_att + corner, T,
                                       sTT, QH(l) + (size_t)k0 * hs, hs, sTh, 0.0f,
                                       dkh + (size_t)k0 * hs, hs, sTh, BH));
            }
            float *dqkv = a->s_big; /* [N,3C]; dyh is no longer needed */
            KCHECK(ctx, k_merge_heads(s, a->s_heads, dqkv, B, T, H, hs, 3));
            /* c_attn */
            if (!frozen) {
                KCHECK(ctx, k_colsum_add(s, dqkv, GW(l, CU_ATTN_B), N, 3 * C, part));
                CU_TRY(cu_gemm(ctx, 1, 0, 3 * C, C, N, 1.0f, dqkv, 3 * C, LN1(l), C, 1.0f,
                               GW(l, CU_ATTN_W), C));
            }
            CU_TRY(cu_gemm(ctx, 0, 0, N, C, 3 * C, 1.0f, dqkv, 3 * C, PW(l, CU_ATTN_W), C,
                           0.0f, dln, C));
            CU_TRY(cu_lora_backward(ctx, lo, l, ORCH_LORA_TARGET_ATTN_QKV, N, LN1(l), C,
                                    dqkv, 3 * C, dln, C));
            /* LN1: d(res[l]) = dres + LN1 backward */
            KCHECK(ctx, k_layernorm_bwd_dx(s, dln, RES(l), LN1M(l), LN1R(l),
                                           PW(l, CU_LN1_W), dres, N, C, 1));
            if (!frozen)
                KCHECK(ctx, k_layernorm_bwd_params(s, dln, RES(l), LN1M(l), LN1R(l),
                                                   GW(l, CU_LN1_W), GW(l, CU_LN1_B), N, C,
                                                   part));
            CU_TRY(cu_grad_ready(ctx, notify, LOFF(l), LOFF(l + 1) - LOFF(l)));
        }
        /* embeddings */
        if (!frozen) {
            KCHECK(ctx, k_embed_bwd_wpe(s, dres, cu_tp(ctx, G, 1), B, T, C));
            KCHECK(ctx, k_embed_bwd_wte(s, dres, cu_tp(ctx, G, 0), emb->uniq, emb->start,
                                        emb->rows, emb->n_uniq, C));
        }
        CU_TRY(cu_grad_ready(ctx, notify, 0, LOFF(0)));
    }
#undef LOFF
#undef PW
#undef GW
#undef RES
#undef LN1
#undef LN1M
#undef LN1R
#undef QH
#undef KH
#undef VH
#undef ATT
#undef YY
#undef X2
#undef LN2
#undef LN2M
#undef LN2R
#undef FCH
#undef FCG

    return cu_part_loss_end(ctx, n_valid, out_loss);
}

/* ------------------------------------------------------------------------- */
/* AdamW                                                                      */
/* ------------------------------------------------------------------------- */

int32_t cu_model_adamw(orch_engine_ctx *ctx, const orch_adamw_params *p,
                       float *out_norm) {
    cudaStream_t s = ctx->stream;
    KCHECK(ctx, k_grad_norm(s, ctx->d_grads, ctx->n_params, ctx->d_red, ctx->d_norm,
                            p->grad_clip));
    cu_adamw_consts c;
    engine_adamw_consts_init(p, &c);
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        const cu_tensor *te = &ctx->tensors[i];
        c.decay = engine_adamw_decay(p, te->flags);
        KCHECK(ctx, k_adamw(s, ctx->d_params + te->offset, ctx->d_grads + te->offset,
                            ctx->d_m + te->offset, ctx->d_v + te->offset, te->numel,
                            ctx->d_norm, &c));
    }
    KCHECK(ctx, cudaMemcpyAsync(ctx->h_norm, ctx->d_norm, 2 * sizeof(float),
                                cudaMemcpyDeviceToHost, s));
    KCHECK(ctx, cudaStreamSynchronize(s));
    float nrm = ctx->h_norm[0];
    if (!isfinite(ctx->h_norm[1])) return engine_fail_nonfinite_norm(ENGINE_ERRBUF(ctx));
    if (out_norm) *out_norm = nrm;
    return ORCH_OK;
}

int32_t cu_model_adamw_range(orch_engine_ctx *ctx, const orch_adamw_params *p,
                             uint64_t off, uint64_t count, float global_norm) {
    cudaStream_t s = ctx->stream;
    /* The kernel reads [norm, clip scale] from the device, as after
     * k_grad_norm; here the caller's global norm gives the scale. */
    ctx->h_norm[0] = global_norm;
    ctx->h_norm[1] = engine_grad_clip_scale(p, (double)global_norm);
    KCHECK(ctx, cudaMemcpyAsync(ctx->d_norm, ctx->h_norm, 2 * sizeof(float),
                                cudaMemcpyHostToDevice, s));
    cu_adamw_consts c;
    engine_adamw_consts_init(p, &c);
    const uint64_t lo = off, hi = off + count;
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        const cu_tensor *te = &ctx->tensors[i];
        uint64_t a = te->offset > lo ? te->offset : lo;
        uint64_t b = te->offset + te->numel < hi ? te->offset + te->numel : hi;
        if (a >= b) continue;
        c.decay = engine_adamw_decay(p, te->flags);
        KCHECK(ctx, k_adamw(s, ctx->d_params + a, ctx->d_grads + a,
                            ctx->d_m + (a - ctx->sh_off), ctx->d_v + (a - ctx->sh_off),
                            b - a, ctx->d_norm, &c));
    }
    KCHECK(ctx, cudaStreamSynchronize(s));
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Inference                                                                  */
/* ------------------------------------------------------------------------- */

int32_t cu_infer_upload_plan(orch_engine_ctx *ctx, const cu_infer_plan *plan,
                             cu_plan_dev *d) {
    const uint32_t n = plan->n_tokens, R = plan->n_rows;
    CU_TRY(cu_infer_reserve(ctx, n, R, plan->n_seqs, plan->n_table));
    /* host staging: tokens | pos | seq | rows | bt_off | bt_all */
    size_t n_ints = 3 * (size_t)n + R + plan->n_seqs + plan->n_table;
    CU_TRY(cu_stage_reserve(ctx, n_ints * sizeof(int32_t)));
    int32_t *h = (int32_t *)ctx->h_stage;
    size_t o = 0;
    memcpy(h + o, plan->tokens, (size_t)n * 4);
    o += n;
    memcpy(h + o, plan->pos, (size_t)n * 4);
    o += n;
    memcpy(h + o, plan->seq, (size_t)n * 4);
    o += n;
    if (R) memcpy(h + o, plan->rows, (size_t)R * 4);
    o += R;
    memcpy(h + o, plan->bt_off, (size_t)plan->n_seqs * 4);
    o += plan->n_seqs;
    memcpy(h + o, plan->bt_all, (size_t)plan->n_table * 4);
    o += plan->n_table;
    KCHECK(ctx, cudaMemcpyAsync(ctx->inf.i_base, h, o * sizeof(int32_t),
                                cudaMemcpyHostToDevice, ctx->stream));
    d->tok = ctx->inf.i_base;
    d->pos = d->tok + n;
    d->seq = d->pos + n;
    d->rows = d->seq + n;
    d->btoff = d->rows + R;
    d->bt = d->btoff + plan->n_seqs;
    return ORCH_OK;
}

int32_t cu_model_infer(orch_engine_ctx *ctx, const cu_infer_plan *plan,
                       float *logits_out) {
    cudaStream_t s = ctx->stream;
    const uint32_t n = plan->n_tokens, R = plan->n_rows;
    cu_plan_dev dp;
    CU_TRY(cu_infer_upload_plan(ctx, plan, &dp));
    cu_infer_bufs *b = &ctx->inf;
    /* one buffer per role, reused by every layer (ls 0); no statistics */
    cu_fwd f;
    memset(&f, 0, sizeof f);
    f.n = f.n_inf = n;
    f.dp = &dp;
    f.d_tok = dp.tok;
    f.d_pos = dp.pos;
    f.res = cu_lbuf{ b->x, 0 };
    f.ln1 = f.ln2 = cu_lbuf{ b->ln, 0 };
    f.y = cu_lbuf{ b->y, 0 };
    f.x2 = cu_lbuf{ b->x2, 0 };
    f.fch = f.fcg = cu_lbuf{ b->fc, 0 }; /* GELU / SwiGLU in place */
    f.lnf = b->ln;
    f.qkv = b->qkv;
    f.tmp = b->tmp;
    f.qi = b->q;
    f.d_head_rows = dp.rows;
    f.n_head = R;
    f.head_in = b->sel;
    f.logits = b->logits;
    CU_TRY(ctx->arch == ORCH_ARCH_LLAMA ? cu_llama_forward(ctx, &f)
                                        : cu_gpt2_forward(ctx, &f));
    if (R)
        KCHECK(ctx,
               cudaMemcpyAsync(logits_out, b->logits, (size_t)R * ctx->V * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
    KCHECK(ctx, cudaStreamSynchronize(s));
    return ORCH_OK;
}
