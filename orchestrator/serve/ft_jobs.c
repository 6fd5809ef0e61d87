/*
 * ft_jobs.c - the fine-tuning jobs of `orch serve`: their record in the
 * state directory and OpenAI's shapes for them (see ft_jobs.h).
 */
#include "orchestrator/serve/ft_jobs.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/util.h"

struct ft_jobs {
    pthread_mutex_t mu;
    char dir[3800]; /* STATE/jobs (short enough for every path below) */
    ft_job *jobs;   /* creation order */
    size_t n, cap;
};

static const char *const status_names[] = { "validating_files", "queued", "running",
                                            "succeeded",        "failed", "cancelled" };

const char *ft_job_status_name(int status) {
    return status >= 0 && status <= FT_JOB_CANCELLED ? status_names[status] : "unknown";
}

static int status_of(const char *name) {
    for (int i = 0; i <= FT_JOB_CANCELLED; i++)
        if (strcmp(name, status_names[i]) == 0) return i;
    return -1;
}

static int valid_job_id(const char *id) {
    if (!id || strncmp(id, "ftjob-", 6) != 0 || strlen(id) != 30) return 0;
    for (const char *p = id + 6; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

static void job_path(const ft_jobs *j, const char *id, const char *file, char *buf,
                     size_t cap) {
    int n = snprintf(buf, cap, "%s/%.30s/%.20s", j->dir, id, file);
    (void)n; /* j->dir is short enough for cap (4096) */
}

/* ---- the job object ---- */

static void hp_json(strbuf *b, const ft_job_hparams *hp) {
    strbuf_puts(b, "{\"n_epochs\":");
    if (hp->n_epochs)
        strbuf_printf(b, "%u", hp->n_epochs);
    else
        strbuf_puts(b, "\"auto\"");
    strbuf_puts(b, ",\"batch_size\":");
    if (hp->batch_size)
        strbuf_printf(b, "%u", hp->batch_size);
    else
        strbuf_puts(b, "\"auto\"");
    strbuf_puts(b, ",\"learning_rate_multiplier\":");
    if (hp->lr_multiplier > 0)
        json_write_double(b, hp->lr_multiplier);
    else
        strbuf_puts(b, "\"auto\"");
    if (hp->lora_rank) strbuf_printf(b, ",\"lora_rank\":%u", hp->lora_rank);
    if (hp->lora_alpha > 0) {
        strbuf_puts(b, ",\"lora_alpha\":");
        json_write_double(b, hp->lora_alpha);
    }
    strbuf_puts(b, "}");
}

static void str_or_null(strbuf *b, const char *s) {
    if (s && *s)
        json_write_cstring(b, s);
    else
        strbuf_puts(b, "null");
}

void ft_job_json(strbuf *b, const ft_job *job) {
    strbuf_puts(b, "{\"object\":\"fine_tuning.job\",\"id\":");
    json_write_cstring(b, job->id);
    strbuf_puts(b, ",\"model\":");
    json_write_cstring(b, job->model);
    strbuf_printf(b, ",\"created_at\":%" PRId64 ",\"finished_at\":", job->created_at);
    if (job->finished_at)
        strbuf_printf(b, "%" PRId64, job->finished_at);
    else
        strbuf_puts(b, "null");
    strbuf_puts(b, ",\"fine_tuned_model\":");
    str_or_null(b, job->fine_tuned_model);
    strbuf_puts(b, ",\"organization_id\":\"orch\",\"result_files\":[],\"status\":");
    json_write_cstring(b, ft_job_status_name(job->status));
    strbuf_puts(b, ",\"training_file\":");
    json_write_cstring(b, job->training_file);
    strbuf_puts(b, ",\"validation_file\":");
    str_or_null(b, job->validation_file);
    strbuf_puts(b, ",\"hyperparameters\":");
    hp_json(b, &job->hp);
    strbuf_puts(b, ",\"method\":{\"type\":\"supervised\",\"supervised\":{"
                   "\"hyperparameters\":");
    hp_json(b, &job->hp);
    strbuf_puts(b, "}},\"trained_tokens\":");
    if (job->status == FT_JOB_SUCCEEDED || job->trained_tokens)
        strbuf_printf(b, "%" PRIu64, job->trained_tokens);
    else
        strbuf_puts(b, "null");
    strbuf_puts(b, ",\"error\":");
    if (job->status == FT_JOB_FAILED) {
        strbuf_puts(b, "{\"code\":");
        json_write_cstring(b, job->error_code);
        strbuf_puts(b, ",\"message\":");
        json_write_cstring(b, job->error_message);
        strbuf_puts(b, ",\"param\":");
        str_or_null(b, job->error_param);
        strbuf_puts(b, "}");
    } else {
        strbuf_puts(b, "null");
    }
    strbuf_printf(b, ",\"seed\":%" PRIu64 ",\"user_provided_suffix\":", job->seed);
    str_or_null(b, job->suffix);
    strbuf_printf(b,
                  ",\"estimated_finish\":null,\"integrations\":[],\"metadata\":null,"
                  "\"orch_seq\":%" PRIu64 "}",
                  job->seq);
}

/* ---- reading a job back ---- */

static int read_u32_or_auto(const cJSON *o, const char *key, uint32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!v || cJSON_IsString(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6) return -1;
    *out = (uint32_t)v->valuedouble;
    return 0;
}

static int read_copy(const cJSON *o, const char *key, char *dst, size_t cap, int need) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    dst[0] = '\0';
    if (!v || cJSON_IsNull(v)) return need ? -1 : 0;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return -1;
    snprintf(dst, cap, "%s", v->valuestring);
    return 0;
}

/* A job from its job.json (what ft_job_json wrote plus the runner fields). */
static int job_from_json(const char *text, size_t len, ft_job *job) {
    cJSON *r = cJSON_ParseWithLength(text, len);
    if (!r) return -1;
    memset(job, 0, sizeof *job);
    int ok =
        read_copy(r, "id", job->id, sizeof job->id, 1) == 0 && valid_job_id(job->id) &&
        read_copy(r, "model", job->model, sizeof job->model, 1) == 0 &&
        read_copy(r, "training_file", job->training_file, sizeof job->training_file, 1) ==
            0 &&
        read_copy(r, "validation_file", job->validation_file, sizeof job->validation_file,
                  0) == 0 &&
        read_copy(r, "user_provided_suffix", job->suffix, sizeof job->suffix, 0) == 0 &&
        read_copy(r, "fine_tuned_model", job->fine_tuned_model,
                  sizeof job->fine_tuned_model, 0) == 0;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "status");
    job->status = cJSON_IsString(st) ? status_of(st->valuestring) : -1;
    ok = ok && job->status >= 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "created_at");
    ok = ok && cJSON_IsNumber(v);
    if (ok) job->created_at = (int64_t)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(r, "finished_at");
    if (cJSON_IsNumber(v)) job->finished_at = (int64_t)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(r, "seed");
    if (cJSON_IsNumber(v)) job->seed = (uint64_t)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(r, "trained_tokens");
    if (cJSON_IsNumber(v)) job->trained_tokens = (uint64_t)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(r, "orch_seq");
    if (cJSON_IsNumber(v)) job->seq = (uint64_t)v->valuedouble;
    const cJSON *hp = cJSON_GetObjectItemCaseSensitive(r, "hyperparameters");
    ok = ok && cJSON_IsObject(hp) &&
         read_u32_or_auto(hp, "n_epochs", &job->hp.n_epochs) == 0 &&
         read_u32_or_auto(hp, "batch_size", &job->hp.batch_size) == 0 &&
         read_u32_or_auto(hp, "lora_rank", &job->hp.lora_rank) == 0;
    if (ok) {
        v = cJSON_GetObjectItemCaseSensitive(hp, "learning_rate_multiplier");
        if (cJSON_IsNumber(v)) job->hp.lr_multiplier = v->valuedouble;
        v = cJSON_GetObjectItemCaseSensitive(hp, "lora_alpha");
        if (cJSON_IsNumber(v)) job->hp.lora_alpha = v->valuedouble;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
    if (ok && cJSON_IsObject(e)) {
        read_copy(e, "code", job->error_code, sizeof job->error_code, 0);
        read_copy(e, "message", job->error_message, sizeof job->error_message, 0);
        read_copy(e, "param", job->error_param, sizeof job->error_param, 0);
    }
    cJSON_Delete(r);
    return ok ? 0 : -1;
}

/* Write job.json (under j->mu). */
static int save_job(ft_jobs *j, const ft_job *job, char *err, size_t err_cap) {
    char path[4096];
    job_path(j, job->id, "job.json", path, sizeof path);
    strbuf b = { 0 };
    ft_job_json(&b, job);
    if (b.oom) {
        strbuf_free(&b);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    int rc = fsio_write_atomic(path, b.p, b.len, err, err_cap);
    strbuf_free(&b);
    return rc;
}

static ft_job *find(ft_jobs *j, const char *id) {
    for (size_t i = 0; i < j->n; i++)
        if (strcmp(j->jobs[i].id, id) == 0) return &j->jobs[i];
    return NULL;
}

static int add(ft_jobs *j, const ft_job *job) {
    if (j->n == j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 16;
        ft_job *p = realloc(j->jobs, cap * sizeof *p);
        if (!p) return -1;
        j->jobs = p;
        j->cap = cap;
    }
    j->jobs[j->n++] = *job;
    return 0;
}

static int by_created(const void *a, const void *b) {
    const ft_job *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return strcmp(x->id, y->id);
}

ft_jobs *ft_jobs_open(const char *state_dir, char *err, size_t err_cap) {
    ft_jobs *j = util_calloc(1, sizeof *j);
    if (!j) {
        util_set_err(err, err_cap, "jobs: out of memory");
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    if (!state_dir ||
        (size_t)snprintf(j->dir, sizeof j->dir, "%s/jobs", state_dir) >= sizeof j->dir) {
        util_set_err(err, err_cap, "jobs: state directory path too long");
        ft_jobs_close(j);
        return NULL;
    }
    if (fsio_mkdir_p(j->dir, err, err_cap) != 0) {
        ft_jobs_close(j);
        return NULL;
    }
    DIR *d = fsio_opendir(j->dir, err, err_cap);
    if (!d) {
        ft_jobs_close(j);
        return NULL;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!valid_job_id(de->d_name)) continue;
        char path[4096];
        job_path(j, de->d_name, "job.json", path, sizeof path);
        char *text = NULL;
        size_t len = 0;
        char rerr[256];
        ft_job job;
        if (fsio_read_file(path, 1 << 20, &text, &len, rerr, sizeof rerr) != 0) continue;
        int ok = job_from_json(text, len, &job) == 0 && strcmp(job.id, de->d_name) == 0;
        free(text);
        if (!ok) continue;
        /* the server stopped while the job was on its way: queue it again
         * (its runner resumes from the last checkpoint) */
        int requeue = job.status == FT_JOB_RUNNING;
        if (requeue) job.status = FT_JOB_QUEUED;
        if (add(j, &job) != 0) {
            closedir(d);
            util_set_err(err, err_cap, "jobs: out of memory");
            ft_jobs_close(j);
            return NULL;
        }
        if (requeue && save_job(j, &job, rerr, sizeof rerr) != 0) {
            closedir(d);
            util_set_err(err, err_cap, "jobs: %s", rerr);
            ft_jobs_close(j);
            return NULL;
        }
    }
    closedir(d);
    if (j->n > 1) qsort(j->jobs, j->n, sizeof *j->jobs, by_created);
    return j;
}

void ft_jobs_close(ft_jobs *j) {
    if (!j) return;
    pthread_mutex_destroy(&j->mu);
    free(j->jobs);
    free(j);
}

/* ---- creating a job ---- */

static int hp_parse(const cJSON *o, const char *where, ft_job_hparams *hp, api_error *e) {
    if (!cJSON_IsObject(o))
        return api_error_set(e, 400, "hyperparameters", "invalid_type",
                             "'%s' must be an object", where);
    const cJSON *v;
    cJSON_ArrayForEach(v, o) {
        const char *k = v->string;
        int is_auto = cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0;
        if (strcmp(k, "n_epochs") == 0 || strcmp(k, "batch_size") == 0 ||
            strcmp(k, "lora_rank") == 0) {
            int epochs = strcmp(k, "n_epochs") == 0, batch = strcmp(k, "batch_size") == 0;
            double max = epochs ? 50 : batch ? 256 : 4096;
            if (is_auto && (epochs || batch)) continue;
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
                v->valuedouble < 1 || v->valuedouble > max)
                return api_error_set(e, 400, "hyperparameters", "invalid_value",
                                     "%s.%s must be %san integer from 1 to %.0f", where,
                                     k, epochs || batch ? "\"auto\" or " : "", max);
            uint32_t x = (uint32_t)v->valuedouble;
            if (epochs)
                hp->n_epochs = x;
            else if (batch)
                hp->batch_size = x;
            else
                hp->lora_rank = x;
        } else if (strcmp(k, "learning_rate_multiplier") == 0 ||
                   strcmp(k, "lora_alpha") == 0) {
            int lr = k[0] == 'l' && k[1] == 'e';
            if (is_auto && lr) continue;
            double max = lr ? 10 : 1e6;
            if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > max)
                return api_error_set(e, 400, "hyperparameters", "invalid_value",
                                     "%s.%s must be %sa number above 0 and at most %g",
                                     where, k, lr ? "\"auto\" or " : "", max);
            if (lr)
                hp->lr_multiplier = v->valuedouble;
            else
                hp->lora_alpha = v->valuedouble;
        } else {
            return api_error_set(e, 400, "hyperparameters", "unknown_parameter",
                                 "%s.%.64s is not a known hyperparameter (n_epochs, "
                                 "batch_size, learning_rate_multiplier, lora_rank, "
                                 "lora_alpha)",
                                 where, k);
        }
    }
    return 0;
}

/* A file id field: present (when need), a fine-tune file of fs. */
static int file_field(const cJSON *req, const char *key, int need, file_store *fs,
                      char *dst, size_t cap, api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, key);
    dst[0] = '\0';
    const char *param = need ? "training_file" : "validation_file";
    if (!v || cJSON_IsNull(v)) {
        if (need)
            return api_error_set(e, 400, param, "missing_required_parameter",
                                 "'%s' is required", key);
        return 0;
    }
    if (!cJSON_IsString(v))
        return api_error_set(e, 400, param, "invalid_type", "'%s' must be a file id",
                             key);
    file_info fi;
    if (!fs || file_store_get(fs, v->valuestring, &fi) != 0)
        return api_error_set(e, 400, param, "invalid_file_id",
                             "%s '%.64s' is not an uploaded file (POST /v1/files)", key,
                             v->valuestring);
    if (strcmp(fi.purpose, "fine-tune") != 0)
        return api_error_set(e, 400, param, "invalid_file_purpose",
                             "%s '%s' has purpose '%s', not fine-tune", key, fi.id,
                             fi.purpose);
    snprintf(dst, cap, "%s", fi.id);
    return 0;
}

int ft_jobs_create(ft_jobs *j, const cJSON *req, const char *const *models,
                   size_t n_models, file_store *fs, ft_job *out, api_error *e) {
    if (!cJSON_IsObject(req))
        return api_error_set(e, 400, NULL, "invalid_type",
                             "the request body must be a JSON object");
    static const char *const known[] = {
        "model", "training_file", "validation_file", "hyperparameters", "suffix",
        "seed",  "method",        "integrations",    "metadata"
    };
    const cJSON *v;
    cJSON_ArrayForEach(v, req) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(v->string, known[k]) != 0)
            k++;
        if (k == sizeof known / sizeof known[0])
            return api_error_set(e, 400, NULL, "unknown_parameter",
                                 "unknown field '%.64s'", v->string);
    }
    ft_job job;
    memset(&job, 0, sizeof job);
    v = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (!cJSON_IsString(v))
        return api_error_set(e, 400, "model", "missing_required_parameter",
                             "'model' is required (a model this server serves)");
    size_t m = 0;
    while (m < n_models && strcmp(models[m], v->valuestring) != 0) m++;
    if (m == n_models)
        return api_error_set(e, 400, "model", "model_not_found",
                             "model '%.128s' is not served here (GET /v1/models)",
                             v->valuestring);
    if (strlen(v->valuestring) >= sizeof job.model)
        return api_error_set(e, 400, "model", "invalid_value", "model name too long");
    snprintf(job.model, sizeof job.model, "%s", v->valuestring);
    if (file_field(req, "training_file", 1, fs, job.training_file,
                   sizeof job.training_file, e) != 0 ||
        file_field(req, "validation_file", 0, fs, job.validation_file,
                   sizeof job.validation_file, e) != 0)
        return -1;
    const cJSON *hp = cJSON_GetObjectItemCaseSensitive(req, "hyperparameters");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(req, "method");
    if (hp && !cJSON_IsNull(hp) && hp_parse(hp, "hyperparameters", &job.hp, e) != 0)
        return -1;
    if (method && !cJSON_IsNull(method)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(method, "type");
        if (!cJSON_IsObject(method) || !cJSON_IsString(type))
            return api_error_set(e, 400, "method", "invalid_type",
                                 "'method' must be an object with a 'type'");
        if (strcmp(type->valuestring, "supervised") != 0)
            return api_error_set(e, 400, "method", "unsupported_value",
                                 "method.type '%.32s' is not supported (this server "
                                 "fine-tunes LoRA adapters with the supervised loss)",
                                 type->valuestring);
        const cJSON *x;
        cJSON_ArrayForEach(x, method) {
            if (strcmp(x->string, "type") && strcmp(x->string, "supervised"))
                return api_error_set(e, 400, "method", "unknown_parameter",
                                     "unknown field method.%.64s", x->string);
        }
        const cJSON *sup = cJSON_GetObjectItemCaseSensitive(method, "supervised");
        if (sup && !cJSON_IsNull(sup)) {
            if (!cJSON_IsObject(sup))
                return api_error_set(e, 400, "method", "invalid_type",
                                     "method.supervised must be an object");
            cJSON_ArrayForEach(x, sup) {
                if (strcmp(x->string, "hyperparameters"))
                    return api_error_set(e, 400, "method", "unknown_parameter",
                                         "unknown field method.supervised.%.64s",
                                         x->string);
            }
            const cJSON *mhp = cJSON_GetObjectItemCaseSensitive(sup, "hyperparameters");
            if (mhp && !cJSON_IsNull(mhp)) {
                if (hp && !cJSON_IsNull(hp))
                    return api_error_set(e, 400, "hyperparameters", "invalid_request",
                                         "give hyperparameters either at the top level "
                                         "or in method.supervised, not both");
                if (hp_parse(mhp, "method.supervised.hyperparameters", &job.hp, e) != 0)
                    return -1;
            }
        }
    }
    v = cJSON_GetObjectItemCaseSensitive(req, "suffix");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v) || strlen(v->valuestring) > 64)
            return api_error_set(e, 400, "suffix", "invalid_value",
                                 "'suffix' must be a string of at most 64 characters");
        for (const char *p = v->valuestring; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
                return api_error_set(e, 400, "suffix", "invalid_value",
                                     "'suffix' may hold letters, digits, '-', '_' and "
                                     "'.' only (it becomes part of a model name)");
        snprintf(job.suffix, sizeof job.suffix, "%s", v->valuestring);
    }
    v = cJSON_GetObjectItemCaseSensitive(req, "seed");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
            v->valuedouble < 0 || v->valuedouble > 2147483647.0)
            return api_error_set(e, 400, "seed", "invalid_value",
                                 "'seed' must be an integer from 0 to 2147483647");
        job.seed = (uint64_t)v->valuedouble;
    } else {
        char hex[16];
        if (util_random_id(hex, sizeof hex, "", 4) == 0)
            job.seed = strtoull(hex, NULL, 16) & 0x7fffffffu;
    }
    v = cJSON_GetObjectItemCaseSensitive(req, "integrations");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return api_error_set(e, 400, "integrations", "unsupported_value",
                             "integrations are not supported (the events and "
                             "checkpoints endpoints report progress)");
    v = cJSON_GetObjectItemCaseSensitive(req, "metadata");
    if (v && !cJSON_IsNull(v))
        return api_error_set(e, 400, "metadata", "unsupported_value",
                             "metadata is not supported");

    if (util_random_id(job.id, sizeof job.id, "ftjob-", 12) != 0)
        return api_error_set(e, 500, NULL, "server_error", "no random source for an id");
    job.status = FT_JOB_VALIDATING;
    job.created_at = (int64_t)time(NULL);
    char path[4096], err[512];
    pthread_mutex_lock(&j->mu);
    job.seq = j->n ? j->jobs[j->n - 1].seq + 1 : 1;
    snprintf(path, sizeof path, "%s/%s", j->dir, job.id);
    int rc = fsio_mkdir(path, err, sizeof err);
    if (rc == 0) rc = save_job(j, &job, err, sizeof err);
    if (rc == 0 && add(j, &job) != 0) {
        util_set_err(err, sizeof err, "out of memory");
        rc = -1;
    }
    if (rc != 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", j->dir, job.id);
        char e2[256];
        fsio_rm_rf(dir, e2, sizeof e2);
    }
    pthread_mutex_unlock(&j->mu);
    if (rc != 0) return api_error_set(e, 500, NULL, "server_error", "%s", err);
    if (out) *out = job;
    return 0;
}

/* ---- reading ---- */

int ft_jobs_get(ft_jobs *j, const char *id, ft_job *out) {
    if (!valid_job_id(id)) return -1;
    pthread_mutex_lock(&j->mu);
    ft_job *job = find(j, id);
    if (job && out) *out = *job;
    pthread_mutex_unlock(&j->mu);
    return job ? 0 : -1;
}

static int no_job(api_error *e, const char *id) {
    return api_error_set(e, 404, "fine_tuning_job_id", "not_found",
                         "no fine-tuning job '%.64s'", id ? id : "");
}

int ft_jobs_list_json(ft_jobs *j, strbuf *b, const char *after, uint32_t limit,
                      api_error *e) {
    if (limit == 0) limit = 20;
    if (limit > 100)
        return api_error_set(e, 400, "limit", "invalid_value",
                             "limit must be from 1 to 100");
    pthread_mutex_lock(&j->mu);
    size_t start = j->n; /* newest first: index n-1 down to 0 */
    if (after && *after) {
        size_t i = 0;
        while (i < j->n && strcmp(j->jobs[i].id, after) != 0) i++;
        if (i == j->n) {
            pthread_mutex_unlock(&j->mu);
            return no_job(e, after);
        }
        start = i;
    }
    strbuf_puts(b, "{\"object\":\"list\",\"data\":[");
    uint32_t k = 0;
    size_t i = start;
    for (; i > 0 && k < limit; i--, k++) {
        if (k) strbuf_puts(b, ",");
        ft_job_json(b, &j->jobs[i - 1]);
    }
    strbuf_printf(b, "],\"has_more\":%s}", i > 0 ? "true" : "false");
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int ft_jobs_cancel(ft_jobs *j, const char *id, ft_job *out, api_error *e) {
    pthread_mutex_lock(&j->mu);
    ft_job *job = valid_job_id(id) ? find(j, id) : NULL;
    if (!job) {
        pthread_mutex_unlock(&j->mu);
        return no_job(e, id);
    }
    if (job->status >= FT_JOB_SUCCEEDED) {
        int st = job->status;
        pthread_mutex_unlock(&j->mu);
        return api_error_set(e, 400, NULL, "invalid_request",
                             "job %s has already ended (%s): it cannot be cancelled", id,
                             ft_job_status_name(st));
    }
    ft_job next = *job;
    next.status = FT_JOB_CANCELLED;
    next.cancel_requested = 1;
    next.finished_at = (int64_t)time(NULL);
    char err[512];
    int rc = save_job(j, &next, err, sizeof err);
    if (rc == 0) *job = next;
    pthread_mutex_unlock(&j->mu);
    if (rc != 0) return api_error_set(e, 500, NULL, "server_error", "%s", err);
    ft_jobs_event(j, id, "info", "Fine-tuning job cancelled", NULL);
    if (out) *out = next;
    return 0;
}

/* The lines of JOB/FILE (oldest first), newest first as a list with
 * pagination; each line is one object with an "id". */
static int lines_json(ft_jobs *j, const char *id, const char *file, strbuf *b,
                      const char *after, uint32_t limit, api_error *e) {
    if (limit == 0) limit = 20;
    if (limit > 100)
        return api_error_set(e, 400, "limit", "invalid_value",
                             "limit must be from 1 to 100");
    if (ft_jobs_get(j, id, NULL) != 0) return no_job(e, id);
    char path[4096];
    job_path(j, id, file, path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    char err[512];
    pthread_mutex_lock(&j->mu);
    int rc = fsio_read_file(path, 64u << 20, &text, &len, err, sizeof err);
    pthread_mutex_unlock(&j->mu);
    if (rc != 0) {
        if (errno != ENOENT)
            return api_error_set(e, 500, NULL, "server_error", "%s", err);
        text = NULL;
        len = 0;
    }
    /* line starts */
    size_t n = 0, cap = 0;
    size_t *starts = NULL;
    for (size_t i = 0; i < len;) {
        size_t s = i;
        while (i < len && text[i] != '\n') i++;
        if (i > s) {
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                size_t *p = realloc(starts, cap * sizeof *p);
                if (!p) {
                    free(starts);
                    free(text);
                    return api_error_set(e, 500, NULL, "server_error", "out of memory");
                }
                starts = p;
            }
            starts[n++] = s;
            text[i] = '\0';
        }
        i++;
    }
    size_t from = n; /* newest first */
    if (after && *after) {
        char key[96];
        snprintf(key, sizeof key, "\"id\":\"%.64s\"", after);
        size_t i = 0;
        while (i < n && !strstr(text + starts[i], key)) i++;
        if (i == n) {
            free(starts);
            free(text);
            return api_error_set(e, 404, "after", "not_found", "no item '%.64s'", after);
        }
        from = i;
    }
    strbuf_puts(b, "{\"object\":\"list\",\"data\":[");
    uint32_t k = 0;
    size_t i = from;
    for (; i > 0 && k < limit; i--, k++) {
        if (k) strbuf_puts(b, ",");
        strbuf_puts(b, text + starts[i - 1]);
    }
    strbuf_printf(b, "],\"has_more\":%s}", i > 0 ? "true" : "false");
    free(starts);
    free(text);
    return 0;
}

int ft_jobs_events_json(ft_jobs *j, const char *id, strbuf *b, const char *after,
                        uint32_t limit, api_error *e) {
    return lines_json(j, id, "events.jsonl", b, after, limit, e);
}

int ft_jobs_checkpoints_json(ft_jobs *j, const char *id, strbuf *b, const char *after,
                             uint32_t limit, api_error *e) {
    return lines_json(j, id, "checkpoints.jsonl", b, after, limit, e);
}

/* ---- the runner's side ---- */

int ft_jobs_oldest(ft_jobs *j, int status, ft_job *out) {
    pthread_mutex_lock(&j->mu);
    int rc = -1;
    for (size_t i = 0; i < j->n; i++)
        if (j->jobs[i].status == status) {
            if (out) *out = j->jobs[i];
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

/* Change job id under the lock with fn, persisting it; -1 when absent or
 * fn refuses. */
static int update(ft_jobs *j, const char *id, int (*fn)(ft_job *, const void *),
                  const void *arg) {
    pthread_mutex_lock(&j->mu);
    ft_job *job = find(j, id);
    int rc = -1;
    if (job) {
        ft_job next = *job;
        char err[512];
        if (fn(&next, arg) == 0 && save_job(j, &next, err, sizeof err) == 0) {
            *job = next;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

struct transition_arg {
    int from, to;
    const ft_job_hparams *hp;
};

static int do_transition(ft_job *job, const void *arg) {
    const struct transition_arg *t = arg;
    if (job->status != t->from) return -1;
    job->status = t->to;
    if (t->hp) job->hp = *t->hp;
    return 0;
}

int ft_jobs_transition(ft_jobs *j, const char *id, int from, int to,
                       const ft_job_hparams *hp) {
    struct transition_arg t = { from, to, hp };
    return update(j, id, do_transition, &t);
}

static int do_progress(ft_job *job, const void *arg) {
    if (job->status != FT_JOB_RUNNING) return -1;
    job->trained_tokens = *(const uint64_t *)arg;
    return 0;
}

int ft_jobs_progress(ft_jobs *j, const char *id, uint64_t trained_tokens) {
    return update(j, id, do_progress, &trained_tokens);
}

struct finish_arg {
    int status;
    const char *model, *code, *message;
};

static int do_finish(ft_job *job, const void *arg) {
    const struct finish_arg *f = arg;
    if (job->status >= FT_JOB_SUCCEEDED) return -1; /* cancelled meanwhile */
    job->status = f->status;
    job->finished_at = (int64_t)time(NULL);
    if (f->status == FT_JOB_SUCCEEDED)
        snprintf(job->fine_tuned_model, sizeof job->fine_tuned_model, "%s",
                 f->model ? f->model : "");
    if (f->status == FT_JOB_FAILED) {
        snprintf(job->error_code, sizeof job->error_code, "%s",
                 f->code ? f->code : "server_error");
        snprintf(job->error_message, sizeof job->error_message, "%s",
                 f->message ? f->message : "");
    }
    return 0;
}

int ft_jobs_finish(ft_jobs *j, const char *id, int status, const char *fine_tuned_model,
                   const char *error_code, const char *error_message) {
    if (status < FT_JOB_SUCCEEDED || status > FT_JOB_CANCELLED) return -1;
    struct finish_arg f = { status, fine_tuned_model, error_code, error_message };
    return update(j, id, do_finish, &f);
}

/* Append one JSON line to JOB/FILE. */
static int append_line(ft_jobs *j, const char *id, const char *file, const strbuf *line) {
    char path[4096], err[512];
    job_path(j, id, file, path, sizeof path);
    pthread_mutex_lock(&j->mu);
    int fd = fsio_open_append(path, 0, err, sizeof err);
    int rc = -1;
    if (fd >= 0) {
        rc = fsio_write_all(fd, line->p, line->len, path, err, sizeof err);
        if (close(fd) != 0) rc = -1;
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int ft_jobs_event(ft_jobs *j, const char *id, const char *level, const char *message,
                  const char *data_json) {
    if (ft_jobs_get(j, id, NULL) != 0) return -1;
    char eid[40];
    if (util_random_id(eid, sizeof eid, "ftevent-", 12) != 0) return -1;
    strbuf b = { 0 };
    strbuf_puts(&b, "{\"object\":\"fine_tuning.job.event\",\"id\":");
    json_write_cstring(&b, eid);
    strbuf_printf(&b, ",\"created_at\":%" PRId64 ",\"level\":", (int64_t)time(NULL));
    json_write_cstring(&b, level);
    strbuf_puts(&b, ",\"message\":");
    json_write_cstring(&b, message);
    strbuf_printf(&b, ",\"data\":%s,\"type\":\"%s\"}\n", data_json ? data_json : "{}",
                  data_json ? "metrics" : "message");
    int rc = b.oom ? -1 : append_line(j, id, "events.jsonl", &b);
    strbuf_free(&b);
    return rc;
}

int ft_jobs_checkpoint(ft_jobs *j, const char *id, uint64_t step, const char *model,
                       const char *metrics_json) {
    if (ft_jobs_get(j, id, NULL) != 0) return -1;
    char cid[40];
    if (util_random_id(cid, sizeof cid, "ftckpt-", 12) != 0) return -1;
    strbuf b = { 0 };
    strbuf_puts(&b, "{\"object\":\"fine_tuning.job.checkpoint\",\"id\":");
    json_write_cstring(&b, cid);
    strbuf_printf(&b, ",\"created_at\":%" PRId64 ",\"fine_tuned_model_checkpoint\":",
                  (int64_t)time(NULL));
    str_or_null(&b, model);
    strbuf_puts(&b, ",\"fine_tuning_job_id\":");
    json_write_cstring(&b, id);
    strbuf_printf(&b, ",\"metrics\":%s,\"step_number\":%" PRIu64 "}\n",
                  metrics_json ? metrics_json : "{}", step);
    int rc = b.oom ? -1 : append_line(j, id, "checkpoints.jsonl", &b);
    strbuf_free(&b);
    return rc;
}

void ft_jobs_counts(ft_jobs *j, uint64_t counts[FT_JOB_CANCELLED + 1]) {
    memset(counts, 0, sizeof(uint64_t) * (FT_JOB_CANCELLED + 1));
    pthread_mutex_lock(&j->mu);
    for (size_t i = 0; i < j->n; i++)
        if (j->jobs[i].status >= 0 && j->jobs[i].status <= FT_JOB_CANCELLED)
            counts[j->jobs[i].status]++;
    pthread_mutex_unlock(&j->mu);
}

size_t ft_jobs_in_status(ft_jobs *j, int status, ft_job *out, size_t cap) {
    size_t k = 0;
    pthread_mutex_lock(&j->mu);
    for (size_t i = 0; i < j->n && k < cap; i++)
        if (j->jobs[i].status == status) out[k++] = j->jobs[i];
    pthread_mutex_unlock(&j->mu);
    return k;
}
