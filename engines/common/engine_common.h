/*
 * engine_common.h - engine-side code that the mock, cpu and cuda engines share
 * (compiled into each engine .so, hidden like the rest of the engine): the
 * status strings of the ABI, a printf-style caller-buffer error helper, the
 * GPT-2 tensor table, the "key=value" options tokenizer, and the argument
 * checks of infer_forward and kv_copy_blocks with their error messages.
 *
 * Error rule: a check fills the caller buffer err (NUL-terminated, truncated
 * to err_cap; err may be NULL) and returns an orch_status only on failure;
 * on success it writes nothing to err. Each engine passes its context's
 * last_error buffer (or the caller's buffer of context_create).
 * Nothing here allocates, keeps pointers, or touches globals: every function
 * is thread-safe on distinct arguments.
 * Never included by the orchestrator; includes no orchestrator header.
 */
#ifndef ORCH_ENGINE_COMMON_H
#define ORCH_ENGINE_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Static English text of an orch_status ("unknown status" for others). */
const char *engine_status_string(int32_t status);

/* Format into err (if err && cap) and return status. */
int32_t engine_fail_buf(char *err, size_t cap, int32_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- GPT-2 tensor table ---- */

/* One tensor of an engine's table (same for PARAM, ADAM_M, ADAM_V). */
typedef struct engine_tensor {
    char name[ORCH_TENSOR_NAME_MAX];
    uint32_t ndim;
    uint32_t flags;     /* ORCH_TENSOR_FLAG_NO_DECAY for 1-D tensors */
    uint64_t shape[2];  /* shape[1] is 0 for 1-D tensors */
    uint64_t numel;
    uint64_t offset;    /* element offset in the flat buffers */
} engine_tensor;

/* Tensors per layer, in table order after wte, wpe: ln_1.weight, ln_1.bias,
 * attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias,
 * ln_2.weight, ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight,
 * mlp.c_proj.bias. */
#define ENGINE_GPT2_PER_LAYER 12u

/* Number of tensors of the GPT-2 table: 2 + 12*layers + 2. */
uint32_t engine_gpt2_tensor_count(uint32_t layers);

/* Fill out[0 .. engine_gpt2_tensor_count(layers)) with the GPT-2 table of the
 * header (names, shapes, NO_DECAY flags, offsets); returns the total element
 * count. Sizes must have been checked for overflow by the caller. */
uint64_t engine_gpt2_table_fill(engine_tensor *out, uint32_t layers, uint64_t vocab,
                                uint64_t context, uint64_t width, uint64_t mlp_width);

/* Describe t into *out, at most out->struct_size bytes (caller checked that
 * out is non-NULL with struct_size >= 4); dtype f32. */
void engine_tensor_info_fill(const engine_tensor *t, orch_tensor_info *out);

/* fn: kind is an orch_tensor_kind and index < n_tensors. */
int32_t engine_check_kind_index(const char *fn, uint32_t kind, uint32_t index,
                                uint32_t n_tensors, char *err, size_t cap);

/* fn: buf non-NULL and bytes == t's f32 size. */
int32_t engine_check_tensor_bytes(const char *fn, const engine_tensor *t,
                                  const void *buf, uint64_t bytes, char *err,
                                  size_t cap);

/* ---- context_create, training calls ---- */

/* context_create's first checks: clears err, model and out_ctx non-NULL,
 * opts (may be NULL) copied into *o as far as its struct_size goes. */
int32_t engine_create_args(const orch_model_desc *model, const orch_engine_options *opts,
                           const void *out_ctx, orch_engine_options *o, char *err,
                           size_t cap);

/* fn (forward_backward / eval_loss): tokens and targets non-NULL, batch and
 * seq_len > 0, seq_len <= context. */
int32_t engine_check_batch_shape(const char *fn, const int32_t *tokens,
                                 const int32_t *targets, uint32_t batch,
                                 uint32_t seq_len, uint32_t context, char *err,
                                 size_t cap);

/* fn: every token in 0..vocab-1, every target in -1..vocab-1. */
int32_t engine_check_batch_ids(const char *fn, const int32_t *tokens,
                               const int32_t *targets, uint32_t batch,
                               uint32_t seq_len, uint32_t vocab, char *err, size_t cap);

/* optimizer_step: params non-NULL, struct_size, step >= 1, sane
 * hyper-parameters; on success *out receives a copy. */
int32_t engine_check_adamw(const orch_adamw_params *params, orch_adamw_params *out,
                           char *err, size_t cap);

/* ---- options strings ---- */

/* One item of an options string: text between ',' / ';' separators, trimmed
 * of spaces. key is the part before the first '=' (or the whole item when
 * there is none, has_eq 0), value the part after it (empty without '='), both
 * trimmed. */
typedef struct engine_opt_item {
    const char *item;  size_t item_len;
    const char *key;   size_t key_len;
    const char *value; size_t value_len;
    int has_eq;
} engine_opt_item;

/* Advance *cursor to the next non-empty item; 1 and *it filled, or 0 at the
 * end of the string. */
int engine_opts_next(const char **cursor, engine_opt_item *it);

/* Parse len decimal digits (1..19 of them) into *out: 0, or -1 if not a number. */
int engine_parse_u64(const char *s, size_t len, uint64_t *out);

/* ---- KV-block checks ---- */

/* Per-pool-block mark used by one validation round. */
typedef struct engine_kv_mark {
    uint32_t epoch;   /* valid when equal to the round's epoch */
    uint32_t seq;     /* sequence that writes the block (or a copy role) */
    uint32_t lblock;  /* logical index in that sequence's table */
} engine_kv_mark;

/* Start a new round over marks[0..num_blocks): returns the round's epoch
 * (*epoch incremented; on wrap-around every mark is cleared). */
uint32_t engine_kv_marks_new_epoch(engine_kv_mark *marks, uint32_t num_blocks,
                                   uint32_t *epoch);

/* Sequence i of a batch (batch->seq_stride apart). */
const orch_seq_input *engine_batch_seq(const orch_infer_batch *batch, uint32_t i);

/* infer_forward: batch non-NULL, struct_size, non-empty. */
int32_t engine_infer_check_header(const orch_infer_batch *batch, char *err, size_t cap);

/* infer_forward, each sequence on its own: pointers, logits_mode, adapter_id,
 * positions within context, token ids within vocab, enough blocks, block ids
 * inside the pool of num_blocks. On success *out_tokens / *out_rows receive
 * the number of new tokens and of logit rows asked for. */
int32_t engine_infer_check_seqs(const orch_infer_batch *batch, uint32_t vocab,
                                uint32_t context, uint32_t block_size,
                                uint32_t num_blocks, uint64_t *out_tokens,
                                uint64_t *out_rows, char *err, size_t cap);

/* infer_forward: rows of vocab floats fit logits_cap, logits non-NULL. */
int32_t engine_infer_check_logits(uint64_t rows, uint32_t vocab, const float *logits,
                                  uint64_t logits_cap, char *err, size_t cap);

/* infer_forward, across sequences (after engine_infer_check_seqs): no block
 * written by one sequence and used by another or twice by one, and every
 * position before start_pos already written (written[block*block_size+slot]).
 * Uses a new round of marks. */
int32_t engine_infer_check_blocks(const orch_infer_batch *batch, uint32_t block_size,
                                  engine_kv_mark *marks, uint32_t num_blocks,
                                  uint32_t *epoch, const uint8_t *written,
                                  char *err, size_t cap);

/* kv_copy_blocks with n > 0: src/dst non-NULL, ids inside the pool, sources
 * and destinations disjoint, no destination twice. Uses a new round of marks. */
int32_t engine_kv_copy_check(const int32_t *src, const int32_t *dst, uint32_t n,
                             engine_kv_mark *marks, uint32_t num_blocks,
                             uint32_t *epoch, char *err, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* ORCH_ENGINE_COMMON_H */
