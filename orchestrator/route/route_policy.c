/*
 * route_policy.c - the routing decision of `orch route` (see route_policy.h).
 */
#include "orchestrator/route/route_policy.h"

#include <string.h>

static const char *const names[] = { "cache_aware", "round_robin", "least_load",
                                     "power_of_two" };

int route_policy_parse(const char *name, route_policy_kind *out) {
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = (route_policy_kind)i;
            return 0;
        }
    return -1;
}

const char *route_policy_name(route_policy_kind k) {
    return (unsigned)k < 4u ? names[k] : "unknown";
}

static uint64_t next_rand(uint64_t *s) { /* xorshift64 */
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static int least_loaded(const route_candidate *c, size_t n) {
    int best = -1;
    for (size_t i = 0; i < n; i++)
        if (c[i].eligible && (best < 0 || c[i].load < c[best].load)) best = (int)i;
    return best;
}

static int pick_cache_aware(const route_policy_params *p, const route_candidate *c,
                            size_t n, size_t req_len, route_pick *out) {
    uint32_t lo = UINT32_MAX, hi = 0;
    int best_match = -1, smallest = -1;
    for (size_t i = 0; i < n; i++) {
        if (!c[i].eligible) continue;
        if (c[i].load < lo) lo = c[i].load;
        if (c[i].load > hi) hi = c[i].load;
        if (best_match < 0 || c[i].match > c[best_match].match ||
            (c[i].match == c[best_match].match && c[i].load < c[best_match].load))
            best_match = (int)i;
        if (smallest < 0 || c[i].tree_size < c[smallest].tree_size ||
            (c[i].tree_size == c[smallest].tree_size && c[i].load < c[smallest].load))
            smallest = (int)i;
    }
    if (best_match < 0) return -1;
    double best = req_len ? (double)c[best_match].match / (double)req_len : 0.0;
    if (hi - lo > p->balance_abs && (double)hi > p->balance_rel * (double)lo) {
        out->reason = ROUTE_WHY_BALANCE;
        return least_loaded(c, n);
    }
    if (best > p->cache_threshold) {
        out->reason = ROUTE_WHY_CACHE;
        return best_match;
    }
    out->reason = ROUTE_WHY_SMALLEST;
    return smallest;
}

route_pick route_policy_pick(const route_policy_params *p, const route_candidate *c,
                             size_t n, size_t req_len, uint64_t *rr, uint64_t *rng) {
    route_pick out = { -1, ROUTE_WHY_POLICY, 0.0 };
    size_t n_ok = 0;
    for (size_t i = 0; i < n; i++) n_ok += c[i].eligible != 0;
    if (n_ok == 0) return out;
    switch (p->kind) {
    case ROUTE_ROUND_ROBIN:
        for (size_t k = 0; k < n; k++) {
            size_t i = (size_t)((*rr + k) % n);
            if (c[i].eligible) {
                out.index = (int)i;
                *rr = i + 1;
                break;
            }
        }
        break;
    case ROUTE_LEAST_LOAD: out.index = least_loaded(c, n); break;
    case ROUTE_POWER_OF_TWO: {
        size_t a = (size_t)(next_rand(rng) % n_ok), b = a;
        if (n_ok > 1) {
            b = (size_t)(next_rand(rng) % (n_ok - 1));
            if (b >= a) b++;
        }
        int ia = -1, ib = -1;
        for (size_t i = 0, k = 0; i < n; i++) {
            if (!c[i].eligible) continue;
            if (k == a) ia = (int)i;
            if (k == b) ib = (int)i;
            k++;
        }
        out.index = c[ib].load < c[ia].load ? ib : ia;
        break;
    }
    default: out.index = pick_cache_aware(p, c, n, req_len, &out); break;
    }
    if (out.index >= 0 && req_len)
        out.match_ratio = (double)c[out.index].match / (double)req_len;
    return out;
}
