/*
 * engine_common.c - engine-side code shared by the mock, cpu and cuda engines
 * (see engine_common.h for the rules). Messages here are part of the engines'
 * behaviour: tests assert them, so change them only with the tests.
 */
#include "engines/common/engine_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *engine_status_string(int32_t status) {
    switch (status) {
    case ORCH_OK: return "ok";
    case ORCH_ERR_INVALID_ARGUMENT: return "invalid argument";
    case ORCH_ERR_OUT_OF_MEMORY: return "out of memory";
    case ORCH_ERR_UNSUPPORTED: return "unsupported";
    case ORCH_ERR_STATE: return "call out of order";
    case ORCH_ERR_CAPACITY: return "capacity exceeded";
    case ORCH_ERR_DEVICE: return "device error";
    case ORCH_ERR_NUMERIC: return "non-finite value";
    case ORCH_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

int32_t engine_fail_buf(char *err, size_t cap, int32_t status, const char *fmt, ...) {
    if (err && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ------------------------------------------------------------------------- */
/* GPT-2 tensor table                                                         */
/* ------------------------------------------------------------------------- */

uint32_t engine_gpt2_tensor_count(uint32_t layers) {
    return 4u + ENGINE_GPT2_PER_LAYER * layers;
}

static void tensor_add(engine_tensor *t, uint32_t *n, uint64_t *offset,
                       const char *name, uint32_t ndim, uint64_t d0, uint64_t d1) {
    engine_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = ndim;
    x->shape[0] = d0;
    x->shape[1] = ndim > 1 ? d1 : 0;
    x->numel = ndim > 1 ? d0 * d1 : d0;
    x->flags = ndim == 1 ? ORCH_TENSOR_FLAG_NO_DECAY : 0;
    x->offset = *offset;
    *offset += x->numel;
}

uint64_t engine_gpt2_table_fill(engine_tensor *out, uint32_t layers, uint64_t V,
                                uint64_t T, uint64_t C, uint64_t M) {
    static const struct {
        const char *suffix;
        uint32_t ndim;
        int d0, d1; /* 1 = C, 3 = 3C, 4 = M */
    } spec[ENGINE_GPT2_PER_LAYER] = {
        {"ln_1.weight", 1, 1, 0},        {"ln_1.bias", 1, 1, 0},
        {"attn.c_attn.weight", 2, 3, 1}, {"attn.c_attn.bias", 1, 3, 0},
        {"attn.c_proj.weight", 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 0},
        {"ln_2.weight", 1, 1, 0},        {"ln_2.bias", 1, 1, 0},
        {"mlp.c_fc.weight", 2, 4, 1},    {"mlp.c_fc.bias", 1, 4, 0},
        {"mlp.c_proj.weight", 2, 1, 4},  {"mlp.c_proj.bias", 1, 1, 0},
    };
    uint32_t n = 0;
    uint64_t off = 0;
    char name[ORCH_TENSOR_NAME_MAX];
    tensor_add(out, &n, &off, "wte.weight", 2, V, C);
    tensor_add(out, &n, &off, "wpe.weight", 2, T, C);
    for (uint32_t i = 0; i < layers; i++) {
        for (uint32_t k = 0; k < ENGINE_GPT2_PER_LAYER; k++) {
            uint64_t d[2];
            for (int a = 0; a < 2; a++) {
                int code = a == 0 ? spec[k].d0 : spec[k].d1;
                d[a] = code == 1 ? C : code == 3 ? 3 * C : code == 4 ? M : 0;
            }
            snprintf(name, sizeof name, "h.%u.%s", i, spec[k].suffix);
            tensor_add(out, &n, &off, name, spec[k].ndim, d[0], d[1]);
        }
    }
    tensor_add(out, &n, &off, "ln_f.weight", 1, C, 0);
    tensor_add(out, &n, &off, "ln_f.bias", 1, C, 0);
    return off;
}

void engine_tensor_info_fill(const engine_tensor *t, orch_tensor_info *out) {
    orch_tensor_info info;
    memset(&info, 0, sizeof info);
    size_t n = out->struct_size < sizeof info ? out->struct_size : sizeof info;
    info.struct_size = (uint32_t)n;
    info.dtype = ORCH_DTYPE_F32;
    info.ndim = t->ndim;
    info.flags = t->flags;
    info.shape[0] = t->shape[0];
    info.shape[1] = t->shape[1];
    info.numel = t->numel;
    info.offset = t->offset;
    memcpy(info.name, t->name, sizeof info.name);
    memcpy(out, &info, n);
}

int32_t engine_check_kind_index(const char *fn, uint32_t kind, uint32_t index,
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

int32_t engine_check_tensor_bytes(const char *fn, const engine_tensor *t,
                                  const void *buf, uint64_t bytes, char *err,
                                  size_t cap) {
    if (!buf)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT, "%s: buffer is NULL",
                               fn);
    if (bytes != t->numel * sizeof(float))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: tensor %s needs %llu bytes (%llu f32), got %llu",
                               fn, t->name,
                               (unsigned long long)(t->numel * sizeof(float)),
                               (unsigned long long)t->numel, (unsigned long long)bytes);
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

int32_t engine_check_batch_shape(const char *fn, const int32_t *tokens,
                                 const int32_t *targets, uint32_t batch,
                                 uint32_t seq_len, uint32_t context, char *err,
                                 size_t cap) {
    if (!tokens || !targets)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                               !tokens ? "tokens" : "targets");
    if (batch == 0 || seq_len == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: batch (%u) and seq_len (%u) must be > 0", fn,
                               batch, seq_len);
    if (seq_len > context)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: seq_len %u exceeds the model context %u", fn,
                               seq_len, context);
    return ORCH_OK;
}

int32_t engine_check_batch_ids(const char *fn, const int32_t *tokens,
                               const int32_t *targets, uint32_t batch,
                               uint32_t seq_len, uint32_t vocab, char *err, size_t cap) {
    const uint64_t n = (uint64_t)batch * seq_len;
    const int32_t V = (int32_t)vocab;
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
    }
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
/* Options strings                                                            */
/* ------------------------------------------------------------------------- */

static int is_sep(char c) { return c == ',' || c == ';'; }
static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int engine_opts_next(const char **cursor, engine_opt_item *it) {
    const char *p = *cursor;
    while (*p && (is_sep(*p) || is_space(*p))) p++;
    if (!*p) {
        *cursor = p;
        return 0;
    }
    const char *start = p;
    while (*p && !is_sep(*p)) p++;
    const char *end = p;
    while (end > start && is_space(end[-1])) end--;
    size_t len = (size_t)(end - start);
    const char *eq = memchr(start, '=', len);
    size_t klen = eq ? (size_t)(eq - start) : len;
    while (klen > 0 && is_space(start[klen - 1])) klen--;
    const char *v = eq ? eq + 1 : end;
    while (v < end && is_space(*v)) v++;
    it->item = start;
    it->item_len = len;
    it->key = start;
    it->key_len = klen;
    it->value = v;
    it->value_len = (size_t)(end - v);
    it->has_eq = eq != NULL;
    *cursor = p;
    return 1;
}

int engine_parse_u64(const char *s, size_t len, uint64_t *out) {
    if (len == 0 || len > 19) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* KV-block checks                                                            */
/* ------------------------------------------------------------------------- */

uint32_t engine_kv_marks_new_epoch(engine_kv_mark *marks, uint32_t num_blocks,
                                   uint32_t *epoch) {
    if (++*epoch == 0) {
        memset(marks, 0, (size_t)num_blocks * sizeof *marks);
        *epoch = 1;
    }
    return *epoch;
}

const orch_seq_input *engine_batch_seq(const orch_infer_batch *b, uint32_t i) {
    return (const orch_seq_input *)(const void *)((const char *)b->seqs +
                                                  (size_t)i * b->seq_stride);
}

int32_t engine_infer_check_header(const orch_infer_batch *batch, char *err, size_t cap) {
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
    return ORCH_OK;
}

int32_t engine_infer_check_seqs(const orch_infer_batch *batch, uint32_t V,
                                uint32_t context, uint32_t bs, uint32_t num_blocks,
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
        if (s->adapter_id != 0)
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

int32_t engine_infer_check_logits(uint64_t rows, uint32_t V, const float *logits,
                                  uint64_t logits_cap, char *err, size_t cap) {
    /* rows * V > logits_cap, without overflow (V > 0) */
    if (rows > logits_cap / V)
        return engine_fail_buf(err, cap, ORCH_ERR_CAPACITY,
                               "infer_forward: %llu logit rows of %u need %llu "
                               "floats, logits_cap is %llu",
                               (unsigned long long)rows, V,
                               (unsigned long long)rows * V,
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

int32_t engine_infer_check_blocks(const orch_infer_batch *batch, uint32_t bs,
                                  engine_kv_mark *marks, uint32_t num_blocks,
                                  uint32_t *epoch, const uint8_t *written, char *err,
                                  size_t cap) {
    /* Mark the blocks each sequence writes; two writers is misuse. */
    const uint32_t ep = engine_kv_marks_new_epoch(marks, num_blocks, epoch);
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        uint64_t first = s->start_pos / bs;
        uint64_t last = ((uint64_t)s->start_pos + s->n_tokens - 1) / bs;
        for (uint64_t j = first; j <= last; j++) {
            engine_kv_mark *mk = &marks[s->block_table[j]];
            if (mk->epoch == ep && mk->seq != i)
                return shared_block(err, cap, s->block_table[j], mk->seq, i);
            if (mk->epoch == ep && mk->lblock != j)
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                       "infer_forward: block %d appears twice in the "
                                       "block table of sequence %u (logical blocks "
                                       "%u and %llu)",
                                       s->block_table[j], i, mk->lblock,
                                       (unsigned long long)j);
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
            if (mk->seq != i) return shared_block(err, cap, s->block_table[j], mk->seq, i);
            if (mk->lblock != j)
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                       "infer_forward: block %d appears twice in the "
                                       "block table of sequence %u (logical blocks "
                                       "%llu and %u)",
                                       s->block_table[j], i, (unsigned long long)j,
                                       mk->lblock);
        }
        for (uint32_t p = 0; p < s->start_pos; p++) {
            int32_t b = s->block_table[p / bs];
            uint32_t o = p % bs;
            if (!written[(size_t)b * bs + o])
                return engine_fail_buf(err, cap, ORCH_ERR_STATE,
                                       "infer_forward: sequence %u reads position %u "
                                       "from block %d slot %u, which was never "
                                       "written",
                                       i, p, b, o);
        }
    }
    return ORCH_OK;
}

int32_t engine_kv_copy_check(const int32_t *src, const int32_t *dst, uint32_t n,
                             engine_kv_mark *marks, uint32_t num_blocks,
                             uint32_t *epoch, char *err, size_t cap) {
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
    const uint32_t ep = engine_kv_marks_new_epoch(marks, num_blocks, epoch);
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
