/*
 * cuda_internal.h - private declarations shared by the CUDA engine's sources:
 * the context struct, error helpers, the GEMM wrappers and the kernel launchers.
 *
 * Files:
 *   cuda_engine.cu   the ABI table, probe, context life cycle, options, tensor
 *                    table and the public entry points; the model rules,
 *                    options parser and every argument check come from
 *                    engines/common (the same as the cpu and mock engines)
 *   cuda_model.cu    GPT-2 forward/backward/AdamW/inference on the device,
 *                    built from cuBLAS GEMMs and the kernels below; the one
 *                    forward (cu_fwd: a stack of inference rows and
 *                    fine-tuning parts) that inference, training and
 *                    co-serving share
 *   cuda_llama.cu    the same passes for LLaMA (RMSNorm, RoPE, GQA, SwiGLU)
 *   cuda_kernels.cu  the CUDA kernels and their host-side launchers
 *   cuda_lora.cu     LoRA adapters (ABI 1.4): storage, the hooks the passes
 *                    call around each target product, the adapter AdamW
 *   cuda_coserve.cu  coserve_forward (ABI 1.4): an inference batch and LoRA
 *                    micro-batches stacked into one pass over the weights
 *   cuda_ft_stream.cu token-level fine-tuning streams (ABI 1.5):
 *                    ft_stream_open / ft_stream_close / coserve_step, a
 *                    micro-batch's forward chunks stacked with the step's
 *                    inference rows in cu_fwd, its backward chunks in
 *                    reverse row order (GPT-2 and LLaMA)
 *
 * The same sources also compile as plain C++ against the CPU emulator of
 * tests/cuda_emu (tests/cuda_emu.sh runs the parity suite on it without a
 * GPU), so kernels are launched through KLAUNCH and dynamic shared memory is
 * declared with CU_DYN_SHARED (cuda_kernels.cu), and nothing else from CUDA
 * is used beyond what the headers of tests/cuda_emu declare.
 *
 * Conventions
 *   - Row-major tensors everywhere; nn.Linear weights are [out, in].
 *   - Every launcher returns the cudaError_t of the launch
 *     (cudaGetLastError()); it never synchronises.
 *   - No atomics anywhere: every reduction has a fixed order, so the same inputs
 *     give the same bits run to run (ORCH_CAP_DETERMINISTIC).
 *   - Everything runs on the context's one stream.
 */
#ifndef ORCH_CUDA_INTERNAL_H
#define ORCH_CUDA_INTERNAL_H

#include "engine_api/orch_engine.h"
#include "engines/common/engine_checks.h"
#include "engines/common/engine_common.h"
#include "engines/common/engine_lora.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------- */
/* Model layout                                                               */
/* ------------------------------------------------------------------------- */

/* Tensors per transformer layer in the table, in table order. */
enum {
    CU_LN1_W = 0,
    CU_LN1_B,
    CU_ATTN_W,
    CU_ATTN_B,
    CU_PROJ_W,
    CU_PROJ_B,
    CU_LN2_W,
    CU_LN2_B,
    CU_FC_W,
    CU_FC_B,
    CU_FCPROJ_W,
    CU_FCPROJ_B,
    CU_PER_LAYER
};
/* Table index of tensor `which` (CU_*) of layer l; wte is 0, wpe is 1, and
 * ln_f.weight / ln_f.bias are the last two. */
#define CU_LAYER_TENSOR(l, which) (2u + (uint32_t)(l)*CU_PER_LAYER + (uint32_t)(which))

/* LLaMA tensors per layer, in table order (engines/common's llama table):
 * model.embed_tokens.weight is 0, model.norm.weight follows the layers, then
 * lm_head.weight with an untied head. q, k, v are adjacent in the flat
 * buffers and so form one [(H+2*KV)*D, C] matrix; gate and up one [2M, C]. */
enum {
    CL_IN_NORM = 0,
    CL_Q,
    CL_K,
    CL_V,
    CL_O,
    CL_POST_NORM,
    CL_GATE,
    CL_UP,
    CL_DOWN,
    CL_PER_LAYER
};
#define CL_LAYER_TENSOR(l, which) (1u + (uint32_t)(l)*CL_PER_LAYER + (uint32_t)(which))

/* One tensor of the model's table (engines/common). */
typedef engine_tensor cu_tensor;

typedef enum cu_math { CU_MATH_FP32 = 0, CU_MATH_TF32 = 1, CU_MATH_BF16 = 2 } cu_math;

/* Training activations for one (batch, seq_len) shape; grown on demand. */
typedef struct cu_acts {
    uint64_t cap_tokens; /* N = B*T the buffers hold */
    uint64_t cap_att;    /* B*H*T*T floats per layer the att buffers hold */
    float *base;         /* one cudaMalloc for all float buffers below */
    float *res; /* (L+1) x [N,C]: residual stream entering each layer, last = final */
    float *ln1; /* L x [N,C] */
    float *ln1_mean, *ln1_rstd; /* L x [N] */
    float *qkvh;                /* L x 3 x [B,H,T,hs]: q, k, v per head (bias added);
                                   llama: q [B,H,T,D], k, v [B,KV,T,D] (RoPE applied) */
    float *att;                 /* L x [B*H,T,T]: causal softmax probabilities */
    float *y;                   /* L x [N,C]: attention output before c_proj */
    float *x2;                  /* L x [N,C]: residual after attention */
    float *ln2;                 /* L x [N,C] */
    float *ln2_mean, *ln2_rstd; /* L x [N] */
    float *fch;                 /* L x [N,M]: c_fc output + bias (pre-GELU);
                                   llama: L x [N,2M] gate | up */
    float *fcg;                 /* L x [N,M]: GELU output; llama: silu(gate)*up */
    float *lnf;                 /* [N,C] */
    float *lnf_mean, *lnf_rstd; /* [N] */
    float *logits;              /* [N,V]; reused in place for d(logits) */
    float *losses;              /* [N] per-token loss (0 for ignored targets) */
    /* scratch shared by the forward and the backward pass */
    float *s_big;   /* [N, max(3C, M)] (llama max(3C, 2M)): qkv before the head
                       split, d(fc), d(qkv) */
    float *s_c0;    /* [N,C] */
    float *s_c1;    /* [N,C] */
    float *s_heads; /* 3 x [N,C]: y per head; dq, dk, dv per head; llama: also
                       d(act) [N,M] (max(3C, M) columns) */
    float *s_att;   /* [B*H,T,T]: d(att) */
    float *s_part;  /* column-sum partial results, CU_COLSUM_CHUNKS x max(3C,M) x 2 */
    /* int buffers, laid out per call for N tokens: tokens [N], targets [N],
     * distinct token ids [N], their CSR offsets [N+1], rows grouped by token
     * (ascending within a token) [N] - the wte gradient without atomics */
    int32_t *i_base;
} cu_acts;

/* Inference scratch, grown on demand. */
typedef struct cu_infer_bufs {
    uint64_t cap_tokens; /* new tokens of a batch */
    uint64_t cap_rows;   /* logit rows */
    uint64_t cap_seqs;
    uint64_t cap_table; /* total block-table entries */
    float *base;
    float *x;      /* [n,C] residual */
    float *x2;     /* [n,C] */
    float *ln;     /* [n,C] */
    float *qkv;    /* [n,3C] */
    float *q;      /* [n,C] query with bias */
    float *y;      /* [n,C] */
    float *tmp;    /* [n,C] */
    float *fc;     /* [n,M]; llama [n,2M] gate | up (silu(gate)*up in place) */
    float *sel;    /* [rows,C] final-LN rows that produce logits */
    float *logits; /* [rows,V] */
    /* int buffers, laid out per call: tokens [n], positions [n], sequence
     * of each token [n], token index of each logit row [rows], offset of each
     * sequence's table in the flat table [seqs], flat block tables [table] */
    int32_t *i_base;
} cu_infer_bufs;

/* Column-sum partials: rows are cut into at most this many chunks. */
#define CU_COLSUM_CHUNKS 64

struct orch_engine_ctx {
    int device;
    cu_math math;
    cublasComputeType_t compute; /* for every GEMM */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    size_t blas_ws_bytes;
    int broken; /* a sticky CUDA error happened: refuse further work */

    /* model */
    uint32_t arch; /* ORCH_ARCH_GPT2 or ORCH_ARCH_LLAMA */
    uint32_t V, T, L, H, C, M, hs;
    uint32_t KVH;      /* K/V heads (H for GPT-2) */
    uint32_t kvC;      /* K/V row width KVH*hs: floats per position per layer of K */
    int untied;        /* llama: separate lm_head.weight (last tensor) */
    float *d_inv_freq; /* llama: [hs/2] RoPE inverse frequencies (engines/common) */
    float eps;
    engine_batch_limits train_lim; /* bounds of forward_backward / eval_loss */

    /* tensor table; the three flat buffers share its offsets */
    cu_tensor *tensors;
    uint32_t n_tensors;
    uint64_t n_params;
    float *d_params, *d_grads, *d_m, *d_v;
    /* d_m and d_v live in d_mom (their own allocation) and cover flat
     * [sh_off, sh_off+sh_count) (ABI 1.2 optimizer_shard; unsharded 0,
     * n_params): d_m[i - sh_off]. */
    float *d_mom;
    uint64_t sh_off, sh_count;

    /* reductions (grad norm, loss) */
    double *d_red; /* CU_NORM_BLOCKS partial sums + 1 result */
    float *d_norm; /* [2]: norm, clip scale */
    double *h_red; /* pinned: loss sum */
    float *h_norm; /* pinned: norm, scale */

    /* pinned host staging for index uploads */
    void *h_stage;
    size_t h_stage_bytes;
    int32_t *h_tok_map; /* host [V], all -1 between calls: embedding CSR build */

    cu_acts acts;
    cu_infer_bufs inf;

    /* KV pool: num_blocks blocks of L x 2 x [bs, kvC] floats each */
    float *d_kv;
    uint32_t kv_block_size, kv_num_blocks;
    engine_kv_mark *h_kv_marks; /* host [num_blocks]: validation marks (engines/common) */
    uint32_t kv_epoch;          /* their round counter */
    uint8_t *h_kv_written;      /* host [num_blocks * block_size]: slot holds K/V */
    size_t attn_smem_max;       /* dynamic shared memory the paged kernel may use */

    /* LoRA adapters (cuda_lora.cu, ABI 1.4): the set (NULL until the first
     * adapter_create; freed by cu_lora_free_all) and the adapter the
     * training pass runs under (NULL: the base model; set, the base is
     * frozen: the passes compute no base gradients). */
    struct cu_lora_set *lora;
    struct cu_lora *lora_cur;
    /* token-level fine-tuning streams (cuda_ft_stream.cu, ABI 1.5; NULL
     * until the first ft_stream_open; freed by cu_ft_free_all) */
    struct cu_ft_set *ft;

    char last_error[1024];
};

#define CU_NORM_BLOCKS 256

/* Tokens of one call (an inference batch, a training micro-batch, a
 * coserve_forward stack) at most: int arguments of cuBLAS, 32-bit index
 * arrays. */
#define CU_MAX_TOKENS (1u << 26)

/* ------------------------------------------------------------------------- */
/* Errors (cuda_engine.cu)                                                    */
/* ------------------------------------------------------------------------- */

/* Set last_error (printf format): cu_set_error(ctx, status, fmt, ...)
 * returns `status`. ctx must not be NULL. */
#define cu_set_error(ctx, ...) ENGINE_FAIL(ctx, __VA_ARGS__)
/* Turn a CUDA error into a status + last_error naming `what`. Out of memory
 * gives ORCH_ERR_OUT_OF_MEMORY (and clears the error); anything else gives
 * ORCH_ERR_DEVICE and marks the context broken. */
int32_t cu_cuda_error(orch_engine_ctx *ctx, cudaError_t e, const char *what);
/* The same for cuBLAS statuses. */
int32_t cu_blas_error(orch_engine_ctx *ctx, cublasStatus_t s, const char *what);

#define CU_CHECK(ctx, call)                                                  \
    do {                                                                     \
        cudaError_t cu_e_ = (call);                                          \
        if (cu_e_ != cudaSuccess) return cu_cuda_error((ctx), cu_e_, #call); \
    } while (0)
#define CU_BLAS(ctx, call)                                                             \
    do {                                                                               \
        cublasStatus_t cu_s_ = (call);                                                 \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS) return cu_blas_error((ctx), cu_s_, #call); \
    } while (0)
#define CU_TRY(expr)                          \
    do {                                      \
        int32_t cu_st_ = (expr);              \
        if (cu_st_ != ORCH_OK) return cu_st_; \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Entry helpers (cuda_engine.cu) and co-serving (cuda_coserve.cu)            */
/* ------------------------------------------------------------------------- */

struct cu_infer_plan;
/* The KV pool as the engines/common checks see it. */
engine_kv_view cu_kv_view(orch_engine_ctx *ctx);
/* Validate an inference batch as infer_forward does (engines/common's
 * checks, the same statuses and messages; no device work) and flatten it
 * into *plan, whose arrays live in one malloc'd block returned in *mem
 * (the caller frees it). */
int32_t cu_plan_batch(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                      const float *logits, uint64_t logits_cap,
                      struct cu_infer_plan *plan, int32_t **mem);
/* Run a planned batch as infer_forward does (its adapters, the pass, the
 * KV slots marked written on success). */
int32_t cu_infer_planned(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                         const struct cu_infer_plan *plan, float *logits);
/* coserve_forward (ABI 1.4, ORCH_CAP_COSERVE); see cuda_coserve.cu. */
int32_t cu_coserve_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                           float *logits, uint64_t logits_cap,
                           const orch_finetune_batch *ft, uint32_t n_finetune,
                           uint32_t ft_stride, float *out_losses);

/* Token-level fine-tuning streams (ABI 1.5, ORCH_CAP_FT_STREAM; see
 * cuda_ft_stream.cu): the three ABI calls with the CPU engine's checks,
 * statuses and messages. */
int32_t cu_ft_stream_open(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                          uint32_t *out_stream);
int32_t cu_ft_stream_close(orch_engine_ctx *ctx, uint32_t stream);
int32_t cu_ft_coserve_step(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                           float *logits, uint64_t logits_cap, uint32_t stream,
                           uint32_t ft_rows, orch_ft_progress *progress);
/* The id of the open stream on adapter_id (0: none): its parameters are
 * locked while it is open. */
uint32_t cu_ft_adapter_stream(const orch_engine_ctx *ctx, uint32_t adapter_id);
/* Release every stream and the set (context_destroy). */
void cu_ft_free_all(orch_engine_ctx *ctx);

/* ------------------------------------------------------------------------- */
/* Model passes (cuda_model.cu)                                               */
/* ------------------------------------------------------------------------- */

/* Device pointer of parameter tensor `index` inside flat buffer `base`. */
static inline float *cu_tp(const orch_engine_ctx *ctx, float *base, uint32_t index) {
    return base + ctx->tensors[index].offset;
}

/* Gradient-ready reporting of forward_backward_notify (ABI 1.3); NULL for
 * forward_backward and eval_loss. The training passes call cu_grad_ready as
 * a flat range becomes final (GPT-2: ln_f, layers last to first, wte+wpe;
 * LLaMA: model.norm (+ untied lm_head), layers, embed_tokens): it waits for
 * the stream (the range's kernels are done), then calls ready on the
 * caller's thread. */
typedef struct cu_grad_notify {
    orch_grad_ready_fn ready;
    void *user;
} cu_grad_notify;
int32_t cu_grad_ready(orch_engine_ctx *ctx, const cu_grad_notify *n, uint64_t offset,
                      uint64_t count);

/* Fill d_params with the GPT-2 initialisation from `seed`; zero grads and
 * moments. Synchronous. */
int32_t cu_model_init(orch_engine_ctx *ctx, uint64_t seed);

/* Forward (+ backward when `grad` != 0) of the cross-entropy over a
 * [B,T] micro-batch, both architectures (a one-part cu_fwd, then the part's
 * loss), under ctx->lora_cur when set. Inputs already validated; n_valid =
 * number of targets that are not -1. Writes the mean loss. Synchronises
 * once at the end. */
int32_t cu_model_train_step(orch_engine_ctx *ctx, const int32_t *tokens,
                            const int32_t *targets, uint32_t B, uint32_t T,
                            uint64_t n_valid, float grad_scale, int grad, float *out_loss,
                            const cu_grad_notify *notify);

/* Global grad norm, clipping and AdamW over every tensor. Inputs validated.
 * Returns ORCH_ERR_NUMERIC (and changes nothing) for a non-finite norm. */
int32_t cu_model_adamw(orch_engine_ctx *ctx, const orch_adamw_params *p, float *out_norm);
/* AdamW over flat [off, off+count) (inside the shard) with the clipping
 * scale of the caller's global gradient norm (ABI 1.2). */
int32_t cu_model_adamw_range(orch_engine_ctx *ctx, const orch_adamw_params *p,
                             uint64_t off, uint64_t count, float global_norm);

/* One validated inference batch (see cuda_engine.cu for the flattening);
 * cu_model_infer runs it (both architectures) as a stack of inference rows
 * only, on ctx->inf's buffers. */
typedef struct cu_infer_plan {
    uint32_t n_tokens; /* all new tokens of the batch */
    uint32_t n_rows;   /* logit rows */
    uint32_t n_seqs;
    uint32_t n_table; /* total block-table entries */
    const int32_t *tokens, *pos, *seq, *rows, *bt_off, *bt_all; /* host arrays */
} cu_infer_plan;
int32_t cu_model_infer(orch_engine_ctx *ctx, const cu_infer_plan *plan,
                       float *logits_out);

/* Scratch shared by both architectures (cuda_model.cu): make the training
 * buffers hold N tokens and `att` attention elements per layer / the
 * inference buffers hold a batch of these sizes. On failure the old buffers
 * are gone and the context stays usable. */
int32_t cu_acts_reserve(orch_engine_ctx *ctx, uint64_t N, uint64_t att);
int32_t cu_infer_reserve(orch_engine_ctx *ctx, uint64_t n, uint64_t rows, uint64_t seqs,
                         uint64_t table);
/* Group rows by token id for the deterministic embedding gradient (see
 * cuda_model.cu): returns the number of distinct ids. */
uint32_t cu_token_csr(int32_t *map, const int32_t *tok, uint32_t n, int32_t *uniq,
                      int32_t *start, int32_t *rows, int32_t *cursor);

/* Free training / inference scratch. */
void cu_acts_free(orch_engine_ctx *ctx);
void cu_infer_free(orch_engine_ctx *ctx);

/* Ensure the pinned staging buffer holds at least `bytes`. */
int32_t cu_stage_reserve(orch_engine_ctx *ctx, size_t bytes);

/* The integer arrays of an inference plan on the device (in ctx->inf.i_base). */
typedef struct cu_plan_dev {
    const int32_t *tok, *pos, *seq, *rows, *btoff, *bt;
} cu_plan_dev;

/* Reserve the inference buffers for plan and upload its tokens, positions,
 * sequence of each token, logits rows and block tables (one async copy on
 * ctx->stream through the pinned staging buffer); *d receives the device
 * pointers. Both architectures. */
int32_t cu_infer_upload_plan(orch_engine_ctx *ctx, const cu_infer_plan *plan,
                             cu_plan_dev *d);

/* ---- the shared forward (one pass over the base weights) ----
 *
 * cu_model_infer, cu_model_train_step and coserve_forward (cuda_coserve.cu)
 * all run the same forward over a stack of rows: the rows of an inference
 * batch first (rows [0, n_inf): paged KV attention), then the rows of
 * fine-tuning parts (micro-batches; part k's B*T rows from r0: causal
 * attention inside each sequence), so that every base product (and the LM
 * head) is ONE GEMM over all rows; attention and the LoRA terms run per
 * part. A matrix of the stack is a cu_lbuf: layer l's [n, width] rows are
 * at p + l * ls (ls 0: one buffer reused by every layer, as the inference
 * pass does; p NULL: not kept, e.g. the inference pass's LayerNorm stats). */
typedef struct cu_lbuf {
    float *p;
    uint64_t ls;
} cu_lbuf;
static inline float *cu_lb(cu_lbuf b, uint32_t l) {
    return b.p ? b.p + (uint64_t)l * b.ls : NULL;
}

/* One fine-tuning part of a stacked forward. */
typedef struct cu_fwd_part {
    uint32_t B, T;      /* its micro-batch */
    uint32_t r0;        /* its first row in the stack */
    uint64_t att0;      /* its B*H*T*T scores start at att(l) + att0 */
    struct cu_lora *lo; /* its adapter (NULL: the base model) */
    uint32_t lrow0;     /* its first logits row (the LM head's output) */
    /* a forward chunk of a fine-tuning stream (cuda_ft_stream.cu; NULL:
     * none): rows [ft_r0, ft_r0 + B*T) of the stream (B is 1), whose
     * attention is cu_ft_attention's */
    struct cu_ft_stream *ft;
    uint64_t ft_r0;
} cu_fwd_part;

typedef struct cu_fwd {
    uint32_t n;            /* rows of the stack */
    uint32_t n_inf;        /* inference rows (first) */
    const cu_plan_dev *dp; /* the inference part's device arrays (NULL: none) */
    const cu_fwd_part *parts;
    uint32_t n_parts;
    const int32_t *d_tok; /* [n] token of each row */
    const int32_t *d_pos; /* [n] GPT-2 position of each row; NULL: r % parts[0].T */
    /* per-layer matrices (the training pass keeps them for the backward) */
    cu_lbuf res;             /* [n,C] residual entering layer l (l = L: the final one) */
    cu_lbuf ln1, ln1m, ln1r; /* [n,C], [n], [n]; stats may be NULL */
    cu_lbuf qkvh;            /* fine-tuning parts' q, k, v in head layout: part k at
                     qkvh(l) + 3 * r0 * C (q [B,H,T,hs], then k, v) */
    cu_lbuf att;             /* the parts' causal softmax probabilities */
    cu_lbuf y, x2, ln2, ln2m, ln2r; /* [n,C] ... */
    cu_lbuf fch;                    /* [n,M] pre-GELU (llama [n,2M] gate | up) */
    cu_lbuf fcg;              /* [n,M] GELU output (llama silu(gate)*up); llama: when
                    fcg.p == fch.p it is written over the gate half (ld 2M) */
    float *lnf, *lnfm, *lnfr; /* [n,C] final norm output and stats */
    /* scratch */
    float *qkv;   /* [n, 3C] (llama [n, C+2*kvC]) */
    float *tmp;   /* [n, C] */
    float *qi;    /* [n_inf, C] inference queries */
    float *heads; /* [N_k, C] per part: attention output in head layout */
    /* LM head: logits [n_head, V] from lnf rows d_head_rows (NULL: all n
     * rows of lnf, no gather) gathered into head_in */
    const int32_t *d_head_rows;
    uint32_t n_head;
    float *head_in, *logits;
} cu_fwd;

/* The forward over a stack, inputs validated, KV written for the inference
 * rows; logits left on the device (f->logits); no synchronisation. The
 * inference rows' adapters are ctx->lora's runs (cu_lora_infer_begin); the
 * scratch of the LoRA hooks must hold the largest part / run. */
int32_t cu_gpt2_forward(orch_engine_ctx *ctx, const cu_fwd *f);
int32_t cu_llama_forward(orch_engine_ctx *ctx, const cu_fwd *f);
/* The attention of layer l for a stream's forward-chunk part p (called by
 * the GPT-2 stack's attention): qkv [R, 3C] (no bias) of the part's rows,
 * y [R, C] of its rows out; the rows' q|k|v (bias added) are kept in the
 * stream. */
int32_t cu_ft_attention(orch_engine_ctx *ctx, const cu_fwd_part *p, uint32_t l,
                        const float *qkv, const float *bias, float *y);
/* Their LM head (cuda_model.cu): f->logits = (rows of f->lnf) head^T, one
 * GEMM over every row of the stack that gives logits. */
int32_t cu_lm_head(orch_engine_ctx *ctx, const cu_fwd *f, const float *head);

/* Loss of part k of a forward that has run (its logits are f->logits from
 * row lrow0; targets d_tgt [B*T]), and with grad its backward: the
 * gradients of (grad_scale * mean loss) added to ctx->d_grads, or under an
 * adapter (part k's lo, the base frozen) to the adapter's only; emb (the
 * token CSR of cu_token_csr on the device: uniq, start, rows and n_uniq) is
 * needed when the base is not frozen. Synchronises; writes *out_loss. */
typedef struct cu_emb_csr {
    const int32_t *uniq, *start, *rows;
    uint32_t n_uniq;
} cu_emb_csr;
int32_t cu_gpt2_part_loss(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t k,
                          const int32_t *d_tgt, uint64_t n_valid, float grad_scale,
                          int grad, const cu_emb_csr *emb, const cu_grad_notify *notify,
                          float *out_loss);
/* Their two ends: the cross-entropy of part k (and d logits in place with
 * grad), its loss sum on its way to the host; then wait and write the mean. */
int32_t cu_part_ce(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t k,
                   const int32_t *d_tgt, uint64_t n_valid, float grad_scale, int grad);
int32_t cu_part_loss_end(orch_engine_ctx *ctx, uint64_t n_valid, float *out_loss);
int32_t cu_llama_part_loss(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t k,
                           const int32_t *d_tgt, uint64_t n_valid, float grad_scale,
                           int grad, const cu_emb_csr *emb, const cu_grad_notify *notify,
                           float *out_loss);

/* The training-pass cu_fwd over the acts (sized for n rows and att scores
 * per layer): every matrix per layer, the scratch of ctx->acts. */
void cu_fwd_on_acts(orch_engine_ctx *ctx, cu_fwd *f, uint32_t n, uint64_t att);

/* ------------------------------------------------------------------------- */
/* GEMM wrappers (cuda_model.cu)                                              */
/* ------------------------------------------------------------------------- */

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
 * transA: A is stored [K,M] (lda = its row length); else [M,K].
 * transB: B is stored [N,K]; else [K,N]. Uses the context's math mode. */
int32_t cu_gemm(orch_engine_ctx *ctx, int transA, int transB, int M, int N, int K,
                float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                float *C, int ldc);
/* The same over `batch` matrices at fixed element strides. */
int32_t cu_gemm_batched(orch_engine_ctx *ctx, int transA, int transB, int M, int N, int K,
                        float alpha, const float *A, int lda, long long sA,
                        const float *B, int ldb, long long sB, float beta, float *C,
                        int ldc, long long sC, int batch);

/* ------------------------------------------------------------------------- */
/* LoRA adapters (cuda_lora.cu, ABI 1.4)                                      */
/* ------------------------------------------------------------------------- */

/* One adapted matrix W [out, in] of one layer. */
/* One adapted matrix (engines/common/engine_lora.h). */
typedef engine_lora_mod cu_lora_mod;

typedef struct cu_lora {
    uint32_t id, rank, targets;
    float alpha, scale; /* scale = alpha / rank */
    uint64_t seed;
    cu_tensor *tensors; /* [n_tensors]: A, B per module, table order (host) */
    uint32_t n_tensors;
    uint64_t n_params, stride; /* stride: n_params rounded up to 64 */
    float *d_base;             /* one cudaMalloc: params | grads | m | v */
    float *d_params, *d_grads, *d_m, *d_v;
    cu_lora_mod *mods; /* [n_mods], table order (host) */
    uint32_t n_mods;
    /* mods of (layer l, target bit t): mods[first[l*4+t] .. first[l*4+t+1]) */
    uint32_t *first; /* [L*4 + 1] */
} cu_lora;

/* Rows [row0, row0+rows) of an inference batch that run through lo. */
typedef struct cu_lora_run {
    cu_lora *lo;
    uint32_t row0, rows;
} cu_lora_run;

typedef struct cu_lora_set {
    cu_lora **items; /* live adapters, creation order */
    uint32_t n, cap;
    uint32_t next_id; /* ids are never reused */
    float *d_scratch; /* hook scratch (device): u, du */
    uint64_t scratch_floats;
    cu_lora_run *runs; /* runs of the inference batch in flight (host) */
    uint32_t n_runs, runs_cap;
} cu_lora_set;

/* adapter_create (desc checked as the CPU engine checks it) / destroy. */
int32_t cu_lora_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                       uint32_t *out_id);
int32_t cu_lora_destroy(orch_engine_ctx *ctx, uint32_t id);
/* The adapter `id`, or NULL with ORCH_ERR_INVALID_ARGUMENT recorded ("fn:
 * adapter_id N is not an adapter of this context"). */
cu_lora *cu_lora_find(orch_engine_ctx *ctx, const char *fn, uint32_t id);
/* Whether adapter `id` exists on context c (engine_infer_check_lora's
 * callback). */
int cu_lora_known(const void *c, uint32_t id);
/* Release every adapter and the set (context_destroy). */
void cu_lora_free_all(orch_engine_ctx *ctx);
/* Size the device scratch of the hooks for products of `rows` rows at
 * `rank` (before a pass, so the hooks never allocate). */
int32_t cu_lora_prepare(orch_engine_ctx *ctx, uint32_t rank, uint64_t rows);

/* Hooks of the passes (nothing when lo is NULL or does not adapt (layer,
 * target)). Forward, over a stack (cu_fwd): each inference run's adapter
 * (cu_lora_infer_begin) on its rows, each part's adapter on its rows:
 * out[:, col0..) += s (x A^T) B^T per module. Backward of one part under
 * lo: dA, dB added to the adapter's gradients; when din is not NULL the
 * LoRA part of d(x) is ADDED to din (the caller wrote the base product
 * there first). */
int32_t cu_lora_stack_forward(orch_engine_ctx *ctx, const cu_fwd *f, uint32_t layer,
                              uint32_t target, const float *x, int ldx, float *out,
                              int ldout);
int32_t cu_lora_backward(orch_engine_ctx *ctx, const cu_lora *lo, uint32_t layer,
                         uint32_t target, uint32_t R, const float *x, int ldx,
                         const float *dout, int lddout, float *din, int lddin);

/* Inference: resolve the adapters of a validated batch into runs of rows
 * (and size the scratch); cu_lora_stack_forward adds each run's LoRA term
 * on (layer, target); end clears the runs. */
int32_t cu_lora_infer_begin(orch_engine_ctx *ctx, const orch_infer_batch *batch);
void cu_lora_infer_end(orch_engine_ctx *ctx);

/* AdamW of the adapter with clipping of its gradient norm (*out_norm may be
 * NULL); a non-finite norm is ORCH_ERR_NUMERIC and changes nothing. */
int32_t cu_lora_optimizer_step(orch_engine_ctx *ctx, cu_lora *lo,
                               const orch_adamw_params *p, float *out_norm);

/* ------------------------------------------------------------------------- */
/* Kernel launchers (cuda_kernels.cu)                                         */
/* ------------------------------------------------------------------------- */

/* out[0..n) ~ N(0, std): Box-Muller pairs from the splitmix64 stream of
 * `seed` starting at output `base` (the CPU engine's stream). */
cudaError_t k_init_normal(cudaStream_t s, float *out, uint64_t n, uint64_t seed,
                          uint64_t base, double std);
cudaError_t k_fill(cudaStream_t s, float *out, uint64_t n, float value);

/* x[n,:] = wte[tokens[n],:] + wpe[pos(n),:], pos(n) = positions ? positions[n]
 * : n % T. */
cudaError_t k_embed(cudaStream_t s, float *x, const int32_t *tokens,
                    const int32_t *positions, const float *wte, const float *wpe,
                    uint32_t n, uint32_t T, uint32_t C);

/* LayerNorm of each row of x [n,C] (one warp per row). mean/rstd may be NULL. */
cudaError_t k_layernorm(cudaStream_t s, const float *x, const float *w, const float *b,
                        float *out, float *mean, float *rstd, uint32_t n, uint32_t C,
                        float eps);
/* res = a + b + bias (bias [C] broadcast), then out = LayerNorm(res). */
cudaError_t k_residual_layernorm(cudaStream_t s, const float *a, const float *b,
                                 const float *bias, float *res, const float *w,
                                 const float *lb, float *out, float *mean, float *rstd,
                                 uint32_t n, uint32_t C, float eps);
/* LayerNorm backward for the input: dx (+)= d/dx given dout. accumulate=0
 * overwrites dx. */
cudaError_t k_layernorm_bwd_dx(cudaStream_t s, const float *dout, const float *x,
                               const float *mean, const float *rstd, const float *w,
                               float *dx, uint32_t n, uint32_t C, int accumulate);
/* LayerNorm parameter gradients: dw += sum_rows dout*xhat, db += sum_rows dout.
 * `part` needs 2 * CU_COLSUM_CHUNKS * C floats. */
cudaError_t k_layernorm_bwd_params(cudaStream_t s, const float *dout, const float *x,
                                   const float *mean, const float *rstd, float *dw,
                                   float *db, uint32_t n, uint32_t C, float *part);
/* out[c] += sum over rows of a[r,c] (a is [n,C]). `part` needs
 * CU_COLSUM_CHUNKS * C floats. */
cudaError_t k_colsum_add(cudaStream_t s, const float *a, float *out, uint32_t n,
                         uint32_t C, float *part);

/* Split qkv [B*T,3C] (+bias) into q,k,v [B,H,T,hs] at dst, dst + N*C,
 * dst + 2*N*C (N = B*T). */
cudaError_t k_split_heads(cudaStream_t s, const float *qkv, const float *bias, float *dst,
                          uint32_t B, uint32_t T, uint32_t H, uint32_t hs);
/* Inverse for `count` (1 or 3) tensors: src + i*N*C [B,H,T,hs] ->
 * dst[:, i*C .. (i+1)*C) of a [B*T, count*C] matrix. */
cudaError_t k_merge_heads(cudaStream_t s, const float *src, float *dst, uint32_t B,
                          uint32_t T, uint32_t H, uint32_t hs, uint32_t count);
/* The same layout change without the bias, for one [B*T,C] tensor:
 * src [B*T,C] -> dst [B,H,T,hs]. */
cudaError_t k_to_heads(cudaStream_t s, const float *src, float *dst, uint32_t B,
                       uint32_t T, uint32_t H, uint32_t hs);

/* Causal softmax in place over rows of [rows, T] (row r is query i = r % T).
 * tc: query-chunk size of the attention products; the kernel reads keys
 * 0..i and writes keys below min(T, (i/tc+1)*tc) (zeros above i). */
cudaError_t k_softmax_causal(cudaStream_t s, float *att, uint64_t rows, uint32_t T,
                             uint32_t tc);
/* datt <- att * (datt - sum(att*datt)) for keys 0..i, 0 above, over the same
 * columns as the forward. */
cudaError_t k_softmax_causal_bwd(cudaStream_t s, const float *att, float *datt,
                                 uint64_t rows, uint32_t T, uint32_t tc);

/* h += bias (broadcast over rows of [n,M]); g = gelu_tanh(h). g may equal h
 * (then h ends up holding gelu). */
cudaError_t k_bias_gelu(cudaStream_t s, float *h, const float *bias, float *g, uint32_t n,
                        uint32_t M);
/* dg <- dg * gelu'(h) */
cudaError_t k_gelu_bwd(cudaStream_t s, const float *h, float *dg, uint32_t n, uint32_t M);

/* Per row: loss[r] = logsumexp(logits[r]) - logits[r,t] (0 when t < 0); when
 * grad, logits[r] <- (softmax - onehot(t)) * dscale (0 row when t < 0). */
cudaError_t k_cross_entropy(cudaStream_t s, float *logits, const int32_t *targets,
                            float *losses, uint32_t n, uint32_t V, float dscale,
                            int grad);
/* *out = sum of x[0..n) in double (one block, fixed order). */
cudaError_t k_sum_to_double(cudaStream_t s, const float *x, uint64_t n, double *out);

/* Embedding backward: dwpe[t] += sum_b dx[b*T+t]; dwte[uniq[u]] += sum of
 * dx rows rows[start[u]..start[u+1]). */
cudaError_t k_embed_bwd_wpe(cudaStream_t s, const float *dx, float *dwpe, uint32_t B,
                            uint32_t T, uint32_t C);
cudaError_t k_embed_bwd_wte(cudaStream_t s, const float *dx, float *dwte,
                            const int32_t *uniq, const int32_t *start,
                            const int32_t *rows, uint32_t n_uniq, uint32_t C);

/* Sum of squares of g[0..n) into part[CU_NORM_BLOCKS] (double), then
 * norm[0] = sqrt(sum), norm[1] = clip scale (1 when no clipping; NaN when the
 * norm is not finite). */
cudaError_t k_grad_norm(cudaStream_t s, const float *g, uint64_t n, double *part,
                        float *norm, float clip);
/* AdamW constants, computed on the host as the CPU engine does
 * (engines/common); gscale is unused: the clip scale is read on the device. */
typedef engine_adamw_consts cu_adamw_consts;
/* AdamW over n elements; reads norm[1] (clip scale) on the device and does
 * nothing when it is not finite. A scale != 1 is also written back to g
 * (the clipped gradient). */
cudaError_t k_adamw(cudaStream_t s, float *p, float *g, float *m, float *v, uint64_t n,
                    const float *norm, const cu_adamw_consts *c);

/* Inference. qkv [n,3C] + bias: q -> q [n,C]; k,v -> KV blocks of layer l. */
cudaError_t k_kv_write(cudaStream_t s, const float *qkv, const float *bias, float *q,
                       float *kv, const int32_t *pos, const int32_t *seq,
                       const int32_t *bt_off, const int32_t *bt_all, uint32_t n,
                       uint32_t C, uint32_t bs, uint32_t L, uint32_t layer);
/* y[n, h*hs..] = softmax(q k^T / sqrt(hs)) v over positions 0..pos[n] of the
 * token's sequence, read through its block table; query head h reads K/V
 * head h / (H/KVH) from pool rows of KVH*hs (GPT-2: KVH = H). smem_bytes >=
 * (max pos + 1) floats. */
cudaError_t k_paged_attention(cudaStream_t s, const float *q, const float *kv,
                              const int32_t *pos, const int32_t *seq,
                              const int32_t *bt_off, const int32_t *bt_all, float *y,
                              uint32_t n, uint32_t C, uint32_t H, uint32_t KVH,
                              uint32_t bs, uint32_t L, uint32_t layer, size_t smem_bytes);
/* Allow the paged-attention kernel `bytes` of dynamic shared memory. */
cudaError_t k_paged_attention_smem(size_t bytes);
/* dst[r,:] = src[rows[r],:] for r < n_rows ([*,C] matrices). */
cudaError_t k_gather_rows(cudaStream_t s, const float *src, const int32_t *rows,
                          float *dst, uint32_t n_rows, uint32_t C);

/* ---- LLaMA ---- */
/* out = RMSNorm(x) * w per row of [n,C] (one warp per row); rstd may be NULL. */
cudaError_t k_rmsnorm(cudaStream_t s, const float *x, const float *w, float *out,
                      float *rstd, uint32_t n, uint32_t C, float eps);
/* res = a + b, then out = RMSNorm(res) * w. */
cudaError_t k_residual_rmsnorm(cudaStream_t s, const float *a, const float *b, float *res,
                               const float *w, float *out, float *rstd, uint32_t n,
                               uint32_t C, float eps);
/* RMSNorm backward for the input: dx (+)= d/dx given dout (accumulate=0
 * overwrites). */
cudaError_t k_rmsnorm_bwd_dx(cudaStream_t s, const float *dout, const float *x,
                             const float *rstd, const float *w, float *dx, uint32_t n,
                             uint32_t C, int accumulate);
/* dw += sum over rows of dout * x * rstd. `part` needs CU_COLSUM_CHUNKS * C. */
cudaError_t k_rmsnorm_bwd_w(cudaStream_t s, const float *dout, const float *x,
                            const float *rstd, float *dw, uint32_t n, uint32_t C,
                            float *part);
/* qkv [B*T, (H+2*KVH)*D] -> q [B,H,T,D], k, v [B,KVH,T,D], RoPE (rotate
 * half, position t, inv_freq [D/2]) on q and k. */
cudaError_t k_llama_split_heads(cudaStream_t s, const float *qkv, float *q, float *k,
                                float *v, const float *inv_freq, uint32_t B, uint32_t T,
                                uint32_t H, uint32_t KVH, uint32_t D);
/* Its backward: dq, dk (inverse RoPE), dv in head layout -> dqkv. */
cudaError_t k_llama_merge_heads(cudaStream_t s, const float *dq, const float *dk,
                                const float *dv, float *dqkv, const float *inv_freq,
                                uint32_t B, uint32_t T, uint32_t H, uint32_t KVH,
                                uint32_t D);
/* out[r*ldo + j] = silu(gu[r, j]) * gu[r, M + j] for gu [n, 2M]; out may be
 * gu with ldo = 2M (in place over the gate half). */
cudaError_t k_swiglu(cudaStream_t s, const float *gu, float *out, uint32_t n, uint32_t M,
                     uint32_t ldo);
/* dgu [n, 2M] (gate | up) from dact [n, M]. */
cudaError_t k_swiglu_bwd(cudaStream_t s, const float *gu, const float *dact, float *dgu,
                         uint32_t n, uint32_t M);
/* Inference: qkv [n, (H+2*KVH)*D] -> q [n, H*D] with RoPE at pos[t]; K (with
 * RoPE) and V into the KV blocks of `layer` (rows of KVH*D floats). */
cudaError_t k_llama_kv_write(cudaStream_t s, const float *qkv, float *q, float *kv,
                             const float *inv_freq, const int32_t *pos,
                             const int32_t *seq, const int32_t *bt_off,
                             const int32_t *bt_all, uint32_t n, uint32_t H, uint32_t KVH,
                             uint32_t D, uint32_t bs, uint32_t L, uint32_t layer);

/* ---- token-level fine-tuning streams (cuda_ft_stream.cu) ---- */
/* dst[r, c] = src[r, c] (+ bias[c] when bias is set) for r < n, c < w
 * (row strides lds, ldd). */
cudaError_t k_ft_copy_cols(cudaStream_t s, const float *src, uint32_t lds,
                           const float *bias, float *dst, uint32_t ldd, uint32_t n,
                           uint32_t w);
/* a[0..n) += b[0..n). */
cudaError_t k_ft_add(cudaStream_t s, float *a, const float *b, uint64_t n);
/* Causal softmax in place over rows of [rows, nk] whose query position is
 * p0 + row % nq (keys 0..p, zeros above up to nk); and its backward
 * (datt <- att * (datt - sum(att*datt)) over the same keys). */
cudaError_t k_ft_softmax(cudaStream_t s, float *att, uint64_t rows, uint32_t nq,
                         uint32_t nk, uint32_t p0);
cudaError_t k_ft_softmax_bwd(cudaStream_t s, const float *att, float *datt, uint64_t rows,
                             uint32_t nq, uint32_t nk, uint32_t p0);
/* LLaMA RoPE (rotate half) of `heads` heads of D per row of n rows, row r at
 * position (p0 + r) % T: out (ld ldo) from in (ld ldi; not in place); sign
 * -1 is the inverse rotation. */
cudaError_t k_ft_rope(cudaStream_t s, const float *in, uint32_t ldi, float *out,
                      uint32_t ldo, uint32_t n, uint32_t heads, uint32_t D, uint64_t p0,
                      uint32_t T, const float *inv_freq, float sign);

#endif
