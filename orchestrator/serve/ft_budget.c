/*
 * ft_budget.c - the fine-tuning token budget of co-serving: an online
 * latency model plus AIMD feedback on the measured p99 TPOT (see
 * ft_budget.h).
 */
#include "orchestrator/serve/ft_budget.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

#define NP           4    /* model parameters: c0, c_dec, c_pre, c_ft */
#define PRIOR_W      1e-2 /* weight of the c_ft = R * c_pre pseudo-observation */
#define FORGET       0.99 /* RLS forgetting factor per observation */
#define P_INIT       1e4
#define REG_W        1e-3 /* weight of the anti-wind-up pseudo-observations */
#define MIN_OBS      4    /* observations before the model is trusted */
#define FACTOR_INIT  0.5
#define SHRINK       0.7 /* factor after an iteration over the target */
#define DITHER_EVERY 8

struct ft_budget {
    ft_budget_config cfg;
    double theta[NP]; /* ms, ms per decode / prefill / fine-tuning token */
    double P[NP][NP];
    uint64_t n_obs;
    double factor;
    uint32_t last_ft; /* the budget of the last observed iteration */
    double *ring;     /* TPOT (ms) of the last `window` decode iterations */
    uint32_t ring_n, ring_pos;
    double *scratch;
    uint64_t decode_iters, within, paused, ft_tokens;
};

ft_budget *ft_budget_create(const ft_budget_config *cfg, char *err, size_t err_cap) {
    if (!cfg || cfg->granule == 0 || cfg->max_tokens < cfg->granule) {
        util_set_err(err, err_cap,
                     "fine-tuning budget: max_tokens (%u) must be at least one "
                     "micro-batch row (%u tokens)",
                     cfg ? cfg->max_tokens : 0, cfg ? cfg->granule : 0);
        return NULL;
    }
    if (!(cfg->slo_tpot_ms >= 0) || !(cfg->slo_ttft_ms >= 0) ||
        !isfinite(cfg->slo_tpot_ms) || !isfinite(cfg->slo_ttft_ms)) {
        util_set_err(err, err_cap, "fine-tuning budget: SLO targets must be >= 0 ms");
        return NULL;
    }
    ft_budget *b = util_calloc(1, sizeof *b);
    if (!b) {
        util_set_err(err, err_cap, "fine-tuning budget: out of memory");
        return NULL;
    }
    b->cfg = *cfg;
    if (!b->cfg.window) b->cfg.window = FT_BUDGET_DEFAULT_WINDOW;
    if (!(b->cfg.ft_ratio > 0) || !isfinite(b->cfg.ft_ratio))
        b->cfg.ft_ratio = FT_BUDGET_PRIOR_FT_RATIO;
    b->ring = calloc(b->cfg.window, sizeof *b->ring);
    b->scratch = calloc(b->cfg.window, sizeof *b->scratch);
    if (!b->ring || !b->scratch) {
        ft_budget_free(b);
        util_set_err(err, err_cap, "fine-tuning budget: out of memory");
        return NULL;
    }
    for (int i = 0; i < NP; i++) b->P[i][i] = P_INIT;
    b->factor = FACTOR_INIT;
    return b;
}

void ft_budget_free(ft_budget *b) {
    if (!b) return;
    free(b->ring);
    free(b->scratch);
    free(b);
}

/* One weighted RLS update with regressor x and target y (weight w). */
static void rls_update(ft_budget *b, const double x[NP], double y, double w,
                       double forget) {
    double Px[NP];
    for (int i = 0; i < NP; i++) {
        Px[i] = 0;
        for (int j = 0; j < NP; j++) Px[i] += b->P[i][j] * x[j];
    }
    double denom = forget / w;
    for (int i = 0; i < NP; i++) denom += x[i] * Px[i];
    if (!(denom > 0) || !isfinite(denom)) return;
    double pred = 0;
    for (int i = 0; i < NP; i++) pred += b->theta[i] * x[i];
    double e = y - pred;
    for (int i = 0; i < NP; i++) b->theta[i] += Px[i] / denom * e;
    for (int i = 0; i < NP; i++)
        for (int j = 0; j < NP; j++)
            b->P[i][j] = (b->P[i][j] - Px[i] * Px[j] / denom) / forget;
}

/* The predicted time (ms) of an iteration's inference part. The fitted sum,
 * not a sum of clamped coefficients: when the load hardly varies (always 4
 * decode tokens, say) the intercept and the per-token cost are collinear and
 * one of them may come out negative while their sum at the operating point
 * is right; clamping each would predict several times the real time. */
static double inference_ms(const ft_budget *b, uint32_t decode, uint32_t prefill) {
    double t = b->theta[0] + b->theta[1] * decode + b->theta[2] * prefill;
    return t > 0 ? t : 0;
}

/* The cost (ms) of one fine-tuning token as used for planning: never free. */
static double finetune_ms(const ft_budget *b) {
    return b->theta[3] > 1e-6 ? b->theta[3] : 1e-6;
}

static int cmp_double(const void *a, const void *c) {
    double x = *(const double *)a, y = *(const double *)c;
    return (x > y) - (x < y);
}

static double p99(ft_budget *b) {
    if (!b->ring_n) return 0;
    memcpy(b->scratch, b->ring, b->ring_n * sizeof *b->ring);
    qsort(b->scratch, b->ring_n, sizeof *b->scratch, cmp_double);
    size_t k = (size_t)ceil(0.99 * b->ring_n) - 1;
    return b->scratch[k];
}

uint32_t ft_budget_next(ft_budget *b, uint32_t decode_tokens, uint32_t prefill_tokens,
                        double oldest_wait_ms) {
    const ft_budget_config *c = &b->cfg;
    if (c->slo_ttft_ms > 0 && oldest_wait_ms >= FT_BUDGET_TTFT_GUARD * c->slo_ttft_ms)
        return 0;
    if (decode_tokens == 0 && c->slo_ttft_ms > 0 && b->n_obs >= MIN_OBS) {
        /* no TPOT to protect, but a request arriving now waits for this
         * iteration: keep it within the TTFT guard */
        double room =
            FT_BUDGET_TTFT_GUARD * c->slo_ttft_ms - inference_ms(b, 0, prefill_tokens);
        double n = room > 0 ? room / finetune_ms(b) : 0;
        if (n > c->max_tokens) n = c->max_tokens;
        uint32_t rows = (uint32_t)(n / c->granule);
        return (rows ? rows : 1) * c->granule; /* progress even when tight */
    }
    if (c->slo_tpot_ms <= 0 || decode_tokens == 0) return c->max_tokens;
    if (b->n_obs < MIN_OBS) return c->granule; /* learn with one row */
    double t0 = inference_ms(b, decode_tokens, prefill_tokens);
    double room = c->slo_tpot_ms * FT_BUDGET_HEADROOM - t0;
    if (room <= 0) {
        b->paused++;
        return 0;
    }
    double n = room / finetune_ms(b) * b->factor;
    /* never more than twice the last budget (plus a row): a model that has
     * just been thrown off cannot make the budget jump */
    double ramp = 2.0 * b->last_ft + c->granule;
    if (n > ramp) n = ramp;
    if (n > c->max_tokens) n = c->max_tokens;
    /* every DITHER_EVERY-th iteration half the budget: without variation in
     * the fine-tuning tokens their cost cannot be told from the rest of the
     * iteration (a slowdown would be blamed on the wrong term) */
    if (b->n_obs % DITHER_EVERY == DITHER_EVERY - 1) n *= 0.5;
    uint32_t rows = (uint32_t)(n / c->granule);
    return rows * c->granule;
}

void ft_budget_observe(ft_budget *b, uint32_t decode_tokens, uint32_t prefill_tokens,
                       uint32_t finetune_tokens, double seconds) {
    if (!(seconds >= 0) || !isfinite(seconds)) return;
    double ms = seconds * 1e3;
    double x[NP] = { 1.0, decode_tokens, prefill_tokens, finetune_tokens };
    rls_update(b, x, ms, 1.0, FORGET);
    /* no covariance wind-up in directions the data does not excite (a
     * constant decode count, no prefill): each coefficient is also
     * "observed" at its current value with a small weight, which bounds P
     * there and changes no estimate */
    for (int i = 0; i < NP; i++) {
        double e[NP] = { 0 };
        e[i] = 1.0;
        rls_update(b, e, b->theta[i], REG_W, 1.0);
    }
    /* the prior that a fine-tuning token costs R prefill tokens (forward +
     * backward through the same weights), weakly: it decides only what the
     * data cannot (no prefill, or a budget that hardly varies) */
    double px[NP] = { 0, 0, -b->cfg.ft_ratio, 1.0 };
    rls_update(b, px, 0.0, PRIOR_W, 1.0);
    b->n_obs++;
    b->last_ft = finetune_tokens;
    b->ft_tokens += finetune_tokens;
    if (decode_tokens == 0 || b->cfg.slo_tpot_ms <= 0) return;
    b->decode_iters++;
    double target = b->cfg.slo_tpot_ms;
    if (ms <= target) b->within++;
    b->ring[b->ring_pos] = ms;
    b->ring_pos = (b->ring_pos + 1) % b->cfg.window;
    if (b->ring_n < b->cfg.window) b->ring_n++;
    if (ms > target) {
        if (finetune_tokens) b->factor *= SHRINK;
    } else if (p99(b) < FT_BUDGET_GROW_BELOW * target) {
        b->factor += FT_BUDGET_GROW_STEP;
        if (b->factor > 1) b->factor = 1;
    }
}

void ft_budget_get_stats(ft_budget *b, ft_budget_stats *out) {
    memset(out, 0, sizeof *out);
    out->p99_tpot_ms = p99(b);
    out->attainment = b->decode_iters ? (double)b->within / (double)b->decode_iters : 1.0;
    out->factor = b->factor;
    for (int i = 0; i < NP; i++) out->model_ms[i] = b->theta[i];
    out->iterations = b->n_obs;
    out->decode_iters = b->decode_iters;
    out->paused_iters = b->paused;
    out->finetune_tokens = b->ft_tokens;
}
