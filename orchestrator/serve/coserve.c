/*
 * coserve.c - LoRA adapters served next to the base model, and the engine
 * tasks of co-serving on the scheduler thread (see coserve.h).
 */
#include "orchestrator/serve/coserve.h"

#include <cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/ft_runner.h"
#include "orchestrator/store/peft_adapter.h"

typedef struct cs_adapter {
    char name[COSERVE_NAME_MAX];
    char dir[4096];
    uint32_t id; /* the engine's */
    uint32_t refs;
    int unloading; /* no new requests; destroyed when refs reach 0 */
    long created;
} cs_adapter;

enum { TASK_LOAD = 1, TASK_UNLOAD };

typedef struct cs_task {
    int kind;
    char name[COSERVE_NAME_MAX];
    char dir[4096];
    int done, rc;
    char err[1024];
    struct cs_task *next;
} cs_task;

struct coserve {
    coserve_config cfg;
    sched_coserve hooks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cs_adapter adapters[COSERVE_MAX_ADAPTERS];
    uint32_t n;
    char fingerprint[PEFT_FP_MAX]; /* of the base ("" until computed) */
    scheduler *sched;              /* attached: tasks go through its thread */
    cs_task *tasks_head, *tasks_tail;
    int destroyed_pending; /* adapters with unloading && refs == 0 exist */
    ft_runner *runner;     /* fine-tuning jobs (NULL = none) */
};

static int lora_capable(const coserve *c, char *err, size_t err_cap) {
    if (c->cfg.engine->api->capabilities & ORCH_CAP_LORA) return 0;
    util_set_err(err, err_cap,
                 "engine '%s' (ABI %u.%u) has no LoRA adapters (capability lora): it "
                 "cannot serve adapters",
                 c->cfg.engine->api->name, c->cfg.engine->api->abi_major,
                 c->cfg.engine->api->abi_minor);
    return -1;
}

/* The base's fingerprint, computed once (engine reads: the caller owns the
 * context at that moment). */
static int ensure_fingerprint(coserve *c, char *err, size_t err_cap) {
    if (c->fingerprint[0]) return 0;
    return peft_base_fingerprint(c->cfg.engine, c->cfg.ctx, c->fingerprint, err, err_cap);
}

static int task_hook(void *arg);

coserve *coserve_create(const coserve_config *cfg, char *err, size_t err_cap) {
    coserve *c = util_calloc(1, sizeof *c);
    if (!c) {
        util_set_err(err, err_cap, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    if (!c->cfg.max_adapters || c->cfg.max_adapters > COSERVE_MAX_ADAPTERS)
        c->cfg.max_adapters = COSERVE_MAX_ADAPTERS;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->hooks.tasks = task_hook;
    c->hooks.arg = c;
    if ((cfg->allow_runtime_load || cfg->fingerprint_now) &&
        (cfg->engine->api->capabilities & ORCH_CAP_LORA) &&
        ensure_fingerprint(c, err, err_cap) != 0) {
        coserve_destroy(c);
        return NULL;
    }
    return c;
}

void coserve_destroy(coserve *c) {
    if (!c) return;
    /* The scheduler is gone: the caller owns the context again. */
    for (uint32_t i = 0; i < c->n; i++)
        c->cfg.engine->api->adapter_destroy(c->cfg.ctx, c->adapters[i].id);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int valid_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= COSERVE_NAME_MAX) return 0;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f || *p == '"' || *p == '\\' || *p == '?' || *p == '#')
            return 0;
    return 1;
}

static cs_adapter *find(coserve *c, const char *name) {
    for (uint32_t i = 0; i < c->n; i++)
        if (strcmp(c->adapters[i].name, name) == 0) return &c->adapters[i];
    return NULL;
}

/* Load DIR into the engine as NAME (the caller owns the context now). */
static int load_adapter(coserve *c, const char *name, const char *dir, char *err,
                        size_t err_cap) {
    if (lora_capable(c, err, err_cap) != 0) return -1;
    if (!valid_name(name)) {
        util_set_err(err, err_cap,
                     "adapter name '%.64s' must be 1 to %d printable characters without "
                     "spaces, quotes, '\\', '?' or '#'",
                     name, COSERVE_NAME_MAX - 1);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    int taken = strcmp(name, c->cfg.base_name) == 0 || find(c, name) != NULL;
    int full = c->n >= c->cfg.max_adapters;
    pthread_mutex_unlock(&c->mu);
    if (taken) {
        util_set_err(err, err_cap, "a model named '%s' is already served", name);
        return -1;
    }
    if (full) {
        util_set_err(err, err_cap, "%u adapters are loaded already (the limit)",
                     c->cfg.max_adapters);
        return -1;
    }
    if (ensure_fingerprint(c, err, err_cap) != 0) return -1;
    peft_adapter a;
    memset(&a, 0, sizeof a);
    uint32_t id = 0;
    if (peft_adapter_load(dir, c->cfg.model, &a, err, err_cap) != 0 ||
        peft_adapter_check_base(&a, dir, c->fingerprint, err, err_cap) != 0 ||
        peft_adapter_to_engine(&a, c->cfg.engine, c->cfg.ctx, &id, err, err_cap) != 0) {
        peft_adapter_free(&a);
        return -1;
    }
    peft_adapter_free(&a);
    pthread_mutex_lock(&c->mu);
    cs_adapter *x = &c->adapters[c->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->dir, sizeof x->dir, "%s", dir);
    x->id = id;
    x->created = (long)time(NULL);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int coserve_add_now(coserve *c, const char *name, const char *dir, char *err,
                    size_t err_cap) {
    if (c->sched) {
        util_set_err(err, err_cap, "coserve_add_now after the scheduler started");
        return -1;
    }
    return load_adapter(c, name, dir, err, err_cap);
}

void coserve_attach(coserve *c, scheduler *s) {
    pthread_mutex_lock(&c->mu);
    c->sched = s;
    pthread_mutex_unlock(&c->mu);
}

const sched_coserve *coserve_hooks(coserve *c) { return &c->hooks; }

/* Remove adapter slot i (under mu), destroying the engine adapter. */
static void drop_locked(coserve *c, uint32_t i) {
    c->cfg.engine->api->adapter_destroy(c->cfg.ctx, c->adapters[i].id);
    c->adapters[i] = c->adapters[c->n - 1];
    c->n--;
}

/* Scheduler thread: queued loads and unloads, then adapters whose unload
 * waited for their last request. */
static int task_hook(void *arg) {
    coserve *c = arg;
    pthread_mutex_lock(&c->mu);
    cs_task *t = c->tasks_head;
    c->tasks_head = c->tasks_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    while (t) {
        cs_task *next = t->next;
        int rc = 0;
        char err[1024] = "";
        if (t->kind == TASK_LOAD) {
            rc = load_adapter(c, t->name, t->dir, err, sizeof err);
        } else {
            pthread_mutex_lock(&c->mu);
            cs_adapter *x = find(c, t->name);
            if (!x || x->unloading) {
                rc = -1;
                util_set_err(err, sizeof err, "no adapter named '%.128s' is loaded",
                             t->name);
            } else {
                x->unloading = 1;
                c->destroyed_pending = 1;
            }
            pthread_mutex_unlock(&c->mu);
        }
        pthread_mutex_lock(&c->mu);
        t->rc = rc;
        snprintf(t->err, sizeof t->err, "%s", err);
        t->done = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        t = next;
    }
    pthread_mutex_lock(&c->mu);
    if (c->destroyed_pending) {
        c->destroyed_pending = 0;
        for (uint32_t i = 0; i < c->n;) {
            if (c->adapters[i].unloading && c->adapters[i].refs == 0)
                drop_locked(c, i);
            else {
                if (c->adapters[i].unloading) c->destroyed_pending = 1;
                i++;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return c->runner ? ft_runner_tasks(c->runner) : 0;
}

static uint32_t take_hook(void *arg, uint32_t decode_tokens, uint32_t prefill_tokens,
                          double oldest_wait_ms, orch_finetune_batch *ft, uint32_t cap) {
    coserve *c = arg;
    return c->runner ? ft_runner_take(c->runner, decode_tokens, prefill_tokens,
                                      oldest_wait_ms, ft, cap)
                     : 0;
}

static void done_hook(void *arg, int32_t st, const char *err, const float *losses,
                      uint32_t n, uint32_t decode_tokens, uint32_t prefill_tokens,
                      double seconds) {
    coserve *c = arg;
    if (c->runner)
        ft_runner_done(c->runner, st, err, losses, n, decode_tokens, prefill_tokens,
                       seconds);
}

static uint32_t take_rows_hook(void *arg, uint32_t decode_tokens, uint32_t prefill_tokens,
                               double oldest_wait_ms, uint32_t *stream) {
    coserve *c = arg;
    return c->runner ? ft_runner_take_rows(c->runner, decode_tokens, prefill_tokens,
                                           oldest_wait_ms, stream)
                     : 0;
}

static void done_rows_hook(void *arg, int32_t st, const char *err,
                           const orch_ft_progress *progress, uint32_t decode_tokens,
                           uint32_t prefill_tokens, double seconds) {
    coserve *c = arg;
    if (c->runner)
        ft_runner_done_rows(c->runner, st, err, progress, decode_tokens, prefill_tokens,
                            seconds);
}

void coserve_set_runner(coserve *c, ft_runner *r) {
    c->runner = r;
    const int rows = r && ft_runner_token_level(r);
    c->hooks.take = r && !rows ? take_hook : NULL;
    c->hooks.done = r && !rows ? done_hook : NULL;
    c->hooks.take_rows = rows ? take_rows_hook : NULL;
    c->hooks.done_rows = rows ? done_rows_hook : NULL;
    c->hooks.separate = r ? ft_runner_temporal(r) : 0;
}

const char *coserve_fingerprint(const coserve *c) { return c->fingerprint; }

int coserve_register(coserve *c, const char *name, const char *dir, uint32_t id,
                     char *err, size_t err_cap) {
    pthread_mutex_lock(&c->mu);
    int rc = -1;
    if (!valid_name(name))
        util_set_err(err, err_cap, "adapter name '%.64s' is not valid", name);
    else if (find(c, name) || strcmp(name, c->cfg.base_name) == 0)
        util_set_err(err, err_cap, "a model named '%s' is already served", name);
    else if (c->n >= c->cfg.max_adapters)
        util_set_err(err, err_cap, "%u adapters are loaded already (the limit)",
                     c->cfg.max_adapters);
    else {
        cs_adapter *x = &c->adapters[c->n++];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", name);
        snprintf(x->dir, sizeof x->dir, "%s", dir);
        x->id = id;
        x->created = (long)time(NULL);
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coserve_resolve(coserve *c, const char *name, uint32_t *adapter_id) {
    if (strcmp(name, c->cfg.base_name) == 0) {
        *adapter_id = 0;
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    cs_adapter *x = find(c, name);
    int rc = -1;
    if (x && !x->unloading) {
        x->refs++;
        *adapter_id = x->id;
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void coserve_release(coserve *c, uint32_t adapter_id) {
    if (!adapter_id) return;
    int wake = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->n; i++)
        if (c->adapters[i].id == adapter_id && c->adapters[i].refs > 0) {
            c->adapters[i].refs--;
            wake = c->adapters[i].unloading && c->adapters[i].refs == 0;
            break;
        }
    scheduler *s = c->sched;
    pthread_mutex_unlock(&c->mu);
    if (wake && s) scheduler_wake(s); /* the destroy runs on its thread */
}

static void entry_json(const coserve *c, const cs_adapter *x, strbuf *b,
                       uint32_t max_model_len) {
    strbuf_puts(b, "{\"id\":");
    json_write_cstring(b, x->name);
    strbuf_printf(b,
                  ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"orch\",\"root\":",
                  x->created);
    json_write_cstring(b, x->dir);
    strbuf_puts(b, ",\"parent\":");
    json_write_cstring(b, c->cfg.base_name);
    strbuf_printf(b, ",\"max_model_len\":%u}", max_model_len);
}

void coserve_models_json(coserve *c, strbuf *b, uint32_t max_model_len) {
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->adapters[i].unloading) continue;
        strbuf_puts(b, ",");
        entry_json(c, &c->adapters[i], b, max_model_len);
    }
    pthread_mutex_unlock(&c->mu);
}

int coserve_model_json(coserve *c, const char *name, strbuf *b, uint32_t max_model_len) {
    pthread_mutex_lock(&c->mu);
    cs_adapter *x = find(c, name);
    if (x && !x->unloading) entry_json(c, x, b, max_model_len);
    int rc = x && !x->unloading ? 0 : -1;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uint32_t coserve_adapter_count(coserve *c) {
    pthread_mutex_lock(&c->mu);
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n; i++) n += !c->adapters[i].unloading;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Queue t and wait for the scheduler thread to run it. */
static int run_task(coserve *c, cs_task *t, double timeout_s, api_error *e) {
    pthread_mutex_lock(&c->mu);
    scheduler *s = c->sched;
    if (!s) {
        pthread_mutex_unlock(&c->mu);
        return api_error_set(e, 503, NULL, "server_busy",
                             "the server is still loading; retry shortly");
    }
    if (c->tasks_tail)
        c->tasks_tail->next = t;
    else
        c->tasks_head = t;
    c->tasks_tail = t;
    pthread_mutex_unlock(&c->mu);
    scheduler_wake(s);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout_s;
    pthread_mutex_lock(&c->mu);
    while (!t->done) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT && !t->done) {
            /* still queued: take it back; running: wait for it anyway (the
             * task lives on this stack) */
            cs_task **pp = &c->tasks_head, *prev = NULL;
            while (*pp && *pp != t) {
                prev = *pp;
                pp = &(*pp)->next;
            }
            if (*pp == t) {
                *pp = t->next;
                if (c->tasks_tail == t) c->tasks_tail = prev;
                pthread_mutex_unlock(&c->mu);
                return api_error_set(e, 503, NULL, "server_busy",
                                     "the scheduler did not take the request in %.0f s",
                                     timeout_s);
            }
            pthread_cond_wait(&c->cv, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* The body: a JSON object with exactly the string fields in `keys`. */
static cJSON *parse_body(const char *body, size_t len, const char *const *keys, size_t n,
                         api_error *e) {
    cJSON *r = cJSON_ParseWithLength(body, len);
    if (!r || !cJSON_IsObject(r)) {
        cJSON_Delete(r);
        api_error_set(e, 400, NULL, "invalid_json", "the body must be a JSON object");
        return NULL;
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, r) {
        size_t k = 0;
        while (k < n && strcmp(v->string, keys[k]) != 0) k++;
        if (k == n) {
            api_error_set(e, 400, NULL, "unknown_parameter", "unknown field '%.64s'",
                          v->string);
            cJSON_Delete(r);
            return NULL;
        }
        if (!cJSON_IsString(v)) {
            api_error_set(e, 400, keys[k], "invalid_type", "'%s' must be a string",
                          keys[k]);
            cJSON_Delete(r);
            return NULL;
        }
    }
    for (size_t k = 0; k < n; k++)
        if (!cJSON_GetObjectItemCaseSensitive(r, keys[k])) {
            api_error_set(e, 400, keys[k], "missing_required_parameter",
                          "'%s' is required", keys[k]);
            cJSON_Delete(r);
            return NULL;
        }
    return r;
}

int coserve_load_request(coserve *c, const char *body, size_t len, double timeout_s,
                         strbuf *answer, api_error *e) {
    if (!c->cfg.allow_runtime_load)
        return api_error_set(e, 403, NULL, "forbidden",
                             "loading adapters at run time is off: start orch serve with "
                             "--enable-lora-loading (or load them with --lora NAME=DIR)");
    static const char *const keys[] = { "lora_name", "lora_path" };
    cJSON *r = parse_body(body, len, keys, 2, e);
    if (!r) return -1;
    cs_task t;
    memset(&t, 0, sizeof t);
    t.kind = TASK_LOAD;
    snprintf(t.name, sizeof t.name, "%s",
             cJSON_GetObjectItemCaseSensitive(r, "lora_name")->valuestring);
    const char *path = cJSON_GetObjectItemCaseSensitive(r, "lora_path")->valuestring;
    int too_long = strlen(path) >= sizeof t.dir;
    snprintf(t.dir, sizeof t.dir, "%s", path);
    cJSON_Delete(r);
    if (too_long)
        return api_error_set(e, 400, "lora_path", "invalid_value", "path too long");
    if (run_task(c, &t, timeout_s, e) != 0) return -1;
    if (t.rc != 0)
        return api_error_set(e, 400, "lora_path", "invalid_adapter", "%s", t.err);
    strbuf_printf(answer, "{\"status\":\"loaded\",\"lora_name\":");
    json_write_cstring(answer, t.name);
    strbuf_puts(answer, "}");
    return 0;
}

int coserve_unload_request(coserve *c, const char *body, size_t len, double timeout_s,
                           strbuf *answer, api_error *e) {
    if (!c->cfg.allow_runtime_load)
        return api_error_set(e, 403, NULL, "forbidden",
                             "unloading adapters at run time is off: start orch serve "
                             "with --enable-lora-loading");
    static const char *const keys[] = { "lora_name" };
    cJSON *r = parse_body(body, len, keys, 1, e);
    if (!r) return -1;
    cs_task t;
    memset(&t, 0, sizeof t);
    t.kind = TASK_UNLOAD;
    snprintf(t.name, sizeof t.name, "%s",
             cJSON_GetObjectItemCaseSensitive(r, "lora_name")->valuestring);
    cJSON_Delete(r);
    if (run_task(c, &t, timeout_s, e) != 0) return -1;
    if (t.rc != 0) return api_error_set(e, 404, "lora_name", "not_found", "%s", t.err);
    strbuf_printf(answer, "{\"status\":\"unloaded\",\"lora_name\":");
    json_write_cstring(answer, t.name);
    strbuf_puts(answer, "}");
    return 0;
}
