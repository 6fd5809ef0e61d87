/*
 * cpu_lora.h - LoRA adapters of the CPU engine (ABI 1.4, ORCH_CAP_LORA):
 * per-context adapter storage (the desc, A/B, their gradients and AdamW
 * moments, the adapter's tensor table with the header's names and order),
 * initialisation from the seed, and the two hooks the training
 * forward/backward of GPT-2 (cpu_train.c) and LLaMA (cpu_llama.c) call
 * around each target product:
 *   forward:  out[:, col0 .. col0+o) += (alpha/rank) * (x A^T) B^T
 *   backward: dB += s dout^T (x A^T), dA += (s dout B)^T x, and the LoRA
 *             part of dx, (s dout B) A, written to din (the caller then
 *             adds the base product with din_accumulate set).
 * One "module" is one adapted matrix: GPT-2 has one per target (c_attn is
 * one [3C, C] matrix); LLaMA's ATTN_QKV target is three modules (q, k, v:
 * column ranges of the fused q|k|v product) and MLP_UP two (gate, up).
 *
 * Which adapter a training call runs under is ctx->lora_cur (NULL: none, the
 * base model as before). While it is set the base is frozen: the training
 * code passes no base gradient pointers (cpu_lora_frozen_grads) and allocates
 * no base gradients or moments.
 *
 * Memory: every adapter is one allocation (params, grads, m, v of its flat
 * table, 4 x its parameter count floats) owned by the context's set;
 * cpu_lora_free_all releases everything. The hooks use per-set scratch that
 * cpu_lora_prepare sizes before a call, so they never allocate or fail.
 * Threads: the hooks run their products on the context's pool (rows for the
 * row-wise products, output rows/columns for dA and dB) with boundaries that
 * depend only on the shapes and the thread count: a given thread count gives
 * the same bits. The products are fp32 OpenBLAS (cpu_sgemm1) under every
 * precision= setting.
 * Errors: status + message in ctx->last_error (the message names the field
 * and the value).
 */
#ifndef ORCH_CPU_LORA_H
#define ORCH_CPU_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engines/common/engine_lora.h"
#include "engines/cpu/cpu_internal.h"

/* One adapted matrix W [out, in] of one layer. */
/* One adapted matrix (engines/common/engine_lora.h). */
typedef engine_lora_mod cpu_lora_mod;

typedef struct cpu_lora {
    uint32_t id, rank, targets;
    float alpha, scale; /* scale = alpha / rank */
    uint64_t seed;
    engine_tensor *tensors; /* [n_tensors]: A, B per module, table order */
    uint32_t n_tensors;
    uint64_t n_params;
    float *params, *grads, *adam_m, *adam_v; /* each [n_params], one allocation */
    cpu_lora_mod *mods;                      /* [n_mods], table order */
    uint32_t n_mods;
    /* mods of (layer l, target bit t): mods[first[l*4+t] .. first[l*4+t+1]) */
    uint32_t *first; /* [L*4 + 1] */
} cpu_lora;

typedef struct cpu_lora_set {
    cpu_lora **items; /* live adapters, creation order */
    uint32_t n, cap;
    uint32_t next_id; /* ids are never reused */
    float *scratch;   /* hook scratch: u and du of up to 3 modules */
    size_t scratch_floats;
    cpu_view gv_none; /* GPT-2 gradient view with every pointer NULL */
} cpu_lora_set;

/* adapter_create: validate desc (rank, alpha, targets, reserved words) and
 * build the adapter; *out_id receives its id. */
int32_t cpu_lora_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                        uint32_t *out_id);
/* adapter_destroy. */
int32_t cpu_lora_destroy(orch_engine_ctx *ctx, uint32_t id);
/* The adapter `id`, or NULL with ORCH_ERR_INVALID_ARGUMENT recorded ("fn:
 * adapter_id N is not an adapter of this context"). */
cpu_lora *cpu_lora_find(orch_engine_ctx *ctx, const char *fn, uint32_t id);
/* Release every adapter and the set (context_destroy). */
void cpu_lora_free_all(orch_engine_ctx *ctx);

/* Size the hook scratch for products of `rows` rows under lo (before a
 * call, so the hooks cannot fail; lo NULL: nothing to do).
 * ORCH_ERR_OUT_OF_MEMORY with a message. */
int32_t cpu_lora_prepare(orch_engine_ctx *ctx, const cpu_lora *lo, size_t rows);

/* The GPT-2 gradient view of a frozen-base call: every pointer NULL. */
const cpu_view *cpu_lora_frozen_grads(const orch_engine_ctx *ctx);

/* Forward hook: for every module of (layer, target) of lo, add
 * scale * (x A^T) B^T to columns [col0, col0+out) of out (rows R, strides
 * ldx, ldout). lo NULL: nothing. Returns 1 when something was added. */
int cpu_lora_forward(orch_engine_ctx *ctx, const cpu_lora *lo, uint32_t layer,
                     uint32_t target, size_t R, const float *x, size_t ldx, float *out,
                     size_t ldout);

/* Backward hook: for every module of (layer, target) of lo, add dA and dB to
 * lo->grads from the target's input x and the gradient dout of its output
 * (the same column ranges as the forward), and, when din is not NULL, write
 * the LoRA part of d(x) to din (overwriting it). Returns 1 when din was
 * written (the caller then accumulates the base product onto it), 0 when lo
 * is NULL or does not adapt (layer, target). */
int cpu_lora_backward(orch_engine_ctx *ctx, cpu_lora *lo, uint32_t layer, uint32_t target,
                      size_t R, const float *x, size_t ldx, const float *dout,
                      size_t lddout, float *din, size_t lddin);

/* cpu_lora_backward adding dA and dB into `grads` (a buffer laid out as
 * lo->grads, [lo->n_params]) instead of lo->grads (ABI 1.5 streams keep
 * their own gradients until their last row). */
int cpu_lora_backward_to(orch_engine_ctx *ctx, const cpu_lora *lo, float *grads,
                         uint32_t layer, uint32_t target, size_t R, const float *x,
                         size_t ldx, const float *dout, size_t lddout, float *din,
                         size_t lddin);

/* ---- inference (infer_forward with orch_seq_input.adapter_id) ---- */

/* The adapters of one infer_forward batch: sequence i (rows row0[i] ..
 * row0[i+1] of the batch's [N, C] activations) runs through lo[i] (NULL:
 * the base). targets is the union of the adapters' targets (0: no sequence
 * has an adapter, nothing was allocated and the hooks do nothing). */
typedef struct cpu_lora_batch {
    cpu_lora **lo;
    uint32_t *row0; /* [n_seqs + 1] */
    uint32_t n_seqs;
    uint32_t targets;
    uint32_t rank_max; /* the batch's largest rank: row stride of the scratch */
} cpu_lora_batch;

/* Resolve the adapters of a validated batch and size the scratch for its
 * rows. ORCH_ERR_OUT_OF_MEMORY with a message (then *lb needs no end). */
int32_t cpu_lora_batch_begin(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                             cpu_lora_batch *lb);
void cpu_lora_batch_end(cpu_lora_batch *lb);

/* Forward hook of inference: out[rows of sequence i] += the LoRA term of
 * lo[i] on (layer, target), as cpu_lora_forward per sequence, all
 * sequences in one pool job. Returns 1 when some sequence was adapted. */
int cpu_lora_batch_forward(orch_engine_ctx *ctx, const cpu_lora_batch *lb, uint32_t layer,
                           uint32_t target, const float *x, size_t ldx, float *out,
                           size_t ldout);

/* GELU (tanh form) in place over rows x [rows, cols] on the pool (the
 * inference MLP when its c_fc is adapted: GELU after the LoRA term). */
void cpu_lora_gelu_rows(orch_engine_ctx *ctx, float *x, size_t rows, size_t cols);

/* AdamW step of the adapter (validated p) with clipping of its gradient
 * norm (written to *out_norm); a non-finite norm is ORCH_ERR_NUMERIC and
 * changes nothing. */
int32_t cpu_lora_optimizer_step(orch_engine_ctx *ctx, cpu_lora *lo,
                                const orch_adamw_params *p, float *out_norm);

#endif
