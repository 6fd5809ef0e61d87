/*
 * seq_output.h - what a scheduled sequence produces, written by the scheduler
 * thread into the output fields of its sched_seq (scheduler.h): each sampled
 * token's id, log-probability and top alternatives (when asked), its bytes
 * appended to the text, the stop conditions (end-of-text token, stop strings
 * found anywhere in the generated text, also across token boundaries,
 * max_tokens, the context), the streamable length text_ready (holding back a
 * tail that could still become a stop string and an incomplete UTF-8
 * character, utf8.h), and prompt log-probabilities.
 *
 * Memory: the output arrays grow with realloc and belong to the sequence;
 * sched_seq_free_outputs (declared in scheduler.h, defined here) frees them.
 * Threads: called on the scheduler thread only; each function takes q->lock
 * while it writes the outputs, so readers holding that lock see consistent
 * values. Errors: -1 when out of memory (the outputs keep what they had).
 */
#ifndef ORCH_SEQ_OUTPUT_H
#define ORCH_SEQ_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/serve/scheduler.h"

/* A sampled token to append. */
typedef struct seq_token {
    int32_t id;
    const char *bytes; /* its text (n_bytes; none for an end-of-text token) */
    size_t n_bytes;
    int is_eot;       /* the end-of-text token: finish with STOP */
    int context_full; /* the sequence now fills the model's context */
    const float *row; /* the logits it was sampled from (log-probabilities);
                         NULL for a forced token: log-probability 0 */
    uint32_t vocab;
    double now; /* util_now() (time of the first token) */
} seq_token;

/* Append t to q's outputs and check the stop conditions. Returns the
 * sched_finish reason (SCHED_FINISH_NONE: go on), or -1 out of memory. A
 * matched stop string and what follows it are cut from the text. */
int seq_output_append(sched_seq *q, const seq_token *t);

/* Prompt log-probabilities from `rows` rows of ALL-mode logits: row r is
 * position pos0 + r and predicts prompt[pos0 + r + 1] (the arrays are
 * allocated on the first call; position 0 stays NaN). */
int seq_output_prompt_logprobs(sched_seq *q, uint32_t pos0, uint32_t rows,
                               const float *logits, uint32_t vocab);

#endif
