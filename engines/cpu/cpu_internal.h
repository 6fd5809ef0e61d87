/*
 * cpu_internal.h - the CPU engine's context and the functions its modules
 * share: cpu_engine.c (the ABI: validation, tensor tables, KV pool, options),
 * cpu_train.c (GPT-2 training forward/backward, AdamW), cpu_infer.c
 * (GPT-2 paged-KV inference), cpu_llama.c (LLaMA training and inference),
 * cpu_linear.c (threaded matrix products), cpu_lora.c (LoRA adapters, ABI
 * 1.4) and cpu_coserve.c (coserve_forward).
 * Private to engines/cpu; the orchestrator never includes it.
 *
 * Memory layout: parameters, gradients and the two AdamW moments are each ONE
 * allocation laid out in tensor-table order (so the flat gradient buffer of
 * the ABI is a memcpy away and a checkpoint is a few writes). Gradients and
 * moments are allocated on first use by training, so a serving-only context
 * holds just the parameters (plus the KV pool and, once decoding, a packed
 * copy of the weight matrices for the skinny kernel).
 *
 * Threads: a context is driven by one caller thread at a time; heavy work
 * runs on the context's pool (cpu_pool) in chunks with fixed boundaries,
 * with OpenBLAS single-threaded inside each pool thread, so results are
 * bit-identical for a given thread count.
 */
#ifndef ORCH_CPU_INTERNAL_H
#define ORCH_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "engines/common/engine_checks.h"
#include "engines/common/engine_common.h"
#include "engines/cpu/cpu_kernels.h"
#include "engines/cpu/cpu_pool.h"

#define CPU_ERR_MAX 512

/* Matrix-product precision (engine option precision=): fp32 everywhere, or
 * bf16 inputs with fp32 accumulation, fp32 master weights and optimizer. */
enum { CPU_PREC_FP32 = 0, CPU_PREC_BF16 = 1 };
/* Weight storage for inference (engine option weights=). */
enum { CPU_WEIGHTS_FP32 = 0, CPU_WEIGHTS_INT8 = 1 };

/* Per-layer tensor order inside the table (after wte, wpe). */
enum {
    L_LN1_W,
    L_LN1_B,
    L_QKV_W,
    L_QKV_B,
    L_AP_W,
    L_AP_B,
    L_LN2_W,
    L_LN2_B,
    L_FC_W,
    L_FC_B,
    L_MP_W,
    L_MP_B,
    L_COUNT
};

/* The GPT-2 table (engines/common); L_* index a layer's tensors in it. */
typedef engine_tensor cpu_tensor;

/* Pointers into one flat buffer (parameters or gradients). */
typedef struct cpu_layer_view {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *ap_w, *ap_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *mp_w, *mp_b;
} cpu_layer_view;

typedef struct cpu_view {
    float *wte, *wpe, *lnf_w, *lnf_b;
    cpu_layer_view *layer; /* [L] */
} cpu_view;

/* Saved activations of one layer for the backward pass. Neither the
 * attention probabilities, the GELU output nor the LayerNorm outputs are
 * kept: the backward pass recomputes them (per (batch, head) from q, k and
 * the softmax statistics; GELU from fc; LayerNorm from its input), so the
 * saved bytes grow linearly in seq_len. */
typedef struct cpu_layer_acts {
    float *res_in;              /* [BT,C] input of the layer */
    float *ln1_mean, *ln1_rstd; /* [BT] */
    float *qkv;                 /* [BT,3C] */
    float *att_max;             /* [B,NH,T] softmax row maximum of the scaled scores */
    float *att_isum;            /* [B,NH,T] 1 / softmax row sum */
    float *atty;                /* [BT,C] attention output before c_proj */
    float *res_mid;             /* [BT,C] after the attention residual */
    float *ln2_mean, *ln2_rstd; /* [BT] */
    float *fc;                  /* [BT,M] before GELU */
} cpu_layer_acts;

typedef struct cpu_train_acts {
    float *base; /* the one allocation */
    size_t floats;
    uint32_t B, T;         /* shape the buffers are carved for */
    cpu_layer_acts *layer; /* [L] */
    float *res_out;        /* [BT,C] output of the last layer */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *row_loss; /* [BT] */
    /* One region reused by whichever step runs: the GELU tanh term and
     * output of the layer being computed (forward and backward), one chunk
     * of logits rows (turned into dlogits in place), or datty/dqkv during the
     * attention backward, or a recomputed LayerNorm output (ln). */
    float *work;
    float *gelu_tanh, *gelu; /* [BT,M] each, in work */
    float *logits;           /* [loss rows, V], in work */
    float *datty, *dqkv;     /* [BT,C], [BT,3C], in work */
    float *ln;               /* [BT,C], in work (same place as datty) */
    /* backward scratch, one layer's worth (dtmp also takes the LayerNorm
     * outputs during the forward pass) */
    float *dres, *dtmp, *dfc;
    float *att_scratch; /* [threads][2 * query block * T] */
} cpu_train_acts;

/* Inference scratch, grown on demand. */
typedef struct cpu_infer_scratch {
    float *base;
    size_t floats;
    float *x, *ln, *qkv, *atty, *fc, *rows;
    float *att; /* per-thread attention scratch */
    size_t att_per_thread;
    int32_t *row_index; /* token index of each logits row */
    size_t row_index_cap;
} cpu_infer_scratch;

struct orch_engine_ctx {
    char last_error[CPU_ERR_MAX];
    /* model */
    uint32_t V, T, L, NH, C, M, HS;
    float eps;
    uint32_t arch;        /* ORCH_ARCH_* */
    uint32_t KVH;         /* key/value heads (= NH for gpt2) */
    uint32_t KVD;         /* KVH * HS: floats of K (and of V) per position and layer */
    orch_model_desc desc; /* the normalised description */
    /* llama (cpu_llama.c): RoPE tables, activations, inference scratch;
     * NULL for gpt2. Freed by cpu_llama_free. */
    struct cpu_llama_state *llama;
    /* execution */
    int isa;       /* kernels to use (<= what the CPU has) */
    int precision; /* CPU_PREC_*: type of the matrix products */
    int weights;   /* CPU_WEIGHTS_*: storage of the weight matrices for inference */
    int threads;
    uint32_t skinny_max; /* row counts up to this use packed kernels */
    uint32_t max_batch_tokens;
    engine_batch_limits train_lim; /* bounds of forward_backward / eval_loss */
    cpu_pool *pool;
    /* tensors */
    cpu_tensor *tensors;
    uint32_t n_tensors;
    uint64_t n_params;
    float *params, *grads, *adam_m, *adam_v;
    /* AdamW moments cover flat elements [sh_off, sh_off+sh_count) (ABI 1.2
     * optimizer_shard; 0 and n_params unsharded): adam_m[i - sh_off]. */
    uint64_t sh_off, sh_count;
    cpu_view pv, gv; /* views into params and grads */
    cpu_train_acts acts;
    /* packed copies of the weight matrices for skinny products */
    float *packed;
    int packed_valid;
    uint64_t params_version; /* bumped by cpu_params_changed */
    float **packed_layer;    /* [L*4]: qkv, attn proj, fc, mlp proj */
    float *packed_wte;
    /* KV pool: head vectors of kv_dtype (CPU_KV_*, cpu_kvq.h), kv_vb bytes
     * each (cpu_kv_vec_bytes of HS); a position's row is KVH of them */
    void *kv;
    int kv_dtype;
    size_t kv_vb;
    uint8_t *kv_written; /* [blocks*block_size] */
    uint32_t kv_block_size, kv_num_blocks;
    engine_kv_mark *kv_marks; /* [blocks] validation marks */
    uint32_t kv_epoch;
    cpu_infer_scratch inf;
    /* int8 (cpu_quant.c): weights=int8 packed copies, built lazily */
    int q8_kernel;       /* CPU_Q8_*: int8 kernel version */
    int q8_valid;        /* q8_packed matches params at q8_version */
    uint64_t q8_version; /* params_version the copy was built from */
    uint8_t *q8_packed;  /* one allocation for all matrices */
    uint8_t **q8_layer;  /* [L*4]: qkv, attn proj, fc, mlp proj */
    uint8_t *q8_wte;     /* tied LM head */
    uint8_t *q8_act;     /* quantized activation rows */
    size_t q8_act_cap;   /* bytes of q8_act */
    /* bf16 (cpu_bf16.c): precision=bf16 products (cpu_linear.c); NULL until
     * the first one. Freed by cpu_linear_bf16_free. */
    struct cpu_bf16_state *bf16;
    /* LoRA adapters (cpu_lora.c, ABI 1.4): the set (NULL until the first
     * adapter_create; freed by cpu_lora_free_all) and the adapter the
     * running training/eval call goes through (NULL: the base model; set:
     * the base is frozen, no base gradients are touched). */
    struct cpu_lora_set *lora;
    struct cpu_lora *lora_cur;
    /* coserve_forward in progress (cpu_coserve.c): the two passes' hand-over
     * state; NULL otherwise. */
    struct cpu_coserve *coserve;
    /* products the co-served passes shared so far (cpu_coserve_run; a
     * white-box counter the tests read) */
    uint64_t coserve_paired;
    /* token-level fine-tuning streams (cpu_ft_stream.c, ABI 1.5): NULL until
     * the first ft_stream_open; freed by cpu_ft_free_all. */
    struct cpu_ft_set *ft;
};

/* Record a failure on ctx and return status: cpu_fail(ctx, status, fmt, ...). */
#define cpu_fail(ctx, ...) ENGINE_FAIL(ctx, __VA_ARGS__)

/* The KV pool as the engines/common checks see it. */
static inline engine_kv_view cpu_kv_view(orch_engine_ctx *ctx) {
    engine_kv_view v = { ctx->kv_block_size, ctx->kv ? ctx->kv_num_blocks : 0,
                         ctx->kv_marks, &ctx->kv_epoch, ctx->kv_written };
    return v;
}

/* (cpu_lora.c) Whether adapter `id` exists on the context `c` (ABI 1.4;
 * engine_infer_check_lora's callback). */
int cpu_lora_known(const void *c, uint32_t id);

/* The parameters changed (tensor_write, optimizer step): every derived copy
 * of the weights (packed, bf16, int8) is stale. Derived copies compare
 * their own version against ctx->params_version. */
void cpu_params_changed(orch_engine_ctx *ctx);

/* (cpu_train.c) Softmax probabilities of query rows [i0, i0 + nq) of one
 * (batch, head) against keys [0, i0 + nq) into P [nq, i0 + nq]: scores
 * scale * q k^T (q and k rows ld floats apart), then per row exp(s - max) *
 * (1 / sum) over the causal prefix, zero after it. The forward pass computes
 * max and 1/sum into mx, isum (save set); the backward pass passes them back
 * and gets the same probabilities bit for bit. GPT-2 and LLaMA training. */
void cpu_attn_probs(const orch_engine_ctx *ctx, const float *q, const float *k, size_t ld,
                    int i0, int nq, float scale, float *mx, float *isum, int save,
                    float *P);

/* (cpu_infer.c) Fill the packed copies of the weights for the skinny
 * kernels, allocating them on first use: the head (V x C) into
 * ctx->packed_wte and, per layer l, the four matrices layer_src[l*4 + k] of
 * sizes[k] = {rows, cols} into ctx->packed_layer[l*4 + k] (gpt2: qkv, attn
 * proj, fc, mlp proj; llama: q|k|v, o, gate|up, down); sets packed_valid.
 * ORCH_ERR_OUT_OF_MEMORY with a message on failure. */
int32_t cpu_packed_build(orch_engine_ctx *ctx, const float *head,
                         const float *const *layer_src, const size_t sizes[4][2]);

/* Allocate gradients and moments if training has not touched them yet. */
int32_t cpu_ensure_train_state(orch_engine_ctx *ctx);

/* ---- cpu_linear.c: threaded matrix products ---- */

/* out[R,N] = in[R,K] * W[N,K]^T (+ bias[N]) (+ resid[R,N]), row strides as
 * given. With gelu_tanh/gelu_out non-NULL the result (pre-activation) goes to
 * out and GELU(tanh) of it to gelu_out, its tanh term to gelu_tanh (training);
 * with gelu_inplace set, out is replaced by GELU(out) (inference).
 * packed != NULL and R <= ctx->skinny_max selects the packed kernel. */
typedef struct cpu_linear_fwd {
    int R, N, K;
    const float *in;
    int ldin;
    const float *W; /* [N,K] row-major */
    const float *packed;
    const float *bias;
    const float *resid;
    int ldresid;
    float *out;
    int ldout;
    float *gelu_tanh, *gelu_out; /* [R,N], stride N */
    int gelu_inplace;
} cpu_linear_fwd;
void cpu_linear_forward(orch_engine_ctx *ctx, const cpu_linear_fwd *op);
/* cpu_linear_forward without the coserve_forward pairing. */
void cpu_linear_forward_solo(orch_engine_ctx *ctx, const cpu_linear_fwd *op);
/* Two products of one weight (same W, N, K, bias; each its own rows, input,
 * residual, output, GELU) in one pass over W (coserve_forward; precision=
 * bf16 runs them one after the other). A part of at most skinny_max rows
 * takes the packed kernel when either op carries the packed copy of W. */
int cpu_linear_forward_pair_ok(const cpu_linear_fwd *a, const cpu_linear_fwd *b);
void cpu_linear_forward_pair(orch_engine_ctx *ctx, const cpu_linear_fwd *a,
                             const cpu_linear_fwd *b);
/* (cpu_coserve.c) Inside coserve_forward: pair op with the other pass's
 * product of the same weight, or hand it over; 1 when op was computed. */
int cpu_coserve_linear(orch_engine_ctx *ctx, const cpu_linear_fwd *op);

/* Backward of out = in*W^T + bias over R rows:
 *   din[R,K] = (din_accumulate ? din : 0) + dout * W    (if din != NULL)
 *   dW[N,K] += dout^T * in (if dW);  dbias[N] += column sums of dout (if dW
 *   and dbias; a frozen base passes neither)
 * With gelu_x/gelu_tanh set, din (the sum, with din_accumulate) is then
 * multiplied elementwise by GELU'(x). */
typedef struct cpu_linear_bwd {
    int R, N, K;
    const float *dout;
    int lddout;
    const float *in;
    int ldin;
    const float *W;
    float *din;
    int lddin;
    int din_accumulate;
    const float *gelu_x, *gelu_tanh; /* [R,K] */
    float *dW, *dbias;
} cpu_linear_bwd;
void cpu_linear_backward(orch_engine_ctx *ctx, const cpu_linear_bwd *op);

/* C = alpha*op(A)*op(B) + beta*C with OpenBLAS on the calling thread only
 * (row-major; cpu_blas.c loads OpenBLAS). */
/* Free the precision=bf16 state (weights copy, plans); NULL state is a no-op. */
typedef struct cpu_bf16_state cpu_bf16_state;
void cpu_linear_bf16_free(orch_engine_ctx *ctx);

void cpu_sgemm1(int trans_a, int trans_b, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C,
                int ldc);

/* ---- gradient-ready reporting (ABI 1.3 forward_backward_notify) ----
 * The training backward passes take a cpu_grad_notify (NULL for plain
 * forward_backward and eval_loss) and call cpu_grad_notify_range as a flat
 * range of the gradient buffer becomes final: GPT-2 ln_f, each layer from
 * the last to the first, then wte+wpe (the tied head's gradient is only
 * final after the embedding backward); LLaMA model.norm (+ an untied
 * lm_head), the layers, then embed_tokens. The pool is parked first, so its
 * workers sleep while the caller's callback runs on the caller's thread. */
typedef struct cpu_grad_notify {
    orch_grad_ready_fn ready;
    void *user;
} cpu_grad_notify;

static inline void cpu_grad_notify_range(orch_engine_ctx *ctx, const cpu_grad_notify *n,
                                         uint64_t offset, uint64_t count) {
    if (!n || !n->ready || count == 0) return;
    cpu_pool_park(ctx->pool);
    n->ready(n->user, offset, count);
}

/* ---- cpu_train.c ---- */
int32_t cpu_train_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                   const int32_t *targets, uint32_t B, uint32_t T,
                                   float grad_scale, int backward, float *out_loss,
                                   const cpu_grad_notify *notify);
/* AdamW over flat elements [off, off+count) (inside the shard) with the
 * clipping scale of the caller's global gradient norm (ABI 1.2). */
int32_t cpu_train_optimizer_step_range(orch_engine_ctx *ctx, const orch_adamw_params *p,
                                       uint64_t off, uint64_t count, double norm);
int32_t cpu_train_optimizer_step(orch_engine_ctx *ctx, const orch_adamw_params *p,
                                 float *out_norm);
void cpu_train_free(orch_engine_ctx *ctx);
/* Bytes of the activation allocation forward_backward / eval_loss use for a
 * batch of B sequences of T tokens (saved activations and scratch; not the
 * parameters, gradients or moments). Pure: allocates and changes nothing. */
size_t cpu_train_act_bytes(const orch_engine_ctx *ctx, uint32_t B, uint32_t T);
/* Softmax cross-entropy of `rows` logits rows of ctx->V (on the pool):
 * row_loss[r] = logsumexp - logit of targets[r] (0 for a target of -1); with
 * backward each row becomes dscale * (softmax - onehot) in place (zero for
 * ignored rows). */
void cpu_train_ce_rows(orch_engine_ctx *ctx, float *logits, const int32_t *targets,
                       float *row_loss, size_t rows, float dscale, int backward);
void cpu_layernorm_rows(int isa, const float *x, float *out, float *mean, float *rstd,
                        const float *w, const float *b, size_t r0, size_t r1, uint32_t C,
                        float eps);

/* ---- cpu_infer.c ---- */
int32_t cpu_infer_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                          float *logits, uint64_t logits_cap);
void cpu_infer_free(orch_engine_ctx *ctx);

#endif
