/*
 * train.h - the training loop behind `orch train`: data, engine, schedule,
 * gradient accumulation, evaluation, early stopping, checkpoints, exact
 * resume, metrics.jsonl, progress output and the optional /metrics endpoint.
 *
 * One step t (1-based):
 *   grads_zero; grad_accum times: next batch from the data loader,
 *   forward_backward with grad_scale 1/grad_accum; loss = mean of the
 *   micro-batch losses; optimizer_step with step t, lr = schedule(t) and
 *   grad_clip (which returns the gradient norm); a metrics.jsonl line.
 *   Every eval_every steps and at the last step: validation loss over the
 *   fixed eval set (eval_batches batches), perplexity exp(loss), early
 *   stopping bookkeeping (patience counted in evaluations, 0 = off).
 *   Every checkpoint_every steps and when the run stops: a checkpoint
 *   (ckpt_save, keeping keep_checkpoints plus the best by validation loss).
 *
 * Run directory: ckpt-NNNNNNNN/ (checkpoint.h), latest, config.json (the
 * merged config), metrics.jsonl: one JSON object per step with step, loss,
 * lr, grad_norm, tokens_per_s, elapsed (seconds, continued across resumes),
 * and val_loss, val_ppl on evaluation steps. Losses are printed with 9
 * significant digits, so equal floats print equal text.
 *
 * state.json (written into every checkpoint):
 *   {"format":1, "step":N, "total_steps":N, "engine":"cpu",
 *    "engine_threads":N, "tokenizer":"byte",
 *    "data":{"rng":"<64 hex digits: xoshiro256** state>","tokens_seen":N,
 *            "world":N,"grad_accum":N},   (the ranks and accumulation that
 *            wrote it: a resume on another number of ranks keeps
 *            world x grad_accum micro-batches per step, see train.c)
 *    "schedule":{"kind":"cosine","lr":X,"min_lr":X,"warmup_steps":N,
 *                "total_steps":N,"last_lr":X},
 *    "best_val_loss":X|null, "best_val_step":N, "evals_since_best":N,
 *    "metrics":{"loss":X,"val_loss":X|null,"elapsed_s":X,"tokens_per_s":X},
 *    "config":{ the merged config, see config.h }}
 * The config's data paths are absolute (train_run applies
 * config_absolute_data_paths), so the checkpoint works from any directory.
 * Readers (generate, eval, serve) need only "config" and "tokenizer";
 * ckpt_read_config (checkpoint.h) reads them. train_state.h writes and
 * parses the rest.
 *
 * Resume: the weights and AdamW moments, the step counter (AdamW bias
 * correction), the data RNG state, the early-stopping state and elapsed time
 * are restored, and metrics.jsonl is cut back to the checkpoint's step, so
 * the continued run produces the same losses, bit for bit, as an
 * uninterrupted one on the same engine and thread count.
 *
 * Init (fine-tuning): a fresh run (step 0, zero AdamW moments, the data RNG
 * from train.seed) whose weights are loaded from init_ckpt by tensor name.
 *
 * Output: progress and the summary go to opts->out (NULL = silent); with
 * opts->live a single progress line is rewritten with '\r'.
 * Threads: train_run runs on the calling thread (plus the data prefetch
 * thread and the engine's own workers); stop_flag may be set from a signal
 * handler.
 * Errors: -1 with one line in err and *err_kind = TRAIN_ERR_INPUT (bad
 * config, data, engine or checkpoint: exit 2) or TRAIN_ERR_RUNTIME (exit 1).
 * A failure never damages an existing checkpoint.
 */
#ifndef ORCH_TRAIN_H
#define ORCH_TRAIN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "orchestrator/core/config.h"

/* Exit status of `orch train` after a signal stopped it with a checkpoint. */
#define TRAIN_EXIT_INTERRUPTED 3

typedef enum train_err_kind { TRAIN_ERR_RUNTIME = 1, TRAIN_ERR_INPUT = 2 } train_err_kind;

typedef enum train_outcome {
    TRAIN_COMPLETED = 0,     /* reached the last step */
    TRAIN_EARLY_STOPPED = 1, /* validation loss stopped improving */
    TRAIN_INTERRUPTED = 2,   /* stop_flag was set (signal) */
    TRAIN_PAUSED = 3,        /* stop_after steps done (this invocation) */
    TRAIN_ALREADY_DONE = 4   /* the resumed checkpoint is at the last step */
} train_outcome;

typedef struct train_opts {
    const orch_config *cfg;           /* merged config (borrowed) */
    const char *run_dir;              /* output directory (created) */
    const char *resume_ckpt;          /* checkpoint directory, or NULL */
    const char *init_ckpt;            /* fresh run starting from these weights
                                      (e.g. imported GPT-2), or NULL */
    uint64_t stop_after;              /* steps in this invocation; 0 = no limit */
    int metrics_port;                 /* < 0: off; 0: any free port */
    volatile sig_atomic_t *stop_flag; /* may be NULL */
    FILE *out;                        /* progress and summary; NULL = silent */
    int live;                         /* rewrite the progress line with '\r' */
} train_opts;

typedef struct train_result {
    train_outcome outcome;
    uint64_t start_step; /* step of the resumed checkpoint (0 fresh) */
    uint64_t step;       /* last completed step */
    uint64_t total_steps;
    double last_loss;     /* NaN if no step ran */
    double last_val_loss; /* NaN if never evaluated */
    double best_val_loss; /* NaN if never evaluated */
    uint64_t best_val_step;
    double elapsed_s;      /* total across resumes */
    double run_s;          /* this invocation */
    double tokens_per_s;   /* this invocation */
    char checkpoint[4096]; /* last checkpoint written or resumed ("" none) */
} train_result;

int train_run(const train_opts *o, train_result *res, int *err_kind, char *err,
              size_t err_cap);

#endif
