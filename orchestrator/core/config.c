/*
 * config.c - load, override, validate and serialise orch run configs.
 * See config.h for the schema and the error format.
 *
 * The schema tables and the validation that fills the struct are in
 * config_schema.c; this file reads documents, applies --set overrides and
 * writes the merged config back out.
 */
#include "orchestrator/core/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/config_schema.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"

/* A config is small; refuse giant files. */
#define CONFIG_FILE_MAX_BYTES ((size_t)64 << 20)

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */
size_t config_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = malloc((lb + 1) * sizeof *row);
    if (!row) return (size_t)-1;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

/* ------------------------------------------------------------------------- */
/* Loading                                                                    */
/* ------------------------------------------------------------------------- */

/* Take ownership of doc: validate it into a new config. */
static int config_from_doc(cJSON *doc, const char *origin, orch_config **out, char *err,
                           size_t cap) {
    orch_config *cfg = util_calloc(1, sizeof *cfg);
    if (!cfg) {
        cJSON_Delete(doc);
        util_set_err(err, cap, "out of memory");
        return -1;
    }
    snprintf(cfg->source, sizeof cfg->source, "%s", origin ? origin : "<text>");
    char msg[1024];
    if (config_validate(doc, cfg, msg, sizeof msg) != 0) {
        if (origin)
            util_set_err(err, cap, "%s: %s", origin, msg);
        else
            util_set_err(err, cap, "%s", msg);
        cJSON_Delete(doc);
        free(cfg);
        return -1;
    }
    cfg->doc = doc;
    *out = cfg;
    return 0;
}

static void line_col(const char *text, const char *pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *p = text; p < pos && *p; p++) {
        if (*p == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

int config_parse_text(const char *text, const char *origin, orch_config **out, char *err,
                      size_t err_cap) {
    const char *name = origin ? origin : "<text>";
    if (!text) {
        util_set_err(err, err_cap, "%s: no text", name);
        return -1;
    }
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithOpts(text, &end, 1);
    if (!doc) {
        int line, col;
        line_col(text, end ? end : text, &line, &col);
        util_set_err(err, err_cap, "%s: line %d, column %d: invalid JSON", name, line,
                     col);
        return -1;
    }
    return config_from_doc(doc, name, out, err, err_cap);
}

int config_from_cjson(const void *json_object, const char *origin, orch_config **out,
                      char *err, size_t err_cap) {
    const cJSON *obj = json_object;
    if (!obj) {
        util_set_err(err, err_cap, "%s: no config", origin ? origin : "<json>");
        return -1;
    }
    cJSON *doc = cJSON_Duplicate(obj, 1);
    if (!doc) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    return config_from_doc(doc, origin ? origin : "<json>", out, err, err_cap);
}

int config_load_file(const char *path, orch_config **out, char *err, size_t err_cap) {
    char *buf = NULL, msg[CONFIG_PATH_MAX + 128];
    size_t len = 0;
    if (fsio_read_file(path, CONFIG_FILE_MAX_BYTES, &buf, &len, msg, sizeof msg) != 0) {
        if (errno == EFBIG)
            util_set_err(err, err_cap, "%s: file too large for a config", path);
        else if (errno == EINVAL || errno == EISDIR) /* a directory, FIFO, device */
            util_set_err(err, err_cap, "%s: cannot open: not a regular file", path);
        else
            util_set_err(err, err_cap, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (strlen(buf) != len) {
        free(buf);
        util_set_err(err, err_cap, "%s: not a text file (contains NUL bytes)", path);
        return -1;
    }
    int rc = config_parse_text(buf, path, out, err, err_cap);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Overrides                                                                  */
/* ------------------------------------------------------------------------- */
/* Parse the value text of an override for `path`. */
static cJSON *override_value(const char *path, const char *text) {
    const config_key_spec *k = config_key_for_path(path);
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithOpts(text, &end, 1);
    if (k && k->type == CONFIG_KT_STR) {
        if (v && cJSON_IsString(v)) return v;
        cJSON_Delete(v);
        return cJSON_CreateString(text);
    }
    if (v) return v;
    return cJSON_CreateString(text);
}

/* Apply one "a.b=value" to doc. */
static int apply_one(cJSON *doc, const char *set, char *err, size_t cap) {
    const char *eq = strchr(set, '=');
    if (!eq) {
        util_set_err(err, cap, "--set %s: expected KEY=VALUE (e.g. train.lr=3e-4)", set);
        return -1;
    }
    size_t plen = (size_t)(eq - set);
    if (plen == 0 || plen >= 256) {
        util_set_err(err, cap, "--set %s: bad key", set);
        return -1;
    }
    char path[256];
    memcpy(path, set, plen);
    path[plen] = '\0';
    if (path[0] == '.' || path[plen - 1] == '.' || strstr(path, "..")) {
        util_set_err(err, cap, "--set %s: bad key '%s'", set, path);
        return -1;
    }
    if (!cJSON_IsObject(doc)) {
        util_set_err(err, cap, "--set %s: the config is not an object", set);
        return -1;
    }
    cJSON *node = doc;
    char walk[256];
    snprintf(walk, sizeof walk, "%s", path);
    char *seg = walk;
    for (;;) {
        char *dot = strchr(seg, '.');
        if (!dot) break;
        *dot = '\0';
        cJSON *child = cJSON_GetObjectItemCaseSensitive(node, seg);
        if (!child) {
            child = cJSON_AddObjectToObject(node, seg);
            if (!child) {
                util_set_err(err, cap, "out of memory");
                return -1;
            }
        } else if (!cJSON_IsObject(child)) {
            util_set_err(err, cap, "--set %s: %.*s is not an object", set,
                         (int)(dot - walk), path);
            return -1;
        }
        node = child;
        seg = dot + 1;
    }
    if (strcmp(eq + 1, "null") == 0) { /* null removes the key */
        cJSON_DeleteItemFromObjectCaseSensitive(node, seg);
        return 0;
    }
    cJSON *v = override_value(path, eq + 1);
    if (!v) {
        util_set_err(err, cap, "out of memory");
        return -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(node, seg)) {
        if (!cJSON_ReplaceItemInObjectCaseSensitive(node, seg, v)) {
            cJSON_Delete(v);
            util_set_err(err, cap, "out of memory");
            return -1;
        }
    } else if (!cJSON_AddItemToObject(node, seg, v)) {
        cJSON_Delete(v);
        util_set_err(err, cap, "out of memory");
        return -1;
    }
    return 0;
}

int config_apply_overrides(orch_config *cfg, const char *const *sets, size_t n_sets,
                           char *err, size_t err_cap) {
    if (n_sets == 0) return 0;
    cJSON *doc = cJSON_Duplicate(cfg->doc, 1);
    if (!doc) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n_sets; i++) {
        if (apply_one(doc, sets[i], err, err_cap) != 0) {
            cJSON_Delete(doc);
            return -1;
        }
    }
    orch_config tmp;
    char msg[1024];
    if (config_validate(doc, &tmp, msg, sizeof msg) != 0) {
        /* Name the override that touches the failing path when there is one. */
        const char *who = NULL;
        for (size_t i = 0; i < n_sets; i++) {
            const char *eq = strchr(sets[i], '=');
            size_t plen = eq ? (size_t)(eq - sets[i]) : 0;
            if (plen && strncmp(msg, sets[i], plen) == 0 && msg[plen] == ':')
                who = sets[i];
        }
        if (who)
            util_set_err(err, err_cap, "--set %s: %s", who, msg);
        else
            util_set_err(err, err_cap, "after --set: %s", msg);
        cJSON_Delete(doc);
        return -1;
    }
    memcpy(cfg, &tmp, offsetof(orch_config, source));
    cJSON_Delete(cfg->doc);
    cfg->doc = doc;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Absolute data paths                                                        */
/* ------------------------------------------------------------------------- */

/* The relative glob pat made absolute into out (see config.h). */
static int absolute_glob(const char *pat, char *out, size_t cap, char *err,
                         size_t err_cap) {
    size_t fixed = strcspn(pat, "*?[\\");
    const char *slash = NULL;
    for (const char *p = pat; p < pat + fixed; p++)
        if (*p == '/') slash = p;
    char base[PATH_MAX], dir[PATH_MAX];
    const char *rest = pat;
    size_t n = slash ? (size_t)(slash - pat) : 0;
    if (n && n < sizeof dir) {
        memcpy(dir, pat, n);
        dir[n] = '\0';
        if (realpath(dir, base)) rest = slash + 1;
    }
    if (rest == pat) { /* no directory part, or it does not exist (yet) */
        if (!getcwd(base, sizeof base)) {
            util_set_err(err, err_cap, "cannot make '%s' absolute: %s", pat,
                         strerror(errno));
            return -1;
        }
        while (rest[0] == '.' && rest[1] == '/') rest += 2;
    }
    int sep = strcmp(base, "/") != 0;
    if (snprintf(out, cap, "%s%s%s", base, sep ? "/" : "", rest) >= (int)cap) {
        util_set_err(err, err_cap, "'%s' made absolute is too long", pat);
        return -1;
    }
    return 0;
}

int config_absolute_data_paths(orch_config *cfg, char *err, size_t err_cap) {
    const char *keys[2] = { "data.train", "data.val" };
    const char *vals[2] = { cfg->data.train, cfg->data.val };
    char sets[2][CONFIG_PATH_MAX + 16];
    const char *set_ptrs[2];
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        if (vals[k][0] == '/') continue;
        char abs[CONFIG_PATH_MAX], msg[CONFIG_PATH_MAX + 64];
        if (absolute_glob(vals[k], abs, sizeof abs, msg, sizeof msg) != 0) {
            util_set_err(err, err_cap, "%s: %s", keys[k], msg);
            return -1;
        }
        snprintf(sets[n], sizeof sets[n], "%s=%s", keys[k], abs);
        set_ptrs[n] = sets[n];
        n++;
    }
    return config_apply_overrides(cfg, set_ptrs, n, err, err_cap);
}

/* ------------------------------------------------------------------------- */
/* Output                                                                     */
/* ------------------------------------------------------------------------- */
void config_model_desc(const orch_config *cfg, orch_model_desc *desc) {
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->arch = strcmp(cfg->model.arch, "llama") == 0 ? ORCH_ARCH_LLAMA : ORCH_ARCH_GPT2;
    desc->vocab_size = cfg->model.vocab_size;
    desc->context = cfg->model.context;
    desc->layers = cfg->model.layers;
    desc->heads = cfg->model.heads;
    desc->kv_heads = cfg->model.kv_heads;
    desc->width = cfg->model.width;
    desc->mlp_width = cfg->model.mlp_width;
    desc->layernorm_eps = (float)cfg->model.layernorm_eps;
    desc->rope_theta = (float)cfg->model.rope_theta;
    if (desc->arch != ORCH_ARCH_LLAMA) return;
    const config_model *m = &cfg->model;
    if (!m->tie_embeddings) desc->flags |= ORCH_MODEL_FLAG_UNTIED_HEAD;
    if (strcmp(m->rope_type, "linear") == 0) {
        desc->rope_scaling = ORCH_ROPE_LINEAR;
        desc->rope_factor = (float)m->rope_factor;
    } else if (strcmp(m->rope_type, "llama3") == 0) {
        desc->rope_scaling = ORCH_ROPE_LLAMA3;
        desc->rope_factor = (float)m->rope_factor;
        desc->rope_low_freq_factor = (float)m->rope_low_freq_factor;
        desc->rope_high_freq_factor = (float)m->rope_high_freq_factor;
        desc->rope_original_context = m->rope_original_context;
    }
}

static int add_section(cJSON *root, const orch_config *cfg,
                       const config_section_spec *s) {
    cJSON *sec = cJSON_AddObjectToObject(root, s->name);
    if (!sec) return -1;
    const char *base = (const char *)cfg + s->offset;
    for (size_t i = 0; i < s->n_keys; i++) {
        const config_key_spec *k = &s->keys[i];
        const char *p = base + k->offset;
        cJSON *v = NULL;
        if (strcmp(s->name, "train") == 0) {
            /* Exactly one of max_steps / epochs is serialised. */
            if (strcmp(k->name, "max_steps") == 0 && cfg->train.max_steps == 0) continue;
            if (strcmp(k->name, "epochs") == 0 && cfg->train.epochs == 0) continue;
        }
        switch (k->type) {
        case CONFIG_KT_OBJ: continue; /* only in the model section (copied) */
        case CONFIG_KT_BOOL: {
            int x;
            memcpy(&x, p, sizeof x);
            v = cJSON_CreateBool(x);
            break;
        }
        case CONFIG_KT_STR: v = cJSON_CreateString(p); break;
        case CONFIG_KT_U32: {
            uint32_t x;
            memcpy(&x, p, sizeof x);
            v = cJSON_CreateNumber((double)x);
            break;
        }
        case CONFIG_KT_U64: {
            uint64_t x;
            memcpy(&x, p, sizeof x);
            v = cJSON_CreateNumber((double)x);
            break;
        }
        case CONFIG_KT_F64: {
            double x;
            memcpy(&x, p, sizeof x);
            v = cJSON_CreateNumber(x);
            break;
        }
        }
        if (!v || !cJSON_AddItemToObject(sec, k->name, v)) {
            cJSON_Delete(v);
            return -1;
        }
    }
    return 0;
}

void *config_to_cjson(const orch_config *cfg) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(cfg->doc, "model");
    cJSON *mcopy = cJSON_Duplicate(model, 1);
    if (!mcopy || !cJSON_AddItemToObject(root, "model", mcopy)) {
        cJSON_Delete(mcopy);
        cJSON_Delete(root);
        return NULL;
    }
    for (size_t i = 0; i < config_n_sections; i++) {
        if (strcmp(config_sections[i].name, "model") == 0) continue;
        if (add_section(root, cfg, &config_sections[i]) != 0) {
            cJSON_Delete(root);
            return NULL;
        }
    }
    return root;
}

char *config_to_json(const orch_config *cfg) {
    cJSON *root = config_to_cjson(cfg);
    if (!root) return NULL;
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

int config_same_model(const orch_config *a, const orch_config *b) {
    const cJSON *ma = cJSON_GetObjectItemCaseSensitive(a->doc, "model");
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(b->doc, "model");
    return cJSON_Compare(ma, mb, 1) ? 1 : 0;
}

orch_config *config_clone(const orch_config *cfg) {
    orch_config *c = util_calloc(1, sizeof *c);
    if (!c) return NULL;
    memcpy(c, cfg, sizeof *c);
    c->doc = cJSON_Duplicate(cfg->doc, 1);
    if (!c->doc) {
        free(c);
        return NULL;
    }
    return c;
}

void config_free(orch_config *cfg) {
    if (!cfg) return;
    cJSON_Delete(cfg->doc);
    free(cfg);
}
