/*
 * train_state.c - state.json of a training checkpoint, to and from JSON. See
 * train_state.h and, for the format, train.h.
 */
#include "orchestrator/train/train_state.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/core/util.h"

static cJSON *num_or_null(double v) {
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static double get_num(const cJSON *obj, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
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

int train_state_from_json(const char *text, train_state *s, char *tok, size_t tok_cap,
                          char *err, size_t cap) {
    cJSON *root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        util_set_err(err, cap, "state.json is not a JSON object");
        return -1;
    }
    int rc = -1;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "step");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(data, "rng");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    if (!cJSON_IsNumber(fmt) || fmt->valuedouble != TRAIN_STATE_FORMAT) {
        util_set_err(err, cap, "state.json: unsupported format (want %d)",
                     TRAIN_STATE_FORMAT);
        goto out;
    }
    if (!cJSON_IsNumber(step) || step->valuedouble < 0) {
        util_set_err(err, cap, "state.json: missing or bad \"step\"");
        goto out;
    }
    memset(s, 0, sizeof *s);
    s->step = (uint64_t)step->valuedouble;
    s->total_steps = (uint64_t)get_num(root, "total_steps", 0);
    if (!cJSON_IsString(rng) || data_rng_from_hex(rng->valuestring, &s->rng)) {
        util_set_err(err, cap, "state.json: missing or bad \"data.rng\"");
        goto out;
    }
    s->tokens_seen = (uint64_t)get_num(data, "tokens_seen", 0);
    s->best_val_loss = get_num(root, "best_val_loss", NAN);
    s->best_val_step = (uint64_t)get_num(root, "best_val_step", 0);
    s->evals_since_best = (uint32_t)get_num(root, "evals_since_best", 0);
    const cJSON *met = cJSON_GetObjectItemCaseSensitive(root, "metrics");
    s->last_loss = get_num(met, "loss", NAN);
    s->last_val_loss = get_num(met, "val_loss", NAN);
    s->elapsed_s = get_num(met, "elapsed_s", 0);
    s->tokens_per_s = get_num(met, "tokens_per_s", 0);
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(root, "schedule");
    s->last_lr = get_num(sch, "last_lr", NAN);
    if (tok) snprintf(tok, tok_cap, "%s", cJSON_IsString(tk) ? tk->valuestring : "");
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}
