/*
 * sampler.c - next-token sampling: greedy, temperature, top-k, top-p, allowed
 * mask, log-probabilities and the xoshiro256** RNG. See sampler.h.
 */
#include "orchestrator/serve/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

/* ------------------------------------------------------------------------- */
/* RNG                                                                        */
/* ------------------------------------------------------------------------- */
void sampler_rng_seed(sampler_rng *rng, uint64_t seed) { rng_seed(rng, seed); }

void sampler_rng_seed_stream(sampler_rng *rng, uint64_t seed, uint64_t stream) {
    uint64_t x = stream;
    uint64_t mix = stream ? rng_splitmix64(&x) : 0; /* stream 0 = plain seed */
    rng_seed(rng, seed ^ mix);
}

uint64_t sampler_rng_next(sampler_rng *rng) { return rng_next(rng); }

double sampler_rng_uniform(sampler_rng *rng) { return rng_uniform(rng); }

/* ------------------------------------------------------------------------- */
/* Parameters                                                                 */
/* ------------------------------------------------------------------------- */
sampler_params sampler_params_default(void) {
    sampler_params p = { .temperature = 1.0f, .top_k = 0, .top_p = 1.0f };
    return p;
}

int sampler_params_check(const sampler_params *p, char *err, size_t err_cap) {
    if (!p) {
        util_set_err(err, err_cap, "sampler: no parameters");
        return -1;
    }
    if (!isfinite(p->temperature) || p->temperature < 0.0f) {
        util_set_err(err, err_cap, "temperature must be a finite number >= 0");
        return -1;
    }
    if (!isfinite(p->top_p) || p->top_p <= 0.0f || p->top_p > 1.0f) {
        util_set_err(err, err_cap, "top_p must be in (0, 1]");
        return -1;
    }
    if (!isfinite(p->min_p) || p->min_p < 0.0f || p->min_p > 1.0f) {
        util_set_err(err, err_cap, "min_p must be in [0, 1]");
        return -1;
    }
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty)) {
        util_set_err(err, err_cap,
                     "presence_penalty and frequency_penalty must be finite");
        return -1;
    }
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty < 0.0f) {
        util_set_err(err, err_cap, "repetition_penalty must be a finite number > 0");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Scratch                                                                    */
/* ------------------------------------------------------------------------- */
typedef struct cand {
    double p; /* weight (unnormalised probability) */
    int32_t id;
} cand;

struct sampler_ws {
    uint32_t vocab;
    cand *c;
    float *logits;   /* sampler_process_logits' copy */
    uint32_t *count; /* per-token counts, all zero between calls */
};

sampler_ws *sampler_ws_create(uint32_t vocab) {
    if (vocab == 0) return NULL;
    sampler_ws *ws = util_calloc(1, sizeof *ws);
    if (!ws) return NULL;
    ws->c = util_calloc(vocab, sizeof *ws->c);
    ws->logits = util_calloc(vocab, sizeof *ws->logits);
    ws->count = util_calloc(vocab, sizeof *ws->count);
    if (!ws->c || !ws->logits || !ws->count) {
        sampler_ws_free(ws);
        return NULL;
    }
    ws->vocab = vocab;
    return ws;
}

void sampler_ws_free(sampler_ws *ws) {
    if (!ws) return;
    free(ws->c);
    free(ws->logits);
    free(ws->count);
    free(ws);
}

/* ------------------------------------------------------------------------- */
/* Logit processing                                                           */
/* ------------------------------------------------------------------------- */
static int in_vocab(int32_t t, uint32_t vocab) { return t >= 0 && (uint32_t)t < vocab; }

const float *sampler_process_logits(const sampler_params *p, const sampler_history *h,
                                    const float *logits, uint32_t vocab, sampler_ws *ws) {
    if (!p || !h || !logits) return logits;
    float rep = p->repetition_penalty;
    int use_rep = rep > 0.0f && rep != 1.0f && (h->n_prompt || h->n_output);
    int use_pf =
        (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) && h->n_output;
    if (!use_rep && !use_pf && !h->n_bias && !h->n_banned) return logits;
    if (!ws || vocab > ws->vocab) return NULL;
    float *out = ws->logits;
    memcpy(out, logits, (size_t)vocab * sizeof *out);
    for (uint32_t i = 0; i < h->n_bias; i++)
        if (in_vocab(h->bias_ids[i], vocab)) out[h->bias_ids[i]] += h->bias[i];
    if (use_rep || use_pf) {
        /* count[t]: bit 31 = seen in the prompt, the rest = times generated */
        uint32_t *cnt = ws->count;
        const uint32_t SEEN = 1u << 31;
        if (use_rep)
            for (uint32_t i = 0; i < h->n_prompt; i++)
                if (in_vocab(h->prompt[i], vocab)) cnt[h->prompt[i]] |= SEEN;
        for (uint32_t i = 0; i < h->n_output; i++)
            if (in_vocab(h->output[i], vocab) && (cnt[h->output[i]] & ~SEEN) < SEEN - 1)
                cnt[h->output[i]]++;
        /* visit each token once (the first time it is met), then clear */
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? h->output : h->prompt;
            uint32_t n = pass ? h->n_output : (use_rep ? h->n_prompt : 0);
            for (uint32_t i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (!in_vocab(t, vocab) || cnt[t] == 0) continue;
                uint32_t gen = cnt[t] & ~SEEN;
                float x = out[t];
                if (use_rep) x = x > 0.0f ? x / rep : x * rep;
                if (use_pf && gen)
                    x -= p->presence_penalty + p->frequency_penalty * (float)gen;
                out[t] = x;
                cnt[t] = 0;
            }
        }
    }
    for (uint32_t i = 0; i < h->n_banned; i++)
        if (in_vocab(h->banned[i], vocab)) out[h->banned[i]] = -INFINITY;
    return out;
}

/* Descending by weight, ascending id on ties: a total order, so qsort's
 * instability cannot change results. */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Move the k best candidates of c[0..n) to the front (unordered), O(n)
 * expected (quickselect with a deterministic middle pivot). */
static void select_top(cand *c, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        cand pivot = c[lo + (hi - lo) / 2];
        /* three-way partition: [lo,lt) better, [lt,gt) equal, [gt,hi) worse */
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            int r = cand_cmp(&c[i], &pivot);
            if (r < 0) {
                cand t = c[lt];
                c[lt] = c[i];
                c[i] = t;
                lt++;
                i++;
            } else if (r > 0) {
                gt--;
                cand t = c[gt];
                c[gt] = c[i];
                c[i] = t;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return;
    }
}

/* ------------------------------------------------------------------------- */
/* Sampling                                                                   */
/* ------------------------------------------------------------------------- */
int32_t sampler_argmax(const float *logits, uint32_t vocab, const uint32_t *mask) {
    if (!logits) return -1;
    int32_t best = -1;
    float bv = 0.0f;
    for (uint32_t v = 0; v < vocab; v++) {
        if (!sampler_mask_allows(mask, v)) continue;
        float x = logits[v];
        if (!isfinite(x)) continue; /* counts as -inf: never chosen */
        if (best < 0 || x > bv) {
            best = (int32_t)v;
            bv = x;
        }
    }
    return best;
}

/* The candidates of a non-greedy draw in ws->c[0..*n): allowed, finite,
 * weighted exp((logit - max) / T), then min-p, top-k and top-p applied, in a
 * deterministic order. Returns the total weight, or -1 when none is left. */
static double candidates(const sampler_params *p, const float *logits, uint32_t vocab,
                         const uint32_t *mask, sampler_ws *ws, size_t *n_out) {
    cand *c = ws->c;
    size_t n = 0;
    double maxl = -INFINITY;
    for (uint32_t v = 0; v < vocab; v++) {
        if (!sampler_mask_allows(mask, v) || !isfinite(logits[v])) continue;
        if (logits[v] > maxl) maxl = logits[v];
        c[n].id = (int32_t)v;
        c[n].p = logits[v];
        n++;
    }
    if (n == 0) return -1;
    double inv_t = 1.0 / (double)p->temperature;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        c[i].p = exp((c[i].p - maxl) * inv_t);
        total += c[i].p;
    }

    /* min-p: the most likely token weighs exactly 1 */
    if (p->min_p > 0.0f) {
        size_t m = 0;
        total = 0.0;
        for (size_t i = 0; i < n; i++)
            if (c[i].p >= (double)p->min_p) {
                c[m++] = c[i];
                total += c[i].p;
            }
        n = m;
    }

    /* top-k */
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        total = 0.0;
        for (size_t i = 0; i < n; i++) total += c[i].p;
    }

    /* top-p: the nucleus is the smallest prefix (by descending probability)
     * whose mass reaches top_p. Tokens lighter than (1-top_p)/n together weigh
     * less than 1-top_p, so they can never be inside the nucleus: drop them
     * before sorting. */
    int sorted = 0;
    if (p->top_p < 1.0f) {
        double cut = (1.0 - (double)p->top_p) / (double)n * total;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (c[i].p >= cut) c[m++] = c[i];
        n = m;
        qsort(c, n, sizeof *c, cand_cmp);
        sorted = 1;
        double want = (double)p->top_p * total, acc = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            acc += c[i].p;
            if (acc >= want) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        total = 0.0;
        for (size_t i = 0; i < n; i++) total += c[i].p;
    }
    if (!sorted && (p->top_k > 0 || p->min_p > 0.0f)) {
        /* make the draw independent of quickselect's arrangement */
        qsort(c, n, sizeof *c, cand_cmp);
    }
    *n_out = n;
    return total;
}

static int is_greedy(const sampler_params *p) {
    return p->temperature <= 0.0f || p->top_k == 1;
}

int32_t sampler_sample(const sampler_params *p, const float *logits, uint32_t vocab,
                       const uint32_t *mask, sampler_rng *rng, sampler_ws *ws) {
    if (!p || !logits || vocab == 0) return -1;
    if (is_greedy(p)) {
        int32_t t = sampler_argmax(logits, vocab, mask);
        /* top_k == 1 is greedy too, but a sampled request still consumes its
         * RNG value so its stream stays aligned with other settings. */
        if (p->temperature > 0.0f && rng) (void)sampler_rng_next(rng);
        return t;
    }
    if (!ws || !rng || vocab > ws->vocab) return -1;
    size_t n = 0;
    double total = candidates(p, logits, vocab, mask, ws, &n);
    if (total < 0) return -1;
    const cand *c = ws->c;
    double u = sampler_rng_uniform(rng) * total, acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id; /* rounding: the last candidate */
}

int sampler_distribution(const sampler_params *p, const float *logits, uint32_t vocab,
                         const uint32_t *mask, sampler_ws *ws, double *out) {
    if (!p || !logits || !out || vocab == 0) return -1;
    for (uint32_t v = 0; v < vocab; v++) out[v] = 0.0;
    if (is_greedy(p)) {
        int32_t t = sampler_argmax(logits, vocab, mask);
        if (t < 0) return -1;
        out[t] = 1.0;
        return 0;
    }
    if (!ws || vocab > ws->vocab) return -1;
    size_t n = 0;
    double total = candidates(p, logits, vocab, mask, ws, &n);
    if (total <= 0) return -1;
    for (size_t i = 0; i < n; i++) out[ws->c[i].id] = ws->c[i].p / total;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Log-probabilities                                                          */
/* ------------------------------------------------------------------------- */
static double log_sum_exp(const float *logits, uint32_t vocab, double *maxl) {
    double m = -INFINITY;
    for (uint32_t v = 0; v < vocab; v++)
        if (isfinite(logits[v]) && logits[v] > m) m = logits[v];
    double s = 0.0;
    for (uint32_t v = 0; v < vocab; v++)
        if (isfinite(logits[v])) s += exp((double)logits[v] - m);
    *maxl = m;
    return s > 0 ? log(s) : -INFINITY; /* no finite logit: log(0) */
}

double sampler_logprob(const float *logits, uint32_t vocab, int32_t token) {
    if (!logits || token < 0 || (uint32_t)token >= vocab || !isfinite(logits[token]))
        return -INFINITY;
    double m;
    double lse = log_sum_exp(logits, vocab, &m);
    return (double)logits[token] - m - lse;
}

uint32_t sampler_top_logprobs(const float *logits, uint32_t vocab, uint32_t n,
                              int32_t *out_ids, double *out_logprobs) {
    if (!logits || vocab == 0 || n == 0) return 0;
    if (n > 32) n = 32;
    if (n > vocab) n = vocab;
    /* insertion into a small sorted list */
    int32_t ids[32];
    float vals[32] = { 0 }; /* vals[have - 1] is read only once have == n */
    uint32_t have = 0;
    for (uint32_t v = 0; v < vocab; v++) {
        float x = isfinite(logits[v]) ? logits[v] : -INFINITY;
        if (have == n && !(x > vals[have - 1])) continue;
        uint32_t pos = have < n ? have : n - 1;
        while (pos > 0 && x > vals[pos - 1]) {
            vals[pos] = vals[pos - 1];
            ids[pos] = ids[pos - 1];
            pos--;
        }
        vals[pos] = x;
        ids[pos] = (int32_t)v;
        if (have < n) have++;
    }
    double m;
    double lse = log_sum_exp(logits, vocab, &m);
    for (uint32_t i = 0; i < have; i++) {
        out_ids[i] = ids[i];
        out_logprobs[i] = isfinite(vals[i]) ? (double)vals[i] - m - lse : -INFINITY;
    }
    return have;
}
