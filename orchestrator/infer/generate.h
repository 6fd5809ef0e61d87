/*
 * generate.h - incremental decoding of ONE sequence through the engine's
 * infer_forward with a simple block table (used by `orch generate`).
 *
 * A session configures the engine's KV pool for one sequence of up to
 * `context` positions (blocks of ORCH_KV_BLOCK_TOKENS positions, block i of
 * the sequence = pool block i), then takes tokens with generate_feed: the first
 * call is the prefill (processed in chunks of at most `prefill_chunk`
 * tokens), later calls usually feed the one sampled token. After each feed the
 * logits of the last fed token are available from generate_logits.
 *
 * Memory: the session owns its logits buffer and block table; it borrows the
 * engine handle and context, which must outlive it (the KV pool it configured
 * stays allocated in the context).
 * Threads: a session is used by one thread at a time, and nothing else may use
 * its engine context meanwhile.
 * Errors: 0 / -1 with a one-line message in err; nothing is printed.
 */
#ifndef ORCH_GENERATE_H
#define ORCH_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/engine_loader.h"

typedef struct generate_session generate_session;

/* Configure ctx's KV pool for one sequence of up to `context` positions and
 * return a session. prefill_chunk 0 = 512. Requires ORCH_CAP_INFER. */
int generate_session_create(const engine_handle *h, orch_engine_ctx *ctx,
                            uint32_t vocab_size, uint32_t context, uint32_t prefill_chunk,
                            generate_session **out, char *err, size_t err_cap);
void generate_session_free(generate_session *s); /* NULL is a no-op */

/* Append n >= 1 tokens at the current position and run the forward.
 * Errors: position + n over the context (nothing is run), bad token id,
 * engine failure (the session is then unusable until generate_reset). */
int generate_feed(generate_session *s, const int32_t *ids, size_t n, char *err,
                  size_t err_cap);

/* vocab_size logits of the last fed token; NULL before the first feed. Valid
 * until the next feed/reset/free. */
const float *generate_logits(const generate_session *s);

/* Run every later feed through LoRA adapter adapter_id of the context (0
 * = the base model); set it before the first feed (or after a reset). */
void generate_set_adapter(generate_session *s, uint32_t adapter_id);

/* Tokens fed so far (= position of the next token), and the limit. */
uint32_t generate_position(const generate_session *s);
uint32_t generate_context(const generate_session *s);

/* Forget the sequence (position 0); the KV pool is reused. */
void generate_reset(generate_session *s);

#endif
