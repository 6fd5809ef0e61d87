/*
 * seq_output.c - token, text, log-probability and stop-string bookkeeping of
 * a scheduled sequence. See seq_output.h.
 */
#include "orchestrator/serve/seq_output.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/utf8.h"
#include "orchestrator/serve/sampler.h"

/* Earliest stop-string match at or after the region new text can affect;
 * returns 1 and *pos, or 0. */
static int find_stop(const sched_seq *q, size_t old_len, size_t *pos) {
    size_t best = SIZE_MAX;
    for (uint32_t i = 0; i < q->n_stop; i++) {
        size_t sl = strlen(q->stop[i]);
        if (sl == 0 || sl > q->text_len) continue;
        size_t from = old_len >= sl - 1 ? old_len - (sl - 1) : 0;
        const char *hit = memmem(q->text + from, q->text_len - from, q->stop[i], sl);
        if (hit && (size_t)(hit - q->text) < best) best = (size_t)(hit - q->text);
    }
    if (best == SIZE_MAX) return 0;
    *pos = best;
    return 1;
}

/* Longest suffix of the text that is a proper prefix of a stop string. */
static size_t stop_holdback(const sched_seq *q) {
    size_t hold = 0;
    for (uint32_t i = 0; i < q->n_stop; i++) {
        size_t sl = strlen(q->stop[i]);
        size_t k = sl > 0 ? sl - 1 : 0;
        if (k > q->text_len) k = q->text_len;
        for (; k > hold; k--) {
            if (memcmp(q->text + q->text_len - k, q->stop[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* Log-probability of tok under row, and the top alternatives (-1 / -inf
 * where the vocabulary has fewer). */
static void logprob_of(const sched_seq *q, const float *row, uint32_t vocab, int32_t tok,
                       double *lp, int32_t *top_ids, double *top_lp) {
    if (!row) { /* a forced token (jump-forward): certain, no alternatives */
        *lp = 0.0;
        for (uint32_t k = 0; k < q->top_logprobs; k++) {
            top_ids[k] = k ? -1 : tok;
            top_lp[k] = k ? -INFINITY : 0.0;
        }
        return;
    }
    *lp = sampler_logprob(row, vocab, tok);
    if (q->top_logprobs) {
        uint32_t got = sampler_top_logprobs(row, vocab, q->top_logprobs, top_ids, top_lp);
        for (uint32_t k = got; k < q->top_logprobs; k++) {
            top_ids[k] = -1;
            top_lp[k] = -INFINITY;
        }
    }
}

/* Room for one more token and nb more text bytes (under q->lock). */
static int reserve_outputs(sched_seq *q, size_t nb) {
    uint32_t n = q->n_out + 1, cap = q->cap_out;
    int oom = 0;
    if (n > cap) {
        uint32_t c = cap ? cap * 2 : 16;
        while (c < n) c *= 2;
        int32_t *t = realloc(q->out_tokens, c * sizeof *t);
        if (t) q->out_tokens = t;
        uint32_t *te = realloc(q->out_text_end, c * sizeof *te);
        if (te) q->out_text_end = te;
        oom = !t || !te;
        if (!oom && q->want_logprobs) {
            double *l = realloc(q->out_logprob, c * sizeof *l);
            if (l) q->out_logprob = l;
            oom = !l;
            if (!oom && q->top_logprobs) {
                int32_t *ti =
                    realloc(q->out_top_ids, (size_t)c * q->top_logprobs * sizeof *ti);
                if (ti) q->out_top_ids = ti;
                double *tl =
                    realloc(q->out_top_lp, (size_t)c * q->top_logprobs * sizeof *tl);
                if (tl) q->out_top_lp = tl;
                oom = !ti || !tl;
            }
        }
        if (!oom) q->cap_out = c;
    }
    if (!oom && q->text_len + nb + 1 > q->text_cap) {
        size_t c = q->text_cap ? q->text_cap * 2 : 64;
        while (c < q->text_len + nb + 1) c *= 2;
        char *t = realloc(q->text, c);
        if (t) {
            q->text = t;
            q->text_cap = c;
        } else {
            oom = 1;
        }
    }
    return oom ? -1 : 0;
}

/* After appending token i: end-of-text, stop strings, length. */
static int check_stop(sched_seq *q, const seq_token *t, uint32_t i, size_t old_len) {
    int reason = SCHED_FINISH_NONE;
    size_t stop_at;
    if (t->is_eot) {
        reason = SCHED_FINISH_STOP;
    } else if (q->n_stop && q->n_out >= q->min_tokens &&
               find_stop(q, old_len, &stop_at)) {
        q->text_len = stop_at;
        q->text[stop_at] = '\0';
        /* tokens before i ended where the text may now be cut; token i's end
         * is written below (reading it here would read an unset value) */
        for (uint32_t k = 0; k < i; k++)
            if (q->out_text_end[k] > stop_at) q->out_text_end[k] = (uint32_t)stop_at;
        reason = SCHED_FINISH_STOP;
    }
    q->out_text_end[i] = (uint32_t)q->text_len;
    if (reason == SCHED_FINISH_NONE && (q->n_out >= q->max_tokens || t->context_full))
        reason = SCHED_FINISH_LENGTH;
    return reason;
}

int seq_output_append(sched_seq *q, const seq_token *t) {
    double lp = 0;
    int32_t top_ids[SCHED_MAX_TOP_LOGPROBS];
    double top_lp[SCHED_MAX_TOP_LOGPROBS];
    if (q->want_logprobs) logprob_of(q, t->row, t->vocab, t->id, &lp, top_ids, top_lp);
    pthread_mutex_lock(q->lock);
    if (reserve_outputs(q, t->n_bytes) != 0) {
        pthread_mutex_unlock(q->lock);
        return -1;
    }
    uint32_t i = q->n_out, k = q->top_logprobs;
    q->out_tokens[i] = t->id;
    if (q->want_logprobs) {
        q->out_logprob[i] = lp;
        if (k) {
            memcpy(q->out_top_ids + (size_t)i * k, top_ids, k * sizeof *top_ids);
            memcpy(q->out_top_lp + (size_t)i * k, top_lp, k * sizeof *top_lp);
        }
    }
    size_t old_len = q->text_len;
    memcpy(q->text + q->text_len, t->bytes, t->n_bytes);
    q->text_len += t->n_bytes;
    q->text[q->text_len] = '\0';
    q->n_out = i + 1;
    if (i == 0) q->t_first_token = t->now;
    int reason = check_stop(q, t, i, old_len);
    if (reason == SCHED_FINISH_NONE) {
        size_t hold = q->n_stop ? stop_holdback(q) : 0;
        size_t ready = utf8_complete_prefix_len(q->text, q->text_len - hold);
        if (ready > q->text_ready) q->text_ready = ready;
    }
    pthread_mutex_unlock(q->lock);
    return reason;
}

int seq_output_prompt_logprobs(sched_seq *q, uint32_t pos0, uint32_t rows,
                               const float *logits, uint32_t vocab) {
    uint32_t k = q->top_logprobs;
    pthread_mutex_lock(q->lock);
    if (!q->prompt_logprob) {
        q->prompt_logprob = malloc(q->n_prompt * sizeof(double));
        if (k) {
            q->prompt_top_ids = malloc((size_t)q->n_prompt * k * sizeof(int32_t));
            q->prompt_top_lp = malloc((size_t)q->n_prompt * k * sizeof(double));
        }
        if (!q->prompt_logprob || (k && (!q->prompt_top_ids || !q->prompt_top_lp))) {
            pthread_mutex_unlock(q->lock);
            return -1;
        }
        for (uint32_t p = 0; p < q->n_prompt; p++) {
            q->prompt_logprob[p] = NAN;
            for (uint32_t j = 0; j < k; j++) {
                q->prompt_top_ids[(size_t)p * k + j] = -1;
                q->prompt_top_lp[(size_t)p * k + j] = -INFINITY;
            }
        }
    }
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t target = pos0 + r + 1;
        if (target >= q->n_prompt) break;
        const float *row = logits + (size_t)r * vocab;
        logprob_of(q, row, vocab, q->prompt[target], &q->prompt_logprob[target],
                   k ? q->prompt_top_ids + (size_t)target * k : NULL,
                   k ? q->prompt_top_lp + (size_t)target * k : NULL);
    }
    pthread_mutex_unlock(q->lock);
    return 0;
}

/* Declared in scheduler.h (part of the sched_seq contract). */
void sched_seq_free_outputs(sched_seq *s) {
    if (!s) return;
    free(s->out_tokens);
    free(s->out_logprob);
    free(s->out_top_ids);
    free(s->out_top_lp);
    free(s->out_text_end);
    free(s->prompt_logprob);
    free(s->prompt_top_ids);
    free(s->prompt_top_lp);
    free(s->text);
    s->out_tokens = NULL;
    s->out_logprob = s->out_top_lp = s->prompt_logprob = s->prompt_top_lp = NULL;
    s->out_top_ids = s->prompt_top_ids = NULL;
    s->out_text_end = NULL;
    s->text = NULL;
    s->n_out = s->cap_out = 0;
    s->text_len = s->text_cap = s->text_ready = 0;
}
