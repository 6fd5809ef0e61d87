/*
 * hf_export.c - orch GPT-2 checkpoint -> Hugging Face model directory (see
 * hf_export.h): the checkpoint, config.json and the other JSON files, the
 * GPT-2 vocabulary copied as vocab.json / merges.txt, and model.safetensors
 * in HF's names and Conv1D layout, all in a temp directory renamed into
 * place.
 */
#include "orchestrator/store/hf_export.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/store/ckpt_files.h"
#include "orchestrator/store/gguf.h"
#include "orchestrator/store/gpt2_import.h"
#include "orchestrator/store/hf_llama.h"
#include "orchestrator/store/llama_model.h"
#include "orchestrator/store/safetensors.h"

#define GPT2_EOT          50256
#define GPT2_VOCAB_TOKENS 50257
#define VOCAB_FILE_MAX    ((size_t)64 << 20)
#define HF_PREFIX         "transformer."

typedef struct hx_ctx {
    const hf_export_opts *o;
    ckpt_model ck;
    const config_model *m;
    int dtype; /* SAFETENSORS_F32 / F16 / BF16 */
    int gpt2_tok, hf_tok;
    int llama; /* model.arch llama: lm holds the model */
    llama_model lm;
    char tmp[PATH_MAX];
    int kind;
} hx_ctx;

static int fail(hx_ctx *x, int kind) {
    x->kind = kind;
    return -1;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Name k of the engine-order table (wte, wpe, h.N.*, ln_f), shape from the
 * config in orch's layout, and whether it is a Conv1D weight. */
static void tensor_at(const config_model *m, size_t k, char *name, size_t cap,
                      uint64_t shape[2], uint32_t *ndim, int *conv1d) {
    const uint64_t C = m->width, M = m->mlp_width;
    size_t nl = GPT2_HF_LAYER_TENSORS;
    *conv1d = 0;
    *ndim = 1;
    shape[0] = C, shape[1] = 0;
    if (k < 2) {
        snprintf(name, cap, "%s", k == 0 ? "wte.weight" : "wpe.weight");
        shape[0] = k == 0 ? m->vocab_size : m->context, shape[1] = C, *ndim = 2;
        return;
    }
    k -= 2;
    if (k >= (size_t)m->layers * nl) {
        snprintf(name, cap, "%s",
                 k == (size_t)m->layers * nl ? "ln_f.weight" : "ln_f.bias");
        return;
    }
    const char *sfx = gpt2_hf_layer_tensor(k % nl, conv1d);
    snprintf(name, cap, "h.%zu.%s", k / nl, sfx);
    if (strcmp(sfx, "attn.c_attn.weight") == 0)
        shape[0] = 3 * C, shape[1] = C;
    else if (strcmp(sfx, "attn.c_attn.bias") == 0)
        shape[0] = 3 * C;
    else if (strcmp(sfx, "attn.c_proj.weight") == 0)
        shape[1] = C;
    else if (strcmp(sfx, "mlp.c_fc.weight") == 0)
        shape[0] = M, shape[1] = C;
    else if (strcmp(sfx, "mlp.c_fc.bias") == 0)
        shape[0] = M;
    else if (strcmp(sfx, "mlp.c_proj.weight") == 0)
        shape[1] = M;
    if (shape[1]) *ndim = 2;
}

static size_t tensor_count(const config_model *m) {
    return 4 + (size_t)m->layers * GPT2_HF_LAYER_TENSORS;
}

/* Find tensor k in the checkpoint and check its shape and dtype. */
static const safetensors_tensor *source(hx_ctx *x, size_t k, char *name, int *conv1d,
                                        char *err, size_t err_cap) {
    uint64_t shape[2];
    uint32_t nd;
    if (x->llama) {
        int lk;
        llama_model_tensor(&x->lm, k, name, 64, shape, &lk);
        nd = shape[1] ? 2 : 1;
        *conv1d = 0;
    } else {
        tensor_at(x->m, k, name, 64, shape, &nd, conv1d);
    }
    const safetensors_tensor *t = safetensors_find(x->ck.st, name);
    if (!t) {
        util_set_err(err, err_cap, "%s: missing tensor '%s'", x->ck.st_path, name);
        return NULL;
    }
    if (t->ndim != nd || t->shape[0] != shape[0] ||
        (nd == 2 && t->shape[1] != shape[1])) {
        util_set_err(
            err, err_cap,
            "%s: tensor '%s' does not have the shape of the config ([%llu%s%.0llu])",
            x->ck.st_path, name, (unsigned long long)shape[0], nd == 2 ? "," : "",
            (unsigned long long)shape[1]);
        return NULL;
    }
    if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_F16 &&
        t->dtype != SAFETENSORS_BF16) {
        util_set_err(err, err_cap, "%s: tensor '%s' has dtype %s (need F32, F16 or BF16)",
                     x->ck.st_path, name, safetensors_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* DIR/NAME of the temp directory. */
static int tmp_path(hx_ctx *x, const char *name, char *out, size_t cap, char *err,
                    size_t err_cap) {
    return ckpt_path_join(out, cap, x->tmp, name, err, err_cap);
}

static int write_weights(hx_ctx *x, hf_export_result *r, char *err, size_t err_cap) {
    char path[PATH_MAX + 64];
    safetensors_writer *w = NULL;
    size_t n = x->llama ? llama_model_tensor_count(&x->lm) : tensor_count(x->m);
    if (safetensors_count(x->ck.st) != n) {
        util_set_err(
            err, err_cap, "%s: holds %zu tensors, a %s model of %u layers has %zu",
            x->ck.st_path, safetensors_count(x->ck.st), x->m->arch, x->m->layers, n);
        return fail(x, GPT2_IMPORT_ERR_INPUT);
    }
    uint64_t max_numel = 0;
    for (size_t k = 0; k < n; k++) {
        char name[64];
        int conv1d;
        const safetensors_tensor *t = source(x, k, name, &conv1d, err, err_cap);
        if (!t) return fail(x, GPT2_IMPORT_ERR_INPUT);
        if (t->numel > max_numel) max_numel = t->numel;
    }
    if (tmp_path(x, CKPT_MODEL_FILE, path, sizeof path, err, err_cap) != 0 ||
        safetensors_writer_create(path, &w, err, err_cap) != 0 ||
        safetensors_writer_add_metadata(w, "format", "pt", err, err_cap) != 0)
        goto runtime;
    for (size_t k = 0; k < n; k++) {
        char name[64], hf[96];
        int conv1d;
        const safetensors_tensor *t = source(x, k, name, &conv1d, err, err_cap);
        uint64_t shape[2] = { t->shape[0], t->ndim == 2 ? t->shape[1] : 0 };
        if (conv1d) shape[0] = t->shape[1], shape[1] = t->shape[0];
        snprintf(hf, sizeof hf, "%s%s", x->llama ? "" : HF_PREFIX, name);
        if (safetensors_writer_declare(w, hf, x->dtype, t->ndim, shape, err, err_cap) !=
            0)
            goto runtime;
        r->params += t->numel;
    }
    if (safetensors_writer_begin_data(w, err, err_cap) != 0) goto runtime;
    float *f = malloc((size_t)max_numel * sizeof *f + 1);
    float *tr = malloc((size_t)max_numel * sizeof *tr + 1);
    uint16_t *h = malloc((size_t)max_numel * sizeof *h + 1);
    int rc = -1;
    if (!f || !tr || !h) {
        util_set_err(err, err_cap, "out of memory");
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        char name[64];
        int conv1d;
        const safetensors_tensor *t = source(x, k, name, &conv1d, err, err_cap);
        (void)safetensors_to_f32(t->dtype, t->data, f, t->numel); /* dtype checked */
        const float *src = f;
        if (conv1d) { /* orch [rows, cols] -> HF [cols, rows] */
            uint64_t rows = t->shape[0], cols = t->shape[1];
            for (uint64_t i = 0; i < rows; i++)
                for (uint64_t j = 0; j < cols; j++) tr[j * rows + i] = f[i * cols + j];
            src = tr;
        }
        const void *data = src;
        size_t bytes = (size_t)t->numel * 4;
        if (x->dtype != SAFETENSORS_F32) {
            for (uint64_t e = 0; e < t->numel; e++)
                h[e] = x->dtype == SAFETENSORS_F16 ? gguf_f32_to_f16(src[e])
                                                   : f32_to_bf16(src[e]);
            data = h;
            bytes = (size_t)t->numel * 2;
        }
        if (safetensors_writer_write(w, data, bytes, err, err_cap) != 0) goto out;
    }
    safetensors_writer *done = w;
    w = NULL;
    if (safetensors_writer_finish(done, NULL, err, err_cap) != 0) goto out;
    r->tensors = n;
    rc = 0;
out:
    free(f);
    free(tr);
    free(h);
    safetensors_writer_abort(w);
    return rc ? fail(x, GPT2_IMPORT_ERR_RUNTIME) : 0;
runtime:
    safetensors_writer_abort(w);
    return fail(x, GPT2_IMPORT_ERR_RUNTIME);
}

/* Print doc into the temp directory as NAME (doc is deleted). */
static int write_json(hx_ctx *x, const char *name, cJSON *doc, char *err,
                      size_t err_cap) {
    char path[PATH_MAX + 64];
    char *text = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    int rc = -1;
    if (!text) {
        util_set_err(err, err_cap, "out of memory");
    } else if (tmp_path(x, name, path, sizeof path, err, err_cap) == 0) {
        size_t len = strlen(text);
        text[len] = '\n'; /* replaces the NUL; the length is known */
        rc = fsio_write_file(path, text, len + 1, err, err_cap);
    }
    free(text);
    return rc ? fail(x, GPT2_IMPORT_ERR_RUNTIME) : 0;
}

static const char *torch_dtype(int dtype) {
    return dtype == SAFETENSORS_F16    ? "float16"
           : dtype == SAFETENSORS_BF16 ? "bfloat16"
                                       : "float32";
}

/* config.json, and generation_config.json unless the tokenizer files
 * brought one. */
static int write_llama_configs(hx_ctx *x, char *err, size_t err_cap) {
    int id = x->gpt2_tok ? GPT2_EOT : -1;
    cJSON *c = hf_llama_config(&x->lm, torch_dtype(x->dtype), id, id);
    if (write_json(x, "config.json", c, err, err_cap) != 0) return -1;
    char path[PATH_MAX + 64];
    if (tmp_path(x, "generation_config.json", path, sizeof path, err, err_cap) != 0)
        return fail(x, GPT2_IMPORT_ERR_RUNTIME);
    if (ckpt_exists(path)) return 0;
    cJSON *g = cJSON_CreateObject();
    if (id >= 0) {
        cJSON_AddNumberToObject(g, "bos_token_id", id);
        cJSON_AddNumberToObject(g, "eos_token_id", id);
    }
    return write_json(x, "generation_config.json", g, err, err_cap);
}

static int write_configs(hx_ctx *x, char *err, size_t err_cap) {
    if (x->llama) return write_llama_configs(x, err, err_cap);
    const config_model *m = x->m;
    cJSON *c = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(c, "model_type", "gpt2");
    cJSON_AddStringToObject(c, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(c, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(c, "n_positions", m->context);
    cJSON_AddNumberToObject(c, "n_ctx", m->context);
    cJSON_AddNumberToObject(c, "n_embd", m->width);
    cJSON_AddNumberToObject(c, "n_layer", m->layers);
    cJSON_AddNumberToObject(c, "n_head", m->heads);
    if (m->mlp_width == 4 * m->width)
        cJSON_AddNullToObject(c, "n_inner");
    else
        cJSON_AddNumberToObject(c, "n_inner", m->mlp_width);
    cJSON_AddNumberToObject(c, "layer_norm_epsilon", m->layernorm_eps);
    cJSON_AddNumberToObject(c, "attn_pdrop", 0);
    cJSON_AddNumberToObject(c, "embd_pdrop", 0);
    cJSON_AddNumberToObject(c, "resid_pdrop", 0);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddBoolToObject(c, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", 1);
    cJSON_AddBoolToObject(c, "use_cache", 1);
    cJSON_AddStringToObject(c, "torch_dtype", torch_dtype(x->dtype));
    cJSON *g = cJSON_CreateObject();
    if (x->gpt2_tok) {
        cJSON_AddNumberToObject(c, "bos_token_id", GPT2_EOT);
        cJSON_AddNumberToObject(c, "eos_token_id", GPT2_EOT);
        cJSON_AddNumberToObject(g, "bos_token_id", GPT2_EOT);
        cJSON_AddNumberToObject(g, "eos_token_id", GPT2_EOT);
    }
    if (write_json(x, "config.json", c, err, err_cap) != 0) {
        cJSON_Delete(g);
        return -1;
    }
    return write_json(x, "generation_config.json", g, err, err_cap);
}

/* vocab.json / merges.txt (copies), tokenizer_config.json and
 * special_tokens_map.json. */
static int write_tokenizer(hx_ctx *x, char *err, size_t err_cap) {
    char vdir[4096];
    if (x->o->vocab_dir)
        snprintf(vdir, sizeof vdir, "%s", x->o->vocab_dir);
    else if (tokenizer_find_gpt2_dir(vdir, sizeof vdir, err, err_cap) != 0)
        return fail(x, GPT2_IMPORT_ERR_INPUT);
    static const char *const files[2][2] = { { "encoder.json", "vocab.json" },
                                             { "vocab.bpe", "merges.txt" } };
    for (int i = 0; i < 2; i++) {
        char src[PATH_MAX], dst[PATH_MAX + 64], *text = NULL;
        size_t len = 0;
        if (ckpt_path_join(src, sizeof src, vdir, files[i][0], err, err_cap) != 0 ||
            fsio_read_file(src, VOCAB_FILE_MAX, &text, &len, err, err_cap) != 0)
            return fail(x, GPT2_IMPORT_ERR_INPUT);
        int rc = tmp_path(x, files[i][1], dst, sizeof dst, err, err_cap) != 0 ||
                 fsio_write_file(dst, text, len, err, err_cap) != 0;
        free(text);
        if (rc) return fail(x, GPT2_IMPORT_ERR_RUNTIME);
    }
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "tokenizer_class", "GPT2Tokenizer");
    cJSON_AddStringToObject(t, "bos_token", "<|endoftext|>");
    cJSON_AddStringToObject(t, "eos_token", "<|endoftext|>");
    cJSON_AddStringToObject(t, "unk_token", "<|endoftext|>");
    cJSON_AddBoolToObject(t, "add_prefix_space", 0);
    cJSON_AddBoolToObject(t, "add_bos_token", 0);
    cJSON_AddNumberToObject(t, "model_max_length", x->m->context);
    if (write_json(x, "tokenizer_config.json", t, err, err_cap) != 0) return -1;
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "bos_token", "<|endoftext|>");
    cJSON_AddStringToObject(s, "eos_token", "<|endoftext|>");
    cJSON_AddStringToObject(s, "unk_token", "<|endoftext|>");
    return write_json(x, "special_tokens_map.json", s, err, err_cap);
}

static int check_input(hx_ctx *x, hf_export_result *r, char *err, size_t err_cap) {
    const hf_export_opts *o = x->o;
    if (!o->type || strcmp(o->type, "f32") == 0) {
        x->dtype = SAFETENSORS_F32;
    } else if (strcmp(o->type, "f16") == 0) {
        x->dtype = SAFETENSORS_F16;
    } else if (strcmp(o->type, "bf16") == 0) {
        x->dtype = SAFETENSORS_BF16;
    } else {
        util_set_err(err, err_cap, "--type: '%s' is not f32, f16 or bf16", o->type);
        return -1;
    }
    if (ckpt_exists(o->out)) {
        util_set_err(err, err_cap, "%s: already exists (give a new directory)", o->out);
        return -1;
    }
    if (ckpt_model_open(o->ckpt, &x->ck, err, err_cap) != 0) return -1;
    snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s", x->ck.dir);
    snprintf(r->warn, sizeof r->warn, "%s", x->ck.warn);
    x->m = &x->ck.cfg->model;
    x->llama = strcmp(x->m->arch, "llama") == 0;
    if (!x->llama && strcmp(x->m->arch, "gpt2") != 0) {
        util_set_err(err, err_cap,
                     "%s: model.arch '%s' has no Hugging Face export (supported: gpt2, "
                     "llama)",
                     r->ckpt_dir, x->m->arch);
        return -1;
    }
    if (x->llama &&
        llama_model_from_ckpt(x->ck.dir, x->ck.cfg, &x->lm, err, err_cap) != 0)
        return -1;
    x->hf_tok = strcmp(x->ck.tokenizer, "hf") == 0;
    if (x->hf_tok && !x->llama) {
        util_set_err(err, err_cap, "%s: the hf tokenizer goes with llama models only",
                     r->ckpt_dir);
        return -1;
    }
    if (!x->llama && x->m->kv_heads != x->m->heads) {
        util_set_err(err, err_cap, "%s: model.kv_heads %u != heads %u (gpt2 has none)",
                     r->ckpt_dir, x->m->kv_heads, x->m->heads);
        return -1;
    }
    x->gpt2_tok = strcmp(x->ck.tokenizer, "gpt2") == 0;
    if (!x->gpt2_tok && !x->hf_tok && strcmp(x->ck.tokenizer, "byte") != 0) {
        util_set_err(err, err_cap, "%s: unknown tokenizer '%s'", r->ckpt_dir,
                     x->ck.tokenizer);
        return -1;
    }
    if (x->gpt2_tok && x->m->vocab_size < GPT2_VOCAB_TOKENS) {
        util_set_err(err, err_cap, "%s: model.vocab_size %u is below the %u GPT-2 tokens",
                     r->ckpt_dir, x->m->vocab_size, GPT2_VOCAB_TOKENS);
        return -1;
    }
    return 0;
}

int hf_export(const hf_export_opts *o, hf_export_result *r, int *err_kind, char *err,
              size_t err_cap) {
    hx_ctx x;
    memset(&x, 0, sizeof x);
    memset(r, 0, sizeof *r);
    x.o = o;
    x.kind = GPT2_IMPORT_ERR_INPUT;
    int rc = -1, made = 0;
    if (!o->ckpt || !o->out) {
        util_set_err(err, err_cap, "need a checkpoint and an output directory");
        goto out;
    }
    if (check_input(&x, r, err, err_cap) != 0) goto out;
    r->layers = x.m->layers;
    r->no_tokenizer = !x.gpt2_tok && !x.hf_tok;
    r->llama = x.llama;
    x.kind = GPT2_IMPORT_ERR_RUNTIME;
    size_t ol = strlen(o->out);
    while (ol > 1 && o->out[ol - 1] == '/') ol--;
    if ((size_t)snprintf(x.tmp, sizeof x.tmp, "%.*s.tmp-%ld", (int)ol, o->out,
                         (long)getpid()) >= sizeof x.tmp) {
        util_set_err(err, err_cap, "%s: path too long", o->out);
        goto out;
    }
    if (fsio_rm_rf(x.tmp, err, err_cap) != 0 || fsio_mkdir(x.tmp, err, err_cap) != 0)
        goto out;
    made = 1;
    int copy_kind = 0;
    if (x.hf_tok &&
        hf_llama_copy_tokenizer(x.ck.dir, x.tmp, &copy_kind, err, err_cap) != 0) {
        x.kind = copy_kind == 1 ? GPT2_IMPORT_ERR_INPUT : GPT2_IMPORT_ERR_RUNTIME;
        goto out;
    }
    if (write_configs(&x, err, err_cap) != 0 ||
        (x.gpt2_tok && write_tokenizer(&x, err, err_cap) != 0) ||
        write_weights(&x, r, err, err_cap) != 0)
        goto out;
    x.kind = GPT2_IMPORT_ERR_RUNTIME;
    if (fsio_fsync_path(x.tmp, 1, err, err_cap) != 0) goto out;
    if (ckpt_exists(o->out)) {
        x.kind = GPT2_IMPORT_ERR_INPUT;
        util_set_err(err, err_cap, "%s: already exists (give a new directory)", o->out);
        goto out;
    }
    if (fsio_rename(x.tmp, o->out, err, err_cap) != 0 ||
        fsio_fsync_parent(o->out, err, err_cap) != 0)
        goto out;
    made = 0;
    rc = 0;
out:
    if (rc != 0) *err_kind = x.kind;
    if (made) {
        char e2[256];
        (void)fsio_rm_rf(x.tmp, e2, sizeof e2);
    }
    ckpt_model_close(&x.ck);
    return rc;
}
