/*
 * hf_llama.c - Hugging Face LLaMA-family config.json reading and writing,
 * and the tokenizer files of an "hf" checkpoint (see hf_llama.h).
 */
#include "orchestrator/store/hf_llama.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_read.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/ckpt_files.h"

#define TOKENIZER_FILE_MAX ((size_t)256 << 20)

const char *const hf_llama_tokenizer_files[] = {
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    NULL,
};

static const char *const families[][2] = {
    { "llama", "LlamaForCausalLM" },
    { "mistral", "MistralForCausalLM" },
    { "qwen2", "Qwen2ForCausalLM" },
};
#define N_FAMILIES (sizeof families / sizeof families[0])

static const char *str_of(const cJSON *j, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static const char *first_arch(const cJSON *j) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *x = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

int hf_llama_is_llama(const cJSON *j) {
    const char *mt = str_of(j, "model_type"), *ar = first_arch(j);
    for (size_t i = 0; i < N_FAMILIES; i++)
        if ((mt && strcmp(mt, families[i][0]) == 0) ||
            (ar && strcmp(ar, families[i][1]) == 0))
            return 1;
    return 0;
}

/* The value of x as text for a message ("true", "\"gelu\"", "3", ...). */
static void value_text(const cJSON *x, char *out, size_t cap) {
    if (cJSON_IsString(x))
        snprintf(out, cap, "\"%.60s\"", x->valuestring);
    else if (cJSON_IsBool(x))
        snprintf(out, cap, "%s", cJSON_IsTrue(x) ? "true" : "false");
    else if (cJSON_IsNumber(x))
        snprintf(out, cap, "%.17g", x->valuedouble);
    else
        snprintf(out, cap, "%s", json_read_type_name(x));
}

/* Positive number KEY of j: *v, def when absent (def < 0: required). */
static int pos_num(const cJSON *j, const char *path, const char *key, double def,
                   double max, double *v, char *err, size_t err_cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x)) {
        if (def >= 0) {
            *v = def;
            return 0;
        }
        util_set_err(err, err_cap, "%s: %s is missing (orch needs it for a llama model)",
                     path, key);
        return -1;
    }
    if (!cJSON_IsNumber(x) || !(x->valuedouble > 0) || x->valuedouble > max) {
        char t[96];
        value_text(x, t, sizeof t);
        util_set_err(err, err_cap, "%s: %s %s is not a positive number up to %g", path,
                     key, t, max);
        return -1;
    }
    *v = x->valuedouble;
    return 0;
}

static int pos_int(const cJSON *j, const char *path, const char *key, double def,
                   double max, uint32_t *v, char *err, size_t err_cap) {
    double d;
    if (pos_num(j, path, key, def, max, &d, err, err_cap) != 0) return -1;
    if (d != (double)(uint32_t)d) {
        util_set_err(err, err_cap, "%s: %s %.17g is not an integer", path, key, d);
        return -1;
    }
    *v = (uint32_t)d;
    return 0;
}

/* A bool field that orch supports only as want (absent or null is fine). */
static int need_bool(const cJSON *j, const char *path, const char *key, int want,
                     const char *why, char *err, size_t err_cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x) || (cJSON_IsBool(x) && cJSON_IsTrue(x) == want)) return 0;
    char t[96];
    value_text(x, t, sizeof t);
    util_set_err(err, err_cap, "%s: %s %s is not supported (%s)", path, key, t, why);
    return -1;
}

static int read_rope_scaling(const cJSON *j, const char *path, llama_model *m, char *err,
                             size_t err_cap) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return 0;
    if (!cJSON_IsObject(rs)) {
        util_set_err(err, err_cap, "%s: rope_scaling is %s, not an object or null", path,
                     json_read_type_name(rs));
        return -1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) {
        util_set_err(err, err_cap, "%s: rope_scaling has no rope_type string", path);
        return -1;
    }
    const char *ty = t->valuestring;
    if (strcmp(ty, "default") == 0) return 0;
    char sub[PATH_MAX + 32];
    snprintf(sub, sizeof sub, "%s: rope_scaling", path);
    if (strcmp(ty, "linear") == 0) {
        m->rope_scaling = ORCH_ROPE_LINEAR;
        return pos_num(rs, sub, "factor", -1, 1e6, &m->rope_factor, err, err_cap);
    }
    if (strcmp(ty, "llama3") == 0) {
        m->rope_scaling = ORCH_ROPE_LLAMA3;
        return pos_num(rs, sub, "factor", -1, 1e6, &m->rope_factor, err, err_cap) ||
                       pos_num(rs, sub, "low_freq_factor", -1, 1e6,
                               &m->rope_low_freq_factor, err, err_cap) ||
                       pos_num(rs, sub, "high_freq_factor", -1, 1e6,
                               &m->rope_high_freq_factor, err, err_cap) ||
                       pos_int(rs, sub, "original_max_position_embeddings", -1, 1048576,
                               &m->rope_original_context, err, err_cap)
                   ? -1
                   : 0;
    }
    util_set_err(err, err_cap,
                 "%s: rope_scaling rope_type \"%.40s\" is not supported (orch has "
                 "default, linear and llama3)",
                 path, ty);
    return -1;
}

int hf_llama_read_config(const cJSON *j, const char *path, llama_model *m, char *err,
                         size_t err_cap) {
    memset(m, 0, sizeof *m);
    const char *ar = first_arch(j);
    int known = !ar;
    for (size_t i = 0; ar && i < N_FAMILIES; i++)
        known |= strcmp(ar, families[i][1]) == 0;
    if (!known) {
        util_set_err(err, err_cap,
                     "%s: architectures \"%.60s\" is not supported with a LLaMA-family "
                     "model_type (orch imports LlamaForCausalLM, MistralForCausalLM and "
                     "Qwen2ForCausalLM)",
                     path, ar);
        return -1;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        char t[96];
        value_text(act, t, sizeof t);
        util_set_err(err, err_cap,
                     "%s: hidden_act %s is not supported (orch's llama has \"silu\")",
                     path, t);
        return -1;
    }
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    const cJSON *usw = cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window");
    const char *mt = str_of(j, "model_type");
    int qwen =
        (mt && strcmp(mt, "qwen2") == 0) || (ar && strcmp(ar, "Qwen2ForCausalLM") == 0);
    if (need_bool(j, path, "attention_bias", 0, "orch's llama has no biases", err,
                  err_cap) != 0 ||
        need_bool(j, path, "mlp_bias", 0, "orch's llama has no biases", err, err_cap) !=
            0 ||
        need_bool(j, path, "use_sliding_window", 0,
                  "orch's llama attends to the whole context", err, err_cap) != 0)
        return -1;
    if (sw && !cJSON_IsNull(sw) && !(qwen && !cJSON_IsTrue(usw))) {
        char t[96];
        value_text(sw, t, sizeof t);
        util_set_err(err, err_cap,
                     "%s: sliding_window %s is not supported (orch's llama attends to "
                     "the whole context)",
                     path, t);
        return -1;
    }
    double eps, theta;
    if (pos_int(j, path, "hidden_size", -1, 65536, &m->width, err, err_cap) != 0 ||
        pos_int(j, path, "intermediate_size", -1, 262144, &m->mlp_width, err, err_cap) !=
            0 ||
        pos_int(j, path, "num_hidden_layers", -1, 1023, &m->layers, err, err_cap) != 0 ||
        pos_int(j, path, "num_attention_heads", -1, 65536, &m->heads, err, err_cap) !=
            0 ||
        pos_int(j, path, "num_key_value_heads", m->heads, 65536, &m->kv_heads, err,
                err_cap) != 0 ||
        pos_int(j, path, "vocab_size", -1, 1 << 24, &m->vocab, err, err_cap) != 0 ||
        pos_int(j, path, "max_position_embeddings", -1, 1048576, &m->context, err,
                err_cap) != 0 ||
        pos_num(j, path, "rms_norm_eps", 1e-6, 0.5, &eps, err, err_cap) != 0 ||
        pos_num(j, path, "rope_theta", 10000, 1e12, &theta, err, err_cap) != 0 ||
        read_rope_scaling(j, path, m, err, err_cap) != 0)
        return -1;
    m->eps = eps;
    m->rope_theta = theta;
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (hd && !cJSON_IsNull(hd) &&
        !(cJSON_IsNumber(hd) && m->width % m->heads == 0 &&
          hd->valuedouble == (double)(m->width / m->heads))) {
        char t[96];
        value_text(hd, t, sizeof t);
        util_set_err(err, err_cap,
                     "%s: head_dim %s is not supported (orch's llama has hidden_size / "
                     "num_attention_heads = %u / %u)",
                     path, t, m->width, m->heads);
        return -1;
    }
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie)) {
        util_set_err(err, err_cap, "%s: tie_word_embeddings is %s, not a bool", path,
                     json_read_type_name(tie));
        return -1;
    }
    m->tied = tie && cJSON_IsTrue(tie);
    return llama_model_check(m, path, err, err_cap);
}

cJSON *hf_llama_config(const llama_model *m, const char *torch_dtype, int bos, int eos) {
    cJSON *c = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "llama");
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "hidden_size", m->width);
    cJSON_AddNumberToObject(c, "intermediate_size", m->mlp_width);
    cJSON_AddNumberToObject(c, "num_hidden_layers", m->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", m->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", m->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", m->width / m->heads);
    cJSON_AddNumberToObject(c, "max_position_embeddings", m->context);
    cJSON_AddNumberToObject(c, "vocab_size", m->vocab);
    cJSON_AddNumberToObject(c, "rms_norm_eps", m->eps);
    cJSON_AddNumberToObject(c, "rope_theta", m->rope_theta);
    if (m->rope_scaling == ORCH_ROPE_NONE) {
        cJSON_AddNullToObject(c, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", llama_rope_name(m->rope_scaling));
        cJSON_AddNumberToObject(rs, "factor", m->rope_factor);
        if (m->rope_scaling == ORCH_ROPE_LLAMA3) {
            cJSON_AddNumberToObject(rs, "low_freq_factor", m->rope_low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", m->rope_high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                    m->rope_original_context);
        }
    }
    cJSON_AddBoolToObject(c, "tie_word_embeddings", m->tied);
    cJSON_AddBoolToObject(c, "attention_bias", 0);
    cJSON_AddBoolToObject(c, "mlp_bias", 0);
    cJSON_AddNumberToObject(c, "attention_dropout", 0);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddNumberToObject(c, "pretraining_tp", 1);
    cJSON_AddBoolToObject(c, "use_cache", 1);
    if (bos >= 0) cJSON_AddNumberToObject(c, "bos_token_id", bos);
    if (eos >= 0) cJSON_AddNumberToObject(c, "eos_token_id", eos);
    cJSON_AddStringToObject(c, "torch_dtype", torch_dtype);
    return c;
}

int hf_llama_copy_tokenizer(const char *src_dir, const char *dst_dir, int *kind,
                            char *err, size_t err_cap) {
    for (size_t i = 0; hf_llama_tokenizer_files[i]; i++) {
        char src[PATH_MAX], dst[PATH_MAX], *text = NULL;
        size_t len = 0;
        *kind = 2;
        if (ckpt_path_join(src, sizeof src, src_dir, hf_llama_tokenizer_files[i], err,
                           err_cap) != 0 ||
            ckpt_path_join(dst, sizeof dst, dst_dir, hf_llama_tokenizer_files[i], err,
                           err_cap) != 0)
            return -1;
        if (!ckpt_exists(src)) {
            if (i > 0) continue;
            *kind = 1;
            util_set_err(err, err_cap, "%s: no such file (an hf tokenizer needs it)",
                         src);
            return -1;
        }
        if (fsio_read_file(src, TOKENIZER_FILE_MAX, &text, &len, err, err_cap) != 0) {
            *kind = 1;
            return -1;
        }
        int rc = fsio_write_file(dst, text, len, err, err_cap);
        free(text);
        if (rc != 0) return -1;
    }
    return 0;
}
