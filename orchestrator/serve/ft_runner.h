/*
 * ft_runner.h - fine-tuning jobs run INSIDE `orch serve` (co-serving,
 * FlexLLM): LoRA adapters trained on the served base model's one copy of
 * the weights while inference goes on, each job's micro-batches riding in
 * the scheduler's iterations as the token budget (ft_budget.h) allows.
 *
 * A job (ft_jobs.h) moves through:
 *   validating_files  a preparer thread reads its training (and
 *                     validation) file from the file store and tokenizes
 *                     it with the server's tokenizer and chat template
 *                     (finetune_data.h; packed into rows, or one example
 *                     per row with --ft-no-packing); the hyper-parameters left "auto"
 *                     are decided (n_epochs 3; batch_size the largest
 *                     multiple of the micro-batch up to 8 rows that the data
 *                     fills; learning_rate_multiplier 1); bad data fails the
 *                     job with the file's line number; the validation file's
 *                     loss (target-weighted, as orch finetune evaluates) is
 *                     reported at each checkpoint and at the end ("valid_loss"
 *                     in the event's data and the checkpoint's metrics);
 *   queued            waits for the runner (one job runs at a time);
 *   running           on the scheduler thread: the adapter is created
 *                     (rank, alpha, targets and seed of the job, the
 *                     server's defaults otherwise); one optimizer step is
 *                     batch_size / micro_batch micro-batches of micro_batch
 *                     rows, taken in ft_order's order, each a
 *                     adapter_forward_backward (or a share of a
 *                     coserve_forward) with grad_scale 1/accumulation, then
 *                     AdamW (the base lr times the multiplier, linear decay
 *                     to 0 over the job's steps, betas 0.9/0.999, eps 1e-8,
 *                     clipping at 1): the arithmetic of `orch finetune
 *                     --batch micro_batch --grad-accum batch_size/micro_batch`
 *                     on the same data and seed; an event per step ("Step
 *                     N/M: training loss=X");
 *   succeeded         the adapter saved in the PEFT layout under
 *                     STATE/adapters/NAME and served at once as model NAME
 *                     ("ft:BASE:SUFFIX:ID8", fine_tuned_model);
 *   failed / cancelled  the adapter is dropped.
 * Checkpoints: every checkpoint_every steps (default once an epoch) the
 * adapter (PEFT), its AdamW moments and the data position go to
 * STATE/jobs/ID/ckpt (replaced whole: written beside it, then exchanged),
 * and a checkpoint object is recorded. A job that was running when the
 * server stopped is queued again (ft_jobs_open) and continues from its
 * checkpoint: the finished adapter is the same, bit for bit, as without the
 * interruption. A checkpoint that does not fit the server's settings now
 * (--ft-seq-len, --ft-micro-batch, --ft-no-packing) is ignored with a warning event.
 *
 * Threads: ft_runner_notify and ft_runner_destroy from any thread; the
 * hook functions only on the scheduler thread (they use the engine
 * context). Memory: the caller owns the runner; it borrows everything in
 * its config. Errors: -1 with a message.
 */
#ifndef ORCH_FT_RUNNER_H
#define ORCH_FT_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/metrics.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/coserve.h"
#include "orchestrator/serve/file_store.h"
#include "orchestrator/serve/ft_budget.h"
#include "orchestrator/serve/ft_jobs.h"
#include "orchestrator/serve/scheduler.h"

typedef struct ft_runner_config {
    const engine_handle *engine;
    orch_engine_ctx *ctx;
    const orch_model_desc *model;
    const char *base_name;
    const tokenizer *tok;
    const chat_template *tmpl; /* NULL: messages examples are refused */
    const char *tmpl_error;
    ft_jobs *jobs;
    file_store *files;
    coserve *cs; /* where a finished adapter is served */
    metrics_registry *metrics;
    const char *state_dir;
    /* defaults and shape of the work */
    double lr;                 /* base learning rate (x the job's multiplier) */
    uint32_t rank;             /* LoRA rank when the job does not say */
    double alpha;              /* LoRA alpha when the job does not say */
    uint32_t targets;          /* ORCH_LORA_TARGET_* */
    uint32_t seq_len;          /* positions per row */
    uint32_t micro_batch;      /* rows per micro-batch */
    uint64_t checkpoint_every; /* steps between checkpoints; 0 = once an epoch */
    ft_budget_config slo;      /* the token budget (granule = micro-batch tokens) */
    int temporal;              /* --coserve-mode temporal: time sharing (the baseline):
                                  after each inference pass one micro-batch in
                                  calls of its own; the budget decides only
                                  iterations without inference */
    int token_level;           /* --ft-granularity token: ABI 1.5 streams, the budget
                                  in chunks of chunk_tokens rows */
    uint32_t chunk_tokens;     /* rows per budget unit at token level */
    int no_packing;            /* --ft-no-packing: one example per row */
} ft_runner_config;

typedef struct ft_runner ft_runner;

ft_runner *ft_runner_create(const ft_runner_config *cfg, char *err, size_t err_cap);
/* Stop the preparer thread and drop the running job's adapter (call after
 * the scheduler is destroyed). NULL is a no-op. */
void ft_runner_destroy(ft_runner *r);
/* The scheduler to wake when work is ready. */
void ft_runner_attach(ft_runner *r, scheduler *s);
/* A job was created or cancelled: look again. */
void ft_runner_notify(ft_runner *r);

/* The scheduler hooks (through coserve_set_runner). */
int ft_runner_tasks(ft_runner *r);
uint32_t ft_runner_take(ft_runner *r, uint32_t decode_tokens, uint32_t prefill_tokens,
                        double oldest_wait_ms, orch_finetune_batch *ft, uint32_t cap);
void ft_runner_done(ft_runner *r, int32_t st, const char *err, const float *losses,
                    uint32_t n, uint32_t decode_tokens, uint32_t prefill_tokens,
                    double seconds);
/* The token-level hooks (token_level): the stream of the running
 * micro-batch (opened on demand) and its rows for the next iteration; then
 * its progress. */
uint32_t ft_runner_take_rows(ft_runner *r, uint32_t decode_tokens,
                             uint32_t prefill_tokens, double oldest_wait_ms,
                             uint32_t *stream);
void ft_runner_done_rows(ft_runner *r, int32_t st, const char *err,
                         const orch_ft_progress *progress, uint32_t decode_tokens,
                         uint32_t prefill_tokens, double seconds);
/* 1 when the runner runs token-level (the scheduler's take_rows hooks). */
int ft_runner_token_level(const ft_runner *r);
/* 1 under --coserve-mode temporal (the scheduler's `separate`). */
int ft_runner_temporal(const ft_runner *r);

#endif
