/*
 * ft_runner.c - fine-tuning jobs run inside `orch serve` (see ft_runner.h).
 */
#include "orchestrator/serve/ft_runner.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cJSON.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/data_loader.h"
#include "orchestrator/data/finetune_data.h"
#include "orchestrator/data/ft_order.h"
#include "orchestrator/store/adapter_moments.h"
#include "orchestrator/store/peft_adapter.h"
#include "orchestrator/train/lr_schedule.h"

#define PREPARED_MAX 4 /* jobs tokenized ahead */

typedef struct prepared {
    char id[FT_JOB_ID_MAX];
    ft_dataset train;
    ft_dataset val;    /* n_rows 0 = no validation file */
    ft_job_hparams hp; /* resolved */
} prepared;

/* The job on the scheduler thread. */
typedef struct active {
    int on;
    ft_job job;
    prepared p;
    uint32_t adapter;
    orch_lora_desc desc;
    ft_order order;
    lr_schedule sched;
    uint64_t step, total_steps;
    uint32_t accum, accum_done; /* micro-batches per step, done in this one */
    double loss_sum;
    uint64_t trained_tokens;
    uint64_t ckpt_every;  /* steps between checkpoints */
    double last_val;      /* validation loss of this step (NAN: none) */
    int32_t *tok, *tgt;   /* SCHED_MAX_FINETUNE_BATCHES micro-batches */
    uint32_t in_flight;   /* micro-batches handed to the scheduler */
    uint32_t stream;      /* token-level: the open stream of the micro-batch (0: none) */
    uint64_t stream_left; /* its rows of work left (forward + backward) */
} active;

struct ft_runner {
    ft_runner_config cfg;
    ft_budget *budget;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int thread_started, stop, kick;
    scheduler *sched;
    prepared ready[PREPARED_MAX]; /* under mu */
    uint32_t n_ready;
    char running_id[FT_JOB_ID_MAX]; /* under mu: the active job ("" = none) */
    active a;                       /* scheduler thread only */
    metrics_series *m_tokens, *m_share, *m_attain, *m_p99, *m_factor, *m_ft_cost;
    metrics_series *m_kind[3]; /* tokens by kind: decode, prefill, finetune */
    metrics_family *m_jobs;
};

/* Tokens of one micro-batch. */
static uint32_t micro_tokens(const ft_runner *r) {
    return r->cfg.micro_batch * r->cfg.seq_len;
}

/* The budget's unit: a micro-batch, or at token level a chunk of rows. */
static uint32_t granule(const ft_runner *r) {
    return r->cfg.token_level ? r->cfg.chunk_tokens : micro_tokens(r);
}

/* ------------------------------------------------------------------------- */
/* The preparer thread                                                        */
/* ------------------------------------------------------------------------- */

static void fail_job(ft_runner *r, const char *id, const char *code, const char *msg) {
    ft_jobs_event(r->cfg.jobs, id, "error", msg, NULL);
    ft_jobs_finish(r->cfg.jobs, id, FT_JOB_FAILED, NULL, code, msg);
}

/* Tokenize job's training file (and check the validation file) and
 * resolve the hyper-parameters. */
static int prepare(ft_runner *r, const ft_job *job, prepared *out, char *err,
                   size_t err_cap) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", job->id);
    ft_data_opts o = { .tok = r->cfg.tok,
                       .tmpl = r->cfg.tmpl,
                       .tmpl_error = r->cfg.tmpl_error,
                       .seq_len = r->cfg.seq_len,
                       .vocab_size = r->cfg.model->vocab_size,
                       .one_per_row = r->cfg.no_packing };
    char path[4200];
    if (file_store_data_path(r->cfg.files, job->training_file, path, sizeof path) != 0) {
        util_set_err(err, err_cap, "training_file %s was deleted", job->training_file);
        return -1;
    }
    char msg[1024];
    if (ft_data_load(path, &o, &out->train, msg, sizeof msg) != 0) {
        /* the store's path means nothing to the client: name the file id */
        const char *colon = strstr(msg, ".data:");
        if (colon)
            util_set_err(err, err_cap, "training_file %s: line %s", job->training_file,
                         colon + 6);
        else
            util_set_err(err, err_cap, "training_file %s: %s", job->training_file, msg);
        return -1;
    }
    if (job->validation_file[0]) {
        ft_dataset v;
        if (file_store_data_path(r->cfg.files, job->validation_file, path, sizeof path) !=
                0 ||
            ft_data_load(path, &o, &v, msg, sizeof msg) != 0) {
            const char *colon = strstr(msg, ".data:");
            util_set_err(err, err_cap, "validation_file %s: %s%s", job->validation_file,
                         colon ? "line " : "", colon ? colon + 6 : "deleted");
            ft_dataset_free(&out->train);
            return -1;
        }
        out->val = v;
    }
    ft_job_hparams hp = job->hp;
    uint32_t mb = r->cfg.micro_batch;
    if (!hp.n_epochs) hp.n_epochs = 3;
    if (!hp.lr_multiplier) hp.lr_multiplier = 1.0;
    if (!hp.lora_rank) hp.lora_rank = r->cfg.rank;
    if (!(hp.lora_alpha > 0)) hp.lora_alpha = r->cfg.alpha;
    if (!hp.batch_size) {
        uint64_t rows = out->train.n_rows;
        uint32_t b = 8;
        while (b > mb && b > rows) b /= 2;
        hp.batch_size = b < mb ? mb : b - b % mb;
    }
    if (hp.batch_size % mb != 0) {
        util_set_err(err, err_cap,
                     "hyperparameters.batch_size %u is not a multiple of this server's "
                     "fine-tuning micro-batch (%u rows, --ft-micro-batch)",
                     hp.batch_size, mb);
        ft_dataset_free(&out->train);
        ft_dataset_free(&out->val);
        return -1;
    }
    out->hp = hp;
    return 0;
}

static int is_ready_locked(const ft_runner *r, const char *id) {
    for (uint32_t i = 0; i < r->n_ready; i++)
        if (strcmp(r->ready[i].id, id) == 0) return 1;
    return 0;
}

static void *preparer_main(void *arg) {
    ft_runner *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->stop && !r->kick) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&r->cv, &r->mu, &until);
            break; /* look every second too (a restart's queued jobs) */
        }
        r->kick = 0;
        int stop = r->stop, room = r->n_ready < PREPARED_MAX;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        if (!room) continue;
        ft_job job;
        int validating = ft_jobs_oldest(r->cfg.jobs, FT_JOB_VALIDATING, &job) == 0;
        if (!validating) {
            /* a queued job without data: read back after a restart */
            if (ft_jobs_oldest(r->cfg.jobs, FT_JOB_QUEUED, &job) != 0) continue;
            pthread_mutex_lock(&r->mu);
            int have = is_ready_locked(r, job.id) || strcmp(r->running_id, job.id) == 0;
            pthread_mutex_unlock(&r->mu);
            if (have) continue;
        }
        prepared p;
        char err[1024];
        if (prepare(r, &job, &p, err, sizeof err) != 0) {
            fail_job(r, job.id, "invalid_file", err);
            continue;
        }
        if (validating) {
            if (ft_jobs_transition(r->cfg.jobs, job.id, FT_JOB_VALIDATING, FT_JOB_QUEUED,
                                   &p.hp) != 0) { /* cancelled meanwhile */
                ft_dataset_free(&p.train);
                ft_dataset_free(&p.val);
                continue;
            }
            char msg[256];
            snprintf(msg, sizeof msg,
                     "Files validated: %" PRIu64 " examples in %" PRIu64
                     " rows of %u tokens%s; queued",
                     p.train.n_examples, p.train.n_rows, r->cfg.seq_len,
                     r->cfg.no_packing ? " (one example per row)" : "");
            ft_jobs_event(r->cfg.jobs, job.id, "info", msg, NULL);
        }
        pthread_mutex_lock(&r->mu);
        r->ready[r->n_ready++] = p;
        scheduler *s = r->sched;
        pthread_mutex_unlock(&r->mu);
        if (s) scheduler_wake(s);
    }
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* Life cycle                                                                 */
/* ------------------------------------------------------------------------- */

ft_runner *ft_runner_create(const ft_runner_config *cfg, char *err, size_t err_cap) {
    if (!(cfg->engine->api->capabilities & ORCH_CAP_LORA)) {
        util_set_err(err, err_cap,
                     "engine '%s' (ABI %u.%u) has no LoRA adapters: fine-tuning jobs "
                     "cannot run on it",
                     cfg->engine->api->name, cfg->engine->api->abi_major,
                     cfg->engine->api->abi_minor);
        return NULL;
    }
    if (!cfg->micro_batch || !cfg->seq_len || cfg->seq_len > cfg->model->context) {
        util_set_err(
            err, err_cap,
            "fine-tuning rows of %u positions do not fit the model's context (%u)",
            cfg->seq_len, cfg->model->context);
        return NULL;
    }
    const orch_engine_api *api = cfg->engine->api;
    if (cfg->token_level &&
        (!(api->capabilities & ORCH_CAP_FT_STREAM) || !ORCH_API_HAS(api, coserve_step))) {
        util_set_err(err, err_cap,
                     "engine '%s' (ABI %u.%u) has no token-level fine-tuning (ABI 1.5 "
                     "streams, ORCH_CAP_FT_STREAM): use --ft-granularity sequence",
                     api->name, api->abi_major, api->abi_minor);
        return NULL;
    }
    if (cfg->token_level && !cfg->chunk_tokens) {
        util_set_err(err, err_cap, "--ft-chunk-tokens must be at least 1");
        return NULL;
    }
    ft_runner *r = util_calloc(1, sizeof *r);
    if (!r) {
        util_set_err(err, err_cap, "out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    ft_budget_config bc = cfg->slo;
    bc.granule = granule(r);
    /* a row of work is a forward or a backward row, not both */
    if (cfg->token_level) bc.ft_ratio = FT_BUDGET_PRIOR_FT_RATIO / 2;
    if (bc.max_tokens < bc.granule) bc.max_tokens = bc.granule;
    r->budget = ft_budget_create(&bc, err, err_cap);
    size_t slot = (size_t)micro_tokens(r) * SCHED_MAX_FINETUNE_BATCHES;
    r->a.tok = malloc(slot * sizeof(int32_t));
    r->a.tgt = malloc(slot * sizeof(int32_t));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (!r->budget || !r->a.tok || !r->a.tgt) {
        if (r->budget) util_set_err(err, err_cap, "out of memory");
        ft_runner_destroy(r);
        return NULL;
    }
    metrics_registry *m = cfg->metrics;
    r->m_tokens = metrics_series_get(
        metrics_counter(m, "orch_finetune_tokens_total",
                        "Fine-tuning tokens trained inside the server (co-serving).", 0,
                        NULL),
        NULL);
    r->m_share = metrics_series_get(
        metrics_gauge(
            m, "orch_coserve_finetune_share",
            "Share of the last iteration's tokens that were fine-tuning tokens.", 0,
            NULL),
        NULL);
    r->m_attain = metrics_series_get(
        metrics_gauge(
            m, "orch_coserve_slo_attainment",
            "Share of decode iterations within the TPOT target (--slo-tpot-ms).", 0,
            NULL),
        NULL);
    r->m_factor = metrics_series_get(
        metrics_gauge(m, "orch_coserve_budget_factor",
                      "The fine-tuning budget's feedback factor (0..1; AIMD on the TPOT "
                      "target).",
                      0, NULL),
        NULL);
    r->m_ft_cost = metrics_series_get(
        metrics_gauge(m, "orch_coserve_finetune_token_seconds",
                      "The latency model's cost of one fine-tuning token (or row of "
                      "work at token level) in an iteration.",
                      0, NULL),
        NULL);
    r->m_p99 = metrics_series_get(
        metrics_gauge(m, "orch_coserve_tpot_p99_seconds",
                      "p99 time per output token over the recent decode iterations.", 0,
                      NULL),
        NULL);
    static const char *const kind_label[1] = { "kind" };
    metrics_family *kinds = metrics_counter(
        m, "orch_coserve_tokens_total",
        "Tokens through the scheduler's iterations by kind (decode, prefill, finetune).",
        1, kind_label);
    static const char *const kind_names[3] = { "decode", "prefill", "finetune" };
    for (int i = 0; i < 3; i++) r->m_kind[i] = metrics_series_get(kinds, &kind_names[i]);
    static const char *const job_labels[1] = { "status" };
    r->m_jobs = metrics_gauge(m, "orch_finetune_jobs", "Fine-tuning jobs by status.", 1,
                              job_labels);
    if (util_thread_start_nosignals(&r->thread, preparer_main, r) != 0) {
        util_set_err(err, err_cap, "cannot start the fine-tuning preparer thread");
        ft_runner_destroy(r);
        return NULL;
    }
    r->thread_started = 1;
    return r;
}

static void drop_active(ft_runner *r) {
    active *a = &r->a;
    if (!a->on) return;
    pthread_mutex_lock(&r->mu);
    r->running_id[0] = '\0';
    pthread_mutex_unlock(&r->mu);
    if (a->stream) r->cfg.engine->api->ft_stream_close(r->cfg.ctx, a->stream);
    if (a->adapter) r->cfg.engine->api->adapter_destroy(r->cfg.ctx, a->adapter);
    ft_order_free(&a->order);
    ft_dataset_free(&a->p.train);
    ft_dataset_free(&a->p.val);
    int32_t *tok = a->tok, *tgt = a->tgt;
    memset(a, 0, sizeof *a);
    a->tok = tok;
    a->tgt = tgt;
}

void ft_runner_destroy(ft_runner *r) {
    if (!r) return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    drop_active(r);
    for (uint32_t i = 0; i < r->n_ready; i++) {
        ft_dataset_free(&r->ready[i].train);
        ft_dataset_free(&r->ready[i].val);
    }
    free(r->a.tok);
    free(r->a.tgt);
    ft_budget_free(r->budget);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void ft_runner_attach(ft_runner *r, scheduler *s) {
    pthread_mutex_lock(&r->mu);
    r->sched = s;
    pthread_mutex_unlock(&r->mu);
}

void ft_runner_notify(ft_runner *r) {
    pthread_mutex_lock(&r->mu);
    r->kick = 1;
    pthread_cond_broadcast(&r->cv);
    scheduler *s = r->sched;
    pthread_mutex_unlock(&r->mu);
    if (s) scheduler_wake(s);
}

/* ------------------------------------------------------------------------- */
/* The scheduler thread                                                       */
/* ------------------------------------------------------------------------- */

static void update_job_gauges(ft_runner *r) {
    uint64_t counts[FT_JOB_CANCELLED + 1];
    ft_jobs_counts(r->cfg.jobs, counts);
    for (int i = 0; i <= FT_JOB_CANCELLED; i++) {
        const char *lv[1] = { ft_job_status_name(i) };
        metrics_gauge_set(metrics_series_get(r->m_jobs, lv), (double)counts[i]);
    }
}

static void engine_msg(ft_runner *r, int32_t st, const char *what, char *buf,
                       size_t cap) {
    char m[512];
    engine_format_error(r->cfg.engine, r->cfg.ctx, st, m, sizeof m);
    snprintf(buf, cap, "%s: %s", what, m);
}

/* ---- checkpoints: STATE/jobs/ID/ckpt (PEFT files, optimizer.safetensors,
 * state.json), replaced whole ---- */

static void ckpt_dir(const ft_runner *r, const char *id, const char *suffix, char *buf,
                     size_t cap) {
    snprintf(buf, cap, "%s/jobs/%.40s/ckpt%s", r->cfg.state_dir, id, suffix);
}

static int save_checkpoint(ft_runner *r, char *err, size_t err_cap) {
    active *a = &r->a;
    char dir[4200], tmp[4200], path[4300];
    ckpt_dir(r, a->job.id, "", dir, sizeof dir);
    ckpt_dir(r, a->job.id, ".tmp", tmp, sizeof tmp);
    char e2[256];
    fsio_rm_rf(tmp, e2, sizeof e2);
    peft_adapter pa;
    memset(&pa, 0, sizeof pa);
    int rc = -1;
    char *state = NULL;
    if (fsio_mkdir(tmp, err, err_cap) != 0 ||
        peft_adapter_from_engine(
            r->cfg.engine, r->cfg.ctx, a->adapter, r->cfg.model, &a->desc,
            r->cfg.base_name, coserve_fingerprint(r->cfg.cs), &pa, err, err_cap) != 0 ||
        peft_adapter_save(tmp, &pa, err, err_cap) != 0)
        goto out;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (adapter_moments_save(path, r->cfg.engine, r->cfg.ctx, a->adapter, &pa, NULL, err,
                             err_cap) != 0)
        goto out;
    char hex[65];
    data_rng_to_hex(&a->order.epoch_rng, hex);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)a->step);
    cJSON_AddNumberToObject(o, "epoch", (double)a->order.epoch);
    cJSON_AddNumberToObject(o, "cursor", (double)a->order.cursor);
    cJSON_AddStringToObject(o, "epoch_rng", hex);
    cJSON_AddNumberToObject(o, "trained_tokens", (double)a->trained_tokens);
    cJSON_AddNumberToObject(o, "total_steps", (double)a->total_steps);
    cJSON_AddNumberToObject(o, "seq_len", r->cfg.seq_len);
    cJSON_AddNumberToObject(o, "micro_batch", r->cfg.micro_batch);
    cJSON_AddBoolToObject(o, "packing", !r->cfg.no_packing);
    cJSON_AddNumberToObject(o, "rows", (double)a->p.train.n_rows);
    state = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "%s/state.json", tmp);
    if (!state) {
        util_set_err(err, err_cap, "out of memory");
        goto out;
    }
    if (fsio_write_file(path, state, strlen(state), err, err_cap) != 0 ||
        fsio_fsync_path(tmp, 1, err, err_cap) != 0)
        goto out;
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (fsio_exchange(tmp, dir, err, err_cap) != 0) goto out;
        fsio_rm_rf(tmp, e2, sizeof e2); /* the previous checkpoint */
    } else if (fsio_rename(tmp, dir, err, err_cap) != 0) {
        goto out;
    }
    rc = fsio_fsync_parent(dir, err, err_cap);
out:
    if (rc != 0) fsio_rm_rf(tmp, e2, sizeof e2);
    free(state);
    peft_adapter_free(&pa);
    return rc;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The checkpoint's packing (absent: from before the setting, packed). */
static int packed(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "packing");
    return v ? cJSON_IsTrue(v) : 1;
}

/* Continue a from its job's checkpoint when there is one that fits; 1 =
 * resumed, 0 = none (start from step 0), -1 = error (message). */
static int resume(ft_runner *r, char *err, size_t err_cap) {
    active *a = &r->a;
    char dir[4200], path[4300];
    ckpt_dir(r, a->job.id, "", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/state.json", dir);
    char *text = NULL;
    size_t len = 0;
    if (fsio_read_file(path, 1 << 16, &text, &len, err, err_cap) != 0) return 0;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(o, "epoch_rng");
    orch_rng er;
    int fits =
        o && cJSON_IsString(rng) && data_rng_from_hex(rng->valuestring, &er) == 0 &&
        num(o, "seq_len") == r->cfg.seq_len &&
        num(o, "micro_batch") == r->cfg.micro_batch && packed(o) == !r->cfg.no_packing &&
        num(o, "rows") == (double)a->p.train.n_rows &&
        num(o, "total_steps") == (double)a->total_steps && num(o, "step") >= 1;
    uint64_t step = fits ? (uint64_t)num(o, "step") : 0;
    uint64_t epoch = fits ? (uint64_t)num(o, "epoch") : 0;
    uint64_t cursor = fits ? (uint64_t)num(o, "cursor") : 0;
    uint64_t tokens = fits ? (uint64_t)num(o, "trained_tokens") : 0;
    cJSON_Delete(o);
    if (!fits) {
        ft_jobs_event(r->cfg.jobs, a->job.id, "warn",
                      "The checkpoint does not fit the server's settings now: starting "
                      "from step 0",
                      NULL);
        return 0;
    }
    peft_adapter pa;
    memset(&pa, 0, sizeof pa);
    uint32_t id = 0;
    int rc = -1;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (peft_adapter_load(dir, r->cfg.model, &pa, err, err_cap) == 0 &&
        peft_adapter_check_base(&pa, dir, coserve_fingerprint(r->cfg.cs), err, err_cap) ==
            0 &&
        pa.rank == a->desc.rank && pa.targets == a->desc.targets &&
        peft_adapter_to_engine(&pa, r->cfg.engine, r->cfg.ctx, &id, err, err_cap) == 0) {
        if (adapter_moments_load(path, r->cfg.engine, r->cfg.ctx, id, &pa, err,
                                 err_cap) == 0 &&
            ft_order_restore(&a->order, a->p.train.n_rows, epoch, cursor, &er) == 0)
            rc = 1;
        else
            r->cfg.engine->api->adapter_destroy(r->cfg.ctx, id);
    } else if (pa.rank != a->desc.rank || pa.targets != a->desc.targets) {
        util_set_err(err, err_cap, "%s: the adapter does not match the job", dir);
    }
    peft_adapter_free(&pa);
    if (rc != 1) return -1;
    a->adapter = id;
    a->step = step;
    a->trained_tokens = tokens;
    return 1;
}

/* Start the oldest queued job that has its data. */
static void start_next(ft_runner *r) {
    ft_job job;
    if (ft_jobs_oldest(r->cfg.jobs, FT_JOB_QUEUED, &job) != 0) return;
    pthread_mutex_lock(&r->mu);
    int found = -1;
    for (uint32_t i = 0; i < r->n_ready; i++)
        if (strcmp(r->ready[i].id, job.id) == 0) found = (int)i;
    prepared p;
    if (found >= 0) {
        p = r->ready[found];
        r->ready[found] = r->ready[--r->n_ready];
        snprintf(r->running_id, sizeof r->running_id, "%s", job.id);
    }
    pthread_mutex_unlock(&r->mu);
    if (found < 0) return;
    if (ft_jobs_transition(r->cfg.jobs, job.id, FT_JOB_QUEUED, FT_JOB_RUNNING, &p.hp) !=
        0) {
        ft_dataset_free(&p.train);
        ft_dataset_free(&p.val);
        pthread_mutex_lock(&r->mu);
        r->running_id[0] = '\0';
        pthread_mutex_unlock(&r->mu);
        return;
    }
    active *a = &r->a;
    a->on = 1;
    a->job = job;
    a->job.hp = p.hp;
    a->p = p;
    memset(&a->desc, 0, sizeof a->desc);
    a->desc.struct_size = sizeof a->desc;
    a->desc.rank = p.hp.lora_rank;
    a->desc.alpha = (float)p.hp.lora_alpha;
    a->desc.targets = r->cfg.targets;
    a->desc.seed = job.seed;
    char msg[1024];
    a->accum = p.hp.batch_size / r->cfg.micro_batch;
    a->total_steps =
        (uint64_t)ceil((double)p.hp.n_epochs * (double)p.train.n_rows / p.hp.batch_size);
    if (!a->total_steps) a->total_steps = 1;
    uint64_t per_epoch = (p.train.n_rows + p.hp.batch_size - 1) / p.hp.batch_size;
    a->ckpt_every = r->cfg.checkpoint_every ? r->cfg.checkpoint_every : per_epoch;
    if (!a->ckpt_every) a->ckpt_every = 1;
    int resumed = resume(r, msg, sizeof msg);
    if (resumed < 0) {
        char full[1200];
        snprintf(full, sizeof full, "resuming from the checkpoint: %s", msg);
        fail_job(r, job.id, "server_error", full);
        drop_active(r);
        return;
    }
    if (!resumed) {
        int32_t st =
            r->cfg.engine->api->adapter_create(r->cfg.ctx, &a->desc, &a->adapter);
        if (st != ORCH_OK) {
            engine_msg(r, st, "adapter_create", msg, sizeof msg);
            a->adapter = 0;
            fail_job(r, job.id, "invalid_hyperparameters", msg);
            drop_active(r);
            return;
        }
        if (ft_order_init(&a->order, p.train.n_rows, job.seed) != 0) {
            fail_job(r, job.id, "server_error", "out of memory");
            drop_active(r);
            return;
        }
    } else {
        snprintf(msg, sizeof msg, "Resumed from the checkpoint of step %" PRIu64,
                 a->step);
        ft_jobs_event(r->cfg.jobs, job.id, "info", msg, NULL);
    }
    a->sched = (lr_schedule){ LR_SCHEDULE_LINEAR, r->cfg.lr * p.hp.lr_multiplier, 0.0, 0,
                              a->total_steps };
    char how[96];
    if (r->cfg.token_level)
        snprintf(how, sizeof how, "token-level, chunks of %u rows", r->cfg.chunk_tokens);
    else
        snprintf(how, sizeof how, "%s",
                 r->cfg.temporal ? "time sharing" : "whole micro-batches");
    snprintf(msg, sizeof msg,
             "Fine-tuning job started: %" PRIu64 " steps of %u rows (%u micro-batches of "
             "%u; %s), LoRA rank %u alpha %g",
             a->total_steps, p.hp.batch_size, a->accum, r->cfg.micro_batch, how,
             a->desc.rank, (double)a->desc.alpha);
    ft_jobs_event(r->cfg.jobs, job.id, "info", msg, NULL);
}

int ft_runner_tasks(ft_runner *r) {
    active *a = &r->a;
    if (a->on && a->in_flight == 0) {
        ft_job now;
        if (ft_jobs_get(r->cfg.jobs, a->job.id, &now) != 0 ||
            now.status != FT_JOB_RUNNING)
            drop_active(r); /* cancelled */
    }
    if (!a->on) start_next(r);
    update_job_gauges(r);
    return a->on;
}

/* Zero the adapter's gradients at the start of an optimizer step; a failure
 * fails the job (-1). */
static int grads_zero(ft_runner *r) {
    active *a = &r->a;
    int32_t st = r->cfg.engine->api->adapter_grads_zero(r->cfg.ctx, a->adapter);
    if (st == ORCH_OK) return 0;
    char msg[1024];
    engine_msg(r, st, "adapter_grads_zero", msg, sizeof msg);
    fail_job(r, a->job.id, "server_error", msg);
    drop_active(r);
    return -1;
}

/* The next micro-batch in ft_order's order into slot i of the buffers. */
static void next_micro_batch(ft_runner *r, uint32_t i, orch_finetune_batch *f) {
    active *a = &r->a;
    const uint32_t T = r->cfg.seq_len, B = r->cfg.micro_batch;
    int32_t *tok = a->tok + (size_t)i * B * T, *tgt = a->tgt + (size_t)i * B * T;
    ft_order_next(&a->order, &a->p.train, B, tok, tgt);
    memset(f, 0, sizeof *f);
    f->struct_size = sizeof *f;
    f->adapter_id = a->adapter;
    f->tokens = tok;
    f->targets = tgt;
    f->batch = B;
    f->seq_len = T;
    f->grad_scale = 1.0f / (float)a->accum;
}

uint32_t ft_runner_take(ft_runner *r, uint32_t decode_tokens, uint32_t prefill_tokens,
                        double oldest_wait_ms, orch_finetune_batch *ft, uint32_t cap) {
    active *a = &r->a;
    if (!a->on || a->step >= a->total_steps) return 0;
    uint32_t budget =
        r->cfg.temporal && decode_tokens + prefill_tokens > 0
            ? granule(r) /* time sharing: one micro-batch after each inference pass */
            : ft_budget_next(r->budget, decode_tokens, prefill_tokens, oldest_wait_ms);
    uint32_t k = budget / granule(r);
    uint32_t left = a->accum - a->accum_done;
    if (k > left) k = left;
    if (k > cap) k = cap;
    if (k > SCHED_MAX_FINETUNE_BATCHES) k = SCHED_MAX_FINETUNE_BATCHES;
    if (k == 0) return 0;
    if (a->accum_done == 0 && grads_zero(r) != 0) return 0;
    for (uint32_t i = 0; i < k; i++) next_micro_batch(r, i, &ft[i]);
    a->in_flight = k;
    return k;
}

uint32_t ft_runner_take_rows(ft_runner *r, uint32_t decode_tokens,
                             uint32_t prefill_tokens, double oldest_wait_ms,
                             uint32_t *stream) {
    active *a = &r->a;
    if (!a->on || a->step >= a->total_steps) return 0;
    uint32_t budget =
        ft_budget_next(r->budget, decode_tokens, prefill_tokens, oldest_wait_ms);
    if (budget == 0) return 0;
    if (!a->stream) {
        if (a->accum_done == 0 && grads_zero(r) != 0) return 0;
        orch_finetune_batch f;
        next_micro_batch(r, 0, &f);
        int32_t st = r->cfg.engine->api->ft_stream_open(r->cfg.ctx, &f, &a->stream);
        if (st != ORCH_OK) {
            char msg[1024];
            engine_msg(r, st, "ft_stream_open", msg, sizeof msg);
            a->stream = 0;
            fail_job(r, a->job.id, "server_error", msg);
            drop_active(r);
            return 0;
        }
        a->stream_left = 2ull * micro_tokens(r);
    }
    *stream = a->stream;
    a->in_flight = 1;
    return budget < a->stream_left ? budget : (uint32_t)a->stream_left;
}

static void fine_tuned_name(const ft_runner *r, const ft_job *job, char *buf,
                            size_t cap) {
    snprintf(buf, cap, "ft:%s:%s:%.8s", r->cfg.base_name,
             job->suffix[0] ? job->suffix : "orch", job->id + 6);
}

/* A checkpoint's metrics object. */
static void metrics_json(char *buf, size_t cap, uint64_t step, double loss, double val) {
    if (isfinite(val))
        snprintf(buf, cap,
                 "{\"step\":%" PRIu64 ",\"train_loss\":%.6g,\"valid_loss\":%.6g}", step,
                 loss, val);
    else
        snprintf(buf, cap, "{\"step\":%" PRIu64 ",\"train_loss\":%.6g}", step, loss);
}

/* The target-weighted mean loss of the validation rows (micro-batches of
 * the server's size), as orch finetune evaluates; NAN without a validation
 * file or on an engine error (reported as an event). */
static double validation_loss(ft_runner *r) {
    active *a = &r->a;
    const ft_dataset *v = &a->p.val;
    const uint32_t T = v->seq_len, B = r->cfg.micro_batch;
    double sum = 0, count = 0;
    for (uint64_t row = 0; row < v->n_rows; row += B) {
        uint32_t nb = (uint32_t)(v->n_rows - row < B ? v->n_rows - row : B);
        const int32_t *tg = v->targets + row * T;
        uint64_t c = 0;
        for (uint64_t i = 0; i < (uint64_t)nb * T; i++) c += tg[i] != -1;
        if (!c) continue;
        float l = 0;
        int32_t st = r->cfg.engine->api->adapter_eval_loss(
            r->cfg.ctx, a->adapter, v->tokens + row * T, tg, nb, T, &l);
        if (st != ORCH_OK) {
            char msg[1024];
            engine_msg(r, st, "adapter_eval_loss", msg, sizeof msg);
            ft_jobs_event(r->cfg.jobs, a->job.id, "warn", msg, NULL);
            return NAN;
        }
        sum += (double)l * (double)c;
        count += (double)c;
    }
    return count > 0 ? sum / count : NAN;
}

/* The last step is done: save the adapter, serve it, succeed. */
static void finish(ft_runner *r) {
    active *a = &r->a;
    char name[FT_JOB_NAME_MAX], dir[4096], msg[1024];
    fine_tuned_name(r, &a->job, name, sizeof name);
    snprintf(dir, sizeof dir, "%s/adapters/%.40s", r->cfg.state_dir, a->job.id);
    peft_adapter pa;
    memset(&pa, 0, sizeof pa);
    const char *fp = coserve_fingerprint(r->cfg.cs);
    if (fsio_mkdir_p(dir, msg, sizeof msg) != 0 ||
        peft_adapter_from_engine(r->cfg.engine, r->cfg.ctx, a->adapter, r->cfg.model,
                                 &a->desc, r->cfg.base_name, fp, &pa, msg,
                                 sizeof msg) != 0 ||
        peft_adapter_save(dir, &pa, msg, sizeof msg) != 0) {
        peft_adapter_free(&pa);
        char full[1200];
        snprintf(full, sizeof full, "saving the adapter: %s", msg);
        fail_job(r, a->job.id, "server_error", full);
        drop_active(r);
        return;
    }
    peft_adapter_free(&pa);
    /* the engine adapter becomes the served model (no copy, no reload) */
    if (coserve_register(r->cfg.cs, name, dir, a->adapter, msg, sizeof msg) != 0) {
        char full[1200];
        snprintf(full, sizeof full, "serving the adapter: %s", msg);
        fail_job(r, a->job.id, "server_error", full);
        drop_active(r);
        return;
    }
    a->adapter = 0; /* coserve's now */
    char metrics[128];
    metrics_json(metrics, sizeof metrics, a->step, a->loss_sum, a->last_val);
    ft_jobs_checkpoint(r->cfg.jobs, a->job.id, a->step, name, metrics);
    ft_jobs_progress(r->cfg.jobs, a->job.id, a->trained_tokens);
    snprintf(msg, sizeof msg, "The job has successfully completed: model %s", name);
    ft_jobs_event(r->cfg.jobs, a->job.id, "info", msg, NULL);
    ft_jobs_finish(r->cfg.jobs, a->job.id, FT_JOB_SUCCEEDED, name, NULL, NULL);
    drop_active(r);
}

/* The budget and the per-iteration metrics of one observed iteration. */
static void observe(ft_runner *r, uint32_t decode_tokens, uint32_t prefill_tokens,
                    uint32_t ft_tokens, double seconds) {
    ft_budget_observe(r->budget, decode_tokens, prefill_tokens, ft_tokens, seconds);
    ft_budget_stats bs;
    ft_budget_get_stats(r->budget, &bs);
    metrics_gauge_set(r->m_attain, bs.attainment);
    metrics_gauge_set(r->m_p99, bs.p99_tpot_ms / 1e3);
    metrics_gauge_set(r->m_factor, bs.factor);
    metrics_gauge_set(r->m_ft_cost, bs.model_ms[3] / 1e3);
    uint32_t all = decode_tokens + prefill_tokens + ft_tokens;
    metrics_counter_add(r->m_kind[0], decode_tokens);
    metrics_counter_add(r->m_kind[1], prefill_tokens);
    metrics_counter_add(r->m_kind[2], ft_tokens);
    metrics_gauge_set(r->m_share, all ? (double)ft_tokens / all : 0);
}

/* After the fine-tuning part of an iteration ran: 0 when the job goes on
 * with it, -1 when it was cancelled meanwhile or the part failed (the job
 * is dropped, failed with the engine's message). */
static int part_ran(ft_runner *r, int32_t st, const char *err) {
    active *a = &r->a;
    a->in_flight = 0;
    ft_job now;
    if (ft_jobs_get(r->cfg.jobs, a->job.id, &now) != 0 || now.status != FT_JOB_RUNNING) {
        drop_active(r); /* cancelled while its micro-batches ran */
        return -1;
    }
    if (st != ORCH_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "engine error: %s", err && *err ? err : "unknown");
        fail_job(r, a->job.id, "server_error", msg);
        drop_active(r);
        return -1;
    }
    return 0;
}

static void micro_batches_done(ft_runner *r, const float *losses, uint32_t n);

void ft_runner_done(ft_runner *r, int32_t st, const char *err, const float *losses,
                    uint32_t n, uint32_t decode_tokens, uint32_t prefill_tokens,
                    double seconds) {
    uint32_t ft_tokens = st == ORCH_OK ? n * micro_tokens(r) : 0;
    observe(r, decode_tokens, prefill_tokens, ft_tokens, seconds);
    if (n == 0 || !r->a.on) return;
    if (part_ran(r, st, err) == 0) micro_batches_done(r, losses, n);
}

void ft_runner_done_rows(ft_runner *r, int32_t st, const char *err,
                         const orch_ft_progress *progress, uint32_t decode_tokens,
                         uint32_t prefill_tokens, double seconds) {
    active *a = &r->a;
    uint32_t rows = progress ? (uint32_t)progress->rows_this_step : 0;
    observe(r, decode_tokens, prefill_tokens, rows, seconds);
    if (!a->on || !a->in_flight) return;
    if (part_ran(r, st, err) != 0) return;
    if (!progress) return;
    a->stream_left -= rows < a->stream_left ? rows : a->stream_left;
    if (!progress->finished) return;
    float loss = progress->loss;
    r->cfg.engine->api->ft_stream_close(r->cfg.ctx, a->stream);
    a->stream = 0;
    a->stream_left = 0;
    micro_batches_done(r, &loss, 1);
}

/* n micro-batches of the running step are done (their gradients in the
 * adapter): at the step's last one, AdamW, the event, checkpoints and the
 * job's end. */
static void micro_batches_done(ft_runner *r, const float *losses, uint32_t n) {
    active *a = &r->a;
    const uint32_t ft_tokens = n * micro_tokens(r);
    for (uint32_t i = 0; i < n; i++) a->loss_sum += (double)losses[i];
    a->accum_done += n;
    a->trained_tokens += ft_tokens;
    metrics_counter_add(r->m_tokens, ft_tokens);
    if (a->accum_done < a->accum) return;
    uint64_t step = a->step + 1;
    double lr = lr_schedule_at(&a->sched, step);
    orch_adamw_params ap;
    memset(&ap, 0, sizeof ap);
    ap.struct_size = sizeof ap;
    ap.step = step;
    ap.lr = (float)lr;
    ap.beta1 = 0.9f;
    ap.beta2 = 0.999f;
    ap.eps = 1e-8f;
    ap.weight_decay = 0.0f;
    ap.grad_clip = 1.0f;
    float gnorm = 0;
    int32_t s2 =
        r->cfg.engine->api->adapter_optimizer_step(r->cfg.ctx, a->adapter, &ap, &gnorm);
    if (s2 != ORCH_OK) {
        char msg[1024];
        engine_msg(r, s2, "adapter_optimizer_step", msg, sizeof msg);
        fail_job(r, a->job.id, "server_error", msg);
        drop_active(r);
        return;
    }
    double loss = a->loss_sum / a->accum;
    a->step = step;
    a->accum_done = 0;
    a->loss_sum = 0;
    char msg[256], data[320];
    int last = step == a->total_steps, ckpt = !last && step % a->ckpt_every == 0;
    double val = (last || ckpt) && a->p.val.n_rows ? validation_loss(r) : NAN;
    if (isfinite(val)) {
        snprintf(msg, sizeof msg,
                 "Step %" PRIu64 "/%" PRIu64 ": training loss=%.4f, validation loss=%.4f",
                 step, a->total_steps, loss, val);
        snprintf(data, sizeof data,
                 "{\"step\":%" PRIu64 ",\"train_loss\":%.8g,\"valid_loss\":%.8g,"
                 "\"learning_rate\":%.8g,\"grad_norm\":%.8g,\"total_steps\":%" PRIu64 "}",
                 step, loss, val, lr, (double)gnorm, a->total_steps);
    } else {
        snprintf(msg, sizeof msg, "Step %" PRIu64 "/%" PRIu64 ": training loss=%.4f",
                 step, a->total_steps, loss);
        snprintf(data, sizeof data,
                 "{\"step\":%" PRIu64 ",\"train_loss\":%.8g,\"learning_rate\":%.8g,"
                 "\"grad_norm\":%.8g,\"total_steps\":%" PRIu64 "}",
                 step, loss, lr, (double)gnorm, a->total_steps);
    }
    a->last_val = val;
    ft_jobs_event(r->cfg.jobs, a->job.id, "info", msg, data);
    ft_jobs_progress(r->cfg.jobs, a->job.id, a->trained_tokens);
    if (step == a->total_steps) {
        a->loss_sum = loss; /* the final loss, for the checkpoint's metrics */
        finish(r);
        return;
    }
    if (step % a->ckpt_every == 0) {
        char cerr[1024];
        if (save_checkpoint(r, cerr, sizeof cerr) != 0) {
            char m[1200];
            snprintf(m, sizeof m, "Checkpoint of step %" PRIu64 " not written: %s", step,
                     cerr);
            ft_jobs_event(r->cfg.jobs, a->job.id, "warn", m, NULL);
        } else {
            char cname[FT_JOB_NAME_MAX + 32], metrics[128];
            fine_tuned_name(r, &a->job, cname, sizeof cname);
            size_t l = strlen(cname);
            snprintf(cname + l, sizeof cname - l, ":ckpt-step-%" PRIu64, step);
            metrics_json(metrics, sizeof metrics, step, loss, a->last_val);
            ft_jobs_checkpoint(r->cfg.jobs, a->job.id, step, cname, metrics);
        }
    }
}

int ft_runner_token_level(const ft_runner *r) { return r->cfg.token_level; }

int ft_runner_temporal(const ft_runner *r) { return r->cfg.temporal; }
