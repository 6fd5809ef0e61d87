/*
 * generate.c - one-sequence incremental decoding through infer_forward with an
 * identity block table. See generate.h.
 */
#include "orchestrator/infer/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"
#include "orchestrator/serve/block_manager.h"

struct generate_session {
    const engine_handle *h;
    orch_engine_ctx *ctx;
    uint32_t vocab;
    uint32_t context;
    uint32_t chunk;
    uint32_t pos;
    int have_logits;
    int broken;
    int32_t *blocks; /* block i of the sequence = pool block i */
    uint32_t n_blocks;
    float *logits;
    uint32_t adapter; /* LoRA adapter of every feed (0 = the base) */
};

int generate_session_create(const engine_handle *h, orch_engine_ctx *ctx,
                            uint32_t vocab_size, uint32_t context, uint32_t prefill_chunk,
                            generate_session **out, char *err, size_t err_cap) {
    if (!h || !h->api || !ctx || vocab_size == 0 || context == 0) {
        util_set_err(err, err_cap, "generate: bad arguments");
        return -1;
    }
    if (!(h->api->capabilities & ORCH_CAP_INFER)) {
        util_set_err(err, err_cap, "engine %s cannot run inference", h->api->name);
        return -1;
    }
    generate_session *s = util_calloc(1, sizeof *s);
    if (!s) goto oom;
    s->h = h;
    s->ctx = ctx;
    s->vocab = vocab_size;
    s->context = context;
    s->chunk = prefill_chunk ? prefill_chunk : 512;
    s->n_blocks = (context + ORCH_KV_BLOCK_TOKENS - 1) / ORCH_KV_BLOCK_TOKENS;
    s->blocks = util_calloc(s->n_blocks, sizeof *s->blocks);
    s->logits = util_calloc(vocab_size, sizeof *s->logits);
    if (!s->blocks || !s->logits) goto oom;
    for (uint32_t i = 0; i < s->n_blocks; i++) s->blocks[i] = (int32_t)i;
    int32_t st = h->api->kv_configure(ctx, ORCH_KV_BLOCK_TOKENS, s->n_blocks);
    if (st != ORCH_OK) {
        char msg[512];
        engine_format_error(h, ctx, st, msg, sizeof msg);
        util_set_err(err, err_cap, "kv_configure(%u blocks of %u): %s", s->n_blocks,
                     ORCH_KV_BLOCK_TOKENS, msg);
        generate_session_free(s);
        return -1;
    }
    *out = s;
    return 0;
oom:
    util_set_err(err, err_cap, "generate: out of memory");
    generate_session_free(s);
    return -1;
}

void generate_session_free(generate_session *s) {
    if (!s) return;
    free(s->blocks);
    free(s->logits);
    free(s);
}

int generate_feed(generate_session *s, const int32_t *ids, size_t n, char *err,
                  size_t err_cap) {
    if (s->broken) {
        util_set_err(err, err_cap, "generate: session failed earlier; reset it");
        return -1;
    }
    if (n == 0 || !ids) {
        util_set_err(err, err_cap, "generate: no tokens to feed");
        return -1;
    }
    if (n > (size_t)(s->context - s->pos)) {
        util_set_err(err, err_cap,
                     "context full: %u tokens so far + %zu new exceed the "
                     "model's context of %u",
                     s->pos, n, s->context);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= s->vocab) {
            util_set_err(err, err_cap, "token id %d outside the vocabulary (%u)", ids[i],
                         s->vocab);
            return -1;
        }
    size_t done = 0;
    while (done < n) {
        uint32_t take = (uint32_t)((n - done) < s->chunk ? (n - done) : s->chunk);
        int last = done + take == n;
        uint32_t end = s->pos + take;
        orch_seq_input seq;
        memset(&seq, 0, sizeof seq);
        seq.tokens = ids + done;
        seq.n_tokens = take;
        seq.start_pos = s->pos;
        seq.block_table = s->blocks;
        seq.n_blocks = (end + ORCH_KV_BLOCK_TOKENS - 1) / ORCH_KV_BLOCK_TOKENS;
        seq.logits_mode = last ? ORCH_LOGITS_LAST : ORCH_LOGITS_NONE;
        seq.adapter_id = s->adapter;
        orch_infer_batch b;
        memset(&b, 0, sizeof b);
        b.struct_size = sizeof b;
        b.n_seqs = 1;
        b.seq_stride = sizeof seq;
        b.seqs = &seq;
        int32_t st = s->h->api->infer_forward(s->ctx, &b, s->logits, last ? s->vocab : 0);
        if (st != ORCH_OK) {
            char msg[512];
            engine_format_error(s->h, s->ctx, st, msg, sizeof msg);
            util_set_err(err, err_cap, "infer_forward at position %u: %s", s->pos, msg);
            s->broken = 1;
            s->have_logits = 0;
            return -1;
        }
        s->pos = end;
        done += take;
    }
    s->have_logits = 1;
    return 0;
}

const float *generate_logits(const generate_session *s) {
    return s && s->have_logits ? s->logits : NULL;
}

void generate_set_adapter(generate_session *s, uint32_t adapter_id) {
    s->adapter = adapter_id;
}

uint32_t generate_position(const generate_session *s) { return s->pos; }
uint32_t generate_context(const generate_session *s) { return s->context; }

void generate_reset(generate_session *s) {
    s->pos = 0;
    s->have_logits = 0;
    s->broken = 0;
}
