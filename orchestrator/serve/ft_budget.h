/*
 * ft_budget.h - the fine-tuning share of co-serving's hybrid token
 * scheduler (FlexLLM, arXiv 2402.18789): each scheduler iteration carries
 * decode tokens first, then prefill chunks, and fine-tuning tokens fill what
 * is left, as many as the inference latency target allows.
 *
 * How the share is chosen:
 *   - a latency model of one iteration, t = c0 + c_dec*decode_tokens +
 *     c_pre*prefill_tokens + c_ft*finetune_tokens, fitted online by
 *     exponentially weighted recursive least squares to the iterations the
 *     scheduler reports (ft_budget_observe), with a weak prior that a
 *     fine-tuning token costs R = FT_BUDGET_PRIOR_FT_RATIO prefill tokens
 *     (its forward plus the backward through the same weights) for what the
 *     data cannot decide, and pseudo-observations that stop covariance
 *     wind-up in directions the load never excites;
 *   - the budget is the largest multiple of `granule` tokens for which the
 *     predicted iteration time (the fitted sum for the inference part, even
 *     when a coefficient alone came out negative) stays under the TPOT target (one decode token
 *     per running sequence per iteration: the iteration time IS the time per
 *     output token), times a feedback factor, and at most twice the last
 *     budget plus a row (no jumps when the model has just been thrown off),
 *     halved one iteration in eight (the variation that keeps the cost of a
 *     fine-tuning token identifiable);
 *   - the feedback factor (AIMD, 0..1, starting at 0.5): an iteration with
 *     fine-tuning tokens over the target multiplies it by 0.7; while the
 *     measured p99 TPOT of the last `window` decode iterations is under
 *     FT_BUDGET_GROW_BELOW of the target it grows by FT_BUDGET_GROW_STEP; so a
 *     model that is wrong (noise, another process) is corrected by what is
 *     measured;
 *   - paused (0 tokens) while inference alone is predicted to miss the
 *     target, and while the oldest waiting request has used
 *     FT_BUDGET_TTFT_GUARD of its TTFT target;
 *   - without running decodes (no TPOT to protect) the whole max_tokens,
 *     or with a TTFT target as many as keep the iteration (which a request
 *     arriving now waits for) under FT_BUDGET_TTFT_GUARD of it, at least
 *     one row.
 * Threads: one ft_budget is used by one thread (the scheduler's).
 * Memory: the caller owns it (ft_budget_create / ft_budget_free).
 * Errors: ft_budget_create returns NULL on a bad configuration (message in
 * err) or when out of memory.
 */
#ifndef ORCH_FT_BUDGET_H
#define ORCH_FT_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#define FT_BUDGET_DEFAULT_WINDOW 256u
#define FT_BUDGET_PRIOR_FT_RATIO 3.0  /* a fine-tuning token ~ 3 prefill tokens */
#define FT_BUDGET_GROW_BELOW     0.85 /* p99 under 85% of the target: grow */
#define FT_BUDGET_GROW_STEP      0.05
#define FT_BUDGET_HEADROOM       0.95 /* plan iterations to 95% of the target */
#define FT_BUDGET_TTFT_GUARD     0.5

typedef struct ft_budget_config {
    double slo_tpot_ms;  /* p99 time per output token target; 0 = none */
    double slo_ttft_ms;  /* time to first token target; 0 = none */
    uint32_t max_tokens; /* fine-tuning tokens per iteration at most (>= granule) */
    uint32_t granule;    /* budgets are multiples of this (a micro-batch row) */
    uint32_t window;     /* iterations in the p99 window; 0 = default */
    double ft_ratio;     /* the prior R; 0 = FT_BUDGET_PRIOR_FT_RATIO (token-level
                            fine-tuning counts forward and backward rows
                            apart: about half of it) */
} ft_budget_config;

typedef struct ft_budget ft_budget;

/* What the controller knows now (for metrics and logs). */
typedef struct ft_budget_stats {
    double p99_tpot_ms;       /* over the window (0 before any decode) */
    double attainment;        /* share of decode iterations within the target */
    double factor;            /* the feedback factor, 0..1 */
    double model_ms[4];       /* c0, c_dec, c_pre, c_ft in ms (per token) */
    uint64_t iterations;      /* observed */
    uint64_t decode_iters;    /* observed with decode tokens */
    uint64_t paused_iters;    /* next() returned 0 because inference needs it all */
    uint64_t finetune_tokens; /* observed */
} ft_budget_stats;

ft_budget *ft_budget_create(const ft_budget_config *cfg, char *err, size_t err_cap);
void ft_budget_free(ft_budget *b);

/* Fine-tuning tokens for the next iteration, which will carry
 * decode_tokens decode tokens (one per running sequence) and
 * prefill_tokens prefill tokens; oldest_wait_ms is how long the oldest
 * request still waiting for its first token has waited (0 = none). */
uint32_t ft_budget_next(ft_budget *b, uint32_t decode_tokens, uint32_t prefill_tokens,
                        double oldest_wait_ms);

/* The iteration that ran: its token counts and wall time. */
void ft_budget_observe(ft_budget *b, uint32_t decode_tokens, uint32_t prefill_tokens,
                       uint32_t finetune_tokens, double seconds);

/* (Sorts the window: not const.) */
void ft_budget_get_stats(ft_budget *b, ft_budget_stats *out);

#endif
