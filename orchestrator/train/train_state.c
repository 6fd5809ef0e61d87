/*
 * train_state.c - state.json of a training checkpoint, to and from JSON. See
 * train_state.h and, for the format, train.h.
 */
#include "orchestrator/train/train_state.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/core/json_read.h"
#include "orchestrator/core/util.h"

static cJSON *num_or_null(double v) {
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

char *train_state_to_json(const train_state *s, const char *engine_name,
                          const lr_schedule *sched, const orch_config *config) {
    cJSON *root = cJSON_CreateObject();
    char hex[65];
    data_rng_to_hex(&s->rng, hex);
    cJSON_AddNumberToObject(root, "format", TRAIN_STATE_FORMAT);
    cJSON_AddNumberToObject(root, "step", (double)s->step);
    cJSON_AddNumberToObject(root, "total_steps", (double)s->total_steps);
    cJSON_AddStringToObject(root, "engine", engine_name);
    cJSON_AddNumberToObject(root, "engine_threads", config->engine.threads);
    cJSON_AddStringToObject(root, "tokenizer", config->data.tokenizer);
    cJSON *data = cJSON_AddObjectToObject(root, "data");
    cJSON_AddStringToObject(data, "rng", hex);
    cJSON_AddNumberToObject(data, "tokens_seen", (double)s->tokens_seen);
    cJSON_AddNumberToObject(data, "world", s->world);
    cJSON_AddNumberToObject(data, "grad_accum", s->grad_accum);
    cJSON *sch = cJSON_AddObjectToObject(root, "schedule");
    cJSON_AddStringToObject(sch, "kind", lr_schedule_kind_name(sched->kind));
    cJSON_AddNumberToObject(sch, "lr", sched->lr);
    cJSON_AddNumberToObject(sch, "min_lr", sched->min_lr);
    cJSON_AddNumberToObject(sch, "warmup_steps", (double)sched->warmup_steps);
    cJSON_AddNumberToObject(sch, "total_steps", (double)sched->total_steps);
    cJSON_AddItemToObject(sch, "last_lr", num_or_null(s->last_lr));
    cJSON_AddItemToObject(root, "best_val_loss", num_or_null(s->best_val_loss));
    cJSON_AddNumberToObject(root, "best_val_step", (double)s->best_val_step);
    cJSON_AddNumberToObject(root, "evals_since_best", s->evals_since_best);
    cJSON *met = cJSON_AddObjectToObject(root, "metrics");
    cJSON_AddItemToObject(met, "loss", num_or_null(s->last_loss));
    cJSON_AddItemToObject(met, "val_loss", num_or_null(s->last_val_loss));
    cJSON_AddNumberToObject(met, "elapsed_s", s->elapsed_s);
    cJSON_AddNumberToObject(met, "tokens_per_s", s->tokens_per_s);
    cJSON *cfg = config_to_cjson(config);
    if (cfg) cJSON_AddItemToObject(root, "config", cfg);
    char *text = cfg ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

/* The numbers of state.json, each range-checked before it is converted. */
static int read_numbers(const cJSON *root, train_state *s, char *err, size_t cap) {
    const uint64_t U53 = JSON_READ_U64_MAX;
    const unsigned N = JSON_READ_NULLABLE;
    uint64_t evals = 0, u = 0, world = 0, accum = 0;
    double d = 0;
    if (json_read_u64(root, "step", JSON_READ_REQUIRED, 0, 0, U53, &s->step, err, cap) ||
        json_read_u64(root, "total_steps", 0, 0, 0, U53, &s->total_steps, err, cap) ||
        json_read_u64(root, "data.tokens_seen", 0, 0, 0, U53, &s->tokens_seen, err,
                      cap) ||
        json_read_u64(root, "best_val_step", 0, 0, 0, s->step, &s->best_val_step, err,
                      cap) ||
        json_read_u64(root, "evals_since_best", 0, 0, 0, UINT32_MAX, &evals, err, cap) ||
        json_read_u64(root, "data.world", 0, 0, 0, UINT32_MAX, &world, err, cap) ||
        json_read_u64(root, "data.grad_accum", 0, 0, 0, UINT32_MAX, &accum, err, cap) ||
        json_read_u64(root, "engine_threads", 0, 0, 0, UINT32_MAX, &u, err, cap) ||
        json_read_f64(root, "best_val_loss", N, NAN, -HUGE_VAL, HUGE_VAL,
                      &s->best_val_loss, err, cap) ||
        json_read_f64(root, "metrics.loss", N, NAN, -HUGE_VAL, HUGE_VAL, &s->last_loss,
                      err, cap) ||
        json_read_f64(root, "metrics.val_loss", N, NAN, -HUGE_VAL, HUGE_VAL,
                      &s->last_val_loss, err, cap) ||
        json_read_f64(root, "metrics.elapsed_s", N, 0, 0, HUGE_VAL, &s->elapsed_s, err,
                      cap) ||
        json_read_f64(root, "metrics.tokens_per_s", N, 0, 0, HUGE_VAL, &s->tokens_per_s,
                      err, cap) ||
        json_read_f64(root, "schedule.last_lr", N, NAN, 0, HUGE_VAL, &s->last_lr, err,
                      cap) ||
        /* Checked, not kept: the schedule is rebuilt from the config. */
        json_read_f64(root, "schedule.lr", N, 0, 0, HUGE_VAL, &d, err, cap) ||
        json_read_f64(root, "schedule.min_lr", N, 0, 0, HUGE_VAL, &d, err, cap) ||
        json_read_u64(root, "schedule.warmup_steps", 0, 0, 0, U53, &u, err, cap) ||
        json_read_u64(root, "schedule.total_steps", 0, 0, 0, U53, &u, err, cap))
        return -1;
    s->evals_since_best = (uint32_t)evals;
    s->world = (uint32_t)world;
    s->grad_accum = (uint32_t)accum;
    return 0;
}

int train_state_from_json(const char *text, train_state *s, char *tok, size_t tok_cap,
                          char *err, size_t cap) {
    const char *end = NULL;
    cJSON *root = text ? cJSON_ParseWithOpts(text, &end, 1) : NULL;
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        util_set_err(err, cap, "state.json is not a JSON object");
        return -1;
    }
    int rc = -1;
    char msg[512];
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(data, "rng");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    if (!cJSON_IsNumber(fmt) || fmt->valuedouble != TRAIN_STATE_FORMAT) {
        util_set_err(err, cap, "state.json: unsupported format (want %d)",
                     TRAIN_STATE_FORMAT);
        goto out;
    }
    memset(s, 0, sizeof *s);
    if (read_numbers(root, s, msg, sizeof msg) != 0) {
        util_set_err(err, cap, "state.json: %s", msg);
        goto out;
    }
    if (!cJSON_IsString(rng) || data_rng_from_hex(rng->valuestring, &s->rng)) {
        util_set_err(err, cap, "state.json: missing or bad \"data.rng\"");
        goto out;
    }
    if (tk && !cJSON_IsString(tk)) {
        util_set_err(err, cap, "state.json: tokenizer: expected a string, got %s",
                     json_read_type_name(tk));
        goto out;
    }
    if (tok) snprintf(tok, tok_cap, "%s", tk ? tk->valuestring : "");
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}
