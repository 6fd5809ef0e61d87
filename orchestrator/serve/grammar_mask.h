/*
 * grammar_mask.h - structured output at decode time: a regex (regex_dfa.h;
 * JSON Schemas arrive here as regexes, json_schema.h) compiled into a
 * byte-level DFA bound to the served vocabulary, the per-step allowed-token
 * mask, and jump-forward over forced runs.
 *
 *  - Token mask (XGrammar's context-independent token cache): for a DFA
 *    state, the tokens whose whole byte string the DFA walks without dying.
 *    Computed by one depth-first walk of a byte trie of the vocabulary (built
 *    once per cache) pruned at dead states, lazily on the first visit of a
 *    state, and kept per state (up to GRAMMAR_MASK_CACHE_BYTES over all the
 *    grammars of a cache; beyond it masks are recomputed into the matcher's
 *    own buffer at every step). The
 *    end-of-text token is allowed only in accepting states.
 *  - Jump-forward (SGLang's compressed FSM): when the DFA allows exactly one
 *    byte from a non-accepting state, the run of such bytes (up to
 *    GRAMMAR_MAX_FORCED bytes, cut to whole UTF-8 characters) is tokenized
 *    on its own and appended as tokens without sampling steps; the next
 *    sampled token starts at the run's end (the boundary is re-tokenized:
 *    the mask of the state after the run decides what may follow).
 *  - Completion: once the DFA is in an accepting state with no way on, the
 *    output is complete and the sequence finishes (finish_reason stop).
 *  - Cache: grammars are kept by the hash of their regex text (the full
 *    text is compared), at most `max_entries`, least recently used evicted.
 *
 * Scheduler hooks: grammar_matcher_attach sets sched_seq.token_mask and
 * sched_seq.forced_tokens (scheduler.h) to functions of this module that read
 * the sequence's generated tokens and keep the matcher in step with them.
 *
 * Memory: a grammar is reference-counted (grammar_cache_get returns a
 * reference, grammar_release drops it; the cache holds its own). A matcher
 * holds a reference until grammar_matcher_reset. Each grammar holds a
 * reference to its cache (the vocabulary trie), so grammar_cache_free may
 * come before the last grammar is released: the cache is freed with it.
 * Threads: grammar_cache_get / grammar_release are thread-safe; a grammar's
 * mask cache is guarded by its own lock; one matcher is used by one thread
 * at a time (the scheduler thread).
 * Errors: grammar_cache_get returns 0, or -1 with a message (bad regex, too
 * large, a language that admits nothing, out of memory).
 */
#ifndef ORCH_GRAMMAR_MASK_H
#define ORCH_GRAMMAR_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/regex_dfa.h"
#include "orchestrator/serve/scheduler.h"

#define GRAMMAR_MAX_FORCED       256u
#define GRAMMAR_MASK_CACHE_BYTES ((size_t)256 << 20)

typedef struct grammar grammar;
typedef struct grammar_cache grammar_cache;

/* tok: the served tokenizer (vocab ids and bytes; borrowed). NULL when out
 * of memory. */
grammar_cache *grammar_cache_create(const tokenizer *tok, uint32_t vocab,
                                    uint32_t max_entries);
void grammar_cache_free(grammar_cache *c);

int grammar_cache_get(grammar_cache *c, const char *re, size_t len, grammar **out,
                      char *err, size_t err_cap);
void grammar_release(grammar *g);

typedef struct grammar_cache_stats {
    uint64_t hits, misses, entries;
} grammar_cache_stats;
void grammar_cache_get_stats(grammar_cache *c, grammar_cache_stats *st);

const regex_dfa *grammar_dfa(const grammar *g);

/* Per-sequence state. */
typedef struct grammar_matcher {
    grammar *g;
    int32_t state;          /* DFA state; -1 after a token the grammar refuses */
    uint32_t consumed;      /* generated tokens fed so far */
    int ended;              /* an end-of-text token was fed */
    uint32_t *scratch;      /* mask buffer when the grammar's cache is full */
    uint64_t forced_tokens; /* tokens appended by jump-forward */
    uint64_t mask_calls;
} grammar_matcher;

/* Start at the grammar's start state; takes a reference to g and allocates
 * the mask buffer. Returns 0, or -1 out of memory (m is then zeroed). */
int grammar_matcher_init(grammar_matcher *m, grammar *g);
/* Drop the reference and the scratch buffer (a zeroed matcher is fine). */
void grammar_matcher_reset(grammar_matcher *m);

/* Feed generated token ids (the end-of-text id ends the match). Returns 0,
 * or -1 when a token leaves the grammar (state becomes -1). */
int grammar_matcher_feed(grammar_matcher *m, const int32_t *ids, uint32_t n);
/* The allowed-token bitset (sampler.h layout) for the current state, never
 * NULL; all zero after a refused token or the end-of-text token (and when
 * the mask cannot be computed for lack of memory: sampling then fails with
 * an error rather than leaving the grammar). Valid until the next call. */
const uint32_t *grammar_matcher_mask(grammar_matcher *m);
/* The forced run from the current state as up to cap token ids (not fed);
 * *complete = the grammar is complete after them. */
uint32_t grammar_matcher_forced(grammar_matcher *m, int32_t *out, uint32_t cap,
                                int *complete);
/* 1 when the match is complete (accepting, nothing may follow). */
int grammar_matcher_complete(const grammar_matcher *m);

/* Set q->token_mask, q->forced_tokens and q->constraint = m (which must
 * live until q finished). */
void grammar_matcher_attach(grammar_matcher *m, sched_seq *q);

#endif
