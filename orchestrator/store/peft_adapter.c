/*
 * peft_adapter.c - LoRA adapters in the PEFT layout (adapter_config.json and
 * adapter_model.safetensors): names, target modules, the base fingerprint,
 * saving and validated loading. See peft_adapter.h.
 */
#include "orchestrator/store/peft_adapter.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/safetensors.h"
#include "orchestrator/store/sha256.h"

#define N_BITS 4

/* The HF module names of each target bit, per arch (NULL-terminated). */
static const char *const *bit_modules(uint32_t arch, int bit) {
    static const char *const g[N_BITS][2] = {
        { "c_attn", NULL }, { "c_proj", NULL }, { "c_fc", NULL }, { "c_proj", NULL }
    };
    static const char *const l[N_BITS][4] = { { "q_proj", "k_proj", "v_proj", NULL },
                                              { "o_proj", NULL },
                                              { "gate_proj", "up_proj", NULL },
                                              { "down_proj", NULL } };
    return arch == ORCH_ARCH_LLAMA ? l[bit] : g[bit];
}

/* The engine tensor stems of one bit in layer order ("attn.c_attn"). */
static const char *const *bit_stems(uint32_t arch, int bit) {
    static const char *const g[N_BITS][2] = { { "attn.c_attn", NULL },
                                              { "attn.c_proj", NULL },
                                              { "mlp.c_fc", NULL },
                                              { "mlp.c_proj", NULL } };
    static const char *const l[N_BITS][4] = { { "self_attn.q_proj", "self_attn.k_proj",
                                                "self_attn.v_proj", NULL },
                                              { "self_attn.o_proj", NULL },
                                              { "mlp.gate_proj", "mlp.up_proj", NULL },
                                              { "mlp.down_proj", NULL } };
    return arch == ORCH_ARCH_LLAMA ? l[bit] : g[bit];
}

static const char *const orch_words[N_BITS] = { "qkv", "attn_out", "mlp_up", "mlp_down" };

static const char *arch_word(uint32_t arch) {
    return arch == ORCH_ARCH_LLAMA ? "llama" : "gpt2";
}

int peft_targets_check(uint32_t arch, uint32_t targets, char *err, size_t err_cap) {
    if (targets == 0 || (targets & ~ORCH_LORA_TARGET_ALL)) {
        util_set_err(err, err_cap,
                     "targets 0x%x: not a non-empty set of qkv, attn_out, "
                     "mlp_up, mlp_down",
                     targets);
        return -1;
    }
    if (arch != ORCH_ARCH_LLAMA && !(targets & ORCH_LORA_TARGET_ATTN_OUT) !=
                                       !(targets & ORCH_LORA_TARGET_MLP_DOWN)) {
        util_set_err(err, err_cap,
                     "targets: gpt2's attn.c_proj (attn_out) and mlp.c_proj (mlp_down) "
                     "are both module 'c_proj' in PEFT's target_modules, so one "
                     "without the other cannot be saved: take both or neither");
        return -1;
    }
    return 0;
}

void peft_targets_modules(uint32_t arch, uint32_t targets, char *buf, size_t cap) {
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (int b = 0; b < N_BITS; b++) {
        if (!(targets & (1u << b))) continue;
        if (arch != ORCH_ARCH_LLAMA && b == 3 && (targets & ORCH_LORA_TARGET_ATTN_OUT))
            continue; /* c_proj once */
        for (const char *const *m = bit_modules(arch, b); *m; m++) {
            int n = snprintf(buf + used, cap > used ? cap - used : 0, "%s%s",
                             used ? "," : "", *m);
            if (n > 0) used += (size_t)n;
        }
    }
}

/* Set the bits that the module names in mods[0..n) give; a partial group or
 * an unknown name is an error (what says where the names come from). */
static int modules_to_bits(uint32_t arch, const char *const *mods, size_t n,
                           const char *what, uint32_t *out, char *err, size_t err_cap) {
    uint32_t bits = 0;
    for (size_t i = 0; i < n; i++) {
        int found = 0;
        for (int b = 0; b < N_BITS; b++)
            for (const char *const *m = bit_modules(arch, b); *m; m++)
                if (strcmp(*m, mods[i]) == 0) found = 1;
        if (!found) {
            char known[256];
            peft_targets_modules(arch, ORCH_LORA_TARGET_ALL, known, sizeof known);
            util_set_err(err, err_cap, "%s: unknown %s module '%s' (known: %s)", what,
                         arch_word(arch), mods[i], known);
            return -1;
        }
    }
    for (int b = 0; b < N_BITS; b++) {
        size_t have = 0, want = 0;
        const char *missing = NULL;
        for (const char *const *m = bit_modules(arch, b); *m; m++) {
            want++;
            int got = 0;
            for (size_t i = 0; i < n; i++) got |= strcmp(*m, mods[i]) == 0;
            if (got)
                have++;
            else if (!missing)
                missing = *m;
        }
        if (have == want)
            bits |= 1u << b;
        else if (have) {
            util_set_err(err, err_cap,
                         "%s: has part of the %s group without '%s': orch adapts "
                         "%s as one target",
                         what, orch_words[b], missing, orch_words[b]);
            return -1;
        }
    }
    *out = bits;
    return 0;
}

int peft_targets_parse(uint32_t arch, const char *list, uint32_t *out, char *err,
                       size_t err_cap) {
    char buf[512];
    if (!list || strlen(list) >= sizeof buf) {
        util_set_err(err, err_cap, "targets: expected a comma-separated list");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", list);
    const char *mods[32];
    size_t n = 0;
    uint32_t bits = 0;
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w;
         w = strtok_r(NULL, ",", &save)) {
        while (*w == ' ') w++;
        int word = -1;
        for (int b = 0; b < N_BITS; b++)
            if (strcmp(w, orch_words[b]) == 0) word = b;
        if (strcmp(w, "all") == 0)
            bits |= ORCH_LORA_TARGET_ALL;
        else if (word >= 0)
            bits |= 1u << word;
        else if (n < 32)
            mods[n++] = w;
    }
    uint32_t mbits = 0;
    if (n && modules_to_bits(arch, mods, n, "targets", &mbits, err, err_cap) != 0)
        return -1;
    bits |= mbits;
    if (peft_targets_check(arch, bits, err, err_cap) != 0) return -1;
    *out = bits;
    return 0;
}

/* in/out of a base matrix of m by its stem. */
static void stem_dims(const orch_model_desc *m, const char *stem, uint64_t *out,
                      uint64_t *in) {
    uint64_t C = m->width, M = m->mlp_width ? m->mlp_width : 4ull * m->width;
    uint64_t H = m->heads, KV = m->kv_heads ? m->kv_heads : m->heads;
    uint64_t D = H ? C / H : 0;
    *in = C;
    if (strcmp(stem, "attn.c_attn") == 0) {
        *out = 3 * C;
    } else if (strcmp(stem, "attn.c_proj") == 0 ||
               strcmp(stem, "self_attn.o_proj") == 0) {
        *out = C;
        *in = m->arch == ORCH_ARCH_LLAMA ? H * D : C;
    } else if (strcmp(stem, "mlp.c_fc") == 0 || strcmp(stem, "mlp.gate_proj") == 0 ||
               strcmp(stem, "mlp.up_proj") == 0) {
        *out = M;
    } else if (strcmp(stem, "mlp.c_proj") == 0 || strcmp(stem, "mlp.down_proj") == 0) {
        *out = C;
        *in = M;
    } else if (strcmp(stem, "self_attn.q_proj") == 0) {
        *out = H * D;
    } else { /* k_proj, v_proj */
        *out = KV * D;
    }
}

int peft_expected_table(const orch_model_desc *m, uint32_t rank, uint32_t targets,
                        peft_adapter_tensor **out, size_t *n, char *err, size_t err_cap) {
    if (peft_targets_check(m->arch, targets, err, err_cap) != 0) return -1;
    size_t per = 0;
    for (int b = 0; b < N_BITS; b++)
        if (targets & (1u << b))
            for (const char *const *s = bit_stems(m->arch, b); *s; s++) per += 2;
    size_t total = per * m->layers;
    peft_adapter_tensor *t = calloc(total ? total : 1, sizeof *t);
    if (!t) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    const char *pre = m->arch == ORCH_ARCH_LLAMA ? "model.layers" : "h";
    size_t k = 0;
    for (uint32_t l = 0; l < m->layers; l++)
        for (int b = 0; b < N_BITS; b++) {
            if (!(targets & (1u << b))) continue;
            for (const char *const *s = bit_stems(m->arch, b); *s; s++) {
                uint64_t o, i;
                stem_dims(m, *s, &o, &i);
                uint64_t lim = o < i ? o : i;
                if (rank < 1 || rank > lim) {
                    util_set_err(err, err_cap,
                                 "rank %u: must be 1..%llu (min(in, out) of %s.%u.%s "
                                 "[%llu,%llu])",
                                 rank, (unsigned long long)lim, pre, l, *s,
                                 (unsigned long long)o, (unsigned long long)i);
                    free(t);
                    return -1;
                }
                for (int ab = 0; ab < 2; ab++, k++) {
                    snprintf(t[k].name, sizeof t[k].name, "%s.%u.%s.lora_%c.weight", pre,
                             l, *s, ab ? 'B' : 'A');
                    t[k].shape[0] = ab ? o : rank;
                    t[k].shape[1] = ab ? rank : i;
                    t[k].numel = t[k].shape[0] * t[k].shape[1];
                }
            }
        }
    *out = t;
    *n = total;
    return 0;
}

/* PEFT's name of engine tensor `name`. */
static void peft_name(uint32_t arch, const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "base_model.model.%s%s",
             arch == ORCH_ARCH_LLAMA ? "" : "transformer.", name);
}

static int engine_err(const engine_handle *h, orch_engine_ctx *ctx, int32_t st,
                      const char *what, char *err, size_t err_cap) {
    char msg[1024];
    engine_format_error(h, ctx, st, msg, sizeof msg);
    util_set_err(err, err_cap, "engine %s: %s failed: %s", h->api->name, what, msg);
    return -1;
}

int peft_base_fingerprint(const engine_handle *h, orch_engine_ctx *ctx,
                          char out[PEFT_FP_MAX], char *err, size_t err_cap) {
    const orch_engine_api *api = h->api;
    uint32_t n = 0;
    int32_t st = api->tensor_count(ctx, ORCH_TENSOR_PARAM, &n);
    if (st != ORCH_OK) return engine_err(h, ctx, st, "tensor_count", err, err_cap);
    sha256_ctx sc;
    sha256_init(&sc);
    void *buf = NULL;
    size_t buf_cap = 0;
    for (uint32_t i = 0; i < n; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        if ((st = api->tensor_info(ctx, ORCH_TENSOR_PARAM, i, &ti)) != ORCH_OK) {
            sha256_discard(&sc);
            free(buf);
            return engine_err(h, ctx, st, "tensor_info", err, err_cap);
        }
        size_t es = safetensors_dtype_size((int)ti.dtype);
        size_t bytes = (size_t)ti.numel * (es ? es : 4);
        if (bytes > buf_cap) {
            void *nb = realloc(buf, bytes);
            if (!nb) {
                sha256_discard(&sc);
                free(buf);
                util_set_err(err, err_cap, "out of memory");
                return -1;
            }
            buf = nb;
            buf_cap = bytes;
        }
        if ((st = api->tensor_read(ctx, ORCH_TENSOR_PARAM, i, buf, bytes)) != ORCH_OK) {
            sha256_discard(&sc);
            free(buf);
            return engine_err(h, ctx, st, "tensor_read", err, err_cap);
        }
        uint8_t head[8 + 8 * ORCH_TENSOR_MAX_DIMS];
        uint32_t nd = ti.ndim > ORCH_TENSOR_MAX_DIMS ? ORCH_TENSOR_MAX_DIMS : ti.ndim;
        memcpy(head, &ti.dtype, 4);
        memcpy(head + 4, &nd, 4);
        memcpy(head + 8, ti.shape, 8 * nd);
        sha256_update(&sc, ti.name, strlen(ti.name) + 1);
        sha256_update(&sc, head, 8 + 8 * nd);
        sha256_update(&sc, buf, bytes);
    }
    free(buf);
    uint8_t d[32];
    char hex[65];
    if (sha256_final(&sc, d) != 0) {
        util_set_err(err, err_cap, "base fingerprint: sha256 failed");
        return -1;
    }
    sha256_hex(d, hex);
    snprintf(out, PEFT_FP_MAX, "sha256:%s", hex);
    return 0;
}

void peft_adapter_free(peft_adapter *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) free(a->t ? a->t[i].data : NULL);
    free(a->t);
    a->t = NULL;
    a->n = 0;
}

int peft_adapter_from_engine(const engine_handle *h, orch_engine_ctx *ctx, uint32_t id,
                             const orch_model_desc *m, const orch_lora_desc *d,
                             const char *base_model, const char *fingerprint,
                             peft_adapter *out, char *err, size_t err_cap) {
    const orch_engine_api *api = h->api;
    peft_adapter a;
    memset(&a, 0, sizeof a);
    a.arch = m->arch;
    a.rank = d->rank;
    a.alpha = d->alpha;
    a.targets = d->targets;
    snprintf(a.base_model, sizeof a.base_model, "%s", base_model ? base_model : "");
    snprintf(a.fingerprint, sizeof a.fingerprint, "%s", fingerprint ? fingerprint : "");
    if (peft_expected_table(m, d->rank, d->targets, &a.t, &a.n, err, err_cap) != 0)
        return -1;
    uint32_t cnt = 0;
    int32_t st = api->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &cnt);
    if (st != ORCH_OK) {
        peft_adapter_free(&a);
        return engine_err(h, ctx, st, "adapter_tensor_count", err, err_cap);
    }
    if (cnt != a.n) {
        util_set_err(err, err_cap, "engine %s: adapter %u has %u tensors, expected %zu",
                     api->name, id, cnt, a.n);
        peft_adapter_free(&a);
        return -1;
    }
    for (uint32_t i = 0; i < cnt; i++) {
        peft_adapter_tensor *t = &a.t[i];
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        if ((st = api->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &ti)) !=
            ORCH_OK) {
            peft_adapter_free(&a);
            return engine_err(h, ctx, st, "adapter_tensor_info", err, err_cap);
        }
        if (strcmp(ti.name, t->name) != 0 || ti.ndim != 2 || ti.shape[0] != t->shape[0] ||
            ti.shape[1] != t->shape[1] || ti.dtype != ORCH_DTYPE_F32) {
            util_set_err(err, err_cap,
                         "engine %s: adapter tensor %u is %s [%llu,%llu], expected %s "
                         "[%llu,%llu] f32",
                         api->name, i, ti.name, (unsigned long long)ti.shape[0],
                         (unsigned long long)ti.shape[1], t->name,
                         (unsigned long long)t->shape[0],
                         (unsigned long long)t->shape[1]);
            peft_adapter_free(&a);
            return -1;
        }
        t->data = malloc((size_t)t->numel * sizeof(float));
        if (!t->data) {
            peft_adapter_free(&a);
            util_set_err(err, err_cap, "out of memory");
            return -1;
        }
        if ((st = api->adapter_tensor_read(ctx, id, ORCH_TENSOR_PARAM, i, t->data,
                                           t->numel * sizeof(float))) != ORCH_OK) {
            peft_adapter_free(&a);
            return engine_err(h, ctx, st, "adapter_tensor_read", err, err_cap);
        }
    }
    *out = a;
    return 0;
}

int peft_adapter_to_engine(const peft_adapter *a, const engine_handle *h,
                           orch_engine_ctx *ctx, uint32_t *out_id, char *err,
                           size_t err_cap) {
    const orch_engine_api *api = h->api;
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.rank = a->rank;
    d.alpha = a->alpha;
    d.targets = a->targets;
    uint32_t id = 0;
    int32_t st = api->adapter_create(ctx, &d, &id);
    if (st != ORCH_OK) return engine_err(h, ctx, st, "adapter_create", err, err_cap);
    uint32_t cnt = 0;
    st = api->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &cnt);
    if (st == ORCH_OK && cnt != a->n) {
        util_set_err(err, err_cap, "engine %s: the adapter has %u tensors, the file %zu",
                     api->name, cnt, a->n);
        api->adapter_destroy(ctx, id);
        return -1;
    }
    for (uint32_t i = 0; st == ORCH_OK && i < cnt; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        st = api->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &ti);
        if (st != ORCH_OK) break;
        if (strcmp(ti.name, a->t[i].name) != 0 || ti.numel != a->t[i].numel) {
            util_set_err(err, err_cap,
                         "engine %s: adapter tensor %u is %s, the file's %s", api->name,
                         i, ti.name, a->t[i].name);
            api->adapter_destroy(ctx, id);
            return -1;
        }
        st = api->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i, a->t[i].data,
                                       a->t[i].numel * sizeof(float));
    }
    if (st != ORCH_OK) {
        engine_err(h, ctx, st, "loading the adapter", err, err_cap);
        api->adapter_destroy(ctx, id);
        return -1;
    }
    *out_id = id;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Saving                                                                     */
/* ------------------------------------------------------------------------- */

static char *config_json(const peft_adapter *a) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
    cJSON_AddNumberToObject(o, "r", a->rank);
    cJSON_AddNumberToObject(o, "lora_alpha", (double)a->alpha);
    cJSON_AddNumberToObject(o, "lora_dropout", 0.0);
    /* sorted, each once */
    const char *mods[8];
    size_t n = 0;
    for (int b = 0; b < N_BITS; b++) {
        if (!(a->targets & (1u << b))) continue;
        for (const char *const *m = bit_modules(a->arch, b); *m; m++) {
            int dup = 0;
            for (size_t i = 0; i < n; i++) dup |= strcmp(mods[i], *m) == 0;
            if (!dup && n < 8) mods[n++] = *m;
        }
    }
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && strcmp(mods[j - 1], mods[j]) > 0; j--) {
            const char *t = mods[j];
            mods[j] = mods[j - 1];
            mods[j - 1] = t;
        }
    cJSON *tm = cJSON_AddArrayToObject(o, "target_modules");
    for (size_t i = 0; tm && i < n; i++)
        cJSON_AddItemToArray(tm, cJSON_CreateString(mods[i]));
    cJSON_AddBoolToObject(o, "fan_in_fan_out", a->arch != ORCH_ARCH_LLAMA);
    cJSON_AddStringToObject(o, "bias", "none");
    cJSON_AddStringToObject(o, "base_model_name_or_path", a->base_model);
    cJSON_AddBoolToObject(o, "inference_mode", 1);
    cJSON_AddBoolToObject(o, "init_lora_weights", 1);
    cJSON_AddBoolToObject(o, "use_rslora", 0);
    cJSON_AddBoolToObject(o, "use_dora", 0);
    cJSON_AddNullToObject(o, "modules_to_save");
    cJSON_AddNullToObject(o, "layers_to_transform");
    cJSON_AddNullToObject(o, "layers_pattern");
    cJSON_AddObjectToObject(o, "rank_pattern");
    cJSON_AddObjectToObject(o, "alpha_pattern");
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return NULL;
    size_t len = strlen(s);
    char *line = realloc(s, len + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    memcpy(line + len, "\n", 2);
    return line;
}

int peft_adapter_save(const char *dir, const peft_adapter *a, char *err, size_t err_cap) {
    char path[4200];
    if (peft_targets_check(a->arch, a->targets, err, err_cap) != 0) return -1;
    if (fsio_mkdir_p(dir, err, err_cap) != 0) return -1;
    char *cfg = config_json(a);
    if (!cfg) {
        util_set_err(err, err_cap, "%s: out of memory", dir);
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_FILE);
    int rc = fsio_write_atomic(path, cfg, strlen(cfg), err, err_cap);
    free(cfg);
    if (rc != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_FILE);
    safetensors_writer *w = NULL;
    if (safetensors_writer_create(path, &w, err, err_cap) != 0) return -1;
    if (safetensors_writer_add_metadata(w, "format", "pt", err, err_cap) != 0 ||
        safetensors_writer_add_metadata(w, "orch_arch", arch_word(a->arch), err,
                                        err_cap) != 0 ||
        (a->fingerprint[0] &&
         safetensors_writer_add_metadata(w, "orch_base_fingerprint", a->fingerprint, err,
                                         err_cap) != 0))
        goto fail;
    for (size_t i = 0; i < a->n; i++) {
        char name[256];
        peft_name(a->arch, a->t[i].name, name, sizeof name);
        if (safetensors_writer_declare(w, name, SAFETENSORS_F32, 2, a->t[i].shape, err,
                                       err_cap) != 0)
            goto fail;
    }
    if (safetensors_writer_begin_data(w, err, err_cap) != 0) goto fail;
    for (size_t i = 0; i < a->n; i++)
        if (safetensors_writer_write(w, a->t[i].data,
                                     (size_t)a->t[i].numel * sizeof(float), err,
                                     err_cap) != 0)
            goto fail;
    return safetensors_writer_finish(w, NULL, err, err_cap);
fail:
    safetensors_writer_abort(w);
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Loading                                                                    */
/* ------------------------------------------------------------------------- */

/* 1 when v is null, false, 0, "", [] or {} (an option left at its default). */
static int trivial(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 1;
    if (cJSON_IsNumber(v)) return v->valuedouble == 0;
    if (cJSON_IsString(v)) return v->valuestring[0] == '\0';
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child == NULL;
    return 0;
}

/* Keys that only describe (accepted with any value). */
static const char *const info_keys[] = { "base_model_name_or_path",
                                         "revision",
                                         "inference_mode",
                                         "init_lora_weights",
                                         "auto_mapping",
                                         "peft_version",
                                         "runtime_config",
                                         "lora_dropout",
                                         "fan_in_fan_out",
                                         "task_type",
                                         "peft_type",
                                         "r",
                                         "lora_alpha",
                                         "target_modules",
                                         "bias",
                                         NULL };

/* Parse and check adapter_config.json text into a. */
static int parse_config(const char *path, const char *text, const orch_model_desc *m,
                        peft_adapter *a, char *err, size_t err_cap) {
    cJSON *o = cJSON_Parse(text);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        util_set_err(err, err_cap, "%s: not a JSON object", path);
        return -1;
    }
    int rc = -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "peft_type");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA") != 0) {
        util_set_err(err, err_cap,
                     "%s: peft_type %s: only \"LORA\" adapters are supported", path,
                     cJSON_IsString(v) ? v->valuestring : "missing or not a string");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "task_type");
    if (v && !cJSON_IsNull(v) &&
        (!cJSON_IsString(v) || strcmp(v->valuestring, "CAUSAL_LM") != 0)) {
        util_set_err(err, err_cap, "%s: task_type %s: only CAUSAL_LM is supported", path,
                     cJSON_IsString(v) ? v->valuestring : "(not a string)");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "r");
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e6 ||
        v->valuedouble != floor(v->valuedouble)) {
        if (cJSON_IsNumber(v))
            util_set_err(err, err_cap, "%s: r %g: expected an integer >= 1", path,
                         v->valuedouble);
        else
            util_set_err(err, err_cap, "%s: r: %s (expected an integer >= 1)", path,
                         v ? "not a number" : "missing");
        goto out;
    }
    a->rank = (uint32_t)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(o, "lora_alpha");
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble) ||
        v->valuedouble > 1e30) {
        util_set_err(err, err_cap, "%s: lora_alpha: expected a number > 0", path);
        goto out;
    }
    a->alpha = (float)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(o, "lora_dropout");
    if (v && !cJSON_IsNull(v) &&
        (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 1)) {
        util_set_err(err, err_cap, "%s: lora_dropout: expected a number in [0, 1)", path);
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "target_modules");
    if (cJSON_IsString(v)) {
        util_set_err(err, err_cap,
                     "%s: target_modules \"%s\" is a regular expression; orch reads a "
                     "list of module names",
                     path, v->valuestring);
        goto out;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0 || cJSON_GetArraySize(v) > 32) {
        util_set_err(err, err_cap,
                     "%s: target_modules: expected a non-empty list of "
                     "module names",
                     path);
        goto out;
    }
    const char *mods[32];
    size_t nm = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it)) {
            util_set_err(err, err_cap, "%s: target_modules: entry %zu is not a string",
                         path, nm);
            goto out;
        }
        mods[nm++] = it->valuestring;
    }
    char what[4300];
    snprintf(what, sizeof what, "%s: target_modules", path);
    if (modules_to_bits(m->arch, mods, nm, what, &a->targets, err, err_cap) != 0)
        goto out;
    v = cJSON_GetObjectItemCaseSensitive(o, "fan_in_fan_out");
    if (m->arch == ORCH_ARCH_LLAMA && cJSON_IsTrue(v)) {
        util_set_err(err, err_cap,
                     "%s: fan_in_fan_out true: llama's projections are nn.Linear "
                     "(fan_in_fan_out must be false)",
                     path);
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "bias");
    if (v && !cJSON_IsNull(v) && (!cJSON_IsString(v) || strcmp(v->valuestring, "none"))) {
        util_set_err(err, err_cap,
                     "%s: bias %s: only \"none\" is supported (orch adapters "
                     "train no biases)",
                     path, cJSON_IsString(v) ? v->valuestring : "(not a string)");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "base_model_name_or_path");
    snprintf(a->base_model, sizeof a->base_model, "%s",
             cJSON_IsString(v) ? v->valuestring : "");
    /* Everything else: an option orch does not apply must be left unset. */
    cJSON_ArrayForEach(it, o) {
        int known = 0;
        for (const char *const *k = info_keys; *k; k++)
            known |= strcmp(*k, it->string) == 0;
        if (known || trivial(it)) continue;
        char *val = cJSON_PrintUnformatted(it);
        util_set_err(
            err, err_cap,
            "%s: %s is %.80s: orch does not support this PEFT option (it must be "
            "unset, false or empty)",
            path, it->string, val ? val : "set");
        free(val);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

int peft_adapter_load(const char *dir, const orch_model_desc *m, peft_adapter *out,
                      char *err, size_t err_cap) {
    char cpath[4200], wpath[4200];
    snprintf(cpath, sizeof cpath, "%s/%s", dir, PEFT_CONFIG_FILE);
    snprintf(wpath, sizeof wpath, "%s/%s", dir, PEFT_WEIGHTS_FILE);
    char *text = NULL;
    if (fsio_read_file(cpath, (size_t)1 << 20, &text, NULL, err, err_cap) != 0) return -1;
    peft_adapter a;
    memset(&a, 0, sizeof a);
    a.arch = m->arch;
    int rc = parse_config(cpath, text, m, &a, err, err_cap);
    free(text);
    if (rc != 0) return -1;
    char msg[1024];
    if (peft_expected_table(m, a.rank, a.targets, &a.t, &a.n, msg, sizeof msg) != 0) {
        util_set_err(err, err_cap, "%s: %s", cpath, msg);
        return -1;
    }
    safetensors_file *f = NULL;
    if (safetensors_open(wpath, &f, err, err_cap) != 0) {
        peft_adapter_free(&a);
        return -1;
    }
    rc = -1;
    const char *arch = safetensors_metadata(f, "orch_arch");
    if (arch && strcmp(arch, arch_word(m->arch)) != 0) {
        util_set_err(err, err_cap, "%s: adapter for a %s model, this base is %s", wpath,
                     arch, arch_word(m->arch));
        goto out;
    }
    const char *fp = safetensors_metadata(f, "orch_base_fingerprint");
    snprintf(a.fingerprint, sizeof a.fingerprint, "%s", fp ? fp : "");
    for (size_t i = 0; i < safetensors_count(f); i++) {
        const safetensors_tensor *st = safetensors_get(f, i);
        int found = 0;
        for (size_t k = 0; k < a.n && !found; k++) {
            char name[256];
            peft_name(m->arch, a.t[k].name, name, sizeof name);
            found = strcmp(name, st->name) == 0;
        }
        if (!found) {
            util_set_err(err, err_cap,
                         "%s: unexpected tensor %s (not a lora_A/lora_B of the targets "
                         "%s, rank %u)",
                         wpath, st->name, cpath, a.rank);
            goto out;
        }
    }
    for (size_t k = 0; k < a.n; k++) {
        peft_adapter_tensor *t = &a.t[k];
        char name[256];
        peft_name(m->arch, t->name, name, sizeof name);
        const safetensors_tensor *st = safetensors_find(f, name);
        if (!st) {
            util_set_err(err, err_cap, "%s: missing tensor %s", wpath, name);
            goto out;
        }
        if (st->dtype != SAFETENSORS_F32 && st->dtype != SAFETENSORS_F16 &&
            st->dtype != SAFETENSORS_BF16) {
            util_set_err(err, err_cap, "%s: %s: dtype %s (expected F32, F16 or BF16)",
                         wpath, name, safetensors_dtype_name(st->dtype));
            goto out;
        }
        if (st->ndim != 2 || st->shape[0] != t->shape[0] || st->shape[1] != t->shape[1]) {
            char got[128] = "";
            size_t u = 0;
            for (uint32_t d = 0; d < st->ndim && u < sizeof got - 24; d++)
                u += (size_t)snprintf(got + u, sizeof got - u, "%s%llu", d ? "," : "",
                                      (unsigned long long)st->shape[d]);
            int is_a = strstr(t->name, "lora_A") != NULL;
            util_set_err(err, err_cap,
                         "%s: %s has shape [%s], expected [%llu,%llu] (r %u in %s%s)",
                         wpath, name, got, (unsigned long long)t->shape[0],
                         (unsigned long long)t->shape[1], a.rank, cpath,
                         (st->ndim == 2 && st->shape[is_a ? 0 : 1] != a.rank)
                             ? ": the ranks disagree"
                             : "");
            goto out;
        }
        t->data = malloc((size_t)t->numel * sizeof(float));
        if (!t->data) {
            util_set_err(err, err_cap, "out of memory");
            goto out;
        }
        if (st->dtype == SAFETENSORS_F32)
            memcpy(t->data, st->data, (size_t)st->nbytes);
        else
            safetensors_to_f32(st->dtype, st->data, t->data, t->numel);
        for (uint64_t j = 0; j < t->numel; j++)
            if (!isfinite(t->data[j])) {
                util_set_err(err, err_cap, "%s: %s: element %llu is not finite", wpath,
                             name, (unsigned long long)j);
                goto out;
            }
    }
    rc = 0;
out:
    safetensors_close(f);
    if (rc != 0)
        peft_adapter_free(&a);
    else
        *out = a;
    return rc;
}

int peft_adapter_check_base(const peft_adapter *a, const char *dir, const char *fp,
                            char *err, size_t err_cap) {
    if (!a->fingerprint[0] || strcmp(a->fingerprint, fp) == 0) return 0;
    util_set_err(err, err_cap,
                 "%s: the adapter was trained on another base model (base fingerprint "
                 "%.23s..., this base %.23s...)",
                 dir, a->fingerprint, fp);
    return -1;
}
