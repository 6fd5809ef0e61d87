/*
 * train_state.h - the trainer's part of a checkpoint: the state.json text
 * that every checkpoint of a run carries besides its tensors (step, data RNG,
 * early-stopping bookkeeping, last metrics, the schedule and the merged
 * config), written at each save and read back on resume. The format is
 * described in train.h.
 *
 * Memory: train_state_to_json returns malloc'd text (caller frees).
 * Threads: reentrant.
 * Errors: train_state_from_json returns 0 / -1 with a one-line message in
 * err ("state.json: ..."); nothing is printed.
 */
#ifndef ORCH_TRAIN_STATE_H
#define ORCH_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/config.h"
#include "orchestrator/data/data_loader.h"
#include "orchestrator/train/lr_schedule.h"

#define TRAIN_STATE_FORMAT 1

/* Everything a checkpoint must carry besides tensors and the config. */
typedef struct train_state {
    uint64_t step;
    uint64_t total_steps;
    data_rng rng;
    uint64_t tokens_seen;
    double best_val_loss; /* NaN: none yet */
    uint64_t best_val_step;
    uint32_t evals_since_best;
    double last_loss;
    double last_val_loss;
    double last_lr;
    double elapsed_s;
    double tokens_per_s;
    /* The data-parallel layout that wrote the state ("data.world",
     * "data.grad_accum"; 0 when absent: an older checkpoint). A resume on a
     * different number of ranks re-derives grad_accum from them (train.c). */
    uint32_t world;
    uint32_t grad_accum;
} train_state;

/* state.json for a checkpoint: s, the engine's name, the schedule and the
 * merged config cfg (also the source of "engine_threads" and "tokenizer").
 * NULL when out of memory. */
char *train_state_to_json(const train_state *s, const char *engine_name,
                          const lr_schedule *sched, const orch_config *cfg);

/* Parse state.json text into *s (zeroed first; absent optional fields get
 * their defaults: NaN losses, 0 counters). tok (may be NULL) receives the
 * "tokenizer" string ("" when absent). Every number is range-checked before
 * it is converted (json_read.h): step, total_steps, data.tokens_seen and the
 * schedule's step counts are integers in [0, 2^53], best_val_step is at most
 * step, evals_since_best and engine_threads fit 32 bits, losses are finite
 * or null, times, rates and learning rates finite and >= 0. Errors: not a
 * JSON object (or trailing text after it), an unsupported format, a number
 * of the wrong type or out of range ("state.json: step: 1e+300 is out of
 * range (0..9007199254740992)"), a missing "step", a bad "data.rng". */
int train_state_from_json(const char *text, train_state *s, char *tok, size_t tok_cap,
                          char *err, size_t err_cap);

#endif
