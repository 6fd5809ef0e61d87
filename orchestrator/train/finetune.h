/*
 * finetune.h - the offline LoRA fine-tuning loop behind `orch finetune`:
 * the base checkpoint opened through its engine (which must have LoRA
 * adapters: ABI 1.4, ORCH_CAP_LORA), the JSONL data packed by
 * finetune_data.h, one adapter trained with AdamW (base weights frozen),
 * the lr schedule (lr_schedule.h), gradient accumulation, evaluation on a
 * validation file, early stopping, metrics.jsonl and the progress line of
 * `orch train` (train_metrics.h), atomic checkpoints with exact resume, and
 * the adapter in the PEFT layout (peft_adapter.h).
 *
 * One step t (1-based): adapter_grads_zero; grad_accum times the next
 * micro-batch of `batch` rows, adapter_forward_backward with grad_scale
 * 1/grad_accum; loss = mean of the micro-batch losses;
 * adapter_optimizer_step (step t, lr = schedule(t), grad_clip). Rows come
 * from the packed training set in an order shuffled per epoch
 * (Fisher-Yates from the data rng, seeded by `seed`); an epoch that ends
 * inside a micro-batch continues into the next one. total steps = max_steps,
 * else ceil(epochs * rows / (batch * grad_accum)).
 * Evaluation (with a validation file) every eval_every steps and at the
 * last step: the target-weighted mean of adapter_eval_loss over all
 * validation rows; patience > 0 stops after that many evaluations without a
 * new best.
 *
 * Output directory DIR:
 *   DIR/adapter_model.safetensors, DIR/adapter_config.json  the adapter of
 *                    the newest checkpoint (the final one at the end), PEFT
 *   DIR/ckpt-NNNNNNNN/ adapter_model.safetensors, adapter_config.json,
 *                    optimizer.safetensors ("m.NAME", "v.NAME": the AdamW
 *                    moments), state.json (the settings, step, data position
 *                    and rng, early-stopping state, SHA-256 of the two
 *                    safetensors files and of the data files)
 *   DIR/latest       "ckpt-NNNNNNNN\n"
 *   DIR/metrics.jsonl  train.h's fields, one line per step
 * A checkpoint is written into DIR/.tmp-ckpt-STEP-PID, fsynced and renamed
 * into place before `latest` is replaced (atomically), then DIR's adapter
 * files are replaced (each atomically), then checkpoints beyond `keep`
 * are removed. A failure at any point (a full disk) leaves `latest` naming a
 * complete checkpoint and DIR's adapter files whole (the previous ones or
 * the new ones).
 * Resume (resume = 1): the settings come from DIR/latest's state.json; the
 * adapter, its moments, the step, the epoch, the position in it and the rng,
 * the early-stopping state and the elapsed time are restored and
 * metrics.jsonl is cut back to the checkpoint's step, so the continued run
 * gives the same numbers, bit for bit, as an uninterrupted one on the same
 * engine. Changed data files are refused.
 *
 * Threads: runs on the calling thread; stop_flag may be set from a signal
 * handler (the step finishes, a checkpoint is written).
 * Errors: -1 with one line in err; *err_kind TRAIN_ERR_INPUT (exit 2: bad
 * flags, data, checkpoint, engine) or TRAIN_ERR_RUNTIME (exit 1).
 */
#ifndef ORCH_FINETUNE_H
#define ORCH_FINETUNE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "orchestrator/train/train.h"

#define FINETUNE_PATH_MAX 4096

/* Everything a run is made of; saved in state.json, restored on resume. */
typedef struct finetune_settings {
    char checkpoint[FINETUNE_PATH_MAX]; /* the base: run or checkpoint dir */
    char data[FINETUNE_PATH_MAX];
    char validation[FINETUNE_PATH_MAX];    /* "" = none */
    char engine[FINETUNE_PATH_MAX];        /* "" = the base config's */
    char chat_template[FINETUNE_PATH_MAX]; /* "" = the model's / default */
    double epochs;                         /* used when max_steps is 0 */
    uint64_t max_steps;
    double lr, min_lr;
    uint64_t warmup_steps;
    char schedule[16]; /* cosine | linear | constant */
    uint32_t rank;
    double alpha;
    char targets[128];       /* the target list as given (peft_targets_parse) */
    uint32_t batch, seq_len; /* seq_len 0 = the model's context */
    uint32_t grad_accum;
    uint64_t seed;
    double weight_decay, grad_clip, beta1, beta2, eps;
    uint64_t eval_every;
    uint32_t patience;
    uint64_t checkpoint_every; /* 0 = only at the end (and on a stop) */
    uint32_t keep;             /* checkpoints kept (>= 1) */
    int packing; /* 1: examples packed into rows; 0: one per row (finetune_data.h) */
} finetune_settings;

/* The defaults: epochs 1, lr 2e-4, min_lr 0, warmup 0, linear, rank 8,
 * alpha 16, targets "qkv", batch 8, seq_len 0, grad_accum 1, seed 0,
 * weight_decay 0, grad_clip 1, betas 0.9/0.999, eps 1e-8, eval_every 0
 * (= once per epoch), patience 0, checkpoint_every 0, keep 2, packing 1. */
void finetune_settings_default(finetune_settings *s);

/* Apply the keys of the JSON object in PATH (--config) to *s: any subset of
 * checkpoint, data, validation, engine, chat_template, schedule, targets
 * (strings), epochs, lr, min_lr, alpha, weight_decay, grad_clip, beta1,
 * beta2, eps (numbers), max_steps, warmup_steps, rank, batch, seq_len,
 * grad_accum, seed, eval_every, patience, checkpoint_every, keep
 * (non-negative integers; seed also as a decimal string), packing (a
 * boolean). Errors: "PATH:
 * not a JSON object", "PATH: unknown key 'x'", "PATH: KEY: expected ..."
 * (one line; *s may be partly updated). */
int finetune_settings_from_file(const char *path, finetune_settings *s, char *err,
                                size_t err_cap);

typedef struct finetune_opts {
    finetune_settings set; /* ignored with resume (state.json's are used) */
    const char *out_dir;
    int resume;
    int trust_config_engine;
    int threads;         /* < 0: the base config's */
    uint64_t stop_after; /* steps in this invocation; 0 = no limit */
    volatile sig_atomic_t *stop_flag;
    FILE *out; /* progress; NULL = silent */
    int live;
} finetune_opts;

int finetune_run(const finetune_opts *o, train_result *res, int *err_kind, char *err,
                 size_t err_cap);

#endif
