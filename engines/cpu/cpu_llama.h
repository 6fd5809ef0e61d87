/*
 * cpu_llama.h - ORCH_ARCH_LLAMA on the CPU engine: the per-context state
 * (RoPE tables, training activations, inference scratch), training
 * forward/backward, and the row kernels training and inference
 * (cpu_llama_infer.h) share (RMSNorm, rotate-half RoPE).
 *
 * The model is the header's LLaMA block (engine_api/orch_engine.h): RMSNorm,
 * RoPE on q and k with engine_rope_inv_freq's frequencies, grouped-query
 * causal attention (query head j reads key/value head j / (NH/KVH)), o_proj
 * with the residual, RMSNorm, SwiGLU MLP, the residual; then model.norm and
 * the head (lm_head.weight with ORCH_MODEL_FLAG_UNTIED_HEAD, else the tied
 * embedding). No biases.
 *
 * Weight layout used by the products: q_proj, k_proj and v_proj are
 * consecutive in the tensor table, so they form ONE [(NH + 2 KVH) D, C]
 * matrix in the flat parameter buffer (one product gives q|k|v per row);
 * gate_proj and up_proj likewise form one [2M, C] matrix (gate|up per row).
 * The gradients of the flat gradient buffer follow the same layout.
 *
 * Threads: as the rest of the engine (one caller thread; work on the pool
 * with fixed chunk boundaries, so a given thread count gives the same bits).
 * Memory: the state is owned by the context (cpu_llama_free).
 * Errors: status + message in ctx->last_error.
 */
#ifndef ORCH_CPU_LLAMA_H
#define ORCH_CPU_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "engines/cpu/cpu_internal.h"

/* Per-layer tensor order of the llama table (after the embedding). */
enum {
    LL_IN_NORM,
    LL_Q,
    LL_K,
    LL_V,
    LL_O,
    LL_POST_NORM,
    LL_GATE,
    LL_UP,
    LL_DOWN,
    LL_COUNT
};

typedef struct cpu_llama_state {
    float *rope_cos, *rope_sin; /* [T, HS/2]: cos/sin(pos * inv_freq[d]) */
    /* training activations (cpu_llama.c), carved for (B, T) */
    float *acts;
    size_t acts_floats;
    uint32_t acts_B, acts_T;
    /* inference scratch (cpu_llama_infer.c) */
    float *inf;
    size_t inf_floats;
} cpu_llama_state;

/* Build ctx->llama for the normalised llama description m (RoPE tables).
 * ORCH_ERR_OUT_OF_MEMORY with a message in err on failure. */
int32_t cpu_llama_setup(orch_engine_ctx *ctx, const orch_model_desc *m, char *err,
                        size_t cap);

/* Release ctx->llama (NULL is a no-op). */
void cpu_llama_free(orch_engine_ctx *ctx);

/* Tensor k (LL_*) of layer l inside the flat buffer base (params or grads). */
float *cpu_llama_tensor(const orch_engine_ctx *ctx, float *base, uint32_t l, int k);
/* The embedding, model.norm.weight and the head (embedding when tied). */
float *cpu_llama_embed(const orch_engine_ctx *ctx, float *base);
float *cpu_llama_norm(const orch_engine_ctx *ctx, float *base);
float *cpu_llama_head(const orch_engine_ctx *ctx, float *base);

/* RMSNorm of one row of n values: out = x * rstd * w, rstd =
 * 1/sqrt(mean(x^2) + eps) (sum of squares in double); *rstd_out if not NULL. */
void cpu_llama_rmsnorm(const float *x, float *out, const float *w, size_t n, float eps,
                       float *rstd_out);

/* RMSNorm backward of one row (rstd r from the forward): dx += r (g - xhat
 * mean(g xhat)), g = dy w, xhat = x r (the dot product in double). */
void cpu_llama_rmsnorm_backward(const float *dy, const float *x, const float *w, float r,
                                float *dx, size_t n);

/* SwiGLU of one row gate|up (gu [2M]): h = silu(gate) * up; and its backward
 * (dh [M] to dgate|dup [2M]). */
void cpu_llama_swiglu(const float *gu, float *h, size_t M);
void cpu_llama_swiglu_backward(const float *gu, const float *dh, float *dgu, size_t M);

/* Rotate-half RoPE of nh heads of hs floats (x[h*hs + d]) at position pos,
 * in place; inverse set: the transposed rotation (the backward pass). */
void cpu_llama_rope(const cpu_llama_state *st, float *x, size_t nh, size_t hs,
                    uint32_t pos, int inverse);

/* Training: the contract of cpu_train_forward_backward, for llama. */
int32_t cpu_llama_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                   const int32_t *targets, uint32_t B, uint32_t T,
                                   float grad_scale, int backward, float *out_loss,
                                   const cpu_grad_notify *notify);

#endif
