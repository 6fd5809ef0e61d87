/*
 * engine_checks.c - the argument checks of the ABI calls that the mock, cpu
 * and cuda engines share (see engine_checks.h for the rules). Messages here
 * are part of the engines' behaviour: tests assert them, so change them only
 * with the tests.
 */
#include "engines/common/engine_checks.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------- */
/* Tensor-table and gradient calls                                            */
/* ------------------------------------------------------------------------- */

static int32_t check_kind_index(const char *fn, uint32_t kind, uint32_t index,
                                uint32_t n_tensors, char *err, size_t cap) {
    if (kind > ORCH_TENSOR_ADAM_V)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: tensor kind %u is unknown (0 param, 1 adam_m, 2 "
                               "adam_v)",
                               fn, kind);
    if (index >= n_tensors)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: tensor index %u out of range (table has %u)", fn,
                               index, n_tensors);
    return ORCH_OK;
}

int32_t engine_check_tensor_count(uint32_t kind, const uint32_t *out_count, char *err,
                                  size_t cap) {
    if (!out_count)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "tensor_count: out_count is NULL");
    if (kind > ORCH_TENSOR_ADAM_V)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "tensor_count: tensor kind %u is unknown", kind);
    return ORCH_OK;
}

int32_t engine_check_tensor_info(uint32_t kind, uint32_t index, uint32_t n_tensors,
                                 const orch_tensor_info *out, char *err, size_t cap) {
    if (!out)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "tensor_info: out is NULL");
    if (out->struct_size < sizeof(uint32_t))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "tensor_info: out->struct_size %u is too small",
                               out->struct_size);
    return check_kind_index("tensor_info", kind, index, n_tensors, err, cap);
}

int32_t engine_check_tensor_io(const char *fn, uint32_t kind, uint32_t index,
                               const engine_tensor *tensors, uint32_t n_tensors,
                               const void *buf, uint64_t bytes, char *err, size_t cap) {
    int32_t st = check_kind_index(fn, kind, index, n_tensors, err, cap);
    if (st != ORCH_OK) return st;
    const engine_tensor *t = &tensors[index];
    if (!buf)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT, "%s: buffer is NULL",
                               fn);
    if (bytes != t->numel * sizeof(float))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: tensor %s needs %llu bytes (%llu f32), got %llu", fn,
                               t->name, (unsigned long long)(t->numel * sizeof(float)),
                               (unsigned long long)t->numel, (unsigned long long)bytes);
    return ORCH_OK;
}

int32_t engine_check_grad_range(const char *fn, uint64_t offset, uint64_t count,
                                uint64_t n_params, const void *buf, char *err,
                                size_t cap) {
    if (offset > n_params || count > n_params - offset)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: range [%llu, %llu+%llu) exceeds the %llu gradient "
                               "elements",
                               fn, (unsigned long long)offset, (unsigned long long)offset,
                               (unsigned long long)count, (unsigned long long)n_params);
    if (count > 0 && !buf)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT, "%s: buffer is NULL",
                               fn);
    return ORCH_OK;
}

int32_t engine_check_flat_range(const char *fn, uint64_t offset, uint64_t count,
                                uint64_t n_params, const void *buf, char *err,
                                size_t cap) {
    if (offset > n_params || count > n_params - offset)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: range [%llu, %llu+%llu) exceeds the %llu parameter "
                               "elements",
                               fn, (unsigned long long)offset, (unsigned long long)offset,
                               (unsigned long long)count, (unsigned long long)n_params);
    if (count > 0 && !buf)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT, "%s: buffer is NULL",
                               fn);
    return ORCH_OK;
}

int32_t engine_check_shard(uint64_t offset, uint64_t count, uint64_t n_params, char *err,
                           size_t cap) {
    if (count == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "optimizer_shard: count is 0 (a shard holds at least one "
                               "element)");
    return engine_check_flat_range("optimizer_shard", offset, count, n_params, "", err,
                                   cap);
}

static int32_t outside_shard(const char *fn, uint64_t offset, uint64_t count,
                             uint64_t sh_off, uint64_t sh_count, char *err, size_t cap) {
    if (offset >= sh_off && offset - sh_off <= sh_count &&
        count <= sh_count - (offset - sh_off))
        return ORCH_OK;
    return engine_fail_buf(err, cap, ORCH_ERR_STATE,
                           "%s: range [%llu, %llu+%llu) is outside this context's "
                           "optimizer shard [%llu, %llu+%llu)",
                           fn, (unsigned long long)offset, (unsigned long long)offset,
                           (unsigned long long)count, (unsigned long long)sh_off,
                           (unsigned long long)sh_off, (unsigned long long)sh_count);
}

int32_t engine_check_moment_range(const char *fn, uint32_t kind, uint64_t offset,
                                  uint64_t count, uint64_t n_params, uint64_t sh_off,
                                  uint64_t sh_count, const void *buf, char *err,
                                  size_t cap) {
    if (kind != ORCH_TENSOR_ADAM_M && kind != ORCH_TENSOR_ADAM_V)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: kind %u is not a moment table (ADAM_M=1, ADAM_V=2)",
                               fn, kind);
    int32_t st = engine_check_flat_range(fn, offset, count, n_params, buf, err, cap);
    if (st != ORCH_OK) return st;
    return outside_shard(fn, offset, count, sh_off, sh_count, err, cap);
}

int32_t engine_check_step_range(const orch_adamw_params *params, uint64_t offset,
                                uint64_t count, uint64_t n_params, uint64_t sh_off,
                                uint64_t sh_count, float global_norm,
                                orch_adamw_params *out, char *err, size_t cap) {
    orch_adamw_params p;
    int32_t st = engine_check_adamw(params, &p, err, cap);
    if (st != ORCH_OK) return st;
    st = engine_check_flat_range("optimizer_step_range", offset, count, n_params, "", err,
                                 cap);
    if (st != ORCH_OK) return st;
    st = outside_shard("optimizer_step_range", offset, count, sh_off, sh_count, err, cap);
    if (st != ORCH_OK) return st;
    if (!isfinite(global_norm) || global_norm < 0)
        return engine_fail_buf(err, cap, ORCH_ERR_NUMERIC,
                               "optimizer_step_range: global gradient norm %g is not a "
                               "finite number >= 0",
                               (double)global_norm);
    *out = p;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* context_create, training calls                                             */
/* ------------------------------------------------------------------------- */

int32_t engine_create_args(const orch_model_desc *model, const orch_engine_options *opts,
                           const void *out_ctx, orch_engine_options *o, char *err,
                           size_t cap) {
    if (err && cap) err[0] = '\0';
    if (!model || !out_ctx)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "context_create: %s is NULL",
                               !model ? "model" : "out_ctx");
    memset(o, 0, sizeof *o);
    if (opts) {
        if (opts->struct_size < sizeof(uint32_t))
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "engine options struct_size %u is too small",
                                   opts->struct_size);
        memcpy(o, opts, opts->struct_size < sizeof *o ? opts->struct_size : sizeof *o);
    }
    return ORCH_OK;
}

static int32_t check_loss_args(const char *fn, const float *out_loss, float grad_scale,
                               char *err, size_t cap) {
    if (!out_loss)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: out_loss is NULL", fn);
    if (!isfinite(grad_scale))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: grad_scale is not finite", fn);
    return ORCH_OK;
}

int32_t engine_check_train_call(const char *fn, const int32_t *tokens,
                                const int32_t *targets, uint32_t batch, uint32_t seq_len,
                                float grad_scale, const float *out_loss,
                                const engine_batch_limits *lim, uint64_t *out_counted,
                                char *err, size_t cap) {
    int32_t st = check_loss_args(fn, out_loss, grad_scale, err, cap);
    if (st != ORCH_OK) return st;
    if (!tokens || !targets)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                               !tokens ? "tokens" : "targets");
    if (batch == 0 || seq_len == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: batch (%u) and seq_len (%u) must be > 0", fn, batch,
                               seq_len);
    if (seq_len > lim->context)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: seq_len %u exceeds the model context %u", fn, seq_len,
                               lim->context);
    const uint64_t n = (uint64_t)batch * seq_len;
    if (lim->max_tokens && n > lim->max_tokens)
        return engine_fail_buf(err, cap, ORCH_ERR_CAPACITY,
                               "%s: batch %u x seq_len %u tokens exceeds the %s "
                               "engine's limit of %llu per call",
                               fn, batch, seq_len, lim->engine,
                               (unsigned long long)lim->max_tokens);
    const int32_t V = (int32_t)lim->vocab;
    uint64_t counted = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "%s: token %d at [%llu,%llu] outside 0..%d", fn,
                                   tokens[i], (unsigned long long)(i / seq_len),
                                   (unsigned long long)(i % seq_len), V - 1);
        if (targets[i] < -1 || targets[i] >= V)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "%s: target %d at [%llu,%llu] outside -1..%d", fn,
                                   targets[i], (unsigned long long)(i / seq_len),
                                   (unsigned long long)(i % seq_len), V - 1);
        counted += targets[i] != -1;
    }
    if (out_counted) *out_counted = counted;
    return ORCH_OK;
}

int32_t engine_check_adamw(const orch_adamw_params *params, orch_adamw_params *out,
                           char *err, size_t cap) {
    if (!params)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "optimizer_step: params is NULL");
    if (params->struct_size < sizeof(orch_adamw_params))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "optimizer_step: params struct_size %u is smaller than "
                               "ABI 1.0's %zu",
                               params->struct_size, sizeof(orch_adamw_params));
    const orch_adamw_params p = *params;
    if (p.step == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "optimizer_step: step must be >= 1 (it is 1-based)");
    if (!(p.lr >= 0.0f) || isinf(p.lr) || !(p.beta1 >= 0.0f && p.beta1 < 1.0f) ||
        !(p.beta2 >= 0.0f && p.beta2 < 1.0f) || !(p.eps > 0.0f) || isinf(p.eps) ||
        !(p.weight_decay >= 0.0f) || isinf(p.weight_decay) || !isfinite(p.grad_clip))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "optimizer_step: bad hyper-parameters (need finite lr "
                               ">= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= "
                               "0, finite grad_clip): lr=%g beta1=%g beta2=%g eps=%g "
                               "wd=%g clip=%g",
                               (double)p.lr, (double)p.beta1, (double)p.beta2,
                               (double)p.eps, (double)p.weight_decay,
                               (double)p.grad_clip);
    *out = p;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* KV pool                                                                    */
/* ------------------------------------------------------------------------- */

/* Start a new round over marks[0..num_blocks): returns the round's epoch
 * (*epoch incremented; on wrap-around every mark is cleared). */
static uint32_t marks_new_epoch(engine_kv_mark *marks, uint32_t num_blocks,
                                uint32_t *epoch) {
    if (++*epoch == 0) {
        memset(marks, 0, (size_t)num_blocks * sizeof *marks);
        *epoch = 1;
    }
    return *epoch;
}

int32_t engine_check_kv_block_bytes(uint32_t block_size, const uint64_t *out, char *err,
                                    size_t cap) {
    if (!out)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "kv_block_bytes: out_bytes is NULL");
    if (block_size == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "kv_block_bytes: block_size is 0");
    return ORCH_OK;
}

int32_t engine_check_kv_configure(uint32_t block_size, uint32_t num_blocks,
                                  uint32_t max_block_size, char *err, size_t cap) {
    if (block_size == 0 || num_blocks == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "kv_configure: block_size (%u) and num_blocks (%u) "
                               "must be > 0",
                               block_size, num_blocks);
    if (num_blocks > (uint32_t)INT32_MAX)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "kv_configure: num_blocks %u exceeds int32 block ids",
                               num_blocks);
    if (max_block_size && block_size > max_block_size)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "kv_configure: block_size %u exceeds the limit %u",
                               block_size, max_block_size);
    return ORCH_OK;
}

const orch_seq_input *engine_batch_seq(const orch_infer_batch *b, uint32_t i) {
    return (const orch_seq_input *)(const void *)((const char *)b->seqs +
                                                  (size_t)i * b->seq_stride);
}

static int32_t infer_check_header(const orch_infer_batch *batch, char *err, size_t cap) {
    if (!batch)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "infer_forward: batch is NULL");
    if (batch->struct_size < sizeof(orch_infer_batch))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "infer_forward: batch struct_size %u is smaller than "
                               "ABI 1.0's %zu",
                               batch->struct_size, sizeof(orch_infer_batch));
    if (batch->n_seqs == 0 || !batch->seqs)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "infer_forward: empty batch (n_seqs %u, seqs %s)",
                               batch->n_seqs, batch->seqs ? "set" : "NULL");
    if (batch->seq_stride < sizeof(orch_seq_input) ||
        batch->seq_stride % _Alignof(orch_seq_input) != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "infer_forward: seq_stride %u must be a multiple of %zu "
                               "and at least ABI 1.0's %zu",
                               batch->seq_stride, _Alignof(orch_seq_input),
                               sizeof(orch_seq_input));
    return ORCH_OK;
}

/* Each sequence on its own; the counts of new tokens and logit rows. */
typedef int (*adapter_known_fn)(const void *user, uint32_t id);

static int32_t infer_check_seqs(const orch_infer_batch *batch, uint32_t V,
                                uint32_t context, uint32_t bs, uint32_t num_blocks,
                                adapter_known_fn known, const void *user,
                                uint64_t *out_tokens, uint64_t *out_rows, char *err,
                                size_t cap) {
    uint64_t tokens = 0, rows = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        if (!s->tokens || s->n_tokens == 0 || !s->block_table)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "infer_forward: sequence %u: %s", i,
                                   !s->tokens         ? "tokens is NULL"
                                   : s->n_tokens == 0 ? "n_tokens is 0"
                                                      : "block_table is NULL");
        if (s->logits_mode > ORCH_LOGITS_NONE)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "infer_forward: sequence %u: logits_mode %u is "
                                   "unknown",
                                   i, s->logits_mode);
        if (s->adapter_id != 0 && known && !known(user, s->adapter_id))
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "infer_forward: sequence %u: adapter_id %u is not an "
                                   "adapter of this context",
                                   i, s->adapter_id);
        if (s->adapter_id != 0 && !known)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "infer_forward: sequence %u: adapter_id %u "
                                   "(adapters are reserved; must be 0)",
                                   i, s->adapter_id);
        uint64_t end = (uint64_t)s->start_pos + s->n_tokens;
        if (end > context)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "infer_forward: sequence %u: positions %u..%llu "
                                   "exceed the model context %u",
                                   i, s->start_pos, (unsigned long long)(end - 1),
                                   context);
        for (uint32_t k = 0; k < s->n_tokens; k++)
            if (s->tokens[k] < 0 || (uint32_t)s->tokens[k] >= V)
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                       "infer_forward: sequence %u: token %d at "
                                       "position %llu outside 0..%u",
                                       i, s->tokens[k],
                                       (unsigned long long)s->start_pos + k, V - 1);
        uint64_t needed = (end + bs - 1) / bs;
        if (s->n_blocks < needed)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "infer_forward: sequence %u: %u blocks cover %llu "
                                   "positions, %llu needed",
                                   i, s->n_blocks, (unsigned long long)s->n_blocks * bs,
                                   (unsigned long long)end);
        for (uint64_t j = 0; j < needed; j++)
            if (s->block_table[j] < 0 || (uint32_t)s->block_table[j] >= num_blocks)
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                       "infer_forward: sequence %u: block id %d "
                                       "(logical block %llu) outside the pool of %u "
                                       "blocks",
                                       i, s->block_table[j], (unsigned long long)j,
                                       num_blocks);
        tokens += s->n_tokens;
        rows += s->logits_mode == ORCH_LOGITS_ALL    ? s->n_tokens
                : s->logits_mode == ORCH_LOGITS_LAST ? 1u
                                                     : 0u;
    }
    *out_tokens = tokens;
    *out_rows = rows;
    return ORCH_OK;
}

static int32_t infer_check_logits(uint64_t rows, uint32_t V, const float *logits,
                                  uint64_t logits_cap, char *err, size_t cap) {
    /* rows * V > logits_cap, without overflow (V > 0) */
    if (rows > logits_cap / V)
        return engine_fail_buf(err, cap, ORCH_ERR_CAPACITY,
                               "infer_forward: %llu logit rows of %u need %llu "
                               "floats, logits_cap is %llu",
                               (unsigned long long)rows, V, (unsigned long long)rows * V,
                               (unsigned long long)logits_cap);
    if (rows > 0 && !logits)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "infer_forward: logits is NULL");
    return ORCH_OK;
}

static int32_t shared_block(char *err, size_t cap, int32_t block, uint32_t writer,
                            uint32_t user) {
    return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                           "infer_forward: block %d is written by sequence %u "
                           "and also used by sequence %u (copy it first)",
                           block, writer, user);
}

static int32_t twice_in_table(char *err, size_t cap, int32_t block, uint32_t seq,
                              uint64_t first, uint64_t second) {
    return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                           "infer_forward: block %d appears twice in the block table "
                           "of sequence %u (logical blocks %llu and %llu)",
                           block, seq, (unsigned long long)first,
                           (unsigned long long)second);
}

/* Across sequences (after infer_check_seqs): blocks written by one sequence
 * only, once; earlier positions already written. */
static int32_t infer_check_blocks(const orch_infer_batch *batch, const engine_kv_view *kv,
                                  char *err, size_t cap) {
    const uint32_t bs = kv->block_size;
    engine_kv_mark *marks = kv->marks;
    /* Mark the blocks each sequence writes; two writers is misuse. */
    const uint32_t ep = marks_new_epoch(marks, kv->num_blocks, kv->epoch);
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        uint64_t first = s->start_pos / bs;
        uint64_t last = ((uint64_t)s->start_pos + s->n_tokens - 1) / bs;
        for (uint64_t j = first; j <= last; j++) {
            engine_kv_mark *mk = &marks[s->block_table[j]];
            if (mk->epoch == ep && mk->seq != i)
                return shared_block(err, cap, s->block_table[j], mk->seq, i);
            if (mk->epoch == ep && mk->lblock != j)
                return twice_in_table(err, cap, s->block_table[j], i, mk->lblock, j);
            mk->epoch = ep;
            mk->seq = i;
            mk->lblock = (uint32_t)j;
        }
    }
    /* Nobody reads a block another sequence writes; earlier positions must
     * already hold K/V. */
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        uint64_t last = ((uint64_t)s->start_pos + s->n_tokens - 1) / bs;
        for (uint64_t j = 0; j <= last; j++) {
            const engine_kv_mark *mk = &marks[s->block_table[j]];
            if (mk->epoch != ep) continue;
            if (mk->seq != i)
                return shared_block(err, cap, s->block_table[j], mk->seq, i);
            if (mk->lblock != j)
                return twice_in_table(err, cap, s->block_table[j], i, j, mk->lblock);
        }
        for (uint32_t p = 0; p < s->start_pos; p++) {
            int32_t b = s->block_table[p / bs];
            uint32_t o = p % bs;
            if (!kv->written[(size_t)b * bs + o])
                return engine_fail_buf(err, cap, ORCH_ERR_STATE,
                                       "infer_forward: sequence %u reads position %u "
                                       "from block %d slot %u, which was never "
                                       "written",
                                       i, p, b, o);
        }
    }
    return ORCH_OK;
}

int32_t engine_infer_check(const orch_infer_batch *batch, const float *logits,
                           uint64_t logits_cap, uint32_t vocab, uint32_t context,
                           uint64_t max_tokens, const char *limit_note,
                           const engine_kv_view *kv, uint64_t *out_tokens,
                           uint64_t *out_rows, char *err, size_t cap) {
    return engine_infer_check_lora(batch, logits, logits_cap, vocab, context, max_tokens,
                                   limit_note, kv, NULL, NULL, out_tokens, out_rows, err,
                                   cap);
}

int32_t engine_infer_check_lora(const orch_infer_batch *batch, const float *logits,
                                uint64_t logits_cap, uint32_t vocab, uint32_t context,
                                uint64_t max_tokens, const char *limit_note,
                                const engine_kv_view *kv, adapter_known_fn known,
                                const void *user, uint64_t *out_tokens,
                                uint64_t *out_rows, char *err, size_t cap) {
    int32_t st = infer_check_header(batch, err, cap);
    if (st != ORCH_OK) return st;
    if (kv->num_blocks == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_STATE,
                               "infer_forward: no KV pool (call kv_configure first)");
    uint64_t tokens = 0, rows = 0;
    st = infer_check_seqs(batch, vocab, context, kv->block_size, kv->num_blocks, known,
                          user, &tokens, &rows, err, cap);
    if (st != ORCH_OK) return st;
    if (max_tokens && tokens > max_tokens)
        return engine_fail_buf(err, cap, ORCH_ERR_CAPACITY,
                               "infer_forward: batch of %llu new tokens exceeds the "
                               "limit of %llu (%s)",
                               (unsigned long long)tokens, (unsigned long long)max_tokens,
                               limit_note ? limit_note : "per call");
    if ((st = infer_check_logits(rows, vocab, logits, logits_cap, err, cap)) != ORCH_OK ||
        (st = infer_check_blocks(batch, kv, err, cap)) != ORCH_OK)
        return st;
    *out_tokens = tokens;
    *out_rows = rows;
    return ORCH_OK;
}

void engine_kv_mark_written(const orch_infer_batch *batch, const engine_kv_view *kv) {
    const uint32_t bs = kv->block_size;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        for (uint32_t k = 0; k < s->n_tokens; k++) {
            uint32_t p = s->start_pos + k;
            kv->written[(size_t)s->block_table[p / bs] * bs + p % bs] = 1;
        }
    }
}

int32_t engine_kv_copy_check(const int32_t *src, const int32_t *dst, uint32_t n,
                             const engine_kv_view *kv, char *err, size_t cap) {
    const uint32_t num_blocks = kv->num_blocks;
    if (num_blocks == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_STATE,
                               "kv_copy_blocks: no KV pool (call kv_configure first)");
    if (n == 0) return ORCH_OK;
    if (!src || !dst)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "kv_copy_blocks: %s is NULL", !src ? "src" : "dst");
    for (uint32_t i = 0; i < n; i++)
        if (src[i] < 0 || (uint32_t)src[i] >= num_blocks || dst[i] < 0 ||
            (uint32_t)dst[i] >= num_blocks)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "kv_copy_blocks: pair %u (%d -> %d) names a block "
                                   "outside the pool of %u blocks",
                                   i, src[i], dst[i], num_blocks);
    /* Roles: seq 0 = source, 1 = destination. */
    engine_kv_mark *marks = kv->marks;
    const uint32_t ep = marks_new_epoch(marks, num_blocks, kv->epoch);
    for (uint32_t i = 0; i < n; i++) {
        marks[src[i]].epoch = ep;
        marks[src[i]].seq = 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        engine_kv_mark *mk = &marks[dst[i]];
        if (mk->epoch == ep)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "kv_copy_blocks: block %d is %s", dst[i],
                                   mk->seq == 0 ? "both a source and a destination"
                                                : "a destination twice");
        mk->epoch = ep;
        mk->seq = 1;
    }
    return ORCH_OK;
}

void engine_kv_copy_written(const int32_t *src, const int32_t *dst, uint32_t n,
                            const engine_kv_view *kv) {
    const size_t bs = kv->block_size;
    for (uint32_t i = 0; i < n; i++)
        memcpy(kv->written + (size_t)dst[i] * bs, kv->written + (size_t)src[i] * bs, bs);
}
