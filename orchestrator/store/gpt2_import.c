/*
 * gpt2_import.c - Hugging Face GPT-2 safetensors -> orch checkpoint (see
 * gpt2_import.h): name check and layer count, shape and head resolution,
 * per-tensor conversion (Conv1D transpose, F16/BF16 widening), the config and
 * state.json, and the atomic checkpoint write.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_read.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/store/ckpt_files.h"
#include "orchestrator/store/gpt2_import.h"
#include "orchestrator/store/hf_llama.h"
#include "orchestrator/store/llama_model.h"
#include "orchestrator/store/safetensors.h"

#define HF_CONFIG_MAX_BYTES (1u << 20)
#define HF_INDEX_MAX_BYTES  (16u << 20)
#define HF_INDEX_FILE       "model.safetensors.index.json"
#define MAX_TENSORS         1024
#define MAX_SHARDS          256

/* Engine-order tensor names of one layer, and whether each is a Conv1D
 * weight to transpose. */
static const struct {
    const char *suffix;
    int conv1d;
} layer_tensors[] = {
    { "ln_1.weight", 0 },      { "ln_1.bias", 0 },          { "attn.c_attn.weight", 1 },
    { "attn.c_attn.bias", 0 }, { "attn.c_proj.weight", 1 }, { "attn.c_proj.bias", 0 },
    { "ln_2.weight", 0 },      { "ln_2.bias", 0 },          { "mlp.c_fc.weight", 1 },
    { "mlp.c_fc.bias", 0 },    { "mlp.c_proj.weight", 1 },  { "mlp.c_proj.bias", 0 },
};
#define N_LAYER_TENSORS (sizeof layer_tensors / sizeof layer_tensors[0])
_Static_assert(N_LAYER_TENSORS == GPT2_HF_LAYER_TENSORS, "layer table size");

const char *gpt2_hf_layer_tensor(size_t k, int *conv1d) {
    if (k >= N_LAYER_TENSORS) return NULL;
    if (conv1d) *conv1d = layer_tensors[k].conv1d;
    return layer_tensors[k].suffix;
}

/* What a Hugging Face config.json says (-1: absent; n_inner -2: null). */
typedef struct hf_config {
    double n_embd, n_layer, n_head, n_positions, vocab_size, n_inner, eps;
} hf_config;

typedef struct import_ctx {
    const char *file;           /* the input (file or directory), for messages */
    safetensors_file **st;      /* the safetensors files (one, or the shards) */
    char (*st_names)[PATH_MAX]; /* their paths */
    size_t n_st;
    hf_config hc;
    ckpt_tensor *out;
    size_t n_out;
    char (*names)[64];
    uint64_t V, C, T, M; /* vocab, width, context, mlp width */
    uint32_t layers, heads;
    double eps;
    const char *tok;
    int kind;  /* gpt2_import_err_kind of the failure */
    int llama; /* config.json is of the LLaMA family: lm holds it */
    llama_model lm;
} import_ctx;

static int oom(import_ctx *ic, char *err, size_t err_cap) {
    util_set_err(err, err_cap, "out of memory");
    ic->kind = GPT2_IMPORT_ERR_RUNTIME;
    return -1;
}

/* Name without the optional "transformer." prefix. */
static const char *strip(const char *n) {
    return strncmp(n, "transformer.", 12) == 0 ? n + 12 : n;
}

/* Find by orch name, with or without the prefix, in any of the files. */
static const safetensors_tensor *find(const import_ctx *ic, const char *name) {
    char buf[256];
    snprintf(buf, sizeof buf, "transformer.%s", name);
    for (size_t i = 0; i < ic->n_st; i++) {
        const safetensors_tensor *t = safetensors_find(ic->st[i], name);
        if (!t) t = safetensors_find(ic->st[i], buf);
        if (t) return t;
    }
    return NULL;
}

static int is_skipped(const char *n) {
    size_t l = strlen(n);
    return strcmp(n, "lm_head.weight") == 0 ||
           (l >= 10 && strcmp(n + l - 10, ".attn.bias") == 0) ||
           (l >= 17 && strcmp(n + l - 17, ".attn.masked_bias") == 0);
}

/* Every tensor of file f must be known or deliberately skipped, and in no
 * other file; counts the layers. */
static int scan_file(import_ctx *ic, size_t f, char *err, size_t err_cap) {
    const safetensors_file *st = ic->st[f];
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const char *full = safetensors_get(st, i)->name;
        for (size_t g = 0; g < f; g++) {
            if (safetensors_find(ic->st[g], full)) {
                util_set_err(err, err_cap, "%s: tensor '%s' is also in %s",
                             ic->st_names[f], full, ic->st_names[g]);
                return -1;
            }
        }
        const char *n = strip(full);
        if (is_skipped(n)) continue;
        if (strncmp(n, "h.", 2) == 0) {
            char *end;
            unsigned long l = strtoul(n + 2, &end, 10);
            int known = end != n + 2 && *end == '.' && l < 1024;
            for (size_t k = 0; known && k < N_LAYER_TENSORS; k++)
                if (strcmp(end + 1, layer_tensors[k].suffix) == 0) {
                    if (l + 1 > ic->layers) ic->layers = (uint32_t)(l + 1);
                    known = 2;
                }
            if (known == 2) continue;
        } else if (strcmp(n, "wte.weight") == 0 || strcmp(n, "wpe.weight") == 0 ||
                   strcmp(n, "ln_f.weight") == 0 || strcmp(n, "ln_f.bias") == 0) {
            continue;
        }
        util_set_err(err, err_cap,
                     "%s: unexpected tensor '%s' (not a GPT-2 "
                     "parameter in the Hugging Face layout%s)",
                     ic->st_names[f], full,
                     strncmp(full, "model.layers.", 13) == 0
                         ? "; a LLaMA-family model needs its config.json"
                         : "");
        return -1;
    }
    return 0;
}

static int scan_names(import_ctx *ic, char *err, size_t err_cap) {
    for (size_t f = 0; f < ic->n_st; f++) {
        if (scan_file(ic, f, err, err_cap) != 0) return -1;
    }
    return 0;
}

/* Vocab, width, context and mlp width from wte, wpe and h.0.mlp.c_fc.bias. */
static int read_shape(import_ctx *ic, char *err, size_t err_cap) {
    const safetensors_tensor *wte = find(ic, "wte.weight");
    const safetensors_tensor *wpe = find(ic, "wpe.weight");
    const safetensors_tensor *fc = find(ic, "h.0.mlp.c_fc.bias");
    if (!wte || !wpe || ic->layers == 0 || !fc || wte->ndim != 2 || wpe->ndim != 2 ||
        fc->ndim != 1) {
        util_set_err(err, err_cap,
                     "%s: not GPT-2 weights (need wte.weight [V,C], "
                     "wpe.weight [T,C] and h.N.* layers)",
                     ic->file);
        return -1;
    }
    ic->V = wte->shape[0];
    ic->C = wte->shape[1];
    ic->T = wpe->shape[0];
    ic->M = fc->shape[0];
    if (wpe->shape[1] != ic->C || ic->V > INT32_MAX || ic->T > 1048576 || ic->C > 65536 ||
        ic->M > 262144 || ic->V == 0 || ic->C == 0 || ic->T == 0 || ic->M == 0) {
        util_set_err(err, err_cap,
                     "%s: inconsistent shapes (wte [%llu,%llu], wpe "
                     "[%llu,%llu])",
                     ic->file, (unsigned long long)ic->V, (unsigned long long)ic->C,
                     (unsigned long long)wpe->shape[0],
                     (unsigned long long)wpe->shape[1]);
        return -1;
    }
    return 0;
}

/* A number field of config.json: 0 and *v (-1 when absent; -2 for null
 * where null_ok), or -1 with err. */
static int hf_num(const cJSON *j, const char *path, const char *key, int null_ok,
                  double *v, char *err, size_t err_cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    *v = -1;
    if (!x) return 0;
    if (null_ok && cJSON_IsNull(x)) {
        *v = -2;
        return 0;
    }
    if (!cJSON_IsNumber(x) || !(x->valuedouble > 0) || x->valuedouble > 1e9) {
        util_set_err(err, err_cap, "%s: %s is not a positive number", path, key);
        return -1;
    }
    *v = x->valuedouble;
    return 0;
}

/* A field that, when present, must have the one value orch implements. */
static int hf_require(const cJSON *j, const char *path, const char *key,
                      const char *want_str, int want_bool, char *err, size_t err_cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (want_str) {
        const char *alt = strcmp(want_str, "gelu_new") == 0 ? "gelu_pytorch_tanh" : NULL;
        if (cJSON_IsString(x) && (strcmp(x->valuestring, want_str) == 0 ||
                                  (alt && strcmp(x->valuestring, alt) == 0)))
            return 0;
        util_set_err(err, err_cap,
                     "%s: %s %s%s%s is not supported (orch's GPT-2 has \"%s\")", path,
                     key, cJSON_IsString(x) ? "\"" : "",
                     cJSON_IsString(x) ? x->valuestring : json_read_type_name(x),
                     cJSON_IsString(x) ? "\"" : "", want_str);
        return -1;
    }
    if (cJSON_IsBool(x) && cJSON_IsTrue(x) == want_bool) return 0;
    util_set_err(
        err, err_cap, "%s: %s %s is not supported (orch's GPT-2 has %s)", path, key,
        cJSON_IsBool(x) ? (cJSON_IsTrue(x) ? "true" : "false") : json_read_type_name(x),
        want_bool ? "true" : "false");
    return -1;
}

/* Read a Hugging Face config.json into ic->hc. Returns 1 if the file was
 * read, 0 if it does not exist, -1 on a bad or unreadable file or a feature
 * orch does not implement. */
static int read_hf_config(import_ctx *ic, const char *path, char *err, size_t err_cap) {
    char *text = NULL;
    if (fsio_read_file(path, HF_CONFIG_MAX_BYTES, &text, NULL, err, err_cap) != 0)
        return errno == ENOENT ? 0 : -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j || !cJSON_IsObject(j)) {
        util_set_err(err, err_cap, "%s: %s", path,
                     j ? "not a JSON object" : "not valid JSON");
        cJSON_Delete(j);
        return -1;
    }
    if (hf_llama_is_llama(j)) {
        int lrc = hf_llama_read_config(j, path, &ic->lm, err, err_cap) != 0 ? -1 : 1;
        cJSON_Delete(j);
        ic->llama = lrc == 1;
        return lrc;
    }
    hf_config *h = &ic->hc;
    int rc =
        hf_num(j, path, "n_embd", 0, &h->n_embd, err, err_cap) ||
                hf_num(j, path, "n_layer", 0, &h->n_layer, err, err_cap) ||
                hf_num(j, path, "n_head", 0, &h->n_head, err, err_cap) ||
                hf_num(j, path, "n_positions", 0, &h->n_positions, err, err_cap) ||
                hf_num(j, path, "vocab_size", 0, &h->vocab_size, err, err_cap) ||
                hf_num(j, path, "n_inner", 1, &h->n_inner, err, err_cap) ||
                hf_num(j, path, "layer_norm_epsilon", 0, &h->eps, err, err_cap) ||
                hf_require(j, path, "model_type", "gpt2", 0, err, err_cap) ||
                hf_require(j, path, "activation_function", "gelu_new", 0, err, err_cap) ||
                hf_require(j, path, "tie_word_embeddings", NULL, 1, err, err_cap) ||
                hf_require(j, path, "scale_attn_weights", NULL, 1, err, err_cap) ||
                hf_require(j, path, "scale_attn_by_inverse_layer_idx", NULL, 0, err,
                           err_cap) ||
                hf_require(j, path, "add_cross_attention", NULL, 0, err, err_cap)
            ? -1
            : 1;
    cJSON_Delete(j);
    if (rc == 1 && h->n_head > 0) ic->heads = (uint32_t)h->n_head;
    if (rc == 1 && h->eps > 0) ic->eps = h->eps;
    return rc;
}

/* The config.json shape against the weights' (read_shape). */
static int check_hf_shape(import_ctx *ic, const char *path, char *err, size_t err_cap) {
    const hf_config *h = &ic->hc;
    const struct {
        const char *key;
        double v;
        uint64_t w;
    } f[] = {
        { "n_embd", h->n_embd, ic->C },
        { "n_layer", h->n_layer, ic->layers },
        { "n_positions", h->n_positions, ic->T },
        { "vocab_size", h->vocab_size, ic->V },
        { "n_inner", h->n_inner == -2 ? 4.0 * (double)ic->C : h->n_inner, ic->M },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].v < 0 || f[i].v == (double)f[i].w) continue;
        util_set_err(err, err_cap, "%s: %s %.17g%s does not match the weights (%llu)",
                     path, f[i].key, f[i].v,
                     h->n_inner == -2 && i == 4 ? " (null: 4*n_embd)" : "",
                     (unsigned long long)f[i].w);
        return -1;
    }
    return 0;
}

/* Heads and epsilon: opts, then the HF config.json, then width/64. */
static int resolve_heads(import_ctx *ic, const gpt2_import_opts *o, const char *path,
                         int got, char *err, size_t err_cap) {
    if (got && check_hf_shape(ic, path, err, err_cap) != 0) return -1;
    if (o->heads) ic->heads = o->heads;
    if (!ic->heads) {
        if (ic->C % 64 != 0) {
            util_set_err(err, err_cap,
                         "cannot tell the number of heads for width "
                         "%llu (give --heads N)",
                         (unsigned long long)ic->C);
            return -1;
        }
        ic->heads = (uint32_t)(ic->C / 64);
    }
    if (ic->C % ic->heads != 0) {
        util_set_err(err, err_cap, "%u heads do not divide the width %llu", ic->heads,
                     (unsigned long long)ic->C);
        return -1;
    }
    return 0;
}

/* Open one more safetensors file. */
static int add_file(import_ctx *ic, const char *path, char *err, size_t err_cap) {
    if (ic->n_st == MAX_SHARDS) {
        util_set_err(err, err_cap, "%s: more than %d shards", ic->file, MAX_SHARDS);
        return -1;
    }
    snprintf(ic->st_names[ic->n_st], PATH_MAX, "%s", path);
    if (safetensors_open(path, &ic->st[ic->n_st], err, err_cap) != 0) return -1;
    ic->n_st++;
    return 0;
}

/* The shards of DIR/model.safetensors.index.json: its "weight_map" {tensor:
 * file} names files in DIR; every tensor it lists must be in the file it
 * names, and every tensor of a shard listed there. */
static int open_index(import_ctx *ic, const char *dir, const char *ipath, char *err,
                      size_t err_cap) {
    char *text = NULL;
    if (fsio_read_file(ipath, HF_INDEX_MAX_BYTES, &text, NULL, err, err_cap) != 0)
        return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    int rc = -1;
    if (!cJSON_IsObject(wm) || !wm->child) {
        util_set_err(err, err_cap, "%s: no \"weight_map\" object", ipath);
        goto out;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        const char *fn = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!fn || !fn[0] || strchr(fn, '/') || strcmp(fn, ".") == 0 ||
            strcmp(fn, "..") == 0) {
            util_set_err(err, err_cap,
                         "%s: weight_map[\"%s\"] is not a file name in the directory",
                         ipath, e->string);
            goto out;
        }
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, fn) >= sizeof path) {
            util_set_err(err, err_cap, "%s/%s: path too long", dir, fn);
            goto out;
        }
        size_t f = 0;
        while (f < ic->n_st && strcmp(ic->st_names[f], path) != 0) f++;
        if (f == ic->n_st && add_file(ic, path, err, err_cap) != 0) goto out;
        if (!safetensors_find(ic->st[f], e->string)) {
            util_set_err(err, err_cap, "%s: tensor '%s' is not in %s, as the index says",
                         ipath, e->string, fn);
            goto out;
        }
    }
    for (size_t f = 0; f < ic->n_st; f++) {
        for (size_t i = 0; i < safetensors_count(ic->st[f]); i++) {
            const char *n = safetensors_get(ic->st[f], i)->name;
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(wm, n);
            const char *slash = strrchr(ic->st_names[f], '/');
            if (!e || strcmp(e->valuestring, slash + 1) != 0) {
                util_set_err(err, err_cap, "%s: tensor '%s' is not in the index %s",
                             ic->st_names[f], n, ipath);
                goto out;
            }
        }
    }
    rc = 0;
out:
    cJSON_Delete(j);
    return rc;
}

/* The input: a Hugging Face directory (model.safetensors, else the index's
 * shards; config.json inside) or one safetensors file (config.json beside
 * it). cfg_path receives the config.json to read. */
static int open_input(import_ctx *ic, const gpt2_import_opts *o, char *cfg_path,
                      size_t cap, char *err, size_t err_cap) {
    ic->st = util_calloc(MAX_SHARDS, sizeof *ic->st);
    ic->st_names = util_calloc(MAX_SHARDS, sizeof *ic->st_names);
    if (!ic->st || !ic->st_names) return oom(ic, err, err_cap);
    const char *in = o->input;
    if (!ckpt_is_dir(in)) {
        const char *slash = strrchr(in, '/');
        snprintf(cfg_path, cap, "%.*s/config.json", slash ? (int)(slash - in) : 1,
                 slash ? in : ".");
        return add_file(ic, in, err, err_cap);
    }
    char one[PATH_MAX], idx[PATH_MAX];
    if ((size_t)snprintf(one, sizeof one, "%s/model.safetensors", in) >= sizeof one ||
        (size_t)snprintf(idx, sizeof idx, "%s/" HF_INDEX_FILE, in) >= sizeof idx) {
        util_set_err(err, err_cap, "%s: path too long", in);
        return -1;
    }
    snprintf(cfg_path, cap, "%s/config.json", in);
    if (ckpt_exists(one)) return add_file(ic, one, err, err_cap);
    if (ckpt_exists(idx)) return open_index(ic, in, idx, err, err_cap);
    util_set_err(err, err_cap,
                 "%s: holds neither model.safetensors nor " HF_INDEX_FILE
                 " (not a Hugging Face model directory)",
                 in);
    return -1;
}

/* Shape text "[a,b,...]" of t. */
static void shape_text(const safetensors_tensor *t, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (uint32_t k = 0; k < t->ndim && n < cap; k++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu", k ? "," : "",
                              (unsigned long long)t->shape[k]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Convert one tensor (orch shape rows x cols, or a vector when cols == 0)
 * into out[n_out]. conv1d: the file holds [cols, rows]. */
static int take(import_ctx *ic, const char *name, uint64_t rows, uint64_t cols,
                int conv1d, char *err, size_t err_cap) {
    const safetensors_tensor *t = find(ic, name);
    if (!t) {
        util_set_err(err, err_cap, "%s: missing tensor '%s'", ic->file, name);
        return -1;
    }
    if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_F16 &&
        t->dtype != SAFETENSORS_BF16) {
        util_set_err(err, err_cap,
                     "%s: tensor '%s' has dtype %s (need F32, F16 "
                     "or BF16)",
                     ic->file, t->name, safetensors_dtype_name(t->dtype));
        return -1;
    }
    uint64_t want0 = conv1d ? cols : rows, want1 = conv1d ? rows : cols;
    int ok = cols ? (t->ndim == 2 && t->shape[0] == want0 && t->shape[1] == want1)
                  : (t->ndim == 1 && t->shape[0] == rows);
    if (!ok) {
        char got[160];
        shape_text(t, got, sizeof got);
        if (cols)
            util_set_err(err, err_cap,
                         "%s: tensor '%s' has shape %s, expected [%llu,%llu]%s", ic->file,
                         t->name, got, (unsigned long long)want0,
                         (unsigned long long)want1,
                         conv1d ? " (Hugging Face Conv1D layout [in, out])" : "");
        else
            util_set_err(err, err_cap, "%s: tensor '%s' has shape %s, expected [%llu]",
                         ic->file, t->name, got, (unsigned long long)rows);
        return -1;
    }
    uint64_t n = cols ? rows * cols : rows;
    float *d = malloc(n ? (size_t)n * sizeof *d : 1);
    float *src = conv1d ? malloc((size_t)n * sizeof *src) : d;
    if (!d || !src) {
        free(d);
        if (src != d) free(src);
        return oom(ic, err, err_cap);
    }
    safetensors_to_f32(t->dtype, t->data, src, n); /* dtype checked above */
    if (conv1d) {
        /* out[r][c] = in[c][r], in is [cols, rows]. */
        for (uint64_t c = 0; c < cols; c++)
            for (uint64_t r = 0; r < rows; r++) d[r * cols + c] = src[c * rows + r];
        free(src);
    }
    ckpt_tensor *o = &ic->out[ic->n_out];
    snprintf(ic->names[ic->n_out], sizeof ic->names[0], "%s", name);
    o->name = ic->names[ic->n_out];
    o->dtype = SAFETENSORS_F32;
    o->ndim = cols ? 2 : 1;
    o->shape[0] = rows;
    o->shape[1] = cols;
    o->data = d;
    ic->n_out++;
    return 0;
}

/* Every tensor, in engine table order. */
static int convert_all(import_ctx *ic, char *err, size_t err_cap) {
    const uint64_t C = ic->C, M = ic->M;
    size_t n_total = 4 + (size_t)ic->layers * N_LAYER_TENSORS;
    if (n_total > MAX_TENSORS) {
        util_set_err(err, err_cap, "%s: too many layers (%u)", ic->file, ic->layers);
        return -1;
    }
    ic->out = util_calloc(n_total, sizeof *ic->out);
    ic->names = util_calloc(n_total, sizeof *ic->names);
    if (!ic->out || !ic->names) return oom(ic, err, err_cap);
    if (take(ic, "wte.weight", ic->V, C, 0, err, err_cap) != 0 ||
        take(ic, "wpe.weight", ic->T, C, 0, err, err_cap) != 0)
        return -1;
    for (uint32_t l = 0; l < ic->layers; l++) {
        for (size_t k = 0; k < N_LAYER_TENSORS; k++) {
            const char *sfx = layer_tensors[k].suffix;
            char name[64];
            snprintf(name, sizeof name, "h.%u.%s", l, sfx);
            uint64_t rows = C, cols = 0;
            if (strcmp(sfx, "attn.c_attn.weight") == 0)
                rows = 3 * C, cols = C;
            else if (strcmp(sfx, "attn.c_attn.bias") == 0)
                rows = 3 * C;
            else if (strcmp(sfx, "attn.c_proj.weight") == 0)
                cols = C;
            else if (strcmp(sfx, "mlp.c_fc.weight") == 0)
                rows = M, cols = C;
            else if (strcmp(sfx, "mlp.c_fc.bias") == 0)
                rows = M;
            else if (strcmp(sfx, "mlp.c_proj.weight") == 0)
                cols = M;
            if (take(ic, name, rows, cols, layer_tensors[k].conv1d, err, err_cap) != 0)
                return -1;
        }
    }
    return take(ic, "ln_f.weight", C, 0, 0, err, err_cap) != 0 ||
                   take(ic, "ln_f.bias", C, 0, 0, err, err_cap) != 0
               ? -1
               : 0;
}

/* The config: the model from the weights, the rest from base or defaults.
 * Returns a new cJSON document, or NULL when out of memory. */
static cJSON *config_doc(const gpt2_import_model *m, const orch_config *base,
                         const char *data_tok, int omit_tie) {
    cJSON *doc = base ? (cJSON *)config_to_cjson(base) : cJSON_CreateObject();
    if (!doc) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(doc, "model");
    cJSON *model = cJSON_AddObjectToObject(doc, "model");
    if (!model) {
        cJSON_Delete(doc);
        return NULL;
    }
    uint64_t context = m->llama ? m->llama->context : m->context;
    if (m->llama) {
        if (llama_model_to_json(m->llama, omit_tie, model) != 0) {
            cJSON_Delete(doc);
            return NULL;
        }
    } else {
        cJSON_AddStringToObject(model, "arch", "gpt2");
        cJSON_AddNumberToObject(model, "vocab_size", (double)m->vocab);
        cJSON_AddNumberToObject(model, "context", (double)m->context);
        cJSON_AddNumberToObject(model, "layers", m->layers);
        cJSON_AddNumberToObject(model, "heads", m->heads);
        cJSON_AddNumberToObject(model, "width", (double)m->width);
        cJSON_AddNumberToObject(model, "mlp_width", (double)m->mlp_width);
        cJSON_AddNumberToObject(model, "layernorm_eps", m->eps);
    }
    if (base) {
        cJSON *da = cJSON_GetObjectItemCaseSensitive(doc, "data");
        if (da)
            cJSON_ReplaceItemInObjectCaseSensitive(da, "tokenizer",
                                                   cJSON_CreateString(data_tok));
        return doc;
    }
    cJSON *tr = cJSON_AddObjectToObject(doc, "train");
    cJSON_AddNumberToObject(tr, "micro_batch", 4);
    cJSON_AddNumberToObject(tr, "seq_len", (double)(context < 1024 ? context : 1024));
    cJSON_AddNumberToObject(tr, "max_steps", 1000);
    cJSON_AddNumberToObject(tr, "lr", 6e-5);
    cJSON *da = cJSON_AddObjectToObject(doc, "data");
    cJSON_AddStringToObject(da, "tokenizer", data_tok);
    cJSON_AddStringToObject(da, "train", "data/finetune/train_*.bin");
    cJSON_AddStringToObject(da, "val", "data/finetune/val_*.bin");
    cJSON *en = cJSON_AddObjectToObject(doc, "engine");
    cJSON_AddStringToObject(en, "name", "cpu");
    return doc;
}

int gpt2_import_texts(const gpt2_import_model *m, const char *input,
                      const char *base_config, char **state_text, char **cfg_text,
                      char *err, size_t err_cap) {
    orch_config *base = NULL, *cfg = NULL;
    *state_text = *cfg_text = NULL;
    if (base_config && config_load_file(base_config, &base, err, err_cap) != 0)
        return GPT2_IMPORT_ERR_INPUT;
    cJSON *state = NULL;
    /* Fallbacks for a config schema without some keys: model.tie_embeddings
     * left out when the config's own default head is the model's, and an
     * "hf" data.tokenizer written as byte (state.json keeps "hf", which is
     * what inference opens). The first attempt's message is the one kept. */
    int rc = -1;
    for (int a = 0; a < 4 && rc != 0; a++) {
        int omit_tie = a & 1, byte_tok = a >> 1;
        if ((omit_tie && !m->llama) || (byte_tok && strcmp(m->tokenizer, "hf") != 0))
            continue;
        cJSON *doc = config_doc(m, base, byte_tok ? "byte" : m->tokenizer, omit_tie);
        if (!doc) {
            config_free(base);
            goto oom;
        }
        char e2[1024];
        rc = config_from_cjson(doc, "imported config", &cfg, a ? e2 : err,
                               a ? sizeof e2 : err_cap);
        cJSON_Delete(doc);
        if (rc == 0 && omit_tie) {
            orch_model_desc d;
            config_model_desc(cfg, &d);
            if (!(d.flags & ORCH_MODEL_FLAG_UNTIED_HEAD) != !!m->llama->tied) {
                config_free(cfg);
                cfg = NULL;
                rc = -1;
            }
        }
    }
    config_free(base);
    if (rc != 0) return GPT2_IMPORT_ERR_INPUT;
    state = cJSON_CreateObject();
    cJSON *cj = state ? config_to_cjson(cfg) : NULL;
    if (cj) {
        cJSON_AddNumberToObject(state, "format", 1);
        cJSON_AddNumberToObject(state, "step", 0);
        cJSON_AddStringToObject(state, "tokenizer", m->tokenizer);
        cJSON_AddStringToObject(state, "imported_from", input);
        cJSON_AddItemToObject(state, "config", cj);
        *state_text = cJSON_Print(state);
        *cfg_text = config_to_json(cfg);
    }
    cJSON_Delete(state);
    config_free(cfg);
    if (cj && *state_text && *cfg_text) return 0;
    free(*state_text);
    free(*cfg_text);
    *state_text = *cfg_text = NULL;
oom:
    util_set_err(err, err_cap, "out of memory");
    return GPT2_IMPORT_ERR_RUNTIME;
}

/* state.json text and the config text (both malloc'd). */
static int build_texts(import_ctx *ic, const gpt2_import_opts *o, char **state_text,
                       char **cfg_text, char *err, size_t err_cap) {
    gpt2_import_model m = { ic->V,     ic->T,   ic->C,   ic->M, ic->layers,
                            ic->heads, ic->eps, ic->tok, NULL };
    int kind = gpt2_import_texts(&m, o->input, o->base_config, state_text, cfg_text, err,
                                 err_cap);
    if (kind == 0) return 0;
    ic->kind = kind;
    return -1;
}

static int write_outputs(import_ctx *ic, const gpt2_import_opts *o,
                         const char *state_text, const char *cfg_text, char *err,
                         size_t err_cap) {
    ic->kind = GPT2_IMPORT_ERR_RUNTIME;
    if (ckpt_write_dir(o->out_dir, ic->out, ic->n_out, state_text, 0, err, err_cap) != 0)
        return -1;
    if (!o->config_out) return 0;
    size_t n = strlen(cfg_text);
    char *text = malloc(n + 2);
    if (!text) return oom(ic, err, err_cap);
    memcpy(text, cfg_text, n);
    text[n] = '\n';
    text[n + 1] = '\0';
    int rc = fsio_write_atomic(o->config_out, text, n + 1, err, err_cap);
    free(text);
    return rc;
}

/* ---- LLaMA family ------------------------------------------------------ */

/* rotary_emb.inv_freq: a buffer older transformers saved, not a parameter. */
static int llama_skipped(const char *n) {
    static const char sfx[] = ".self_attn.rotary_emb.inv_freq";
    size_t l = strlen(n), ls = sizeof sfx - 1;
    return l > ls && strncmp(n, "model.layers.", 13) == 0 && strcmp(n + l - ls, sfx) == 0;
}

/* Every tensor must be in the table, a skipped buffer, or the tied head;
 * none in two files. */
static int llama_scan(import_ctx *ic, char *err, size_t err_cap) {
    const llama_model *m = &ic->lm;
    size_t n = llama_model_tensor_count(m);
    for (size_t f = 0; f < ic->n_st; f++) {
        const safetensors_file *st = ic->st[f];
        for (size_t i = 0; i < safetensors_count(st); i++) {
            const char *full = safetensors_get(st, i)->name;
            for (size_t g = 0; g < f; g++)
                if (safetensors_find(ic->st[g], full)) {
                    util_set_err(err, err_cap, "%s: tensor '%s' is also in %s",
                                 ic->st_names[f], full, ic->st_names[g]);
                    return -1;
                }
            if (llama_skipped(full) || (m->tied && strcmp(full, "lm_head.weight") == 0))
                continue;
            int known = 0;
            for (size_t k = 0; !known && k < n; k++) {
                char name[96];
                uint64_t shape[2];
                int lk;
                llama_model_tensor(m, k, name, sizeof name, shape, &lk);
                known = strcmp(name, full) == 0;
            }
            if (!known) {
                util_set_err(err, err_cap,
                             "%s: unexpected tensor '%s' (not a parameter of orch's "
                             "llama with %u layers and %s head: no biases)",
                             ic->st_names[f], full, m->layers,
                             m->tied ? "a tied" : "an untied");
                return -1;
            }
        }
    }
    return 0;
}

/* A tied model's lm_head.weight, when the file has one, must be the
 * embedding. */
static int llama_check_tied_head(import_ctx *ic, char *err, size_t err_cap) {
    const safetensors_tensor *h = find(ic, "lm_head.weight");
    const safetensors_tensor *e = find(ic, "model.embed_tokens.weight");
    if (!ic->lm.tied || !h) return 0;
    if (e && h->dtype == e->dtype && h->ndim == e->ndim && h->numel == e->numel &&
        h->shape[0] == e->shape[0] && h->nbytes == e->nbytes &&
        memcmp(h->data, e->data, (size_t)h->nbytes) == 0)
        return 0;
    util_set_err(err, err_cap,
                 "%s: tie_word_embeddings is true but lm_head.weight differs from "
                 "model.embed_tokens.weight",
                 ic->file);
    return -1;
}

static int llama_convert(import_ctx *ic, char *err, size_t err_cap) {
    const llama_model *m = &ic->lm;
    size_t n = llama_model_tensor_count(m);
    ic->out = util_calloc(n, sizeof *ic->out);
    ic->names = util_calloc(n, sizeof *ic->names);
    if (!ic->out || !ic->names) return oom(ic, err, err_cap);
    for (size_t k = 0; k < n; k++) {
        char name[64];
        uint64_t shape[2];
        int lk;
        llama_model_tensor(m, k, name, sizeof name, shape, &lk);
        if (take(ic, name, shape[0], shape[1], 0, err, err_cap) != 0) return -1;
    }
    return 0;
}

typedef struct llama_copy {
    const char *src_dir;
    int kind;
} llama_copy;

static int llama_copy_files(const char *tmp, void *user, char *err, size_t err_cap) {
    llama_copy *c = user;
    return hf_llama_copy_tokenizer(c->src_dir, tmp, &c->kind, err, err_cap);
}

/* The LLaMA import after config.json (ic->lm) and the weights are open. */
static int llama_import(import_ctx *ic, const gpt2_import_opts *o, const char *cfg_path,
                        char *err, size_t err_cap) {
    if (o->heads && o->heads != ic->lm.heads) {
        util_set_err(err, err_cap, "--heads %u differs from num_attention_heads %u in %s",
                     o->heads, ic->lm.heads, cfg_path);
        return -1;
    }
    char dir[PATH_MAX], tj[PATH_MAX + 32];
    const char *slash = strrchr(cfg_path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - cfg_path) : 1,
             slash ? cfg_path : ".");
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    ic->tok = o->tokenizer ? o->tokenizer : "hf";
    if (strcmp(ic->tok, "hf") == 0 && !ckpt_exists(tj)) {
        util_set_err(err, err_cap,
                     "%s: no such file (the model's tokenizer; or give --tokenizer "
                     "byte|gpt2)",
                     tj);
        return -1;
    }
    if (llama_scan(ic, err, err_cap) != 0 ||
        llama_check_tied_head(ic, err, err_cap) != 0 ||
        llama_convert(ic, err, err_cap) != 0)
        return -1;
    gpt2_import_model gm = { ic->lm.vocab,     ic->lm.context, ic->lm.width,
                             ic->lm.mlp_width, ic->lm.layers,  ic->lm.heads,
                             ic->lm.eps,       ic->tok,        &ic->lm };
    char *state_text = NULL, *cfg_text = NULL;
    int kind = gpt2_import_texts(&gm, o->input, o->base_config, &state_text, &cfg_text,
                                 err, err_cap);
    if (kind != 0) {
        ic->kind = kind;
        return -1;
    }
    llama_copy cp = { dir, 0 };
    int hf = strcmp(ic->tok, "hf") == 0;
    int rc = ckpt_write_dir_extra(o->out_dir, ic->out, ic->n_out, state_text, 0,
                                  hf ? llama_copy_files : NULL, &cp, err, err_cap);
    ic->kind = cp.kind == 1 ? GPT2_IMPORT_ERR_INPUT : GPT2_IMPORT_ERR_RUNTIME;
    if (rc == 0 && o->config_out) {
        size_t n = strlen(cfg_text);
        char *text = malloc(n + 2);
        if (!text) {
            rc = oom(ic, err, err_cap);
        } else {
            memcpy(text, cfg_text, n);
            memcpy(text + n, "\n", 2);
            rc = fsio_write_atomic(o->config_out, text, n + 1, err, err_cap);
            free(text);
        }
    }
    free(state_text);
    free(cfg_text);
    return rc;
}

int gpt2_import(const gpt2_import_opts *o, gpt2_import_result *r, int *err_kind,
                char *err, size_t err_cap) {
    *err_kind = GPT2_IMPORT_ERR_INPUT;
    if (!o->input || !o->out_dir) {
        util_set_err(err, err_cap, "need an input file and an output directory");
        return -1;
    }
    if (o->tokenizer && strcmp(o->tokenizer, "gpt2") != 0 &&
        strcmp(o->tokenizer, "byte") != 0 && strcmp(o->tokenizer, "hf") != 0) {
        util_set_err(err, err_cap, "--tokenizer: '%s' is not gpt2, byte or hf",
                     o->tokenizer);
        return -1;
    }
    import_ctx ic;
    memset(&ic, 0, sizeof ic);
    ic.file = o->input;
    ic.eps = 1e-5;
    ic.kind = GPT2_IMPORT_ERR_INPUT;
    char *state_text = NULL, *cfg_text = NULL, cfg_path[PATH_MAX];
    int rc = -1;
    if (open_input(&ic, o, cfg_path, sizeof cfg_path, err, err_cap) != 0) goto out;
    if (o->hf_config) snprintf(cfg_path, sizeof cfg_path, "%s", o->hf_config);
    char e2[1024];
    int got = read_hf_config(&ic, cfg_path, e2, sizeof e2);
    if (got < 0 || (got == 0 && o->hf_config)) {
        if (got == 0) util_set_err(e2, sizeof e2, "%s: no such file", cfg_path);
        util_set_err(err, err_cap, "%s%s", o->hf_config ? "--hf-config: " : "", e2);
        goto out;
    }
    if (ic.llama) {
        if (llama_import(&ic, o, cfg_path, err, err_cap) != 0) goto out;
        memset(r, 0, sizeof *r);
        r->layers = ic.lm.layers;
        r->heads = ic.lm.heads;
        r->kv_heads = ic.lm.kv_heads;
        r->width = ic.lm.width;
        r->mlp_width = ic.lm.mlp_width;
        r->vocab = ic.lm.vocab;
        r->context = ic.lm.context;
        r->layernorm_eps = ic.lm.eps;
        r->tied = ic.lm.tied;
        snprintf(r->tokenizer, sizeof r->tokenizer, "%s", ic.tok);
        snprintf(r->arch, sizeof r->arch, "llama");
        for (size_t i = 0; i < ic.n_out; i++)
            r->params +=
                ic.out[i].shape[0] * (ic.out[i].ndim == 2 ? ic.out[i].shape[1] : 1);
        rc = 0;
        goto out;
    }
    if (o->tokenizer && strcmp(o->tokenizer, "hf") == 0) {
        util_set_err(err, err_cap,
                     "--tokenizer hf: not for GPT-2 weights (gpt2 or byte)");
        goto out;
    }
    if (scan_names(&ic, err, err_cap) != 0 || read_shape(&ic, err, err_cap) != 0 ||
        resolve_heads(&ic, o, cfg_path, got, err, err_cap) != 0)
        goto out;
    ic.tok = o->tokenizer ? o->tokenizer : ic.V >= 50257 ? "gpt2" : "byte";
    if (convert_all(&ic, err, err_cap) != 0 ||
        build_texts(&ic, o, &state_text, &cfg_text, err, err_cap) != 0 ||
        write_outputs(&ic, o, state_text, cfg_text, err, err_cap) != 0)
        goto out;
    memset(r, 0, sizeof *r);
    r->layers = ic.layers;
    r->heads = ic.heads;
    r->width = ic.C;
    r->mlp_width = ic.M;
    r->vocab = ic.V;
    r->context = ic.T;
    r->layernorm_eps = ic.eps;
    r->kv_heads = ic.heads;
    snprintf(r->tokenizer, sizeof r->tokenizer, "%s", ic.tok);
    snprintf(r->arch, sizeof r->arch, "gpt2");
    for (size_t i = 0; i < ic.n_out; i++)
        r->params += ic.out[i].shape[0] * (ic.out[i].ndim == 2 ? ic.out[i].shape[1] : 1);
    rc = 0;
out:
    if (rc != 0) *err_kind = ic.kind;
    for (size_t i = 0; i < ic.n_out; i++) free((void *)ic.out[i].data);
    free(ic.out);
    free(ic.names);
    free(state_text);
    free(cfg_text);
    for (size_t i = 0; i < ic.n_st; i++) safetensors_close(ic.st[i]);
    free(ic.st);
    free(ic.st_names);
    return rc;
}
