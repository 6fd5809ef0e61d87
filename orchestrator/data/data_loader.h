/*
 * data_loader.h - training batches from a token dataset: windows of
 * seq_len+1 tokens at offsets drawn from a seeded RNG, prepared one batch
 * ahead by a background thread; and a fixed, deterministic validation set.
 *
 * RNG: xoshiro256** seeded through splitmix64. Its whole state (four 64-bit
 * words) is what a checkpoint saves; a loader started from a saved state
 * yields exactly the batches the original loader would have yielded next.
 *
 * Batches: each call to data_loader_next draws world*micro_batch offsets
 * uniformly from [0, total - seq_len - 1] and returns the micro_batch windows
 * of this rank (rank r takes draws r*micro_batch .. (r+1)*micro_batch-1), so
 * every rank advances the same RNG and ranks read disjoint draws. tokens are
 * window[0..seq_len-1], targets window[1..seq_len], both [micro_batch,
 * seq_len] row-major.
 *
 * Validation: data_eval_set_build takes n_batches*micro_batch windows at
 * evenly spaced offsets over the whole validation dataset (no RNG), so every
 * evaluation of every run sees the same tokens.
 *
 * Memory: the loader owns its buffers; pointers from data_loader_next stay
 * valid until the next call or data_loader_close. The dataset is borrowed and
 * must outlive the loader.
 * Threads: one consumer thread per loader. The prefetch thread blocks
 * SIGINT, SIGTERM and SIGUSR1 so those reach the caller's threads.
 * Errors: 0 / -1 with a one-line message in err.
 */
#ifndef ORCH_DATA_LOADER_H
#define ORCH_DATA_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/data/shard.h"

typedef orch_rng data_rng;

/* Seed the generator from one 64-bit seed (splitmix64 expansion). */
void data_rng_seed(data_rng *r, uint64_t seed);
/* Next 64 random bits. */
uint64_t data_rng_next(data_rng *r);
/* Uniform integer in [0, n) without modulo bias; n >= 1. */
uint64_t data_rng_below(data_rng *r, uint64_t n);

/* State <-> text: 64 lowercase hex digits (four words, big-endian each).
 * data_rng_to_hex writes 65 bytes including the NUL. */
void data_rng_to_hex(const data_rng *r, char out[65]);
int data_rng_from_hex(const char *hex, data_rng *r);

typedef struct data_loader_opts {
    uint32_t micro_batch;
    uint32_t seq_len;
    uint32_t rank;  /* 0 for a single process */
    uint32_t world; /* number of data-parallel ranks; 0 or 1 = one */
    int prefetch;   /* 1: background thread (default use); 0: synchronous */
} data_loader_opts;

typedef struct data_loader data_loader;

/* Start a loader at RNG state *start (the state after the batches already
 * consumed). Errors: dataset shorter than seq_len+1 tokens, bad options,
 * out of memory, thread creation failure. */
int data_loader_open(const dataset *ds, const data_loader_opts *o, const data_rng *start,
                     data_loader **out, char *err, size_t err_cap);

/* The next batch (blocks until the prefetch thread has it ready). */
int data_loader_next(data_loader *l, const int32_t **tokens, const int32_t **targets,
                     char *err, size_t err_cap);

/* RNG state after the last batch returned by data_loader_next (the start
 * state when none was returned yet): save this to resume. Batches prefetched
 * but not returned do not count. */
void data_loader_rng_state(const data_loader *l, data_rng *out);

/* Stop the prefetch thread and free everything. NULL is a no-op. */
void data_loader_close(data_loader *l);

/* A fixed validation set: n_batches batches of [micro_batch, seq_len]. */
typedef struct data_eval_set {
    uint32_t n_batches;
    uint32_t micro_batch;
    uint32_t seq_len;
    int32_t *tokens;  /* n_batches * micro_batch * seq_len */
    int32_t *targets; /* same shape */
} data_eval_set;

/* Build the set from evenly spaced windows of ds. Caller frees with
 * data_eval_set_free. */
int data_eval_set_build(const dataset *ds, uint32_t n_batches, uint32_t micro_batch,
                        uint32_t seq_len, data_eval_set *out, char *err, size_t err_cap);
void data_eval_set_free(data_eval_set *s);

#endif
