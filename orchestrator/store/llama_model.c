/*
 * llama_model.c - orch LLaMA hyperparameters, config keys, parameter table,
 * RoPE row permutation and llama3 frequency factors (see llama_model.h).
 */
#include "orchestrator/store/llama_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_read.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/ckpt_files.h"

static const char *const layer_suffix[LLAMA_LAYER_TENSORS] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight",
    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

const char *llama_layer_suffix(size_t k) {
    return k < LLAMA_LAYER_TENSORS ? layer_suffix[k] : NULL;
}

const char *llama_rope_name(uint32_t scaling) {
    return scaling == ORCH_ROPE_LINEAR   ? "linear"
           : scaling == ORCH_ROPE_LLAMA3 ? "llama3"
                                         : "none";
}

int llama_model_check(const llama_model *m, const char *what, char *err, size_t err_cap) {
    if (!m->vocab || !m->context || !m->layers || !m->heads || !m->width ||
        !m->mlp_width || m->layers > 1023 || m->width > 65536 || m->mlp_width > 262144 ||
        m->context > 1048576 || m->vocab > (1u << 24)) {
        util_set_err(err, err_cap,
                     "%s: a size is 0 or too large (vocab %u, context %u, layers %u, "
                     "heads %u, width %u, mlp %u)",
                     what, m->vocab, m->context, m->layers, m->heads, m->width,
                     m->mlp_width);
        return -1;
    }
    if (m->width % m->heads != 0 || (m->width / m->heads) % 2 != 0) {
        util_set_err(err, err_cap,
                     "%s: %u heads do not divide the width %u into heads of an even "
                     "size",
                     what, m->heads, m->width);
        return -1;
    }
    if (!m->kv_heads || m->heads % m->kv_heads != 0) {
        util_set_err(err, err_cap, "%s: %u kv heads do not divide the %u heads", what,
                     m->kv_heads, m->heads);
        return -1;
    }
    if (!(m->eps > 0 && m->eps < 1) || !(m->rope_theta > 0 && m->rope_theta < 1e12)) {
        util_set_err(err, err_cap, "%s: epsilon %g or rope theta %g out of range", what,
                     m->eps, m->rope_theta);
        return -1;
    }
    if (m->rope_scaling != ORCH_ROPE_NONE && !(m->rope_factor > 0)) {
        util_set_err(err, err_cap, "%s: rope scaling factor %g is not positive", what,
                     m->rope_factor);
        return -1;
    }
    if (m->rope_scaling == ORCH_ROPE_LLAMA3 &&
        (!(m->rope_low_freq_factor > 0) ||
         !(m->rope_high_freq_factor > m->rope_low_freq_factor) ||
         !m->rope_original_context)) {
        util_set_err(err, err_cap,
                     "%s: llama3 rope scaling needs low_freq_factor > 0, "
                     "high_freq_factor > low_freq_factor and original_context > 0 "
                     "(got %g, %g, %u)",
                     what, m->rope_low_freq_factor, m->rope_high_freq_factor,
                     m->rope_original_context);
        return -1;
    }
    return 0;
}

/* A non-negative number key (absent: def). */
static int num(const cJSON *o, const char *key, const char *what, double def, double *v,
               char *err, size_t err_cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = def;
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0)) {
        util_set_err(err, err_cap, "%s: %s: expected a non-negative number, got %s", what,
                     key, json_read_type_name(x));
        return -1;
    }
    *v = x->valuedouble;
    return 0;
}

int llama_model_from_json(const cJSON *model, const char *what, llama_model *m, char *err,
                          size_t err_cap) {
    memset(m, 0, sizeof *m);
    if (!cJSON_IsObject(model)) {
        util_set_err(err, err_cap, "%s: no model section", what);
        return -1;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(model, "arch");
    if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "llama") != 0) {
        util_set_err(err, err_cap, "%s: model.arch is not \"llama\"", what);
        return -1;
    }
    double v[10] = { 0 };
    static const char *const keys[10] = { "vocab_size", "context",       "layers",
                                          "heads",      "kv_heads",      "width",
                                          "mlp_width",  "layernorm_eps", "rope_theta",
                                          NULL };
    for (int i = 0; keys[i]; i++)
        if (num(model, keys[i], what, 0, &v[i], err, err_cap) != 0) return -1;
    m->vocab = (uint32_t)v[0];
    m->context = (uint32_t)v[1];
    m->layers = (uint32_t)v[2];
    m->heads = (uint32_t)v[3];
    m->kv_heads = v[4] > 0 ? (uint32_t)v[4] : m->heads;
    m->width = (uint32_t)v[5];
    m->mlp_width = v[6] > 0 ? (uint32_t)v[6] : 4 * m->width;
    m->eps = v[7] > 0 ? v[7] : 1e-5;
    m->rope_theta = v[8] > 0 ? v[8] : 10000.0;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(model, "tie_embeddings");
    if (tie && !cJSON_IsBool(tie)) {
        util_set_err(err, err_cap, "%s: model.tie_embeddings: expected a bool, got %s",
                     what, json_read_type_name(tie));
        return -1;
    }
    m->tied = tie && cJSON_IsTrue(tie);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(model, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsObject(rs) || !cJSON_IsString(t)) {
            util_set_err(err, err_cap,
                         "%s: model.rope_scaling: expected an object with "
                         "a \"type\" string",
                         what);
            return -1;
        }
        if (strcmp(t->valuestring, "linear") == 0)
            m->rope_scaling = ORCH_ROPE_LINEAR;
        else if (strcmp(t->valuestring, "llama3") == 0)
            m->rope_scaling = ORCH_ROPE_LLAMA3;
        else if (strcmp(t->valuestring, "none") != 0) {
            util_set_err(err, err_cap,
                         "%s: model.rope_scaling.type \"%.40s\" is not linear or llama3",
                         what, t->valuestring);
            return -1;
        }
        double oc;
        if (num(rs, "factor", what, 1, &m->rope_factor, err, err_cap) != 0 ||
            num(rs, "low_freq_factor", what, 1, &m->rope_low_freq_factor, err, err_cap) !=
                0 ||
            num(rs, "high_freq_factor", what, 4, &m->rope_high_freq_factor, err,
                err_cap) != 0 ||
            num(rs, "original_context", what, 8192, &oc, err, err_cap) != 0)
            return -1;
        m->rope_original_context = (uint32_t)oc;
    }
    return llama_model_check(m, what, err, err_cap);
}

int llama_model_from_ckpt(const char *ckpt_dir, const struct orch_config *cfg_in,
                          llama_model *m, char *err, size_t err_cap) {
    char p[4096], *text = NULL;
    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_STATE_FILE, err, err_cap) != 0 ||
        fsio_read_file(p, CKPT_STATE_MAX_BYTES, &text, NULL, err, err_cap) != 0)
        return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(cfg, "model");
    int rc = llama_model_from_json(model, p, m, err, err_cap);
    if (rc == 0 && !cJSON_GetObjectItemCaseSensitive(model, "tie_embeddings")) {
        orch_model_desc d;
        config_model_desc(cfg_in, &d);
        m->tied = !(d.flags & ORCH_MODEL_FLAG_UNTIED_HEAD);
    }
    cJSON_Delete(root);
    return rc;
}

int llama_model_to_json(const llama_model *m, int omit_tie, cJSON *model) {
    int ok = cJSON_AddStringToObject(model, "arch", "llama") &&
             cJSON_AddNumberToObject(model, "vocab_size", m->vocab) &&
             cJSON_AddNumberToObject(model, "context", m->context) &&
             cJSON_AddNumberToObject(model, "layers", m->layers) &&
             cJSON_AddNumberToObject(model, "heads", m->heads) &&
             cJSON_AddNumberToObject(model, "kv_heads", m->kv_heads) &&
             cJSON_AddNumberToObject(model, "width", m->width) &&
             cJSON_AddNumberToObject(model, "mlp_width", m->mlp_width) &&
             cJSON_AddNumberToObject(model, "layernorm_eps", m->eps) &&
             cJSON_AddNumberToObject(model, "rope_theta", m->rope_theta);
    if (ok && !omit_tie)
        ok = cJSON_AddBoolToObject(model, "tie_embeddings", m->tied) != NULL;
    if (ok && m->rope_scaling != ORCH_ROPE_NONE) {
        cJSON *rs = cJSON_AddObjectToObject(model, "rope_scaling");
        ok = rs &&
             cJSON_AddStringToObject(rs, "type", llama_rope_name(m->rope_scaling)) &&
             cJSON_AddNumberToObject(rs, "factor", m->rope_factor);
        if (ok && m->rope_scaling == ORCH_ROPE_LLAMA3)
            ok =
                cJSON_AddNumberToObject(rs, "low_freq_factor", m->rope_low_freq_factor) &&
                cJSON_AddNumberToObject(rs, "high_freq_factor",
                                        m->rope_high_freq_factor) &&
                cJSON_AddNumberToObject(rs, "original_context", m->rope_original_context);
    }
    return ok ? 0 : -1;
}

size_t llama_model_tensor_count(const llama_model *m) {
    return 2 + (size_t)m->layers * LLAMA_LAYER_TENSORS + (m->tied ? 0 : 1);
}

int llama_model_tensor(const llama_model *m, size_t i, char *name, size_t cap,
                       uint64_t shape[2], int *layer_k) {
    const uint64_t C = m->width, M = m->mlp_width;
    const uint64_t KV = (uint64_t)m->kv_heads * (C / m->heads);
    size_t nl = (size_t)m->layers * LLAMA_LAYER_TENSORS;
    *layer_k = -1;
    shape[0] = C, shape[1] = 0;
    if (i == 0) {
        snprintf(name, cap, "model.embed_tokens.weight");
        shape[0] = m->vocab, shape[1] = C;
        return 0;
    }
    if (i - 1 < nl) {
        size_t k = (i - 1) % LLAMA_LAYER_TENSORS;
        snprintf(name, cap, "model.layers.%zu.%s", (i - 1) / LLAMA_LAYER_TENSORS,
                 layer_suffix[k]);
        *layer_k = (int)k;
        static const uint8_t d[LLAMA_LAYER_TENSORS][2] = {
            { 1, 0 }, { 1, 1 }, { 2, 1 }, { 2, 1 }, { 1, 1 },
            { 1, 0 }, { 3, 1 }, { 3, 1 }, { 1, 3 },
        }; /* 1 = C, 2 = KV, 3 = M */
        for (int a = 0; a < 2; a++)
            shape[a] = d[k][a] == 1 ? C : d[k][a] == 2 ? KV : d[k][a] == 3 ? M : 0;
        return 0;
    }
    if (i == nl + 1) {
        snprintf(name, cap, "model.norm.weight");
        return 0;
    }
    if (i == nl + 2 && !m->tied) {
        snprintf(name, cap, "lm_head.weight");
        shape[0] = m->vocab, shape[1] = C;
        return 0;
    }
    return -1;
}

void llama_rope_permute(const float *src, float *dst, uint32_t heads, uint64_t rows,
                        uint64_t cols, int to_gguf) {
    const uint64_t D = rows / heads, half = D / 2;
    for (uint64_t h = 0; h < heads; h++)
        for (uint64_t j = 0; j < half; j++)
            for (uint64_t s = 0; s < 2; s++) {
                uint64_t g = h * D + 2 * j + s, f = h * D + s * half + j;
                const float *from = src + (to_gguf ? f : g) * cols;
                memcpy(dst + (to_gguf ? g : f) * cols, from, (size_t)cols * sizeof *dst);
            }
}

void llama_rope_freq_factors(const llama_model *m, float *out) {
    const uint32_t D = m->width / m->heads;
    const double factor = m->rope_factor, lo = m->rope_low_freq_factor;
    const double hi = m->rope_high_freq_factor, orig = m->rope_original_context;
    for (uint32_t i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(m->rope_theta, (double)(2 * i) / (double)D), s = f;
        double wavelen = 2.0 * 3.14159265358979323846 / f;
        if (wavelen > orig / lo) {
            s = f / factor;
        } else if (!(wavelen < orig / hi)) {
            double smooth = (orig / wavelen - lo) / (hi - lo);
            s = (1.0 - smooth) * f / factor + smooth * f;
        }
        out[i] = (float)(f / s);
    }
}
