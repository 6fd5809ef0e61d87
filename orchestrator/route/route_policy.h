/*
 * route_policy.h - which worker `orch route` sends a request to: the pure
 * decision, given a snapshot of the candidate workers (route_workers.h takes
 * it and applies the choice).
 *
 * Policies:
 *   round_robin   the next eligible worker after the previous choice;
 *   least_load    the eligible worker with the fewest requests in flight
 *                 (ties: the lowest index);
 *   power_of_two  two distinct eligible workers drawn at random, the less
 *                 loaded of them (ties: the first drawn);
 *   cache_aware   SGLang's cache-aware policy:
 *                 1. imbalanced load (max - min > balance_abs and
 *                    max > balance_rel * min, over the eligible workers):
 *                    the least-loaded worker;
 *                 2. else the worker whose radix tree matches the longest
 *                    prefix of the request (ties: fewer in flight, then the
 *                    lowest index), if the match covers more than
 *                    cache_threshold of the request's length;
 *                 3. else the worker with the smallest tree (ties: fewer in
 *                    flight, then the lowest index).
 *
 * Memory: none held. Threads: reentrant (the caller owns *state).
 * Errors: route_policy_pick returns -1 when no candidate is eligible;
 * route_policy_parse returns -1 for an unknown name.
 */
#ifndef ORCH_ROUTE_POLICY_H
#define ORCH_ROUTE_POLICY_H

#include <stddef.h>
#include <stdint.h>

typedef enum route_policy_kind {
    ROUTE_CACHE_AWARE = 0,
    ROUTE_ROUND_ROBIN,
    ROUTE_LEAST_LOAD,
    ROUTE_POWER_OF_TWO
} route_policy_kind;

/* Why cache_aware chose (route_pick.reason; other policies: ROUTE_WHY_POLICY). */
enum { ROUTE_WHY_POLICY = 0, ROUTE_WHY_BALANCE, ROUTE_WHY_CACHE, ROUTE_WHY_SMALLEST };

typedef struct route_policy_params {
    route_policy_kind kind;
    double cache_threshold; /* fraction of the request (default 0.5) */
    uint32_t balance_abs;   /* default 32 */
    double balance_rel;     /* default 1.0001 */
} route_policy_params;

typedef struct route_candidate {
    int eligible;     /* up, serves the model, not tried already */
    uint32_t load;    /* requests in flight */
    size_t match;     /* bytes of the request its tree matches */
    size_t tree_size; /* bytes in its tree */
} route_candidate;

typedef struct route_pick {
    int index;          /* the chosen candidate, or -1 */
    int reason;         /* ROUTE_WHY_* */
    double match_ratio; /* the chosen worker's match / request length (0 for
                           an empty request or none chosen) */
} route_pick;

/* Pick among c[0..n) for a request of req_len bytes. *rr is the round-robin
 * position, *rng a random state (any non-zero value), both updated. */
route_pick route_policy_pick(const route_policy_params *p, const route_candidate *c,
                             size_t n, size_t req_len, uint64_t *rr, uint64_t *rng);

/* "cache_aware" | "round_robin" | "least_load" | "power_of_two" -> *out. */
int route_policy_parse(const char *name, route_policy_kind *out);
const char *route_policy_name(route_policy_kind k);

#endif
