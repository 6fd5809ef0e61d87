/*
 * train_metrics.c - metrics.jsonl and the /metrics endpoint of a training
 * run. See train_metrics.h.
 */
#include "orchestrator/train/train_metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"

/* ------------------------------------------------------------------------- */
/* /metrics                                                                   */
/* ------------------------------------------------------------------------- */
static metrics_series *gauge(metrics_registry *r, const char *name, const char *help) {
    return metrics_series_get(metrics_gauge(r, name, help, 0, NULL), NULL);
}

int train_metrics_start(train_metrics *m, int port, const train_state *st, FILE *out,
                        char *err, size_t cap) {
    memset(m, 0, sizeof *m);
    if (port < 0) return 0;
    if (port > 65535) {
        util_set_err(err, cap, "--metrics-port %d: out of range", port);
        return -1;
    }
    m->reg = metrics_registry_create();
    if (!m->reg) {
        util_set_err(err, cap, "metrics: out of memory");
        return -1;
    }
    metrics_registry *r = m->reg;
    m->step = gauge(r, "orch_train_step", "Last completed training step.");
    m->max_steps = gauge(r, "orch_train_max_steps", "Steps this run trains for.");
    m->loss = gauge(r, "orch_train_loss", "Training loss of the last step.");
    m->val_loss =
        gauge(r, "orch_train_val_loss", "Validation loss of the last evaluation.");
    m->val_ppl = gauge(r, "orch_train_val_perplexity",
                       "Validation perplexity of the last evaluation.");
    m->lr = gauge(r, "orch_train_learning_rate", "Learning rate of the last step.");
    m->grad_norm =
        gauge(r, "orch_train_grad_norm", "Global gradient L2 norm before clipping.");
    m->tps =
        gauge(r, "orch_train_tokens_per_second", "Training throughput of the last step.");
    m->elapsed = gauge(r, "orch_train_elapsed_seconds", "Training time across resumes.");
    m->tokens =
        metrics_series_get(metrics_counter(r, "orch_train_tokens_total",
                                           "Tokens trained on in this process.", 0, NULL),
                           NULL);
    m->ckpts = metrics_series_get(metrics_counter(r, "orch_train_checkpoints_total",
                                                  "Checkpoints written by this process.",
                                                  0, NULL),
                                  NULL);
    m->step_seconds = metrics_series_get(
        metrics_histogram(r, "orch_train_step_seconds",
                          "Wall time of one optimizer step.", 0, NULL, NULL, 0),
        NULL);
    metrics_gauge_set(m->max_steps, (double)st->total_steps);
    metrics_gauge_set(m->step, (double)st->step);
    metrics_gauge_set(m->elapsed, st->elapsed_s);
    char msg[512] = "";
    m->http = metrics_http_start(r, NULL, (uint16_t)port, msg, sizeof msg);
    if (!m->http) {
        util_set_err(err, cap, "--metrics-port %d: %s", port, msg);
        return -1;
    }
    if (out)
        fprintf(out, "metrics: http://127.0.0.1:%u/metrics\n",
                metrics_http_port(m->http));
    return 0;
}

void train_metrics_stop(train_metrics *m) {
    metrics_http_stop(m->http);
    metrics_registry_free(m->reg);
    m->http = NULL;
    m->reg = NULL;
}

void train_metrics_step(train_metrics *m, uint64_t step, double loss, double lr,
                        double grad_norm, const train_state *st, double step_tokens,
                        double step_seconds) {
    metrics_gauge_set(m->step, (double)step);
    metrics_gauge_set(m->loss, loss);
    metrics_gauge_set(m->lr, lr);
    metrics_gauge_set(m->grad_norm, grad_norm);
    metrics_gauge_set(m->tps, st->tokens_per_s);
    metrics_gauge_set(m->elapsed, st->elapsed_s);
    metrics_counter_add(m->tokens, step_tokens);
    metrics_histogram_observe(m->step_seconds, step_seconds);
}

void train_metrics_eval(train_metrics *m, double val_loss) {
    metrics_gauge_set(m->val_loss, val_loss);
    metrics_gauge_set(m->val_ppl, exp(val_loss));
}

/* ------------------------------------------------------------------------- */
/* metrics.jsonl                                                              */
/* ------------------------------------------------------------------------- */

static int jsonl_path(char *path, size_t cap, const char *run_dir, char *err,
                      size_t err_cap) {
    if (snprintf(path, cap, "%s/metrics.jsonl", run_dir) >= (int)cap) {
        util_set_err(err, err_cap, "%s: path too long", run_dir);
        return -1;
    }
    return 0;
}

/* Rewrite PATH (open as `in`) keeping the complete lines whose step is <=
 * keep_step. */
static int jsonl_cut(const char *path, FILE *in, uint64_t keep_step, char *err,
                     size_t cap) {
    fsio_atomic_file f;
    if (fsio_atomic_open(&f, path, err, cap) != 0) return -1;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = getline(&line, &lcap, in)) > 0) {
        if (line[n - 1] != '\n') break; /* torn last line */
        cJSON *j = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
        int keep = cJSON_IsNumber(s) && s->valuedouble <= (double)keep_step;
        cJSON_Delete(j);
        if (keep) rc = fsio_atomic_write(&f, line, (size_t)n, err, cap);
    }
    if (rc == 0 && ferror(in)) {
        util_set_err(err, cap, "%s: read: %s", path, strerror(errno));
        rc = -1;
    }
    free(line);
    if (rc != 0) {
        fsio_atomic_abort(&f);
        return -1;
    }
    return fsio_atomic_commit(&f, err, cap);
}

/* Open an existing PATH for reading without blocking on a FIFO: 1 and *in
 * when it is a regular file, 0 when it does not exist, -1 otherwise. */
static int open_existing(const char *path, FILE **in, char *err, size_t cap) {
    int fd;
    if (fsio_open_regular(path, &fd, NULL, err, cap) != 0)
        return errno == ENOENT ? 0 : -1;
    *in = fdopen(fd, "r");
    if (!*in) {
        util_set_err(err, cap, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return 1;
}

int train_jsonl_open(const char *run_dir, uint64_t keep_step, int fresh, FILE **out,
                     char *err, size_t cap) {
    char path[PATH_MAX];
    if (jsonl_path(path, sizeof path, run_dir, err, cap) != 0) return -1;
    if (!fresh) {
        FILE *in = NULL;
        int have = open_existing(path, &in, err, cap);
        if (have < 0) return -1;
        if (have) {
            int rc = jsonl_cut(path, in, keep_step, err, cap);
            fclose(in);
            if (rc != 0) return -1;
        }
    }
    int fd = fsio_open_append(path, fresh, err, cap);
    if (fd < 0) return -1;
    /* The stream only carries the descriptor (the caller fcloses it): lines
     * are written by train_jsonl_append, one write(2) each. */
    *out = fdopen(fd, "a");
    if (!*out) {
        util_set_err(err, cap, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return 0;
}

int train_jsonl_append(FILE *f, const char *run_dir, uint64_t step, double loss,
                       double lr, double gnorm, double tps, double elapsed,
                       double val_loss, char *err, size_t cap) {
    if (!f) return 0;
    char line[512], path[PATH_MAX];
    int n = snprintf(line, sizeof line,
                     "{\"step\":%llu,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
                     "\"tokens_per_s\":%.1f,\"elapsed\":%.3f",
                     (unsigned long long)step, loss, lr, gnorm, tps, elapsed);
    if (isfinite(val_loss) && n > 0 && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n,
                      ",\"val_loss\":%.9g,\"val_ppl\":%.9g", val_loss, exp(val_loss));
    if (n > 0 && n < (int)sizeof line - 2) n += snprintf(line + n, 3, "}\n");
    if (jsonl_path(path, sizeof path, run_dir ? run_dir : ".", err, cap) != 0) return -1;
    if (n <= 0 || n >= (int)sizeof line) { /* cannot happen: the fields are numbers */
        util_set_err(err, cap, "%s: line too long", path);
        errno = EOVERFLOW;
        return -1;
    }
    return fsio_write_all(fileno(f), line, (size_t)n, path, err, cap);
}
