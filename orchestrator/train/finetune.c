/*
 * finetune.c - offline LoRA fine-tuning: base checkpoint, packed JSONL data,
 * one adapter trained through the engine's ABI 1.4 adapter calls, atomic
 * checkpoints with exact resume, the adapter in the PEFT layout. See
 * finetune.h.
 */
#include "orchestrator/train/finetune.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/rng.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/data_loader.h"
#include "orchestrator/data/finetune_data.h"
#include "orchestrator/data/ft_order.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/store/adapter_moments.h"
#include "orchestrator/store/peft_adapter.h"
#include "orchestrator/store/safetensors.h"
#include "orchestrator/store/sha256.h"
#include "orchestrator/train/lr_schedule.h"
#include "orchestrator/train/train_metrics.h"

#define FT_STATE_FORMAT 1
#define FT_OPTIM_FILE   "optimizer.safetensors"
#define FT_STATE_FILE   "state.json"
#define JSON_SAFE_MAX   ((uint64_t)1 << 53)

void finetune_settings_default(finetune_settings *s) {
    memset(s, 0, sizeof *s);
    s->epochs = 1;
    s->lr = 2e-4;
    snprintf(s->schedule, sizeof s->schedule, "linear");
    s->rank = 8;
    s->alpha = 16;
    snprintf(s->targets, sizeof s->targets, "qkv");
    s->batch = 8;
    s->grad_accum = 1;
    s->packing = 1;
    s->grad_clip = 1.0;
    s->beta1 = 0.9;
    s->beta2 = 0.999;
    s->eps = 1e-8;
    s->keep = 2;
}

/* What changes while a run goes (state.json besides the settings). */
typedef struct ft_state {
    uint64_t step, total_steps;
    uint64_t epoch, cursor; /* rows of the current epoch's order consumed */
    orch_rng epoch_rng;     /* the rng before this epoch's shuffle */
    uint64_t tokens_seen;
    double best_val_loss; /* NaN: none */
    uint64_t best_val_step;
    uint32_t evals_since_best;
    double last_loss, last_val_loss, last_lr, elapsed_s, tokens_per_s;
} ft_state;

typedef struct ft {
    const finetune_opts *o;
    finetune_settings set;
    ft_state st;
    inference_model m;
    int m_open;
    chat_template_choice chat;
    ft_dataset train, val;
    uint32_t targets;
    uint32_t adapter;
    int have_adapter;
    char fingerprint[PEFT_FP_MAX];
    char data_sha[65], val_sha[65];
    ft_order order; /* the row order (ft_order.h, shared with orch serve) */
    int32_t *btok, *btgt;
    lr_schedule sched;
    FILE *jsonl;
    char ckpt_dir[FINETUNE_PATH_MAX + 64];
    int have_ckpt;
    int progress_open;
    double last_print;
} ft;

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

static const orch_engine_api *API(const ft *t) { return t->m.engine.api; }

static int engine_fail(ft *t, int32_t st, const char *what, int *kind, char *err,
                       size_t cap) {
    char msg[1024];
    engine_format_error(&t->m.engine, t->m.ctx, st, msg, sizeof msg);
    char last[FINETUNE_PATH_MAX + 128] = "";
    if (t->have_ckpt)
        snprintf(last, sizeof last, "; last good checkpoint: %s", t->ckpt_dir);
    return fail(
        kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: engine %s: %s failed: %s%s%s",
        (unsigned long long)t->st.step + 1, API(t)->name, what, msg,
        st == ORCH_ERR_NUMERIC ? " (training diverged: try a lower --lr)" : "", last);
}

/* ------------------------------------------------------------------------- */
/* Output                                                                     */
/* ------------------------------------------------------------------------- */
static void progress_break(ft *t) {
    if (t->progress_open && t->o->out) {
        fputc('\n', t->o->out);
        t->progress_open = 0;
    }
}

static void say(ft *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(ft *t, const char *fmt, ...) {
    if (!t->o->out) return;
    progress_break(t);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->o->out, fmt, ap);
    va_end(ap);
    fflush(t->o->out);
}

static void progress(ft *t, double loss, double lr, double eta, int force) {
    FILE *f = t->o->out;
    if (!f) return;
    double now = util_now();
    if (!force && now - t->last_print < (t->o->live ? 0.1 : 2.0)) return;
    t->last_print = now;
    int w = snprintf(NULL, 0, "%llu", (unsigned long long)t->st.total_steps);
    fprintf(f, "%sstep %*llu/%llu | loss %.4f | lr %.2e | %.0f tok/s | ETA %.0fs%s",
            t->o->live ? "\r" : "", w, (unsigned long long)t->st.step,
            (unsigned long long)t->st.total_steps, loss, lr, t->st.tokens_per_s, eta,
            t->o->live ? "\033[K" : "\n");
    t->progress_open = t->o->live;
    fflush(f);
}

/* ------------------------------------------------------------------------- */
/* state.json                                                                 */
/* ------------------------------------------------------------------------- */
static void add_u64(cJSON *o, const char *k, uint64_t v) {
    cJSON_AddNumberToObject(o, k, (double)v);
}

static void add_num_or_null(cJSON *o, const char *k, double v) {
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static cJSON *settings_json(const finetune_settings *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "checkpoint", s->checkpoint);
    cJSON_AddStringToObject(o, "data", s->data);
    cJSON_AddStringToObject(o, "validation", s->validation);
    cJSON_AddStringToObject(o, "engine", s->engine);
    cJSON_AddStringToObject(o, "chat_template", s->chat_template);
    cJSON_AddNumberToObject(o, "epochs", s->epochs);
    add_u64(o, "max_steps", s->max_steps);
    cJSON_AddNumberToObject(o, "lr", s->lr);
    cJSON_AddNumberToObject(o, "min_lr", s->min_lr);
    add_u64(o, "warmup_steps", s->warmup_steps);
    cJSON_AddStringToObject(o, "schedule", s->schedule);
    add_u64(o, "rank", s->rank);
    cJSON_AddNumberToObject(o, "alpha", s->alpha);
    cJSON_AddStringToObject(o, "targets", s->targets);
    add_u64(o, "batch", s->batch);
    add_u64(o, "seq_len", s->seq_len);
    add_u64(o, "grad_accum", s->grad_accum);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
    cJSON_AddStringToObject(o, "seed", seed); /* a string: 64 bits exact */
    cJSON_AddNumberToObject(o, "weight_decay", s->weight_decay);
    cJSON_AddNumberToObject(o, "grad_clip", s->grad_clip);
    cJSON_AddNumberToObject(o, "beta1", s->beta1);
    cJSON_AddNumberToObject(o, "beta2", s->beta2);
    cJSON_AddNumberToObject(o, "eps", s->eps);
    add_u64(o, "eval_every", s->eval_every);
    add_u64(o, "patience", s->patience);
    add_u64(o, "checkpoint_every", s->checkpoint_every);
    add_u64(o, "keep", s->keep);
    cJSON_AddBoolToObject(o, "packing", s->packing);
    return o;
}

/* Read helpers: -1 with "state.json: KEY: ..." in err. */
static int get_num(const cJSON *o, const char *k, double lo, double hi, double *out,
                   char *err, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        util_set_err(err, cap, "%s: missing or out of range", k);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int get_u64(const cJSON *o, const char *k, uint64_t max, uint64_t *out, char *err,
                   size_t cap) {
    double d;
    if (get_num(o, k, 0, (double)max, &d, err, cap) != 0) return -1;
    if (d != floor(d)) {
        util_set_err(err, cap, "%s: not an integer", k);
        return -1;
    }
    *out = (uint64_t)d;
    return 0;
}

static int get_str(const cJSON *o, const char *k, char *out, size_t n, char *err,
                   size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) {
        util_set_err(err, cap, "%s: missing or not a string", k);
        return -1;
    }
    snprintf(out, n, "%s", v->valuestring);
    return 0;
}

static int settings_from_json(const cJSON *o, finetune_settings *s, char *err,
                              size_t cap) {
    uint64_t u;
    char seed[32];
    finetune_settings_default(s);
    if (!cJSON_IsObject(o)) {
        util_set_err(err, cap, "settings: missing");
        return -1;
    }
    if (get_str(o, "checkpoint", s->checkpoint, sizeof s->checkpoint, err, cap) ||
        get_str(o, "data", s->data, sizeof s->data, err, cap) ||
        get_str(o, "validation", s->validation, sizeof s->validation, err, cap) ||
        get_str(o, "engine", s->engine, sizeof s->engine, err, cap) ||
        get_str(o, "chat_template", s->chat_template, sizeof s->chat_template, err,
                cap) ||
        get_str(o, "schedule", s->schedule, sizeof s->schedule, err, cap) ||
        get_str(o, "targets", s->targets, sizeof s->targets, err, cap) ||
        get_str(o, "seed", seed, sizeof seed, err, cap) ||
        get_num(o, "epochs", 0, 1e9, &s->epochs, err, cap) ||
        get_u64(o, "max_steps", JSON_SAFE_MAX, &s->max_steps, err, cap) ||
        get_num(o, "lr", 0, 1e9, &s->lr, err, cap) ||
        get_num(o, "min_lr", 0, 1e9, &s->min_lr, err, cap) ||
        get_u64(o, "warmup_steps", JSON_SAFE_MAX, &s->warmup_steps, err, cap) ||
        get_num(o, "alpha", 0, 1e30, &s->alpha, err, cap) ||
        get_num(o, "weight_decay", 0, 1e9, &s->weight_decay, err, cap) ||
        get_num(o, "grad_clip", 0, 1e30, &s->grad_clip, err, cap) ||
        get_num(o, "beta1", 0, 1, &s->beta1, err, cap) ||
        get_num(o, "beta2", 0, 1, &s->beta2, err, cap) ||
        get_num(o, "eps", 0, 1, &s->eps, err, cap) ||
        get_u64(o, "eval_every", JSON_SAFE_MAX, &s->eval_every, err, cap) ||
        get_u64(o, "checkpoint_every", JSON_SAFE_MAX, &s->checkpoint_every, err, cap))
        return -1;
    if (util_parse_u64(seed, &s->seed) != 0) {
        util_set_err(err, cap, "seed: not an integer");
        return -1;
    }
#define U32(key, field)                                            \
    if (get_u64(o, key, UINT32_MAX, &u, err, cap) != 0) return -1; \
    s->field = (uint32_t)u;
    U32("rank", rank)
    U32("batch", batch)
    U32("seq_len", seq_len)
    U32("grad_accum", grad_accum)
    U32("patience", patience)
    U32("keep", keep)
#undef U32
    /* absent in the state of runs from before the setting: they packed */
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(o, "packing");
    if (pk && !cJSON_IsBool(pk)) {
        util_set_err(err, cap, "packing: not a boolean");
        return -1;
    }
    s->packing = pk ? cJSON_IsTrue(pk) : 1;
    return 0;
}

int finetune_settings_from_file(const char *path, finetune_settings *s, char *err,
                                size_t err_cap) {
    char *text = NULL;
    if (fsio_read_file(path, (size_t)1 << 20, &text, NULL, err, err_cap) != 0) return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        util_set_err(err, err_cap, "%s: not a JSON object", path);
        return -1;
    }
    static const struct {
        const char *key;
        char kind; /* s string, d double, u u64, w u32 */
        size_t off, size;
    } keys[] = {
#define K(k, kind, f) \
    { #k, kind, offsetof(finetune_settings, f), sizeof(((finetune_settings *)0)->f) }
        K(checkpoint, 's', checkpoint),
        K(data, 's', data),
        K(validation, 's', validation),
        K(engine, 's', engine),
        K(chat_template, 's', chat_template),
        K(schedule, 's', schedule),
        K(targets, 's', targets),
        K(epochs, 'd', epochs),
        K(lr, 'd', lr),
        K(min_lr, 'd', min_lr),
        K(alpha, 'd', alpha),
        K(weight_decay, 'd', weight_decay),
        K(grad_clip, 'd', grad_clip),
        K(beta1, 'd', beta1),
        K(beta2, 'd', beta2),
        K(eps, 'd', eps),
        K(max_steps, 'u', max_steps),
        K(warmup_steps, 'u', warmup_steps),
        K(seed, 'u', seed),
        K(eval_every, 'u', eval_every),
        K(checkpoint_every, 'u', checkpoint_every),
        K(rank, 'w', rank),
        K(batch, 'w', batch),
        K(seq_len, 'w', seq_len),
        K(grad_accum, 'w', grad_accum),
        K(patience, 'w', patience),
        K(keep, 'w', keep),
        K(packing, 'b', packing),
#undef K
    };
    int rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        size_t k = 0, nk = sizeof keys / sizeof keys[0];
        while (k < nk && strcmp(keys[k].key, it->string) != 0) k++;
        if (k == nk) {
            util_set_err(err, err_cap, "%s: unknown key '%s'", path, it->string);
            rc = -1;
            break;
        }
        char *dst = (char *)s + keys[k].off;
        uint64_t u = 0;
        if (keys[k].kind == 's') {
            if (!cJSON_IsString(it) || strlen(it->valuestring) >= keys[k].size) {
                util_set_err(err, err_cap,
                             "%s: %s: expected a string (at most %zu bytes)", path,
                             it->string, keys[k].size - 1);
                rc = -1;
                break;
            }
            snprintf(dst, keys[k].size, "%s", it->valuestring);
        } else if (keys[k].kind == 'b') {
            if (!cJSON_IsBool(it)) {
                util_set_err(err, err_cap, "%s: %s: expected true or false", path,
                             it->string);
                rc = -1;
                break;
            }
            int b = cJSON_IsTrue(it);
            memcpy(dst, &b, sizeof b);
        } else if (keys[k].kind == 'd') {
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
                it->valuedouble < 0) {
                util_set_err(err, err_cap, "%s: %s: expected a number >= 0", path,
                             it->string);
                rc = -1;
                break;
            }
            memcpy(dst, &it->valuedouble, sizeof(double));
        } else {
            uint64_t max = keys[k].kind == 'w' ? UINT32_MAX : JSON_SAFE_MAX;
            int ok = 0;
            if (cJSON_IsNumber(it))
                ok = it->valuedouble >= 0 && it->valuedouble <= (double)max &&
                     it->valuedouble == floor(it->valuedouble);
            else if (cJSON_IsString(it) && strcmp(it->string, "seed") == 0)
                ok = util_parse_u64(it->valuestring, &u) == 0;
            if (!ok) {
                util_set_err(err, err_cap, "%s: %s: expected an integer in [0, %llu]",
                             path, it->string, (unsigned long long)max);
                rc = -1;
                break;
            }
            if (cJSON_IsNumber(it)) u = (uint64_t)it->valuedouble;
            if (keys[k].kind == 'w') {
                uint32_t w = (uint32_t)u;
                memcpy(dst, &w, sizeof w);
            } else {
                memcpy(dst, &u, sizeof u);
            }
        }
    }
    cJSON_Delete(o);
    return rc;
}

/* state.json text (malloc'd) with the SHA-256 of the checkpoint's files. */
static char *state_json(const ft *t, const char *adapter_sha, const char *optim_sha) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "format", FT_STATE_FORMAT);
    cJSON_AddStringToObject(o, "kind", "orch-finetune");
    cJSON_AddStringToObject(o, "engine", API(t)->name);
    add_u64(o, "step", t->st.step);
    add_u64(o, "total_steps", t->st.total_steps);
    add_u64(o, "epoch", t->st.epoch);
    add_u64(o, "cursor", t->st.cursor);
    char hex[65];
    data_rng_to_hex(&t->st.epoch_rng, hex);
    cJSON_AddStringToObject(o, "epoch_rng", hex);
    add_u64(o, "tokens_seen", t->st.tokens_seen);
    add_num_or_null(o, "best_val_loss", t->st.best_val_loss);
    add_u64(o, "best_val_step", t->st.best_val_step);
    add_u64(o, "evals_since_best", t->st.evals_since_best);
    add_num_or_null(o, "last_loss", t->st.last_loss);
    add_num_or_null(o, "last_val_loss", t->st.last_val_loss);
    add_num_or_null(o, "last_lr", t->st.last_lr);
    cJSON_AddNumberToObject(o, "elapsed_s", t->st.elapsed_s);
    cJSON_AddStringToObject(o, "base_fingerprint", t->fingerprint);
    cJSON_AddStringToObject(o, "data_sha256", t->data_sha);
    cJSON_AddStringToObject(o, "validation_sha256", t->val_sha);
    cJSON *files = cJSON_AddObjectToObject(o, "files");
    if (files) {
        cJSON_AddStringToObject(files, PEFT_WEIGHTS_FILE, adapter_sha);
        cJSON_AddStringToObject(files, FT_OPTIM_FILE, optim_sha);
    }
    cJSON *s = settings_json(&t->set);
    if (s) cJSON_AddItemToObject(o, "settings", s);
    char *text = s && files ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return text;
}

static double get_nullable(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The checkpoint named by DIR/latest: its directory into dir, its parsed
 * state.json into *root (cJSON_Delete). */
static int read_latest(const char *out_dir, char *dir, size_t dir_cap, cJSON **root,
                       char *err, size_t cap) {
    char path[FINETUNE_PATH_MAX + 64], *text = NULL;
    snprintf(path, sizeof path, "%s/latest", out_dir);
    if (fsio_read_file(path, 256, &text, NULL, err, cap) != 0) return -1;
    size_t n = strcspn(text, "\n");
    text[n] = '\0';
    int ok =
        n == 13 && strncmp(text, "ckpt-", 5) == 0 && strspn(text + 5, "0123456789") == 8;
    if (!ok) {
        util_set_err(err, cap, "%s: does not name a checkpoint (ckpt-NNNNNNNN)", path);
        free(text);
        return -1;
    }
    snprintf(dir, dir_cap, "%s/%s", out_dir, text);
    free(text);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, FT_STATE_FILE) >= sizeof path) {
        util_set_err(err, cap, "%s: path too long", dir);
        return -1;
    }
    if (fsio_read_file(path, (size_t)1 << 20, &text, NULL, err, cap) != 0) return -1;
    *root = cJSON_Parse(text);
    free(text);
    const cJSON *kind = *root ? cJSON_GetObjectItemCaseSensitive(*root, "kind") : NULL;
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, "orch-finetune") != 0) {
        util_set_err(err, cap, "%s: not the state of an `orch finetune` checkpoint",
                     path);
        cJSON_Delete(*root);
        *root = NULL;
        return -1;
    }
    return 0;
}

static int state_from_json(const cJSON *o, ft_state *s, char *err, size_t cap) {
    memset(s, 0, sizeof *s);
    char hex[80];
    uint64_t u;
    double fmt;
    if (get_num(o, "format", 1, 1, &fmt, err, cap) ||
        get_u64(o, "step", JSON_SAFE_MAX, &s->step, err, cap) ||
        get_u64(o, "epoch", JSON_SAFE_MAX, &s->epoch, err, cap) ||
        get_u64(o, "cursor", JSON_SAFE_MAX, &s->cursor, err, cap) ||
        get_u64(o, "tokens_seen", JSON_SAFE_MAX, &s->tokens_seen, err, cap) ||
        get_u64(o, "best_val_step", JSON_SAFE_MAX, &s->best_val_step, err, cap) ||
        get_u64(o, "evals_since_best", UINT32_MAX, &u, err, cap) ||
        get_num(o, "elapsed_s", 0, 1e15, &s->elapsed_s, err, cap) ||
        get_str(o, "epoch_rng", hex, sizeof hex, err, cap))
        return -1;
    s->evals_since_best = (uint32_t)u;
    if (data_rng_from_hex(hex, &s->epoch_rng) != 0) {
        util_set_err(err, cap, "epoch_rng: not 64 hex digits");
        return -1;
    }
    s->best_val_loss = get_nullable(o, "best_val_loss");
    s->last_loss = get_nullable(o, "last_loss");
    s->last_val_loss = get_nullable(o, "last_val_loss");
    s->last_lr = get_nullable(o, "last_lr");
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Setup                                                                      */
/* ------------------------------------------------------------------------- */

/* An absolute path for a file or directory that must exist. */
static int absolute(const char *what, char *path, size_t cap, int *kind, char *err,
                    size_t ecap) {
    char buf[PATH_MAX];
    if (!realpath(path, buf))
        return fail(kind, TRAIN_ERR_INPUT, err, ecap, "%s %s: %s", what, path,
                    strerror(errno));
    if (strlen(buf) >= cap)
        return fail(kind, TRAIN_ERR_INPUT, err, ecap, "%s %s: path too long", what, path);
    snprintf(path, cap, "%s", buf);
    return 0;
}

static int file_sha(const char *path, char hex[65], int *kind, char *err, size_t cap) {
    uint8_t d[32];
    char msg[1024];
    hex[0] = '\0';
    if (!path[0]) return 0;
    if (sha256_file(path, d, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "%s", msg);
    sha256_hex(d, hex);
    return 0;
}

/* The engine must have ABI 1.4's adapters. */
static int check_engine(const orch_engine_api *api, int *kind, char *err, size_t cap) {
    if (api->abi_minor < 4 ||
        api->struct_size < offsetof(orch_engine_api, coserve_forward))
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "engine %s (ABI %u.%u) has no LoRA adapters: orch finetune needs ABI "
                    "1.4's adapter calls (ORCH_CAP_LORA)",
                    api->name, api->abi_major, api->abi_minor);
    if (!(api->capabilities & ORCH_CAP_LORA) || !ORCH_API_HAS(api, adapter_create) ||
        !ORCH_API_HAS(api, adapter_destroy) || !ORCH_API_HAS(api, adapter_tensor_info) ||
        !ORCH_API_HAS(api, adapter_tensor_count) ||
        !ORCH_API_HAS(api, adapter_tensor_read) ||
        !ORCH_API_HAS(api, adapter_tensor_write) ||
        !ORCH_API_HAS(api, adapter_grads_zero) ||
        !ORCH_API_HAS(api, adapter_forward_backward) ||
        !ORCH_API_HAS(api, adapter_eval_loss) ||
        !ORCH_API_HAS(api, adapter_optimizer_step))
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "engine %s does not implement LoRA adapters (capability "
                    "ORCH_CAP_LORA and the adapter_* calls of ABI 1.4), which orch "
                    "finetune needs",
                    api->name);
    return 0;
}

static int open_base(ft *t, int *kind, char *err, size_t cap) {
    const finetune_opts *o = t->o;
    char warn[2048], msg[4096];
    if (t->set
            .engine[0]) { /* refuse an engine without adapters before the weights load */
        engine_handle h;
        if (engine_load(t->set.engine, &h, msg, sizeof msg) != 0)
            return fail(kind, TRAIN_ERR_INPUT, err, cap, "%s", msg);
        int rc = check_engine(h.api, kind, err, cap);
        engine_unload(&h);
        if (rc != 0) return -1;
    }
    inference_model_opts mo = {
        t->set.checkpoint, t->set.engine[0] ? t->set.engine : NULL, o->threads, NULL,
        INFERENCE_MODEL_TOKENIZER |
            (o->trust_config_engine ? INFERENCE_MODEL_TRUST_CONFIG_ENGINE : 0)
    };
    if (inference_model_open(&mo, &t->m, warn, sizeof warn, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--checkpoint: %s", msg);
    t->m_open = 1;
    if (warn[0]) say(t, "finetune: warning: %s\n", warn);
    if (check_engine(API(t), kind, err, cap) != 0) return -1;
    if (peft_base_fingerprint(&t->m.engine, t->m.ctx, t->fingerprint, msg, sizeof msg) !=
        0)
        return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "%s", msg);
    return 0;
}

static int open_data(ft *t, int *kind, char *err, size_t cap) {
    finetune_settings *s = &t->set;
    char msg[4096];
    const char *dirs[1] = { t->m.ckpt_dir };
    if (chat_template_choose(s->chat_template[0] ? s->chat_template : NULL, dirs, 1,
                             &t->chat, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--chat-template: %s", msg);
    uint32_t ctxlen = t->m.desc.context;
    if (s->seq_len == 0) s->seq_len = ctxlen;
    if (s->seq_len > ctxlen)
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "--seq-len %u: longer than the model's context of %u", s->seq_len,
                    ctxlen);
    ft_data_opts dop = { t->m.tok,   t->chat.tmpl,         t->chat.error,
                         s->seq_len, t->m.desc.vocab_size, !s->packing };
    if (ft_data_load(s->data, &dop, &t->train, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--data: %s", msg);
    if (s->validation[0] &&
        ft_data_load(s->validation, &dop, &t->val, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--validation: %s", msg);
    if (file_sha(s->data, t->data_sha, kind, err, cap) != 0 ||
        file_sha(s->validation, t->val_sha, kind, err, cap) != 0)
        return -1;
    return 0;
}

/* The next micro-batch of `batch` rows into btok/btgt (ft_order), the
 * position recorded in t->st for the checkpoint. */
static void next_batch(ft *t) {
    ft_order_next(&t->order, &t->train, t->set.batch, t->btok, t->btgt);
    t->st.epoch = t->order.epoch;
    t->st.cursor = t->order.cursor;
    t->st.epoch_rng = t->order.epoch_rng;
}

static orch_lora_desc lora_desc(const ft *t) {
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.rank = t->set.rank;
    d.alpha = (float)t->set.alpha;
    d.targets = t->targets;
    d.seed = t->set.seed;
    return d;
}

/* ------------------------------------------------------------------------- */
/* Checkpoints                                                                */
/* ------------------------------------------------------------------------- */

static int sha_of(const char *dir, const char *file, char hex[65], char *err,
                  size_t cap) {
    char path[FINETUNE_PATH_MAX + 128];
    uint8_t d[32];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (sha256_file(path, d, err, cap) != 0) return -1;
    sha256_hex(d, hex);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* 1 when NAME is ".tmp-ckpt-STEP-PID" or ".trash-ckpt-STEP-PID" of a process
 * that is gone (a run killed mid-save). */
static int stale_temp(const char *name) {
    if (strncmp(name, ".tmp-ckpt-", 10) != 0 && strncmp(name, ".trash-ckpt-", 12) != 0)
        return 0;
    const char *dash = strrchr(name, '-');
    uint64_t pid = 0;
    if (!dash || util_parse_u64(dash + 1, &pid) != 0 || pid == 0 || pid > INT_MAX)
        return 0;
    return (pid_t)pid != getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Remove checkpoints beyond the newest `keep` and the temp dirs of dead
 * runs (failures are not errors: the next save retries). */
static void retention(ft *t) {
    char msg[256];
    DIR *d = fsio_opendir(t->o->out_dir, msg, sizeof msg);
    if (!d) return;
    char *names[4096] = { NULL };
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        if (stale_temp(e->d_name)) {
            char path[FINETUNE_PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", t->o->out_dir, e->d_name);
            fsio_rm_rf(path, msg, sizeof msg);
        } else if (strncmp(e->d_name, "ckpt-", 5) == 0 && strlen(e->d_name) == 13) {
            names[n++] = strdup(e->d_name);
        }
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    const char *latest = strrchr(t->ckpt_dir, '/');
    latest = latest ? latest + 1 : t->ckpt_dir;
    for (size_t i = 0; i < n; i++) {
        if (names[i] && i + t->set.keep < n && strcmp(names[i], latest) != 0) {
            char path[FINETUNE_PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/%s", t->o->out_dir, names[i]);
            fsio_rm_rf(path, msg, sizeof msg);
        }
        free(names[i]);
    }
}

static int save_checkpoint(ft *t, int *kind, char *err, size_t cap) {
    const char *dir = t->o->out_dir;
    char tmp[FINETUNE_PATH_MAX + 64], final[FINETUNE_PATH_MAX + 64];
    char trash[FINETUNE_PATH_MAX + 64], path[FINETUNE_PATH_MAX + 128], msg[2048];
    snprintf(tmp, sizeof tmp, "%s/.tmp-ckpt-%08llu-%ld", dir,
             (unsigned long long)t->st.step, (long)getpid());
    snprintf(final, sizeof final, "%s/ckpt-%08llu", dir, (unsigned long long)t->st.step);
    snprintf(trash, sizeof trash, "%s/.trash-ckpt-%08llu-%ld", dir,
             (unsigned long long)t->st.step, (long)getpid());
    orch_lora_desc d = lora_desc(t);
    peft_adapter a;
    memset(&a, 0, sizeof a);
    char ash[65], osh[65];
    char *state = NULL;
    fsio_rm_rf(tmp, msg, sizeof msg);
    if (peft_adapter_from_engine(&t->m.engine, t->m.ctx, t->adapter, &t->m.desc, &d,
                                 t->set.checkpoint, t->fingerprint, &a, msg,
                                 sizeof msg) != 0 ||
        fsio_mkdir(tmp, msg, sizeof msg) != 0 ||
        peft_adapter_save(tmp, &a, msg, sizeof msg) != 0)
        goto fail;
    snprintf(path, sizeof path, "%s/%s", tmp, FT_OPTIM_FILE);
    if (adapter_moments_save(path, &t->m.engine, t->m.ctx, t->adapter, &a, NULL, msg,
                             sizeof msg) != 0 ||
        sha_of(tmp, PEFT_WEIGHTS_FILE, ash, msg, sizeof msg) != 0 ||
        sha_of(tmp, FT_OPTIM_FILE, osh, msg, sizeof msg) != 0)
        goto fail;
    state = state_json(t, ash, osh);
    if (!state) {
        snprintf(msg, sizeof msg, "out of memory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/%s", tmp, FT_STATE_FILE);
    if (fsio_write_file(path, state, strlen(state), msg, sizeof msg) != 0 ||
        fsio_fsync_path(tmp, 1, msg, sizeof msg) != 0)
        goto fail;
    struct stat sb;
    int had = stat(final, &sb) == 0;
    if (had && fsio_rename(final, trash, msg, sizeof msg) != 0) goto fail;
    if (fsio_rename(tmp, final, msg, sizeof msg) != 0) {
        if (had) fsio_rename(trash, final, path, sizeof path);
        goto fail;
    }
    if (had) fsio_rm_rf(trash, path, sizeof path);
    if (fsio_fsync_path(dir, 1, msg, sizeof msg) != 0) goto fail_late;
    char line[32];
    int ln = snprintf(line, sizeof line, "ckpt-%08llu\n", (unsigned long long)t->st.step);
    snprintf(path, sizeof path, "%s/latest", dir);
    if (fsio_write_atomic(path, line, (size_t)ln, msg, sizeof msg) != 0) goto fail_late;
    snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", final);
    t->have_ckpt = 1;
    /* The run's adapter, for PEFT and serving: DIR's two files. */
    if (peft_adapter_save(dir, &a, msg, sizeof msg) != 0) goto fail_late;
    retention(t);
    free(state);
    peft_adapter_free(&a);
    return 0;
fail:
    fsio_rm_rf(tmp, path, sizeof path);
fail_late:
    free(state);
    peft_adapter_free(&a);
    return fail(
        kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: cannot save checkpoint: %s%s%s",
        (unsigned long long)t->st.step, msg,
        t->have_ckpt ? " (last good checkpoint: " : "", t->have_ckpt ? t->ckpt_dir : "");
}

/* Resume: the adapter and its moments from checkpoint dir. */
static int restore_adapter(ft *t, const char *dir, const cJSON *root, int *kind,
                           char *err, size_t cap) {
    char msg[4096], hex[65];
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const char *names[2] = { PEFT_WEIGHTS_FILE, FT_OPTIM_FILE };
    for (int i = 0; i < 2; i++) {
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(files, names[i]);
        if (sha_of(dir, names[i], hex, msg, sizeof msg) != 0)
            return fail(kind, TRAIN_ERR_INPUT, err, cap, "--resume: %s", msg);
        if (!cJSON_IsString(want) || strcmp(want->valuestring, hex) != 0)
            return fail(kind, TRAIN_ERR_INPUT, err, cap,
                        "--resume: %s/%s: SHA-256 differs from state.json's (the "
                        "checkpoint is damaged)",
                        dir, names[i]);
    }
    peft_adapter a;
    if (peft_adapter_load(dir, &t->m.desc, &a, msg, sizeof msg) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--resume: %s", msg);
    if (peft_adapter_check_base(&a, dir, t->fingerprint, msg, sizeof msg) != 0 ||
        a.rank != t->set.rank || a.targets != t->targets ||
        peft_adapter_to_engine(&a, &t->m.engine, t->m.ctx, &t->adapter, msg,
                               sizeof msg) != 0) {
        if (a.rank != t->set.rank || a.targets != t->targets)
            util_set_err(msg, sizeof msg,
                         "%s: the adapter does not match state.json's settings", dir);
        peft_adapter_free(&a);
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--resume: %s", msg);
    }
    t->have_adapter = 1;
    char path[FINETUNE_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", dir, FT_OPTIM_FILE);
    int rc = 0;
    if (adapter_moments_load(path, &t->m.engine, t->m.ctx, t->adapter, &a, msg,
                             sizeof msg) != 0)
        rc = fail(kind, TRAIN_ERR_INPUT, err, cap, "--resume: %s", msg);
    peft_adapter_free(&a);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* The loop                                                                   */
/* ------------------------------------------------------------------------- */

/* Target-weighted mean validation loss. */
static int evaluate(ft *t, double *out, int *kind, char *err, size_t cap) {
    const uint32_t T = t->set.seq_len, B = t->set.batch;
    double sum = 0, count = 0;
    for (uint64_t r = 0; r < t->val.n_rows; r += B) {
        uint32_t nb = (uint32_t)(t->val.n_rows - r < B ? t->val.n_rows - r : B);
        const int32_t *tg = t->val.targets + r * T;
        uint64_t c = 0;
        for (uint64_t i = 0; i < (uint64_t)nb * T; i++) c += tg[i] != -1;
        if (!c) continue;
        float l = 0;
        int32_t st = API(t)->adapter_eval_loss(t->m.ctx, t->adapter,
                                               t->val.tokens + r * T, tg, nb, T, &l);
        if (st != ORCH_OK) return engine_fail(t, st, "adapter_eval_loss", kind, err, cap);
        sum += (double)l * (double)c;
        count += (double)c;
    }
    *out = count > 0 ? sum / count : NAN;
    return 0;
}

static int run_loop(ft *t, train_result *res, int *kind, char *err, size_t cap) {
    const finetune_opts *o = t->o;
    const finetune_settings *s = &t->set;
    const orch_engine_api *api = API(t);
    const uint32_t B = s->batch, T = s->seq_len;
    double step_tokens = (double)B * T * s->grad_accum;
    float grad_scale = 1.0f / (float)s->grad_accum;
    double run_start = util_now(), elapsed0 = t->st.elapsed_s;
    uint64_t steps_run = 0, first = t->st.step;
    uint64_t eval_every = s->eval_every;
    if (!eval_every) { /* once per epoch */
        uint64_t per = (uint64_t)B * s->grad_accum;
        eval_every = (t->train.n_rows + per - 1) / per;
        if (!eval_every) eval_every = 1;
    }
    char msg[2048];
    res->outcome = TRAIN_COMPLETED;
    while (t->st.step < t->st.total_steps) {
        uint64_t step = t->st.step + 1;
        double t0 = util_now();
        int32_t st = api->adapter_grads_zero(t->m.ctx, t->adapter);
        if (st != ORCH_OK)
            return engine_fail(t, st, "adapter_grads_zero", kind, err, cap);
        double loss_sum = 0;
        for (uint32_t k = 0; k < s->grad_accum; k++) {
            next_batch(t);
            float l = 0;
            st = api->adapter_forward_backward(t->m.ctx, t->adapter, t->btok, t->btgt, B,
                                               T, grad_scale, &l);
            if (st != ORCH_OK)
                return engine_fail(t, st, "adapter_forward_backward", kind, err, cap);
            loss_sum += (double)l;
        }
        double lr = lr_schedule_at(&t->sched, step);
        orch_adamw_params ap;
        memset(&ap, 0, sizeof ap);
        ap.struct_size = sizeof ap;
        ap.step = step;
        ap.lr = (float)lr;
        ap.beta1 = (float)s->beta1;
        ap.beta2 = (float)s->beta2;
        ap.eps = (float)s->eps;
        ap.weight_decay = (float)s->weight_decay;
        ap.grad_clip = (float)s->grad_clip;
        float gnorm = 0;
        st = api->adapter_optimizer_step(t->m.ctx, t->adapter, &ap, &gnorm);
        if (st != ORCH_OK)
            return engine_fail(t, st, "adapter_optimizer_step", kind, err, cap);
        double loss = loss_sum / s->grad_accum, dt = util_now() - t0;
        steps_run++;
        t->st.step = step;
        t->st.tokens_seen += (uint64_t)step_tokens;
        t->st.last_loss = loss;
        t->st.last_lr = lr;
        t->st.tokens_per_s = dt > 0 ? step_tokens / dt : 0;
        t->st.elapsed_s = elapsed0 + (util_now() - run_start);
        int last = step == t->st.total_steps;
        double avg = (util_now() - run_start) / (double)steps_run;
        progress(t, loss, lr, avg * (double)(t->st.total_steps - step),
                 step == first + 1 || last);
        double val = NAN;
        int stop_early = 0;
        if (t->val.n_rows && (step % eval_every == 0 || last)) {
            if (evaluate(t, &val, kind, err, cap) != 0) return -1;
            t->st.last_val_loss = val;
            int better = !isfinite(t->st.best_val_loss) || val < t->st.best_val_loss;
            if (better) {
                t->st.best_val_loss = val;
                t->st.best_val_step = step;
                t->st.evals_since_best = 0;
            } else {
                t->st.evals_since_best++;
            }
            say(t, "step %llu: val loss %.4f | ppl %.2f%s\n", (unsigned long long)step,
                val, exp(val), better ? " (best)" : "");
            stop_early = s->patience && t->st.evals_since_best >= s->patience;
        }
        if (train_jsonl_append(t->jsonl, o->out_dir, step, loss, lr, gnorm,
                               t->st.tokens_per_s, t->st.elapsed_s, val, msg,
                               sizeof msg) != 0)
            return fail(kind, TRAIN_ERR_RUNTIME, err, cap, "step %llu: %s",
                        (unsigned long long)step, msg);
        int signalled = o->stop_flag && *o->stop_flag;
        int paused = o->stop_after && steps_run >= o->stop_after && !last;
        int periodic = s->checkpoint_every && step % s->checkpoint_every == 0;
        if (periodic || last || signalled || paused || stop_early) {
            if (save_checkpoint(t, kind, err, cap) != 0) return -1;
            if (periodic && !last && !signalled && !paused && !stop_early)
                say(t, "step %llu: checkpoint %s\n", (unsigned long long)step,
                    t->ckpt_dir);
        }
        if (stop_early) {
            res->outcome = TRAIN_EARLY_STOPPED;
            say(t,
                "early stop: validation loss has not improved for %u evaluations (best "
                "%.4f at step %llu)\n",
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
    res->run_s = run_s;
    res->tokens_per_s = run_s > 0 ? (double)steps_run * step_tokens / run_s : 0;
    return 0;
}

static void ft_close(ft *t) {
    if (t->jsonl) fclose(t->jsonl);
    if (t->have_adapter) API(t)->adapter_destroy(t->m.ctx, t->adapter);
    if (t->m_open) inference_model_close(&t->m);
    chat_template_choice_free(&t->chat);
    ft_dataset_free(&t->train);
    ft_dataset_free(&t->val);
    ft_order_free(&t->order);
    free(t->btok);
    free(t->btgt);
}

static int check_settings(const finetune_settings *s, int *kind, char *err, size_t cap) {
    lr_schedule_kind k;
    if (lr_schedule_parse_kind(s->schedule, &k) != 0)
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "--schedule '%s': expected cosine, linear or constant", s->schedule);
    if (!s->max_steps && !(s->epochs > 0))
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--epochs must be > 0");
    if (!(s->lr > 0) || s->min_lr > s->lr)
        return fail(kind, TRAIN_ERR_INPUT, err, cap, "--lr must be > 0 and >= --min-lr");
    if (!s->batch || !s->grad_accum || !s->keep)
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "--batch, --grad-accum and --keep must be >= 1");
    if (s->patience && !s->validation[0])
        return fail(kind, TRAIN_ERR_INPUT, err, cap,
                    "--patience needs --validation (early stopping watches its loss)");
    return 0;
}

int finetune_run(const finetune_opts *o, train_result *res, int *err_kind, char *err,
                 size_t err_cap) {
    ft t;
    memset(&t, 0, sizeof t);
    memset(res, 0, sizeof *res);
    res->last_loss = res->last_val_loss = res->best_val_loss = NAN;
    t.o = o;
    int rc = -1;
    char msg[4096], ckpt[FINETUNE_PATH_MAX + 64] = "";
    cJSON *root = NULL;
    t.st.best_val_loss = t.st.last_loss = t.st.last_val_loss = t.st.last_lr = NAN;
    if (o->resume) {
        if (read_latest(o->out_dir, ckpt, sizeof ckpt, &root, msg, sizeof msg) != 0) {
            fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "--resume: %s", msg);
            goto out;
        }
        if (settings_from_json(cJSON_GetObjectItemCaseSensitive(root, "settings"), &t.set,
                               msg, sizeof msg) != 0 ||
            state_from_json(root, &t.st, msg, sizeof msg) != 0) {
            fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "--resume: %s/%s: %s", ckpt,
                 FT_STATE_FILE, msg);
            goto out;
        }
        snprintf(t.ckpt_dir, sizeof t.ckpt_dir, "%s", ckpt);
        t.have_ckpt = 1;
    } else {
        t.set = o->set;
        if (absolute("--checkpoint", t.set.checkpoint, sizeof t.set.checkpoint, err_kind,
                     err, err_cap) != 0 ||
            absolute("--data", t.set.data, sizeof t.set.data, err_kind, err, err_cap) !=
                0 ||
            (t.set.validation[0] &&
             absolute("--validation", t.set.validation, sizeof t.set.validation, err_kind,
                      err, err_cap) != 0))
            goto out;
        rng_seed(&t.st.epoch_rng, t.set.seed);
        struct stat sb;
        char lp[FINETUNE_PATH_MAX + 16];
        snprintf(lp, sizeof lp, "%s/latest", o->out_dir);
        if (stat(lp, &sb) == 0) {
            fail(err_kind, TRAIN_ERR_INPUT, err, err_cap,
                 "%s already holds a fine-tuning run: use --resume to continue it or "
                 "another --out",
                 o->out_dir);
            goto out;
        }
    }
    if (check_settings(&t.set, err_kind, err, err_cap) != 0) goto out;
    if (open_base(&t, err_kind, err, err_cap) != 0) goto out;
    if (peft_targets_parse(t.m.desc.arch, t.set.targets, &t.targets, msg, sizeof msg) !=
        0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "--targets: %s", msg);
        goto out;
    }
    peft_adapter_tensor *exp = NULL;
    size_t n_exp = 0;
    if (peft_expected_table(&t.m.desc, t.set.rank, t.targets, &exp, &n_exp, msg,
                            sizeof msg) != 0) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "--rank: %s", msg);
        goto out;
    }
    free(exp);
    if (open_data(&t, err_kind, err, err_cap) != 0) goto out;
    if (o->resume) {
        const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "data_sha256");
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(root, "validation_sha256");
        if (!cJSON_IsString(ds) || strcmp(ds->valuestring, t.data_sha) != 0 ||
            !cJSON_IsString(vs) || strcmp(vs->valuestring, t.val_sha) != 0) {
            fail(err_kind, TRAIN_ERR_INPUT, err, err_cap,
                 "--resume: %s or %s changed since %s was written (an exact resume needs "
                 "the same data)",
                 t.set.data, t.set.validation[0] ? t.set.validation : "(none)", ckpt);
            goto out;
        }
        if (restore_adapter(&t, ckpt, root, err_kind, err, err_cap) != 0) goto out;
    } else {
        orch_lora_desc d = lora_desc(&t);
        int32_t st = API(&t)->adapter_create(t.m.ctx, &d, &t.adapter);
        if (st != ORCH_OK) {
            engine_format_error(&t.m.engine, t.m.ctx, st, msg, sizeof msg);
            fail(err_kind, TRAIN_ERR_INPUT, err, err_cap, "engine %s: adapter_create: %s",
                 API(&t)->name, msg);
            goto out;
        }
        t.have_adapter = 1;
    }
    uint64_t per_step = (uint64_t)t.set.batch * t.set.grad_accum;
    uint64_t total =
        t.set.max_steps
            ? t.set.max_steps
            : (uint64_t)ceil(t.set.epochs * (double)t.train.n_rows / (double)per_step);
    t.st.total_steps = total ? total : 1;
    lr_schedule_kind sk = LR_SCHEDULE_LINEAR;
    lr_schedule_parse_kind(t.set.schedule, &sk);
    t.sched =
        (lr_schedule){ sk, t.set.lr, t.set.min_lr, t.set.warmup_steps, t.st.total_steps };
    if (t.st.cursor > t.train.n_rows) {
        fail(err_kind, TRAIN_ERR_INPUT, err, err_cap,
             "--resume: %s: cursor beyond the data", ckpt);
        goto out;
    }
    int order_ok = ft_order_restore(&t.order, t.train.n_rows, t.st.epoch, t.st.cursor,
                                    &t.st.epoch_rng) == 0;
    t.btok = malloc((size_t)t.set.batch * t.set.seq_len * sizeof *t.btok);
    t.btgt = malloc((size_t)t.set.batch * t.set.seq_len * sizeof *t.btgt);
    if (!order_ok || !t.btok || !t.btgt) {
        fail(err_kind, TRAIN_ERR_RUNTIME, err, err_cap, "out of memory");
        goto out;
    }
    res->start_step = t.st.step;
    if (t.st.step >= t.st.total_steps) {
        res->outcome = TRAIN_ALREADY_DONE;
        rc = 0;
        goto done;
    }
    if (fsio_mkdir_p(o->out_dir, msg, sizeof msg) != 0 ||
        train_jsonl_open(o->out_dir, t.st.step, !o->resume, &t.jsonl, msg, sizeof msg) !=
            0) {
        fail(err_kind, TRAIN_ERR_RUNTIME, err, err_cap, "%s", msg);
        goto out;
    }
    if (o->out) {
        char mods[128];
        peft_targets_modules(t.m.desc.arch, t.targets, mods, sizeof mods);
        fprintf(o->out,
                "finetune: engine %s | base %s (%s, %u layers, width %u) | LoRA rank %u, "
                "alpha %g on %s\n"
                "finetune: data %llu examples -> %llu rows of %u%s (%llu target tokens; "
                "%llu truncated, %llu without a target dropped)%s | batch %u x %u x %u "
                "accum | %llu steps | out %s\n",
                API(&t)->name, t.m.ckpt_dir,
                t.m.desc.arch == ORCH_ARCH_LLAMA ? "llama" : "gpt2", t.m.desc.layers,
                t.m.desc.width, t.set.rank, t.set.alpha, mods,
                (unsigned long long)t.train.n_examples,
                (unsigned long long)t.train.n_rows, t.set.seq_len,
                t.set.packing ? "" : ", one example per row",
                (unsigned long long)t.train.n_targets,
                (unsigned long long)t.train.n_truncated,
                (unsigned long long)t.train.n_dropped,
                t.val.n_rows ? " | validation on" : "", t.set.batch, t.set.seq_len,
                t.set.grad_accum, (unsigned long long)t.st.total_steps, o->out_dir);
        if (o->resume)
            fprintf(o->out, "finetune: resuming from %s (step %llu)\n", ckpt,
                    (unsigned long long)t.st.step);
        fflush(o->out);
    }
    if (run_loop(&t, res, err_kind, err, err_cap) != 0) goto out;
    rc = 0;
done:
    res->step = t.st.step;
    res->total_steps = t.st.total_steps;
    res->last_loss = t.st.last_loss;
    res->last_val_loss = t.st.last_val_loss;
    res->best_val_loss = t.st.best_val_loss;
    res->best_val_step = t.st.best_val_step;
    res->elapsed_s = t.st.elapsed_s;
    snprintf(res->checkpoint, sizeof res->checkpoint, "%.4000s", t.ckpt_dir);
out:
    progress_break(&t);
    cJSON_Delete(root);
    ft_close(&t);
    return rc;
}
