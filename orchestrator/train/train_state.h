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
} train_state;

/* state.json for a checkpoint: s, the engine's name, the schedule and the
 * merged config cfg (also the source of "engine_threads" and "tokenizer").
 * NULL when out of memory. */
char *train_state_to_json(const train_state *s, const char *engine_name,
                          const lr_schedule *sched, const orch_config *cfg);

/* Parse state.json text into *s (zeroed first; absent optional fields get
 * their defaults: NaN losses, 0 counters). tok (may be NULL) receives the
 * "tokenizer" string ("" when absent). Errors: not a JSON object, an
 * unsupported format, a missing or bad "step" or "data.rng". */
int train_state_from_json(const char *text, train_state *s, char *tok, size_t tok_cap,
                          char *err, size_t err_cap);

#endif
