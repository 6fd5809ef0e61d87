/*
 * train_metrics.h - what a training run reports while it runs: the run
 * directory's metrics.jsonl (one JSON object per step, cut back to the
 * resumed step on resume) and the optional Prometheus /metrics endpoint
 * (--metrics-port). The metrics.jsonl fields are listed in train.h.
 *
 * Memory: a train_metrics owns its registry and HTTP server until
 * train_metrics_stop; the metrics.jsonl stream belongs to the caller
 * (fclose).
 * Threads: used by the training thread; the HTTP server reads the registry
 * from its own threads (metrics.h makes that safe).
 * Errors: 0 / -1 with a one-line message in err; nothing is printed except
 * the endpoint's address on `out`. A metrics.jsonl write error is an error
 * of the run (train_jsonl_append), never ignored.
 */
#ifndef ORCH_TRAIN_METRICS_H
#define ORCH_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/train/train_state.h"

/* Figures exported on --metrics-port (all NULL when it is off; the update
 * functions accept that). */
typedef struct train_metrics {
    metrics_registry *reg;
    metrics_http *http;
    metrics_series *step, *max_steps, *loss, *val_loss, *val_ppl, *lr, *grad_norm, *tps,
        *elapsed, *tokens, *ckpts, *step_seconds;
} train_metrics;

/* port < 0: off (nothing is started); 0: any free port. Seeds the gauges
 * from st and prints "metrics: http://127.0.0.1:PORT/metrics" to out (may be
 * NULL). */
int train_metrics_start(train_metrics *m, int port, const train_state *st, FILE *out,
                        char *err, size_t err_cap);
void train_metrics_stop(train_metrics *m); /* safe on a zeroed struct */

/* One optimizer step: gauges, token counter and step-time histogram. */
void train_metrics_step(train_metrics *m, uint64_t step, double loss, double lr,
                        double grad_norm, const train_state *st, double step_tokens,
                        double step_seconds);
/* One evaluation. */
void train_metrics_eval(train_metrics *m, double val_loss);

/* Open RUN_DIR/metrics.jsonl for appending into *out: truncated when fresh;
 * otherwise lines with a step above keep_step (and a torn last line) are
 * dropped first, by an atomic rewrite. Everything goes through fsio (fault
 * sites); a metrics.jsonl that is not a regular file (a FIFO, a device) is
 * refused without blocking. *out only carries the descriptor: write lines
 * with train_jsonl_append, fclose it when done. */
int train_jsonl_open(const char *run_dir, uint64_t keep_step, int fresh, FILE **out,
                     char *err, size_t err_cap);

/* Append one line (val_loss and val_ppl only when val_loss is finite) to f,
 * opened by train_jsonl_open for RUN_DIR, with one write(2) (O_APPEND: a line
 * is never split by buffering). f may be NULL (nothing is written).
 * Errors: -1 with err = "RUN_DIR/metrics.jsonl: write: REASON" (e.g. no space
 * left on device) and errno set. The caller stops the run: the line is lost,
 * and a resume from the last checkpoint writes it again (metrics.jsonl is cut
 * back to the checkpoint's step), so nothing is saved first. */
int train_jsonl_append(FILE *f, const char *run_dir, uint64_t step, double loss,
                       double lr, double grad_norm, double tokens_per_s, double elapsed,
                       double val_loss, char *err, size_t err_cap);

#endif
