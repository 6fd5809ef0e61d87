/*
 * config_schema.c - the key tables of every config section and the
 * validation of a document against them (unknown keys, duplicate keys,
 * types, ranges, required keys, then the relations between keys). See
 * config_schema.h; the schema is documented in config.h.
 */
#include "orchestrator/core/config_schema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/json_read.h"
#include "orchestrator/core/util.h"

/* ------------------------------------------------------------------------- */
/* Schema                                                                     */
/* ------------------------------------------------------------------------- */
/* Short names for the tables below. */
#define KT_U32    CONFIG_KT_U32
#define KT_U64    CONFIG_KT_U64
#define KT_F64    CONFIG_KT_F64
#define KT_STR    CONFIG_KT_STR
#define KT_BOOL   CONFIG_KT_BOOL
#define KT_OBJ    CONFIG_KT_OBJ
#define U53       9007199254740992.0 /* 2^53: the largest exact JSON integer */
#define OFF(s, f) offsetof(s, f)
#define CAP(s, f) sizeof(((s *)0)->f)

/* Model keys: their defaults are NOT written into the document (the model
 * section is preserved as given); derived defaults are applied in config_validate. */
static const config_key_spec model_keys[] = {
    { "arch", KT_STR, 0, 0, 0, 0, 0, "gpt2|llama", OFF(config_model, arch),
      CAP(config_model, arch), 0, "gpt2" },
    { "vocab_size", KT_U32, 1, 1, 2147483647.0, 0, 0, NULL, OFF(config_model, vocab_size),
      0, 0, NULL },
    { "context", KT_U32, 1, 1, 1048576, 0, 0, NULL, OFF(config_model, context), 0, 0,
      NULL },
    { "layers", KT_U32, 1, 1, 1024, 0, 0, NULL, OFF(config_model, layers), 0, 0, NULL },
    { "heads", KT_U32, 1, 1, 4096, 0, 0, NULL, OFF(config_model, heads), 0, 0, NULL },
    { "kv_heads", KT_U32, 0, 1, 4096, 0, 0, NULL, OFF(config_model, kv_heads), 0, 0,
      NULL },
    { "width", KT_U32, 1, 1, 65536, 0, 0, NULL, OFF(config_model, width), 0, 0, NULL },
    { "mlp_width", KT_U32, 0, 1, 262144, 0, 0, NULL, OFF(config_model, mlp_width), 0, 0,
      NULL },
    { "layernorm_eps", KT_F64, 0, 0, 1, 1, 0, NULL, OFF(config_model, layernorm_eps), 0,
      1e-5, NULL },
    { "rope_theta", KT_F64, 0, 0, 1e12, 0, 0, NULL, OFF(config_model, rope_theta), 0, 0,
      NULL },
    { "tie_embeddings", KT_BOOL, 0, 0, 0, 0, 0, NULL, OFF(config_model, tie_embeddings),
      0, 0, NULL },
    { "rope_scaling", KT_OBJ, 0, 0, 0, 0, 0, NULL, 0, 0, 0, NULL },
};

static const config_key_spec train_keys[] = {
    { "micro_batch", KT_U32, 1, 1, 65536, 0, 0, NULL, OFF(config_train, micro_batch), 0,
      0, NULL },
    { "seq_len", KT_U32, 1, 1, 1048576, 0, 0, NULL, OFF(config_train, seq_len), 0, 0,
      NULL },
    { "grad_accum", KT_U32, 0, 1, 1048576, 0, 0, NULL, OFF(config_train, grad_accum), 0,
      1, NULL },
    { "max_steps", KT_U64, 0, 1, U53, 0, 0, NULL, OFF(config_train, max_steps), 0, 0,
      NULL },
    { "epochs", KT_F64, 0, 0, 1e9, 1, 0, NULL, OFF(config_train, epochs), 0, 0, NULL },
    { "lr", KT_F64, 1, 0, 10, 1, 0, NULL, OFF(config_train, lr), 0, 0, NULL },
    { "min_lr", KT_F64, 0, 0, 10, 0, 0, NULL, OFF(config_train, min_lr), 0, 0, NULL },
    { "warmup_steps", KT_U64, 0, 0, U53, 0, 0, NULL, OFF(config_train, warmup_steps), 0,
      0, NULL },
    { "schedule", KT_STR, 0, 0, 0, 0, 0, "cosine|linear|constant",
      OFF(config_train, schedule), CAP(config_train, schedule), 0, "cosine" },
    { "weight_decay", KT_F64, 0, 0, 10, 0, 0, NULL, OFF(config_train, weight_decay), 0,
      0.0, NULL },
    { "beta1", KT_F64, 0, 0, 1, 0, 1, NULL, OFF(config_train, beta1), 0, 0.9, NULL },
    { "beta2", KT_F64, 0, 0, 1, 0, 1, NULL, OFF(config_train, beta2), 0, 0.95, NULL },
    { "eps", KT_F64, 0, 0, 1, 1, 0, NULL, OFF(config_train, eps), 0, 1e-8, NULL },
    { "grad_clip", KT_F64, 0, 0, 1e9, 0, 0, NULL, OFF(config_train, grad_clip), 0, 1.0,
      NULL },
    { "seed", KT_U64, 0, 0, U53, 0, 0, NULL, OFF(config_train, seed), 0, 1337, NULL },
    { "eval_every", KT_U64, 0, 0, U53, 0, 0, NULL, OFF(config_train, eval_every), 0, 100,
      NULL },
    { "eval_batches", KT_U32, 0, 1, 1048576, 0, 0, NULL, OFF(config_train, eval_batches),
      0, 8, NULL },
    { "checkpoint_every", KT_U64, 0, 0, U53, 0, 0, NULL,
      OFF(config_train, checkpoint_every), 0, 0, NULL },
    { "keep_checkpoints", KT_U32, 0, 1, 1000000, 0, 0, NULL,
      OFF(config_train, keep_checkpoints), 0, 3, NULL },
    { "early_stop_patience", KT_U32, 0, 0, 1000000, 0, 0, NULL,
      OFF(config_train, early_stop_patience), 0, 0, NULL },
    { "zero", KT_U32, 0, 0, 1, 0, 0, NULL, OFF(config_train, zero), 0, 0, NULL },
    { "overlap_allreduce", KT_BOOL, 0, 0, 0, 0, 0, NULL,
      OFF(config_train, overlap_allreduce), 0, 1, NULL },
    { "allreduce_bucket_mb", KT_F64, 0, 0, 1024, 1, 0, NULL,
      OFF(config_train, allreduce_bucket_mb), 0, 25, NULL },
};

static const config_key_spec data_keys[] = {
    { "tokenizer", KT_STR, 1, 0, 0, 0, 0, "byte|gpt2", OFF(config_data, tokenizer),
      CAP(config_data, tokenizer), 0, NULL },
    { "train", KT_STR, 1, 0, 0, 0, 0, NULL, OFF(config_data, train),
      CAP(config_data, train), 0, NULL },
    { "val", KT_STR, 1, 0, 0, 0, 0, NULL, OFF(config_data, val), CAP(config_data, val), 0,
      NULL },
};

static const config_key_spec engine_keys[] = {
    { "name", KT_STR, 0, 0, 0, 0, 0, NULL, OFF(config_engine, name),
      CAP(config_engine, name), 0, "cpu" },
    { "threads", KT_U32, 0, 0, 4096, 0, 0, NULL, OFF(config_engine, threads), 0, 0,
      NULL },
    { "options", KT_STR, 0, 0, 0, 0, 0, "", OFF(config_engine, options),
      CAP(config_engine, options), 0, "" },
};

#define NKEYS(a) (sizeof(a) / sizeof((a)[0]))
const config_section_spec config_sections[] = {
    { "model", 1, model_keys, NKEYS(model_keys), OFF(orch_config, model) },
    { "train", 1, train_keys, NKEYS(train_keys), OFF(orch_config, train) },
    { "data", 1, data_keys, NKEYS(data_keys), OFF(orch_config, data) },
    { "engine", 0, engine_keys, NKEYS(engine_keys), OFF(orch_config, engine) },
};
const size_t config_n_sections = NKEYS(config_sections);

const config_section_spec *config_find_section(const char *name) {
    for (size_t i = 0; i < config_n_sections; i++)
        if (strcmp(config_sections[i].name, name) == 0) return &config_sections[i];
    return NULL;
}

const config_key_spec *config_find_key(const config_section_spec *s, const char *name) {
    for (size_t i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i].name, name) == 0) return &s->keys[i];
    return NULL;
}

const config_key_spec *config_key_for_path(const char *path) {
    const char *dot = strchr(path, '.');
    if (!dot || strchr(dot + 1, '.')) return NULL;
    char sec[64];
    size_t n = (size_t)(dot - path);
    if (n >= sizeof sec) return NULL;
    memcpy(sec, path, n);
    sec[n] = '\0';
    const config_section_spec *s = config_find_section(sec);
    return s ? config_find_key(s, dot + 1) : NULL;
}

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */
/* Nearest valid path to `path` ("section" or "section.key"), preferring the
 * same section on ties. */
static void nearest_path(const char *path, char *out, size_t cap) {
    int top_level = strchr(path, '.') == NULL;
    size_t best = (size_t)-1;
    out[0] = '\0';
    for (size_t i = 0; i < config_n_sections; i++) {
        const config_section_spec *s = &config_sections[i];
        if (top_level) {
            size_t d = config_edit_distance(path, s->name);
            if (d < best) {
                best = d;
                snprintf(out, cap, "%s", s->name);
            }
            continue;
        }
        size_t slen = strlen(s->name);
        int same = strncmp(path, s->name, slen) == 0 && path[slen] == '.';
        for (size_t k = 0; k < s->n_keys; k++) {
            char cand[128];
            snprintf(cand, sizeof cand, "%s.%s", s->name, s->keys[k].name);
            size_t d = config_edit_distance(path, cand) * 2 + (same ? 0 : 1);
            if (d < best) {
                best = d;
                snprintf(out, cap, "%s", cand);
            }
        }
    }
}

static int is_choice(const char *choices, const char *v) {
    size_t n = strlen(v);
    const char *p = choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

static void fmt_num(char *buf, size_t cap, double v) { snprintf(buf, cap, "%.10g", v); }

/* ------------------------------------------------------------------------- */
/* Validation                                                                 */
/* ------------------------------------------------------------------------- */

/* Check one present value against its spec. */
static int check_value(const char *path, const config_key_spec *k, const cJSON *v,
                       char *err, size_t cap) {
    if (k->type == KT_BOOL) {
        if (!cJSON_IsBool(v)) {
            util_set_err(err, cap, "%s: expected true or false, got %s", path,
                         json_read_type_name(v));
            return -1;
        }
        return 0;
    }
    if (k->type == KT_OBJ) {
        if (!cJSON_IsObject(v) && !cJSON_IsNull(v)) {
            util_set_err(err, cap, "%s: expected an object or null, got %s", path,
                         json_read_type_name(v));
            return -1;
        }
        return 0;
    }
    if (k->type == KT_STR) {
        if (!cJSON_IsString(v)) {
            util_set_err(err, cap, "%s: expected a string, got %s", path,
                         json_read_type_name(v));
            return -1;
        }
        const char *s = v->valuestring;
        if (strlen(s) >= k->cap) {
            util_set_err(err, cap, "%s: string too long (at most %zu bytes)", path,
                         k->cap - 1);
            return -1;
        }
        if (k->choices && *k->choices && !is_choice(k->choices, s)) {
            char list[128];
            snprintf(list, sizeof list, "%s", k->choices);
            for (char *p = list; *p; p++)
                if (*p == '|') *p = ',';
            util_set_err(err, cap, "%s: '%s' is not one of %s", path, s, list);
            return -1;
        }
        if (!k->choices && !*s) {
            util_set_err(err, cap, "%s: must not be empty", path);
            return -1;
        }
        return 0;
    }
    const char *want = k->type == KT_F64 ? "a number" : "an integer";
    if (!cJSON_IsNumber(v)) {
        util_set_err(err, cap, "%s: expected %s, got %s", path, want,
                     json_read_type_name(v));
        return -1;
    }
    double d = v->valuedouble;
    char got[64], lo[64], hi[64];
    fmt_num(got, sizeof got, d);
    if (!isfinite(d)) {
        util_set_err(err, cap, "%s: must be finite", path);
        return -1;
    }
    if (k->type != KT_F64 && d != floor(d)) {
        util_set_err(err, cap, "%s: expected an integer, got %s", path, got);
        return -1;
    }
    fmt_num(lo, sizeof lo, k->min);
    fmt_num(hi, sizeof hi, k->max);
    if (k->min_open ? !(d > k->min) : !(d >= k->min)) {
        util_set_err(err, cap, "%s: out of range: %s must be %s %s", path, got,
                     k->min_open ? ">" : ">=", lo);
        return -1;
    }
    if (k->max_open ? !(d < k->max) : !(d <= k->max)) {
        util_set_err(err, cap, "%s: out of range: %s must be %s %s", path, got,
                     k->max_open ? "<" : "<=", hi);
        return -1;
    }
    return 0;
}

/* Store a validated value (or the default when v is NULL) into the struct. */
static void store_value(void *section, const config_key_spec *k, const cJSON *v) {
    char *base = (char *)section + k->offset;
    switch (k->type) {
    case KT_OBJ: break; /* config_validate reads it */
    case KT_BOOL: {
        int x = v ? cJSON_IsTrue(v) : (int)k->def_num;
        memcpy(base, &x, sizeof x);
        break;
    }
    case KT_STR: {
        const char *s = v ? v->valuestring : (k->def_str ? k->def_str : "");
        snprintf(base, k->cap, "%s", s);
        break;
    }
    case KT_U32: {
        uint32_t x = (uint32_t)(v ? v->valuedouble : k->def_num);
        memcpy(base, &x, sizeof x);
        break;
    }
    case KT_U64: {
        uint64_t x = (uint64_t)(v ? v->valuedouble : k->def_num);
        memcpy(base, &x, sizeof x);
        break;
    }
    case KT_F64: {
        double x = v ? v->valuedouble : k->def_num;
        memcpy(base, &x, sizeof x);
        break;
    }
    }
}

/* One number of model.rope_scaling (present: v non-NULL): finite, > lo. */
static int rope_number(const cJSON *v, const char *name, double lo, double *out,
                       char *err, size_t cap) {
    if (!v) {
        util_set_err(err, cap, "model.rope_scaling.%s: missing required key", name);
        return -1;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        util_set_err(err, cap, "model.rope_scaling.%s: expected a number, got %s", name,
                     cJSON_IsNumber(v) ? "a non-finite number" : json_read_type_name(v));
        return -1;
    }
    if (!(v->valuedouble > lo)) {
        char got[64], l[64];
        fmt_num(got, sizeof got, v->valuedouble);
        fmt_num(l, sizeof l, lo);
        util_set_err(err, cap, "model.rope_scaling.%s: out of range: %s must be > %s",
                     name, got, l);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

/* model.rope_scaling (an object; arch llama) into m. */
static int validate_rope_scaling(const cJSON *rs, config_model *m, char *err,
                                 size_t cap) {
    static const char *const keys[] = { "type", "factor", "low_freq_factor",
                                        "high_freq_factor", "original_context" };
    const size_t n_keys = sizeof keys / sizeof keys[0];
    for (const cJSON *it = rs->child; it; it = it->next) {
        const char *name = it->string ? it->string : "";
        size_t k = 0;
        while (k < n_keys && strcmp(keys[k], name) != 0) k++;
        if (k == n_keys) {
            size_t best = (size_t)-1, bi = 0;
            for (size_t j = 0; j < n_keys; j++) {
                size_t d = config_edit_distance(name, keys[j]);
                if (d < best) best = d, bi = j;
            }
            util_set_err(err, cap,
                         "model.rope_scaling.%s: unknown key (did you mean "
                         "model.rope_scaling.%s?)",
                         name, keys[bi]);
            return -1;
        }
        for (const cJSON *o = rs->child; o != it; o = o->next)
            if (o->string && strcmp(o->string, name) == 0) {
                util_set_err(err, cap, "model.rope_scaling.%s: duplicate key", name);
                return -1;
            }
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!type) {
        util_set_err(err, cap,
                     "model.rope_scaling.type: missing required key (linear or llama3)");
        return -1;
    }
    if (!cJSON_IsString(type)) {
        util_set_err(err, cap, "model.rope_scaling.type: expected a string, got %s",
                     json_read_type_name(type));
        return -1;
    }
    int llama3 = strcmp(type->valuestring, "llama3") == 0;
    if (!llama3 && strcmp(type->valuestring, "linear") != 0) {
        util_set_err(err, cap,
                     "model.rope_scaling.type: '%.64s' is not one of linear,llama3",
                     type->valuestring);
        return -1;
    }
    snprintf(m->rope_type, sizeof m->rope_type, "%s", type->valuestring);
    if (rope_number(cJSON_GetObjectItemCaseSensitive(rs, "factor"), "factor", 0,
                    &m->rope_factor, err, cap) != 0)
        return -1;
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(rs, "low_freq_factor");
    const cJSON *hi = cJSON_GetObjectItemCaseSensitive(rs, "high_freq_factor");
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(rs, "original_context");
    if (!llama3) {
        const char *extra = lo   ? "low_freq_factor"
                            : hi ? "high_freq_factor"
                            : oc ? "original_context"
                                 : NULL;
        if (extra) {
            util_set_err(err, cap,
                         "model.rope_scaling.%s: belongs to type llama3, not linear",
                         extra);
            return -1;
        }
        return 0;
    }
    double octx;
    if (rope_number(lo, "low_freq_factor", 0, &m->rope_low_freq_factor, err, cap) != 0 ||
        rope_number(hi, "high_freq_factor", m->rope_low_freq_factor,
                    &m->rope_high_freq_factor, err, cap) != 0 ||
        rope_number(oc, "original_context", 0, &octx, err, cap) != 0)
        return -1;
    if (octx != floor(octx) || octx > 1048576) {
        char got[64];
        fmt_num(got, sizeof got, octx);
        util_set_err(
            err, cap,
            "model.rope_scaling.original_context: expected an integer 1..1048576, "
            "got %s",
            got);
        return -1;
    }
    m->rope_original_context = (uint32_t)octx;
    return 0;
}

/* The keys that depend on model.arch: llama's RoPE, head and GQA keys, and
 * their refusal for gpt2 (learned positions, tied head, no GQA). */
static int validate_arch_keys(const cJSON *msec, config_model *m, char *err, size_t cap) {
    const cJSON *theta = cJSON_GetObjectItemCaseSensitive(msec, "rope_theta");
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(msec, "tie_embeddings");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(msec, "rope_scaling");
    if (strcmp(m->arch, "llama") != 0) {
        if (m->kv_heads != m->heads) {
            util_set_err(
                err, cap,
                "model.kv_heads: %u differs from model.heads (%u); grouped-query "
                "attention needs model.arch llama",
                m->kv_heads, m->heads);
            return -1;
        }
        if (theta) {
            util_set_err(err, cap,
                         "model.rope_theta: applies to model.arch llama only (%s has "
                         "learned positions)",
                         m->arch);
            return -1;
        }
        if (rs && !cJSON_IsNull(rs)) {
            util_set_err(err, cap,
                         "model.rope_scaling: applies to model.arch llama only");
            return -1;
        }
        if (tie && !m->tie_embeddings) {
            util_set_err(err, cap,
                         "model.tie_embeddings: false is not supported for model.arch %s "
                         "(its LM head is the token embedding)",
                         m->arch);
            return -1;
        }
        m->tie_embeddings = 1;
        return 0;
    }
    if (!theta) m->rope_theta = 10000.0;
    if (!(m->rope_theta > 1.0)) {
        char got[64];
        fmt_num(got, sizeof got, m->rope_theta);
        util_set_err(err, cap, "model.rope_theta: out of range: %s must be > 1", got);
        return -1;
    }
    if ((m->width / m->heads) % 2 != 0) {
        util_set_err(err, cap,
                     "model.heads: head size %u (model.width / model.heads) must be even "
                     "for RoPE",
                     m->width / m->heads);
        return -1;
    }
    if (rs && cJSON_IsObject(rs)) return validate_rope_scaling(rs, m, err, cap);
    return 0;
}

/* Validate the whole document and fill *cfg (which is zeroed first). */
int config_validate(const void *json, orch_config *cfg, char *err, size_t cap) {
    const cJSON *doc = json;
    memset(cfg, 0, offsetof(orch_config, source));
    if (!cJSON_IsObject(doc)) {
        util_set_err(err, cap, "top level: expected an object, got %s",
                     json_read_type_name(doc));
        return -1;
    }
    /* Unknown and duplicate sections. */
    for (const cJSON *it = doc->child; it; it = it->next) {
        const char *name = it->string ? it->string : "";
        if (!config_find_section(name)) {
            char near[128];
            nearest_path(name, near, sizeof near);
            util_set_err(err, cap, "%s: unknown key (did you mean %s?)", name, near);
            return -1;
        }
        for (const cJSON *o = doc->child; o != it; o = o->next)
            if (o->string && strcmp(o->string, name) == 0) {
                util_set_err(err, cap, "%s: duplicate key", name);
                return -1;
            }
    }
    for (size_t si = 0; si < config_n_sections; si++) {
        const config_section_spec *s = &config_sections[si];
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(doc, s->name);
        void *dst = (char *)cfg + s->offset;
        if (!sec) {
            if (s->required) {
                util_set_err(err, cap, "%s: missing required section", s->name);
                return -1;
            }
        } else if (!cJSON_IsObject(sec)) {
            util_set_err(err, cap, "%s: expected an object, got %s", s->name,
                         json_read_type_name(sec));
            return -1;
        }
        if (sec) {
            for (const cJSON *it = sec->child; it; it = it->next) {
                const char *kname = it->string ? it->string : "";
                char path[256];
                snprintf(path, sizeof path, "%s.%s", s->name, kname);
                const config_key_spec *k = config_find_key(s, kname);
                if (!k) {
                    char near[128];
                    nearest_path(path, near, sizeof near);
                    util_set_err(err, cap, "%s: unknown key (did you mean %s?)", path,
                                 near);
                    return -1;
                }
                for (const cJSON *o = sec->child; o != it; o = o->next)
                    if (o->string && strcmp(o->string, kname) == 0) {
                        util_set_err(err, cap, "%s: duplicate key", path);
                        return -1;
                    }
                if (check_value(path, k, it, err, cap) != 0) return -1;
            }
        }
        for (size_t ki = 0; ki < s->n_keys; ki++) {
            const config_key_spec *k = &s->keys[ki];
            const cJSON *v = sec ? cJSON_GetObjectItemCaseSensitive(sec, k->name) : NULL;
            if (!v && k->required) {
                util_set_err(err, cap, "%s.%s: missing required key", s->name, k->name);
                return -1;
            }
            store_value(dst, k, v);
        }
    }

    /* Relations between keys. */
    config_model *m = &cfg->model;
    config_train *t = &cfg->train;
    const cJSON *msec = cJSON_GetObjectItemCaseSensitive(doc, "model");
    const cJSON *tsec = cJSON_GetObjectItemCaseSensitive(doc, "train");
    if (m->width % m->heads != 0) {
        util_set_err(err, cap, "model.heads: %u does not divide model.width (%u)",
                     m->heads, m->width);
        return -1;
    }
    if (!cJSON_GetObjectItemCaseSensitive(msec, "kv_heads")) m->kv_heads = m->heads;
    if (m->kv_heads > m->heads || m->heads % m->kv_heads != 0) {
        util_set_err(err, cap, "model.kv_heads: %u does not divide model.heads (%u)",
                     m->kv_heads, m->heads);
        return -1;
    }
    if (validate_arch_keys(msec, m, err, cap) != 0) return -1;
    if (!cJSON_GetObjectItemCaseSensitive(msec, "mlp_width")) {
        if ((uint64_t)m->width * 4 > 262144) {
            util_set_err(err, cap, "model.mlp_width: 4*width is too large");
            return -1;
        }
        m->mlp_width = m->width * 4;
    }
    if (t->seq_len > m->context) {
        util_set_err(err, cap, "train.seq_len: %u exceeds model.context (%u)", t->seq_len,
                     m->context);
        return -1;
    }
    if (t->min_lr > t->lr) {
        char a[64], b[64];
        fmt_num(a, sizeof a, t->min_lr);
        fmt_num(b, sizeof b, t->lr);
        util_set_err(err, cap, "train.min_lr: %s exceeds train.lr (%s)", a, b);
        return -1;
    }
    int has_steps = cJSON_GetObjectItemCaseSensitive(tsec, "max_steps") != NULL;
    int has_epochs = cJSON_GetObjectItemCaseSensitive(tsec, "epochs") != NULL;
    if (has_steps && has_epochs) {
        util_set_err(err, cap,
                     "train.epochs: give train.max_steps or train.epochs, not "
                     "both");
        return -1;
    }
    if (!has_steps && !has_epochs) {
        util_set_err(err, cap,
                     "train.max_steps: missing required key (or give "
                     "train.epochs)");
        return -1;
    }
    uint32_t tok_vocab = strcmp(cfg->data.tokenizer, "gpt2") == 0 ? 50257 : 256;
    if (m->vocab_size < tok_vocab) {
        util_set_err(err, cap,
                     "model.vocab_size: %u is smaller than the %s tokenizer's "
                     "%u tokens",
                     m->vocab_size, cfg->data.tokenizer, tok_vocab);
        return -1;
    }
    return 0;
}
