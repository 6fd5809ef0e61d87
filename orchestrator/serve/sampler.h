/*
 * sampler.h - next-token sampling over a row of logits: greedy, temperature,
 * top-k, top-p (nucleus), an optional allowed-token mask (structured output),
 * log-probabilities, and a small seeded RNG whose whole state is a plain struct.
 * Used by `orch serve` (one RNG per request/choice, so the same seed gives the
 * same tokens alone or in a busy batch) and by `orch generate`.
 *
 * Order of operations (as vLLM): logit processing (sampler_process_logits:
 * logit_bias, repetition / presence / frequency penalties, banned tokens) ->
 * mask -> temperature -> min-p -> top-k -> top-p -> draw. temperature == 0
 * is greedy: argmax over the processed, allowed logits, ties broken by the
 * lowest token id; the RNG is not advanced. A sampled draw consumes exactly
 * one RNG value, so a request's token sequence depends only on its seed and
 * its logits.
 *
 * Memory: a sampler_ws is scratch space sized for one vocabulary, created by
 * sampler_ws_create and released by sampler_ws_free (NULL is a no-op).
 * Threads: functions are reentrant; a sampler_ws or sampler_rng must not be
 * used by two threads at once. Logits are never modified.
 */
#ifndef ORCH_SAMPLER_H
#define ORCH_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/rng.h"

/* RNG: the orchestrator's xoshiro256** (rng.h). Plain struct: copy it to
 * snapshot a stream, store it in a checkpoint, etc. */
typedef orch_rng sampler_rng;

/* Seed deterministically from a 64-bit seed (any value, including 0). */
void sampler_rng_seed(sampler_rng *rng, uint64_t seed);
/* Seed from (seed, stream): distinct streams give independent sequences
 * (used for choice i of an n>1 request). Stream 0 is the same as
 * sampler_rng_seed(seed), so `orch generate --seed S` and a served request
 * with seed S draw the same numbers. */
void sampler_rng_seed_stream(sampler_rng *rng, uint64_t seed, uint64_t stream);
/* Next raw 64-bit value. */
uint64_t sampler_rng_next(sampler_rng *rng);
/* Uniform double in [0, 1) with 53 random bits. */
double sampler_rng_uniform(sampler_rng *rng);

/* Sampling parameters. Defaults: sampler_params_default() = greedy off,
 * temperature 1, top_k 0 (off), top_p 1 (off), min_p 0 (off), no penalties.
 * A zeroed struct is greedy with everything else off. */
typedef struct sampler_params {
    float temperature; /* >= 0; 0 = greedy */
    uint32_t top_k;    /* 0 = no top-k limit */
    float top_p;       /* (0, 1]; 1 = no nucleus limit */
    /* [0, 1]: after temperature, drop tokens whose probability is below
     * min_p x that of the most likely token; 0 = off */
    float min_p;
    /* OpenAI's: logit -= presence (token generated at least once) +
     * frequency x (times generated); over the generated tokens only */
    float presence_penalty, frequency_penalty;
    /* HF / vLLM's, over prompt and generated tokens: a positive logit is
     * divided by it, a negative one multiplied; 1 (or 0, unset) = off */
    float repetition_penalty;
} sampler_params;

sampler_params sampler_params_default(void);

/* Validate ranges: temperature finite and >= 0, top_p in (0, 1], min_p in
 * [0, 1], penalties finite, repetition_penalty >= 0. Returns 0, or -1 with a
 * message naming the field in err. (API-level limits such as OpenAI's
 * temperature <= 2 are the caller's business.) */
int sampler_params_check(const sampler_params *p, char *err, size_t err_cap);

/* What logit processing reads besides the logits (all borrowed; any array
 * may be NULL with its count 0). */
typedef struct sampler_history {
    const int32_t *prompt; /* prompt ids (repetition_penalty) */
    uint32_t n_prompt;
    const int32_t *output; /* generated ids so far (all penalties) */
    uint32_t n_output;
    const int32_t *bias_ids; /* logit_bias: logit[bias_ids[i]] += bias[i] */
    const float *bias;
    uint32_t n_bias;
    const int32_t *banned; /* tokens made impossible for this step (e.g. the */
    uint32_t n_banned;     /* end-of-text token before min_tokens) */
} sampler_history;

/* Allowed-token mask: a bitset of ceil(vocab/32) uint32 words, bit (v % 32) of
 * word v/32 set = token v allowed. NULL means every token is allowed. */
#define SAMPLER_MASK_WORDS(vocab) (((size_t)(vocab) + 31u) / 32u)
static inline int sampler_mask_allows(const uint32_t *mask, uint32_t v) {
    return !mask || ((mask[v >> 5] >> (v & 31u)) & 1u);
}

typedef struct sampler_ws sampler_ws; /* opaque scratch */

/* Scratch for vocabularies up to `vocab` tokens; NULL when out of memory. */
sampler_ws *sampler_ws_create(uint32_t vocab);
void sampler_ws_free(sampler_ws *ws);

/* Apply logit_bias, the penalties of p and the banned tokens of h to
 * logits[0..vocab-1]. Returns `logits` itself when none applies, else ws's
 * processed copy (valid until the next call with ws). Ids out of range are
 * skipped. NULL when ws is NULL or smaller than vocab and something applies. */
const float *sampler_process_logits(const sampler_params *p, const sampler_history *h,
                                    const float *logits, uint32_t vocab, sampler_ws *ws);

/* The distribution sampler_sample draws from: out[v] = probability of token
 * v after mask, temperature, min-p, top-k and top-p (0 outside; for greedy
 * 1 at the argmax). Returns 0, or -1 as sampler_sample would fail. */
int sampler_distribution(const sampler_params *p, const float *logits, uint32_t vocab,
                         const uint32_t *mask, sampler_ws *ws, double *out);

/* Pick the next token from logits[0..vocab-1] (vocab <= the ws size).
 * mask may be NULL. rng is advanced once for a non-greedy draw (not used and
 * may be NULL when temperature == 0). Non-finite logits count as -inf.
 * Returns the token id, or -1 when no token is allowed / every allowed logit
 * is -inf / arguments are bad. */
int32_t sampler_sample(const sampler_params *p, const float *logits, uint32_t vocab,
                       const uint32_t *mask, sampler_rng *rng, sampler_ws *ws);

/* Greedy helper: argmax over allowed tokens (lowest id on ties), -1 if none. */
int32_t sampler_argmax(const float *logits, uint32_t vocab, const uint32_t *mask);

/* Natural-log softmax probability of `token` under the raw logits
 * (temperature 1, no truncation, no mask), computed in double. */
double sampler_logprob(const float *logits, uint32_t vocab, int32_t token);

/* The n most likely tokens under the raw logits (n <= 32), most likely first
 * (ties: lower id first): ids into out_ids, log-probs into out_logprobs.
 * Returns how many were written (min(n, vocab)). */
uint32_t sampler_top_logprobs(const float *logits, uint32_t vocab, uint32_t n,
                              int32_t *out_ids, double *out_logprobs);

#endif
