/*
 * train.c - the training loop: engine context, data loader, schedule,
 * accumulation, evaluation, early stopping, checkpoints, exact resume.
 * state.json is train_state.c; metrics.jsonl and /metrics are
 * train_metrics.c. See train.h.
 */
#include "orchestrator/train/train.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/store/checkpoint.h"
#include "orchestrator/data/data_loader.h"
#include "orchestrator/train/dist.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/metrics.h"
#include "orchestrator/train/lr_schedule.h"
#include "orchestrator/train/train_metrics.h"
#include "orchestrator/train/train_state.h"
#include "orchestrator/data/shard.h"
#include "orchestrator/core/util.h"

/* The state of one train_run call. */
typedef struct trainer {
    const train_opts *o;
    const orch_config *cfg;
    orch_config *own_cfg; /* o->cfg with absolute data paths (cfg points here) */
    engine_handle eng;
    int eng_loaded;
    orch_engine_ctx *ctx;
    dataset *train_ds, *val_ds;
    data_loader *loader;
    data_eval_set eval;
    lr_schedule sched;
    train_state st;
    FILE *jsonl;
    train_metrics m;
    int progress_open; /* a live line is on screen */
    double last_print;
    char ckpt_dir[4096];
    uint64_t ckpt_step; /* step of the newest checkpoint (saved or resumed) */
    int have_ckpt;
    int zero;                    /* train.zero = 1: ZeRO-1 (dist.h) */
    int overlap;                 /* all-reduce overlapped with the backward (dist.h) */
    uint64_t n_params;           /* flat parameter count */
    uint64_t zero_off, zero_cnt; /* this rank's moment shard */
    char elastic_note[512];      /* the elastic-resume line, printed after the banner */
} trainer;

/* ------------------------------------------------------------------------- */
/* Small helpers                                                              */
/* ------------------------------------------------------------------------- */
static int fail(int *kind, int k, char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(int *kind, int k, char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && cap) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    if (kind) *kind = k;
    return -1;
}

static void fmt_duration(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

static void fmt_rate(double r, char *buf, size_t cap) {
    if (r >= 1e6)
        snprintf(buf, cap, "%.2fM", r / 1e6);
    else if (r >= 1e3)
        snprintf(buf, cap, "%.1fk", r / 1e3);
    else
        snprintf(buf, cap, "%.0f", r);
}

/* ------------------------------------------------------------------------- */
/* Output                                                                     */
/* ------------------------------------------------------------------------- */
/* End a live progress line before printing a normal one. */
static void progress_break(trainer *t) {
    if (t->progress_open && t->o->out) {
        fputc('\n', t->o->out);
        t->progress_open = 0;
    }
}

static void progress(trainer *t, uint64_t step, double loss, double lr, double tps,
                     double eta, int force) {
    FILE *f = t->o->out;
    if (!f) return;
    double now = util_now();
    /* Live: at most 10 updates a second; plain lines: one every 2 s. */
    if (!force && now - t->last_print < (t->o->live ? 0.1 : 2.0)) return;
    t->last_print = now;
    char rate[32], etas[32];
    fmt_rate(tps, rate, sizeof rate);
    fmt_duration(eta, etas, sizeof etas);
    int w = snprintf(NULL, 0, "%llu", (unsigned long long)t->st.total_steps);
    if (t->o->live) {
        fprintf(f,
                "\rstep %*llu/%llu | loss %.4f | lr %.2e | %s tok/s | ETA %s"
                "\033[K",
                w, (unsigned long long)step, (unsigned long long)t->st.total_steps, loss,
                lr, rate, etas);
        t->progress_open = 1;
    } else {
        fprintf(f, "step %*llu/%llu | loss %.4f | lr %.2e | %s tok/s | ETA %s\n", w,
                (unsigned long long)step, (unsigned long long)t->st.total_steps, loss, lr,
                rate, etas);
    }
    fflush(f);
}

static void say(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(trainer *t, const char *fmt, ...) {
    if (!t->o->out) return;
    progress_break(t);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->o->out, fmt, ap);
    va_end(ap);
    fflush(t->o->out);
}

/* ------------------------------------------------------------------------- */
/* Engine calls                                                               */
/* ------------------------------------------------------------------------- */
static int engine_fail(trainer *t, int32_t st, const char *what, uint64_t step, int *kind,
                       char *err, size_t cap) {
    char msg[1024];
    engine_format_error(&t->eng, t->ctx, st, msg, sizeof msg);
    const char *hint = st == ORCH_ERR_NUMERIC
                           ? " (training diverged: try a lower train.lr or "
                             "train.grad_clip)"
                           : "";
    char last[4300] = "";
    if (t->have_ckpt)
        snprintf(last, sizeof last, "; last good checkpoint: %s", t->ckpt_dir);
    return fail(kind, TRAIN_ERR_RUNTIME, err, cap,
                "step %llu: engine %s: %s failed: %s%s%s", (unsigned long long)step,
                t->eng.api->name, what, msg, hint, last);
}

/* Mean validation loss over the eval set. Data parallel (dist.h): rank r
 * evaluates batches r, r+N, ...; the per-batch losses are summed over the
 * ranks and added up in batch order, as one process would. */
static int evaluate(trainer *t, double *out, int *kind, char *err, size_t cap) {
    const data_eval_set *e = &t->eval;
    const orch_engine_api *api = t->eng.api;
    double sum = 0;
    size_t per = (size_t)e->micro_batch * e->seq_len;
    double *shared = NULL;
    if (dist_world() > 1 && !(shared = calloc(e->n_batches, sizeof *shared)))
        return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "evaluation: out of memory");
    for (uint32_t b = 0; b < e->n_batches; b++) {
        if (shared && b % (uint32_t)dist_world() != (uint32_t)dist_rank()) continue;
        float l = 0;
        int32_t st = api->eval_loss(t->ctx, e->tokens + b * per, e->targets + b * per,
                                    e->micro_batch, e->seq_len, &l);
        if (st != ORCH_OK) {
            free(shared);
            return engine_fail(t, st, "eval_loss", t->st.step, kind, err, cap);
        }
        if (shared)
            shared[b] = (double)l;
        else
            sum += (double)l;
    }
    if (shared) {
        char msg[1024];
        int rc = dist_allreduce_sum(shared, e->n_batches, "evaluation", msg, sizeof msg);
        for (uint32_t b = 0; b < e->n_batches; b++) sum += shared[b];
        free(shared);
        if (rc != 0)
            return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                        (unsigned long long)t->st.step, msg);
    }
    *out = sum / e->n_batches;
    return 0;
}

static int save_checkpoint(trainer *t, double val_loss, int *kind, char *err,
                           size_t cap) {
    char *state = train_state_to_json(&t->st, t->eng.api->name, &t->sched, t->cfg);
    if (!state)
        return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "checkpoint: out of memory");
    ckpt_save_opts so = ckpt_save_opts_default();
    so.keep_last = (int)t->cfg->train.keep_checkpoints;
    so.with_optimizer = 1;
    so.val_loss = val_loss;
    char dir[4096], msg[1024];
    int rc = ckpt_save(t->o->run_dir, t->st.step, &t->eng, t->ctx, state, &so, dir,
                       sizeof dir, msg, sizeof msg);
    free(state);
    if (rc != 0) {
        char last[4300] = "";
        if (t->have_ckpt)
            snprintf(last, sizeof last, " (last good checkpoint: %s)", t->ckpt_dir);
        return fail(kind, TRAIN_ERR_RUNTIME, err, cap,
                    "step %llu: cannot save checkpoint: %s%s",
                    (unsigned long long)t->st.step, msg, last);
    }
    snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", dir);
    t->ckpt_step = t->st.step;
    t->have_ckpt = 1;
    metrics_counter_add(t->m.ckpts, 1);
    return 0;
}

/* Data parallel (dist.h): rank 0 alone writes checkpoints; tell every rank
 * how it went (the directory, or rank 0's error). */
static int share_checkpoint(trainer *t, int *saved, int *kind, char *err, size_t cap) {
    if (dist_world() == 1) return 0;
    char text[4096], msg[1024];
    snprintf(text, sizeof text, "%s", *saved == 0 ? t->ckpt_dir : err);
    if (dist_share_status(saved, text, sizeof text, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                    (unsigned long long)t->st.step, msg);
    if (dist_is_root()) return 0;
    if (*saved != 0) return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "rank 0: %s", text);
    snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", text);
    t->ckpt_step = t->st.step;
    t->have_ckpt = 1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Setup                                                                      */
/* ------------------------------------------------------------------------- */
static int open_data(trainer *t, int *kind, char *err, size_t cap) {
    const orch_config *c = t->cfg;
    char msg[2048];
    if (dataset_open(c->data.train, &t->train_ds, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "data.train: %s", msg);
    if (dataset_open(c->data.val, &t->val_ds, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "data.val: %s", msg);
    const dataset *ds[2] = { t->train_ds, t->val_ds };
    const char *which[2] = { "data.train", "data.val" };
    for (int i = 0; i < 2; i++) {
        if (strcmp(dataset_tokenizer_name(ds[i]), c->data.tokenizer) != 0)
            return fail(kind, TRAIN_ERR_INPUT, err, cap,
                        "%s: shards were made with the '%s' tokenizer but "
                        "data.tokenizer is '%s'",
                        which[i], dataset_tokenizer_name(ds[i]), c->data.tokenizer);
        if (dataset_vocab_size(ds[i]) > c->model.vocab_size)
            return fail(kind, TRAIN_ERR_INPUT, err, cap,
                        "%s: shard vocabulary (%u) exceeds model.vocab_size "
                        "(%u)",
                        which[i], dataset_vocab_size(ds[i]), c->model.vocab_size);
    }
    if (data_eval_set_build(t->val_ds, c->train.eval_batches, c->train.micro_batch,
                            c->train.seq_len, &t->eval, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "data.val: %s", msg);
    return 0;
}

static uint64_t total_steps_of(const orch_config *c, const dataset *train) {
    if (c->train.max_steps) return c->train.max_steps;
    double per_step = (double)c->train.micro_batch * c->train.seq_len *
                      c->train.grad_accum * dist_world();
    double steps = ceil(c->train.epochs * (double)dataset_total_tokens(train) / per_step);
    return steps < 1 ? 1 : (uint64_t)steps;
}

static int open_engine(trainer *t, int *kind, char *err, size_t cap) {
    const orch_config *c = t->cfg;
    char msg[2048];
    if (engine_load(c->engine.name, &t->eng, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "%s", msg);
    t->eng_loaded = 1;
    uint64_t caps = t->eng.api->capabilities;
    if (!(caps & ORCH_CAP_TRAIN) || !(caps & ORCH_CAP_EVAL))
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "engine %s cannot train (needs the train and eval "
                    "capabilities)",
                    t->eng.api->name);
    if (c->train.zero && !dist_zero_supported(t->eng.api, msg, sizeof msg))
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "%s", msg);
    orch_model_desc desc;
    config_model_desc(c, &desc);
    if (engine_create_context(&t->eng, &desc, c->engine.threads, c->train.seed,
                              c->engine.options, &t->ctx, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "%s", msg);
    return 0;
}

/* Elastic resume: the checkpoint was written by s->world ranks, this run has
 * N = dist_world(). Each step consumes G = world x grad_accum micro-batches
 * drawn in order from the one shared sampler stream (data_loader.h: every
 * data_loader_next draws N x micro_batch windows and rank r keeps draws
 * r*B .. r*B+B-1), and the checkpoint holds the stream's state after the
 * last consumed draw. Re-deriving the windows therefore means: keep G, so
 * grad_accum becomes G / N; every step then consumes exactly the G*B windows
 * the old layout would have, split over the new ranks, and none is skipped
 * or repeated. A G that N does not divide is refused. A config grad_accum
 * other than the checkpoint's (--set on the resume) is taken as given: the
 * stream still continues where it stopped, with another global batch, and
 * the line says so. */
static int elastic_rederive(trainer *t, const train_state *s, const char *dir, int *kind,
                            char *err, size_t cap) {
    uint32_t n = (uint32_t)dist_world();
    uint32_t accum = s->grad_accum ? s->grad_accum : t->cfg->train.grad_accum;
    uint64_t global = (uint64_t)s->world * accum;
    if (s->grad_accum && t->cfg->train.grad_accum != s->grad_accum) {
        /* --set train.grad_accum on the command line: the user's choice wins;
         * the stream still continues where the checkpoint left it. */
        snprintf(t->elastic_note, sizeof t->elastic_note,
                 "train: resuming on %u rank%s (checkpoint was written by %u): data "
                 "windows re-derived from the sample stream, grad_accum %u as set "
                 "(%llu micro-batches per step instead of %llu)\n",
                 n, n == 1 ? "" : "s", s->world, t->cfg->train.grad_accum,
                 (unsigned long long)n * t->cfg->train.grad_accum,
                 (unsigned long long)global);
        return 0;
    }
    if (global % n != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "resume: %s was written by %u ranks x grad_accum %u = %llu "
                    "micro-batches per step, which %u ranks cannot split evenly "
                    "(use a number of ranks that divides %llu)",
                    dir, s->world, accum, (unsigned long long)global, n,
                    (unsigned long long)global);
    uint32_t new_accum = (uint32_t)(global / n);
    t->own_cfg->train.grad_accum = new_accum;
    snprintf(t->elastic_note, sizeof t->elastic_note,
             "train: resuming on %u rank%s (checkpoint was written by %u): data windows "
             "re-derived, grad_accum %u -> %u keeps %llu micro-batches of %u per step, "
             "continuing the sample stream after %llu windows\n",
             n, n == 1 ? "" : "s", s->world, accum, new_accum, (unsigned long long)global,
             t->cfg->train.micro_batch,
             (unsigned long long)(s->step * global * t->cfg->train.micro_batch));
    return 0;
}

static int restore(trainer *t, int *kind, char *err, size_t cap) {
    const char *dir = t->o->resume_ckpt;
    char *text = NULL, msg[2048], tok[64] = "";
    if (ckpt_read_state(dir, &text, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "resume: %s", msg);
    train_state s;
    int rc = train_state_from_json(text, &s, tok, sizeof tok, msg, sizeof msg);
    free(text);
    if (rc != 0) return fail(kind, TRAIN_ERR_INPUT, err, cap, "resume: %s: %s", dir, msg);
    if (*tok && strcmp(tok, t->cfg->data.tokenizer) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "resume: %s was trained with the '%s' tokenizer, the config "
                    "says '%s'",
                    dir, tok, t->cfg->data.tokenizer);
    if (!ckpt_has_optimizer(dir))
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "resume: %s has no optimizer state (it can seed a new run "
                    "but not continue one)",
                    dir);
    if (ckpt_load_weights(dir, &t->eng, t->ctx, 1, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "resume: %s", msg);
    if (s.world && s.world != (uint32_t)dist_world() &&
        elastic_rederive(t, &s, dir, kind, err, cap) != 0)
        return -1;
    uint64_t total = total_steps_of(t->cfg, t->train_ds); /* this run's config */
    t->st = s;
    t->st.total_steps = total;
    snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", dir);
    t->ckpt_step = s.step;
    t->have_ckpt = 1;
    return 0;
}

/* RUN/config.json: the merged config (absolute data paths), atomically. */
static int write_config_copy(trainer *t, char *err, size_t cap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", t->o->run_dir);
    char *text = config_to_json(t->cfg);
    size_t n = text ? strlen(text) : 0;
    char *line = text ? realloc(text, n + 2) : NULL;
    if (!line) {
        free(text);
        util_set_err(err, cap, "%s: out of memory", path);
        return -1;
    }
    memcpy(line + n, "\n", 2);
    int rc = fsio_write_atomic(path, line, n + 1, err, cap);
    free(line);
    return rc;
}

static void trainer_close(trainer *t) {
    train_metrics_stop(&t->m);
    if (t->jsonl) fclose(t->jsonl);
    data_loader_close(t->loader);
    data_eval_set_free(&t->eval);
    if (t->ctx) t->eng.api->context_destroy(t->ctx);
    if (t->eng_loaded) engine_unload(&t->eng);
    dataset_close(t->train_ds);
    dataset_close(t->val_ds);
    config_free(t->own_cfg);
}

/* ------------------------------------------------------------------------- */
/* The loop                                                                   */
/* ------------------------------------------------------------------------- */
/* The evaluation of `step`: validation loss into *val, the best-so-far and
 * early-stopping bookkeeping, a line of output; *stop becomes 1 when the
 * patience is used up. */
static int eval_step(trainer *t, uint64_t step, double *val, int *stop, int *kind,
                     char *err, size_t cap) {
    double v = NAN;
    if (evaluate(t, &v, kind, err, cap) != 0) return -1;
    *val = v;
    t->st.last_val_loss = v;
    int improved = !isfinite(t->st.best_val_loss) || v < t->st.best_val_loss;
    if (improved) {
        t->st.best_val_loss = v;
        t->st.best_val_step = step;
        t->st.evals_since_best = 0;
    } else {
        t->st.evals_since_best++;
    }
    say(t, "step %llu: val loss %.4f | ppl %.2f%s\n", (unsigned long long)step, v, exp(v),
        improved ? " (best)" : "");
    train_metrics_eval(&t->m, v);
    uint32_t patience = t->cfg->train.early_stop_patience;
    *stop = patience && t->st.evals_since_best >= patience;
    return 0;
}

/* After the first step (engines allocate moments lazily): every rank's
 * optimizer_bytes, printed by rank 0 as one line, e.g.
 * "train: optimizer state per rank: 1000, 1000 bytes (zero=1, ...)". Quiet on
 * an engine without optimizer_bytes (ABI < 1.2). Collective. */
static int report_optimizer_memory(trainer *t, char *err, size_t cap) {
    const orch_engine_api *api = t->eng.api;
    if (!ORCH_API_HAS(api, optimizer_bytes)) return 0;
    int world = dist_world();
    double *all = calloc((size_t)world, sizeof *all);
    if (!all) {
        util_set_err(err, cap, "out of memory");
        return -1;
    }
    uint64_t bytes = 0;
    int32_t st = api->optimizer_bytes(t->ctx, &bytes);
    if (st != ORCH_OK) {
        char m[1024];
        engine_format_error(&t->eng, t->ctx, st, m, sizeof m);
        util_set_err(err, cap, "engine %s: optimizer_bytes failed: %s", api->name, m);
        free(all);
        return -1;
    }
    all[dist_rank()] = (double)bytes;
    if (dist_allreduce_sum(all, (size_t)world, "optimizer memory report", err, cap) !=
        0) {
        free(all);
        return -1;
    }
    if (t->o->out) {
        char list[1024] = "";
        size_t len = 0;
        for (int r = 0; r < world && len + 32 < sizeof list; r++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%.0f",
                                    r ? ", " : "", all[r]);
        say(t,
            "train: optimizer state per rank: %s bytes (zero=%d, %d rank%s, %llu "
            "parameters; unsharded %llu bytes)\n",
            list, t->zero, world, world == 1 ? "" : "s", (unsigned long long)t->n_params,
            (unsigned long long)(8 * t->n_params));
    }
    free(all);
    return 0;
}

static int train_loop(trainer *t, train_result *res, int *kind, char *err, size_t cap) {
    const train_opts *o = t->o;
    const config_train *c = &t->cfg->train;
    const orch_engine_api *api = t->eng.api;
    uint32_t B = c->micro_batch, T = c->seq_len;
    /* Data parallel (dist.h): each of N ranks runs grad_accum micro-batches
     * of its own; the gradient sum over ranks is the mean over all. */
    double step_tokens = (double)B * T * c->grad_accum * dist_world();
    float grad_scale = 1.0f / (float)(c->grad_accum * (uint32_t)dist_world());
    double run_start = util_now();
    double elapsed0 = t->st.elapsed_s;
    uint64_t first = t->st.step;
    uint64_t steps_run = 0;
    double val_at_step = NAN; /* val loss measured at the current step */
    char msg[1024];

    res->outcome = TRAIN_COMPLETED;
    while (t->st.step < t->st.total_steps) {
        uint64_t step = t->st.step + 1;
        double t0 = util_now();
        int32_t st = api->grads_zero(t->ctx);
        if (st != ORCH_OK) return engine_fail(t, st, "grads_zero", step, kind, err, cap);
        double loss_sum = 0;
        for (uint32_t m = 0; m < c->grad_accum; m++) {
            const int32_t *tok, *tgt;
            if (data_loader_next(t->loader, &tok, &tgt, msg, sizeof msg) != 0)
                return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                            (unsigned long long)step, msg);
            float l = 0;
            if (t->overlap && m + 1 == c->grad_accum) {
                /* the gradient all-reduce starts during this backward */
                if (dist_overlap_forward_backward(&t->eng, t->ctx, tok, tgt, B, T,
                                                  grad_scale, &l, &st, step, msg,
                                                  sizeof msg) != 0)
                    return st != ORCH_OK
                               ? engine_fail(t, st, "forward_backward_notify", step, kind,
                                             err, cap)
                               : fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                                      (unsigned long long)step, msg);
            } else {
                st = api->forward_backward(t->ctx, tok, tgt, B, T, grad_scale, &l);
                if (st != ORCH_OK)
                    return engine_fail(t, st, "forward_backward", step, kind, err, cap);
            }
            loss_sum += (double)l;
        }
        double shared[2] = { loss_sum, o->stop_flag && *o->stop_flag };
        if (!t->zero && (t->overlap ? dist_overlap_finish(&t->eng, t->ctx, shared, 2,
                                                          step, msg, sizeof msg)
                                    : dist_allreduce_grads(&t->eng, t->ctx, shared, 2,
                                                           step, msg, sizeof msg)) != 0)
            return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                        (unsigned long long)step, msg);
        double lr = lr_schedule_at(&t->sched, step);
        orch_adamw_params ap;
        memset(&ap, 0, sizeof ap);
        ap.struct_size = sizeof ap;
        ap.step = step;
        ap.lr = (float)lr;
        ap.beta1 = (float)c->beta1;
        ap.beta2 = (float)c->beta2;
        ap.eps = (float)c->eps;
        ap.weight_decay = (float)c->weight_decay;
        ap.grad_clip = (float)c->grad_clip;
        float gnorm = 0;
        if (t->zero) { /* reduce-scatter, sharded AdamW, all-gather (dist.h) */
            int diverged = 0;
            if (dist_zero_step(&t->eng, t->ctx, &ap, shared, 2, step, &gnorm, &diverged,
                               msg, sizeof msg) != 0)
                return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s%s",
                            (unsigned long long)step, msg,
                            diverged ? " (training diverged: try a lower train.lr or "
                                       "train.grad_clip)"
                                     : "");
        } else {
            st = api->optimizer_step(t->ctx, &ap, &gnorm);
            if (st != ORCH_OK)
                return engine_fail(t, st, "optimizer_step", step, kind, err, cap);
        }
        loss_sum = shared[0];
        double loss = loss_sum / ((double)c->grad_accum * dist_world());
        double dt = util_now() - t0;
        if (steps_run == 0 && report_optimizer_memory(t, msg, sizeof msg) != 0)
            return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                        (unsigned long long)step, msg);
        steps_run++;
        t->st.step = step;
        t->st.tokens_seen += (uint64_t)step_tokens;
        t->st.last_loss = loss;
        t->st.last_lr = lr;
        t->st.tokens_per_s = dt > 0 ? step_tokens / dt : 0;
        t->st.elapsed_s = elapsed0 + (util_now() - run_start);
        data_loader_rng_state(t->loader, &t->st.rng);
        t->st.world = (uint32_t)dist_world();
        t->st.grad_accum = c->grad_accum;

        int last = step == t->st.total_steps;
        double avg = (util_now() - run_start) / (double)steps_run;
        double eta = avg * (double)(t->st.total_steps - step);
        progress(t, step, loss, lr, t->st.tokens_per_s, eta, step == first + 1 || last);

        /* Evaluation and early stopping. */
        val_at_step = NAN;
        int stop_early = 0;
        if (((c->eval_every && step % c->eval_every == 0) || last) &&
            eval_step(t, step, &val_at_step, &stop_early, kind, err, cap) != 0)
            return -1;
        /* A lost metrics line stops the run: a resume from the last
         * checkpoint writes it again (metrics.jsonl is cut back to it). */
        if (train_jsonl_append(t->jsonl, o->run_dir, step, loss, lr, gnorm,
                               t->st.tokens_per_s, t->st.elapsed_s, val_at_step, msg,
                               sizeof msg) != 0) {
            char last[4300] = "";
            if (t->have_ckpt)
                snprintf(last, sizeof last, " (last good checkpoint: %s)", t->ckpt_dir);
            return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s%s",
                        (unsigned long long)step, msg, last);
        }
        train_metrics_step(&t->m, step, loss, lr, gnorm, &t->st, step_tokens, dt);

        /* Ranks stop together: a signal counts when any rank had it at the
         * all-reduce of this step. */
        int signalled = dist_world() > 1 ? shared[1] > 0 : o->stop_flag && *o->stop_flag;
        int paused = o->stop_after && steps_run >= o->stop_after && !last;
        int periodic = c->checkpoint_every && step % c->checkpoint_every == 0;
        if (periodic || last || signalled || paused || stop_early) {
            if (t->zero && dist_zero_gather(&t->eng, t->ctx, msg, sizeof msg) != 0)
                return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                            (unsigned long long)step, msg);
            int saved =
                dist_is_root() ? save_checkpoint(t, val_at_step, kind, err, cap) : 0;
            if (share_checkpoint(t, &saved, kind, err, cap) != 0 || saved != 0) return -1;
            if (t->zero && dist_zero_reshard(&t->eng, t->ctx, msg, sizeof msg) != 0)
                return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                            (unsigned long long)step, msg);
            if (periodic && !last && !signalled && !paused && !stop_early)
                say(t, "step %llu: checkpoint %s\n", (unsigned long long)step,
                    t->ckpt_dir);
        }
        if (stop_early) {
            res->outcome = TRAIN_EARLY_STOPPED;
            say(t,
                "early stop: validation loss has not improved for %u "
                "evaluations (best %.4f at step %llu)\n",
                t->st.evals_since_best, t->st.best_val_loss,
                (unsigned long long)t->st.best_val_step);
            break;
        }
        if (signalled) {
            res->outcome = TRAIN_INTERRUPTED;
            break;
        }
        if (paused) {
            res->outcome = TRAIN_PAUSED;
            break;
        }
    }
    progress_break(t);
    double run_s = util_now() - run_start;
    res->step = t->st.step;
    res->total_steps = t->st.total_steps;
    res->last_loss = t->st.last_loss;
    res->last_val_loss = t->st.last_val_loss;
    res->best_val_loss = t->st.best_val_loss;
    res->best_val_step = t->st.best_val_step;
    res->elapsed_s = t->st.elapsed_s;
    res->run_s = run_s;
    res->tokens_per_s = run_s > 0 ? (double)steps_run * step_tokens / run_s : 0;
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", t->ckpt_dir);
    return 0;
}

/* What train prints before the first step: engine, model, data, batch,
 * steps, run directory, and where the weights come from. */
static void print_banner(const trainer *t) {
    const train_opts *o = t->o;
    const config_train *c = &t->cfg->train;
    if (!o->out) return;
    char ntok[32];
    fmt_rate((double)dataset_total_tokens(t->train_ds), ntok, sizeof ntok);
    orch_model_desc d;
    config_model_desc(t->cfg, &d);
    uint32_t n_tensors = 0;
    uint64_t n_params = 0;
    if (t->eng.api->tensor_count(t->ctx, ORCH_TENSOR_PARAM, &n_tensors) == ORCH_OK) {
        for (uint32_t i = 0; i < n_tensors; i++) {
            orch_tensor_info ti;
            memset(&ti, 0, sizeof ti);
            ti.struct_size = sizeof ti;
            if (t->eng.api->tensor_info(t->ctx, ORCH_TENSOR_PARAM, i, &ti) == ORCH_OK)
                n_params += ti.numel;
        }
    }
    fprintf(o->out,
            "train: engine %s (%s) | model %u layers, %u heads, width %u, "
            "context %u, %.2fM parameters\n"
            "train: data %s tokens (%s tokenizer) | batch %u x %u x %u "
            "accum | %llu steps | out %s\n",
            t->eng.api->name, t->eng.probe_msg, d.layers, d.heads, d.width, d.context,
            (double)n_params / 1e6, ntok, t->cfg->data.tokenizer, c->micro_batch,
            c->seq_len, c->grad_accum, (unsigned long long)t->st.total_steps, o->run_dir);
    if (o->resume_ckpt)
        fprintf(o->out, "train: resuming from %s (step %llu)\n", o->resume_ckpt,
                (unsigned long long)t->st.step);
    else if (o->init_ckpt)
        fprintf(o->out, "train: starting from the weights of %s\n", o->init_ckpt);
    fflush(o->out);
}

int train_run(const train_opts *o, train_result *res, int *err_kind, char *err,
              size_t err_cap) {
    trainer t;
    memset(&t, 0, sizeof t);
    memset(res, 0, sizeof *res);
    res->last_loss = res->last_val_loss = res->best_val_loss = NAN;
    t.o = o;
    t.st.best_val_loss = NAN;
    t.st.last_loss = t.st.last_val_loss = t.st.last_lr = NAN;
    data_rng_seed(&t.st.rng, o->cfg->train.seed);
    const config_train *c = &o->cfg->train;
    int rc = -1;
    char msg[2048];

    if (fsio_mkdir_p(o->run_dir, msg, sizeof msg) != 0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "--out: %s", msg);
        goto out;
    }
    /* The config this run stores (config.json, state.json) names its data
     * by absolute paths, so its checkpoints work from any directory. */
    t.own_cfg = config_clone(o->cfg);
    if (!t.own_cfg) {
        fail(err_kind, TRAIN_ERR_RUNTIME, err, err_cap, "out of memory");
        goto out;
    }
    t.cfg = t.own_cfg;
    if (config_absolute_data_paths(t.own_cfg, msg, sizeof msg) != 0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "%s", msg);
        goto out;
    }
    if (open_data(&t, err_kind, err, err_cap) != 0) goto out;
    t.st.total_steps = total_steps_of(t.cfg, t.train_ds);
    if (open_engine(&t, err_kind, err, err_cap) != 0) goto out;
    if (o->resume_ckpt && restore(&t, err_kind, err, err_cap) != 0) goto out;
    if (!o->resume_ckpt && o->init_ckpt &&
        ckpt_load_weights(o->init_ckpt, &t.eng, t.ctx, 0, msg, sizeof msg) != 0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "--init: %s", msg);
        goto out;
    }
    /* Data parallel: every rank continues from rank 0's weights, moments
     * and state. */
    if (dist_world() > 1 &&
        (dist_bcast_model(&t.eng, t.ctx, msg, sizeof msg) != 0 ||
         dist_bcast_bytes(&t.st, sizeof t.st, "training state", msg, sizeof msg) != 0)) {
        fail(err_kind, TRAIN_ERR_RUNTIME, err, err_cap, "%s", msg);
        goto out;
    }
    res->start_step = t.st.step;
    uint32_t n_tensors = 0;
    if (t.eng.api->tensor_count(t.ctx, ORCH_TENSOR_PARAM, &n_tensors) == ORCH_OK)
        for (uint32_t i = 0; i < n_tensors; i++) {
            orch_tensor_info ti;
            memset(&ti, 0, sizeof ti);
            ti.struct_size = sizeof ti;
            if (t.eng.api->tensor_info(t.ctx, ORCH_TENSOR_PARAM, i, &ti) == ORCH_OK)
                t.n_params += ti.numel;
        }
    if (c->zero) {
        if (dist_zero_setup(&t.eng, t.ctx, t.n_params, &t.zero_off, &t.zero_cnt, msg,
                            sizeof msg) != 0) {
            fail(err_kind, TRAIN_ERR_RUNTIME, err, err_cap, "%s", msg);
            goto out;
        }
        t.zero = 1;
    }
    dist_set_allreduce(c->allreduce_bucket_mb, c->overlap_allreduce);
    t.overlap = dist_overlap_enabled(t.eng.api);

    lr_schedule_kind kind = LR_SCHEDULE_COSINE;
    lr_schedule_parse_kind(c->schedule, &kind);
    t.sched.kind = kind;
    t.sched.lr = c->lr;
    t.sched.min_lr = c->min_lr;
    t.sched.warmup_steps = c->warmup_steps;
    t.sched.total_steps = t.st.total_steps;

    if (t.st.step >= t.st.total_steps) {
        res->outcome = TRAIN_ALREADY_DONE;
        res->step = t.st.step;
        res->total_steps = t.st.total_steps;
        res->last_loss = t.st.last_loss;
        res->last_val_loss = t.st.last_val_loss;
        res->best_val_loss = t.st.best_val_loss;
        res->best_val_step = t.st.best_val_step;
        res->elapsed_s = t.st.elapsed_s;
        snprintf(res->checkpoint, sizeof res->checkpoint, "%s", t.ckpt_dir);
        rc = 0;
        goto out;
    }

    data_loader_opts lo = { c->micro_batch, c->seq_len, (uint32_t)dist_rank(),
                            (uint32_t)dist_world(), 1 };
    if (data_loader_open(t.train_ds, &lo, &t.st.rng, &t.loader, msg, sizeof msg) != 0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "data.train: %s", msg);
        goto out;
    }
    if (dist_is_root() && /* rank 0 alone writes the run's files */
        (write_config_copy(&t, msg, sizeof msg) != 0 ||
         train_jsonl_open(o->run_dir, t.st.step, o->resume_ckpt == NULL, &t.jsonl, msg,
                          sizeof msg) != 0)) {
        fail(err_kind, TRAIN_ERR_RUNTIME, err, err_cap, "%s", msg);
        goto out;
    }
    if (train_metrics_start(&t.m, o->metrics_port, &t.st, o->out, msg, sizeof msg) != 0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "%s", msg);
        goto out;
    }
    print_banner(&t);
    if (t.elastic_note[0] && o->out) {
        fputs(t.elastic_note, o->out);
        fflush(o->out);
    }
    if (t.zero && o->out) {
        fprintf(o->out,
                "train: ZeRO-1: AdamW moments sharded over %d rank%s (rank 0 keeps "
                "[%llu, %llu) of %llu)\n",
                dist_world(), dist_world() == 1 ? "" : "s",
                (unsigned long long)t.zero_off,
                (unsigned long long)(t.zero_off + t.zero_cnt),
                (unsigned long long)t.n_params);
        fflush(o->out);
    }
    if (dist_world() > 1 && t.zero && c->overlap_allreduce && o->out) {
        fprintf(o->out, "train: ZeRO-1 reduce-scatters the gradients after the backward "
                        "(train.overlap_allreduce applies to zero = 0)\n");
        fflush(o->out);
    }
    if (dist_world() > 1 && !t.zero && o->out) {
        if (t.overlap)
            fprintf(o->out,
                    "train: gradient all-reduce overlapped with the backward "
                    "(buckets of %.3g MiB)\n",
                    (double)dist_bucket_floats() * sizeof(float) / 1048576.0);
        else if (c->overlap_allreduce)
            fprintf(o->out,
                    "train: gradient all-reduce after the backward: engine %s (ABI "
                    "%u.%u) has no forward_backward_notify (ABI 1.3)\n",
                    t.eng.api->name, t.eng.api->abi_major, t.eng.api->abi_minor);
        fflush(o->out);
    }
    rc = train_loop(&t, res, err_kind, err, err_cap);
    dist_allreduce_stats ar;
    dist_get_allreduce_stats(&ar);
    if (rc == 0 && ar.steps && o->out) {
        fprintf(o->out,
                "train: gradient all-reduce (%s): %.2f ms per step waited after the "
                "backward, %.1f buckets per step (%.1f started during it)\n",
                t.overlap ? "overlapped" : "not overlapped",
                1e3 * ar.wait_s / (double)ar.steps, (double)ar.buckets / (double)ar.steps,
                (double)ar.buckets_early / (double)ar.steps);
        fflush(o->out);
    }
out:
    progress_break(&t);
    trainer_close(&t);
    return rc;
}
