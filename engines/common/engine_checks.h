/*
 * engine_checks.h - the argument checks of every ABI call that the mock, cpu
 * and cuda engines share, with their error messages, so that every engine
 * words the same misuse the same way: tensor tables, gradient ranges,
 * context_create's arguments, training batches, AdamW parameters, the KV
 * pool, infer_forward batches and kv_copy_blocks; plus the KV bookkeeping
 * that goes with them (validation marks, written flags).
 *
 * Error rule: a check fills the caller buffer err (NUL-terminated, truncated
 * to err_cap; err may be NULL) and returns an orch_status only on failure;
 * on success it writes nothing to err. Each engine passes its context's
 * last_error buffer or the caller's buffer of context_create.
 * Memory: nothing here allocates or keeps pointers past a call.
 * Threads: no globals; every function is thread-safe on distinct arguments
 * (the KV checks write the marks and epoch of the view they are given).
 * Includable from C11 and C++ (nvcc); never included by the orchestrator.
 */
#ifndef ORCH_ENGINE_CHECKS_H
#define ORCH_ENGINE_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "engines/common/engine_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensor-table and gradient calls ---- */

/* tensor_count: out_count non-NULL, kind known. */
int32_t engine_check_tensor_count(uint32_t kind, const uint32_t *out_count, char *err,
                                  size_t cap);

/* tensor_info: out non-NULL with struct_size >= 4, kind known,
 * index < n_tensors. */
int32_t engine_check_tensor_info(uint32_t kind, uint32_t index, uint32_t n_tensors,
                                 const orch_tensor_info *out, char *err, size_t cap);

/* fn (tensor_read / tensor_write): kind known, index < n_tensors, buf
 * non-NULL and bytes == the f32 size of tensors[index]. */
int32_t engine_check_tensor_io(const char *fn, uint32_t kind, uint32_t index,
                               const engine_tensor *tensors, uint32_t n_tensors,
                               const void *buf, uint64_t bytes, char *err, size_t cap);

/* fn (grads_read / grads_write): [offset, offset+count) inside the n_params
 * gradient elements, buf non-NULL when count > 0. */
int32_t engine_check_grad_range(const char *fn, uint64_t offset, uint64_t count,
                                uint64_t n_params, const void *buf, char *err,
                                size_t cap);

/* ---- ABI 1.2: flat ranges and the optimizer shard ---- */

/* Like engine_check_grad_range for the flat parameter buffer (fn names the
 * call in the message). */
int32_t engine_check_flat_range(const char *fn, uint64_t offset, uint64_t count,
                                uint64_t n_params, const void *buf, char *err,
                                size_t cap);

/* optimizer_shard's arguments: count >= 1 and the range inside n_params. */
int32_t engine_check_shard(uint64_t offset, uint64_t count, uint64_t n_params, char *err,
                           size_t cap);

/* moments_read / moments_write: kind ADAM_M or ADAM_V, the range inside
 * n_params (INVALID_ARGUMENT), buf non-NULL when count > 0, and the range
 * inside the shard [sh_off, sh_off+sh_count) (ORCH_ERR_STATE). */
int32_t engine_check_moment_range(const char *fn, uint32_t kind, uint64_t offset,
                                  uint64_t count, uint64_t n_params, uint64_t sh_off,
                                  uint64_t sh_count, const void *buf, char *err,
                                  size_t cap);

/* optimizer_step_range: params as engine_check_adamw (validated copy into
 * *out), the range inside n_params and inside the shard, and a finite,
 * non-negative global_norm (ORCH_ERR_NUMERIC). */
int32_t engine_check_step_range(const orch_adamw_params *params, uint64_t offset,
                                uint64_t count, uint64_t n_params, uint64_t sh_off,
                                uint64_t sh_count, float global_norm,
                                orch_adamw_params *out, char *err, size_t cap);

/* ---- context_create, training calls ---- */

/* context_create's first checks: clears err, model and out_ctx non-NULL,
 * opts (may be NULL) copied into *o as far as its struct_size goes. */
int32_t engine_create_args(const orch_model_desc *model, const orch_engine_options *opts,
                           const void *out_ctx, orch_engine_options *o, char *err,
                           size_t cap);

/* The model-side bounds of a training batch (an engine keeps one per
 * context). */
typedef struct engine_batch_limits {
    const char *engine; /* named in the capacity message */
    uint32_t vocab, context;
    uint64_t max_tokens; /* batch*seq_len per call (ORCH_ERR_CAPACITY); 0 = any */
} engine_batch_limits;

/* fn (forward_backward / eval_loss), in order: out_loss non-NULL, grad_scale
 * finite (eval_loss passes 0), tokens and targets non-NULL, batch and
 * seq_len > 0, seq_len <= context, batch*seq_len within max_tokens
 * (ORCH_ERR_CAPACITY), every token in 0..vocab-1, every target in
 * -1..vocab-1. On success *out_counted (may be NULL) receives the number of
 * targets that are not -1. */
int32_t engine_check_train_call(const char *fn, const int32_t *tokens,
                                const int32_t *targets, uint32_t batch, uint32_t seq_len,
                                float grad_scale, const float *out_loss,
                                const engine_batch_limits *lim, uint64_t *out_counted,
                                char *err, size_t cap);

/* optimizer_step: params non-NULL, struct_size, step >= 1, sane
 * hyper-parameters; on success *out receives a copy. */
int32_t engine_check_adamw(const orch_adamw_params *params, orch_adamw_params *out,
                           char *err, size_t cap);

/* ---- KV pool ---- */

/* Per-pool-block mark used by one validation round. */
typedef struct engine_kv_mark {
    uint32_t epoch;  /* valid when equal to the round's epoch */
    uint32_t seq;    /* sequence that writes the block (or a copy role) */
    uint32_t lblock; /* logical index in that sequence's table */
} engine_kv_mark;

/* An engine's KV pool as the checks see it (filled from the context for each
 * call). num_blocks 0 means no pool is configured. */
typedef struct engine_kv_view {
    uint32_t block_size, num_blocks;
    engine_kv_mark *marks; /* [num_blocks] validation marks */
    uint32_t *epoch;       /* the marks' round counter */
    uint8_t *written;      /* [num_blocks * block_size]: slot holds K/V */
} engine_kv_view;

/* kv_block_bytes: out non-NULL, block_size > 0. */
int32_t engine_check_kv_block_bytes(uint32_t block_size, const uint64_t *out, char *err,
                                    size_t cap);

/* kv_configure: block_size and num_blocks > 0, num_blocks fits int32 block
 * ids, block_size <= max_block_size (0 = any). */
int32_t engine_check_kv_configure(uint32_t block_size, uint32_t num_blocks,
                                  uint32_t max_block_size, char *err, size_t cap);

/* Sequence i of a batch (batch->seq_stride apart). */
const orch_seq_input *engine_batch_seq(const orch_infer_batch *batch, uint32_t i);

/* infer_forward's validation of the whole batch, in order: batch non-NULL,
 * struct_size, non-empty, seq_stride (at least ABI 1.0's orch_seq_input, a
 * multiple of its alignment), a pool (ORCH_ERR_STATE), then each sequence on
 * its own (pointers, logits_mode, adapter_id, positions within context, token
 * ids within vocab, enough blocks, block ids inside the pool), at most
 * max_tokens new tokens (ORCH_ERR_CAPACITY, 0 = any; limit_note says where
 * the limit comes from), the logit rows within logits_cap (ORCH_ERR_CAPACITY)
 * and logits non-NULL when rows are asked for, and across sequences: no block
 * written by one sequence and used by another or twice by one, every position
 * before start_pos already written (ORCH_ERR_STATE). Uses a new round of the
 * view's marks. On success *out_tokens / *out_rows receive the number of new
 * tokens and of logit rows. */
int32_t engine_infer_check(const orch_infer_batch *batch, const float *logits,
                           uint64_t logits_cap, uint32_t vocab, uint32_t context,
                           uint64_t max_tokens, const char *limit_note,
                           const engine_kv_view *kv, uint64_t *out_tokens,
                           uint64_t *out_rows, char *err, size_t cap);

/* engine_infer_check for an engine with ORCH_CAP_LORA (ABI 1.4): a
 * sequence's adapter_id other than 0 must be one known(user, id) accepts
 * (engine_infer_check refuses every id but 0). */
int32_t engine_infer_check_lora(const orch_infer_batch *batch, const float *logits,
                                uint64_t logits_cap, uint32_t vocab, uint32_t context,
                                uint64_t max_tokens, const char *limit_note,
                                const engine_kv_view *kv,
                                int (*known)(const void *user, uint32_t id),
                                const void *user, uint64_t *out_tokens,
                                uint64_t *out_rows, char *err, size_t cap);

/* For a batch engine_infer_check accepted (before or after its forward, as
 * the engine chooses): flag every position the batch writes. */
void engine_kv_mark_written(const orch_infer_batch *batch, const engine_kv_view *kv);

/* kv_copy_blocks: a pool (ORCH_ERR_STATE), then for n > 0: src/dst non-NULL,
 * ids inside the pool, sources and destinations disjoint, no destination
 * twice. Uses a new round of the view's marks. */
int32_t engine_kv_copy_check(const int32_t *src, const int32_t *dst, uint32_t n,
                             const engine_kv_view *kv, char *err, size_t cap);

/* kv_copy_blocks: copy the written flags of block src[i] to dst[i]. */
void engine_kv_copy_written(const int32_t *src, const int32_t *dst, uint32_t n,
                            const engine_kv_view *kv);

#ifdef __cplusplus
}
#endif
#endif /* ORCH_ENGINE_CHECKS_H */
