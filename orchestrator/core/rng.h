/*
 * rng.h - the orchestrator's one pseudo-random generator: xoshiro256**
 * seeded through splitmix64. Used by the data loader (window sampling, whose
 * state goes into checkpoints) and the sampler (per-request streams).
 *
 * The state is a plain struct: copy it to snapshot a stream.
 * Threads: a generator is used by one thread at a time; functions are
 * reentrant. No errors.
 */
#ifndef ORCH_RNG_H
#define ORCH_RNG_H

#include <stdint.h>

typedef struct orch_rng {
    uint64_t s[4];
} orch_rng;

/* One splitmix64 step: advances *x and returns the mixed value. */
uint64_t rng_splitmix64(uint64_t *x);
/* Seed from one 64-bit value (any value, including 0). */
void rng_seed(orch_rng *r, uint64_t seed);
/* Next raw 64-bit value. */
uint64_t rng_next(orch_rng *r);
/* Uniform integer in [0, n) without modulo bias; 0 when n <= 1. */
uint64_t rng_below(orch_rng *r, uint64_t n);
/* Uniform double in [0, 1) with 53 random bits. */
double rng_uniform(orch_rng *r);

#endif
