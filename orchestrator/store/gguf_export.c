/*
 * gguf_export.c - orch checkpoint -> GGUF (see gguf_export.h): the checkpoint
 * and its config, the GPT-2 vocabulary as GGUF tokenizer metadata, the
 * hyperparameter keys, and each tensor converted to the chosen type.
 */
#include "orchestrator/store/gguf_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/bpe_vocab.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/store/gguf.h"
#include "orchestrator/store/gguf_hf_tok.h"
#include "orchestrator/store/gguf_model.h"
#include "orchestrator/store/gpt2_import.h"
#include "orchestrator/store/llama_model.h"
#include "orchestrator/store/safetensors.h"

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_UNUSED = 5 };

typedef struct export_ctx {
    const gguf_export_opts *o;
    ckpt_model ck;
    orch_config *cfg;     /* ck.cfg */
    safetensors_file *st; /* ck.st */
    const char *st_path;  /* ck.st_path */
    const gguf_arch *arch;
    bpe_vocab voc;
    int have_voc;
    uint32_t wtype, ftype;
    int kind;
    int llama, untied; /* model.arch llama (lm), and its head untied */
    int hf_tok;        /* tokenizer "hf": tokenizer.json in the checkpoint */
    llama_model lm;
} export_ctx;

static int fail(export_ctx *x, int kind) {
    x->kind = kind;
    return -1;
}

/* The tokenizer keys from GPT-2's tables (vocabulary rows past 50257 are
 * padding). */
static int add_tokenizer(export_ctx *x, gguf_writer *w, char *err, size_t err_cap) {
    const bpe_vocab *v = &x->voc;
    uint32_t n = x->cfg->model.vocab_size;
    size_t pool_cap = 0;
    for (uint32_t i = 0; i < v->vocab_size; i++)
        pool_cap += 2 * (size_t)(v->off[i + 1] - v->off[i]);
    pool_cap += 24 * (size_t)(n - v->vocab_size) + 1;
    int32_t *pairs = NULL;
    size_t n_merges = 0;
    if (bpe_vocab_merges(v, &pairs, &n_merges, err, err_cap) != 0)
        return fail(x, GPT2_IMPORT_ERR_RUNTIME);
    char *pool = malloc(pool_cap);
    const char **strs = util_calloc(n > n_merges ? n
                                    : n_merges   ? n_merges
                                                 : 1,
                                    sizeof *strs);
    size_t *lens = util_calloc(n > n_merges ? n : n_merges ? n_merges : 1, sizeof *lens);
    int32_t *types = util_calloc(n, sizeof *types);
    char *mpool = NULL;
    int rc = -1;
    if (!pool || !strs || !lens || !types) goto oom;
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        strs[i] = pool + pos;
        if (i < v->vocab_size) {
            lens[i] = bpe_gpt2_spell((const unsigned char *)v->pool + v->off[i],
                                     v->off[i + 1] - v->off[i], pool + pos);
            types[i] = (int32_t)i == v->eot ? TOKEN_CONTROL : TOKEN_NORMAL;
        } else {
            lens[i] = (size_t)snprintf(pool + pos, 24, "[PAD%u]", i);
            types[i] = TOKEN_UNUSED;
        }
        pos += lens[i];
    }
    if (gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", err, err_cap) != 0 ||
        gguf_writer_add_str(w, "tokenizer.ggml.pre", "gpt-2", err, err_cap) != 0 ||
        gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", strs, lens, n, err,
                                  err_cap) != 0 ||
        gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types, n, err,
                                  err_cap) != 0)
        goto out;
    size_t mcap = 1;
    for (size_t k = 0; k < 2 * n_merges; k++)
        mcap += 2 * (size_t)(v->off[pairs[k] + 1] - v->off[pairs[k]]) + 1;
    mpool = malloc(mcap);
    if (!mpool) goto oom;
    pos = 0;
    for (size_t k = 0; k < n_merges; k++) {
        int32_t a = pairs[2 * k], b = pairs[2 * k + 1];
        strs[k] = mpool + pos;
        size_t l = bpe_gpt2_spell((const unsigned char *)v->pool + v->off[a],
                                  v->off[a + 1] - v->off[a], mpool + pos);
        mpool[pos + l++] = ' ';
        l += bpe_gpt2_spell((const unsigned char *)v->pool + v->off[b],
                            v->off[b + 1] - v->off[b], mpool + pos + l);
        lens[k] = l;
        pos += l;
    }
    if (gguf_writer_add_str_array(w, "tokenizer.ggml.merges", strs, lens, n_merges, err,
                                  err_cap) != 0 ||
        gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->eot, err,
                            err_cap) != 0 ||
        gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eot, err,
                            err_cap) != 0 ||
        gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0, err, err_cap) != 0)
        goto out;
    rc = 0;
    goto out;
oom:
    util_set_err(err, err_cap, "out of memory");
out:
    if (rc != 0) x->kind = GPT2_IMPORT_ERR_RUNTIME;
    free(pairs);
    free(pool);
    free(mpool);
    free(strs);
    free(lens);
    free(types);
    return rc;
}

/* The tokenizer keys from the checkpoint's tokenizer.json (gguf_hf_tok.h). */
static int add_hf_tokenizer(export_ctx *x, gguf_writer *w, char *err, size_t err_cap) {
    int kind = 1;
    if (gguf_hf_tok_add(w, x->ck.dir, x->cfg->model.vocab_size, &kind, err, err_cap) == 0)
        return 0;
    return fail(x, kind == 2 ? GPT2_IMPORT_ERR_INPUT : GPT2_IMPORT_ERR_RUNTIME);
}

/* The hyperparameter keys. */
static int add_hparams(export_ctx *x, gguf_writer *w, char *err, size_t err_cap) {
    const config_model *m = &x->cfg->model;
    const char *a = x->arch->gguf_name;
    char k[128];
    int rc = gguf_writer_add_str(w, "general.architecture", a, err, err_cap);
    rc = rc ? rc : gguf_writer_add_str(w, "general.name", "orch", err, err_cap);
    rc = rc ? rc : gguf_writer_add_u32(w, "general.file_type", x->ftype, err, err_cap);
    if (x->wtype == GGUF_TYPE_Q8_0)
        rc = rc ? rc
                : gguf_writer_add_u32(w, "general.quantization_version", 2, err, err_cap);
    const struct {
        const char *key;
        uint32_t v;
    } u[] = {
        { "context_length", m->context },        { "embedding_length", m->width },
        { "feed_forward_length", m->mlp_width }, { "block_count", m->layers },
        { "attention.head_count", m->heads },
    };
    for (size_t i = 0; rc == 0 && i < sizeof u / sizeof u[0]; i++) {
        snprintf(k, sizeof k, "%s.%s", a, u[i].key);
        rc = gguf_writer_add_u32(w, k, u[i].v, err, err_cap);
    }
    snprintf(k, sizeof k, "%s.%s", a, x->arch->eps_key);
    rc = rc ? rc : gguf_writer_add_f32(w, k, (float)m->layernorm_eps, err, err_cap);
    if (x->llama && rc == 0) {
        const llama_model *l = &x->lm;
        snprintf(k, sizeof k, "%s.attention.head_count_kv", a);
        rc = gguf_writer_add_u32(w, k, l->kv_heads, err, err_cap);
        snprintf(k, sizeof k, "%s.rope.dimension_count", a);
        rc = rc ? rc : gguf_writer_add_u32(w, k, l->width / l->heads, err, err_cap);
        snprintf(k, sizeof k, "%s.rope.freq_base", a);
        rc = rc ? rc : gguf_writer_add_f32(w, k, (float)l->rope_theta, err, err_cap);
        snprintf(k, sizeof k, "%s.vocab_size", a);
        rc = rc ? rc : gguf_writer_add_u32(w, k, l->vocab, err, err_cap);
        if (rc == 0 && l->rope_scaling == ORCH_ROPE_LINEAR) {
            snprintf(k, sizeof k, "%s.rope.scaling.type", a);
            rc = gguf_writer_add_str(w, k, "linear", err, err_cap);
            snprintf(k, sizeof k, "%s.rope.scaling.factor", a);
            rc = rc ? rc : gguf_writer_add_f32(w, k, (float)l->rope_factor, err, err_cap);
        } else if (rc == 0 && l->rope_scaling == ORCH_ROPE_LLAMA3) {
            /* llama.cpp: rope_freqs.weight carries the scaling (no scaling type,
             * which would apply a second time); orch.* keys keep the exact
             * parameters for orch import gguf. */
            rc = gguf_writer_add_str(w, "orch.rope.scaling.type", "llama3", err, err_cap);
            rc = rc ? rc
                    : gguf_writer_add_f32(w, "orch.rope.scaling.factor",
                                          (float)l->rope_factor, err, err_cap);
            rc = rc ? rc
                    : gguf_writer_add_f32(w, "orch.rope.scaling.low_freq_factor",
                                          (float)l->rope_low_freq_factor, err, err_cap);
            rc = rc ? rc
                    : gguf_writer_add_f32(w, "orch.rope.scaling.high_freq_factor",
                                          (float)l->rope_high_freq_factor, err, err_cap);
            rc = rc ? rc
                    : gguf_writer_add_u32(w, "orch.rope.scaling.original_context_length",
                                          l->rope_original_context, err, err_cap);
        }
    }
    return rc ? fail(x, GPT2_IMPORT_ERR_RUNTIME) : 0;
}

/* Find tensor i of the table in the checkpoint and check its shape. */
static const safetensors_tensor *source(export_ctx *x, size_t i,
                                        const gguf_tensor_map **mp, char *gname,
                                        char *err, size_t err_cap) {
    char oname[64];
    const gguf_tensor_map *m =
        gguf_arch_tensor(x->arch, x->cfg->model.layers, x->untied, i, oname, gname, 64);
    const safetensors_tensor *t = safetensors_find(x->st, oname);
    uint64_t d0 = gguf_dim_size(&x->cfg->model, m->dim[0]);
    uint64_t d1 = gguf_dim_size(&x->cfg->model, m->dim[1]);
    uint32_t nd = m->dim[1] ? 2 : 1;
    *mp = m;
    if (!t) {
        util_set_err(err, err_cap, "%s: missing tensor '%s'", x->st_path, oname);
        return NULL;
    }
    if (t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        util_set_err(
            err, err_cap,
            "%s: tensor '%s' does not have the shape of the config ([%llu%s%.0llu])",
            x->st_path, oname, (unsigned long long)d0, nd == 2 ? "," : "",
            (unsigned long long)d1);
        return NULL;
    }
    if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_F16 &&
        t->dtype != SAFETENSORS_BF16) {
        util_set_err(err, err_cap, "%s: tensor '%s' has dtype %s (need F32, F16 or BF16)",
                     x->st_path, oname, safetensors_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

static uint32_t type_of(const export_ctx *x, const gguf_tensor_map *m,
                        const safetensors_tensor *t) {
    if (m->keep_f32 || t->ndim < 2) return GGUF_TYPE_F32;
    if (x->wtype == GGUF_TYPE_Q8_0 && t->shape[1] % GGUF_Q8_0_BLOCK != 0)
        return GGUF_TYPE_F32;
    return x->wtype;
}

static int write_tensors(export_ctx *x, gguf_writer *w, gguf_export_result *r, char *err,
                         size_t err_cap) {
    size_t n = gguf_arch_tensor_count(x->arch, x->cfg->model.layers, x->untied);
    if (safetensors_count(x->st) != n) {
        util_set_err(err, err_cap,
                     "%s: holds %zu tensors, a %s model of %u layers has %zu", x->st_path,
                     safetensors_count(x->st), x->arch->orch_name, x->cfg->model.layers,
                     n);
        return fail(x, GPT2_IMPORT_ERR_INPUT);
    }
    uint64_t max_numel = 0;
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor_map *m;
        char g[64];
        const safetensors_tensor *t = source(x, i, &m, g, err, err_cap);
        if (!t) return fail(x, GPT2_IMPORT_ERR_INPUT);
        uint64_t ne[2] = { t->shape[t->ndim - 1], t->ndim == 2 ? t->shape[0] : 1 };
        if (gguf_writer_declare(w, g, type_of(x, m, t), t->ndim, ne, err, err_cap) != 0)
            return fail(x, GPT2_IMPORT_ERR_RUNTIME);
        if (t->numel > max_numel) max_numel = t->numel;
        r->params += t->numel;
    }
    const uint64_t half = x->llama ? x->lm.width / x->lm.heads / 2 : 0;
    int freqs = x->llama && x->lm.rope_scaling == ORCH_ROPE_LLAMA3;
    if (freqs && gguf_writer_declare(w, "rope_freqs.weight", GGUF_TYPE_F32, 1, &half, err,
                                     err_cap) != 0)
        return fail(x, GPT2_IMPORT_ERR_RUNTIME);
    if (gguf_writer_begin_data(w, err, err_cap) != 0)
        return fail(x, GPT2_IMPORT_ERR_RUNTIME);
    float *f = malloc((size_t)max_numel * sizeof *f + 1);
    float *p = malloc((size_t)max_numel * sizeof *p + 1);
    uint8_t *q = malloc((size_t)max_numel * 2 + 1); /* F16 and Q8_0 are smaller */
    int rc = -1;
    if (!f || !p || !q) {
        util_set_err(err, err_cap, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor_map *m;
        char g[64];
        const safetensors_tensor *t = source(x, i, &m, g, err, err_cap);
        uint32_t ty = type_of(x, m, t);
        (void)safetensors_to_f32(t->dtype, t->data, f, t->numel); /* dtype checked */
        if (m->rope != GGUF_ROPE_NONE) { /* HF rotate-half rows -> llama.cpp pairs */
            uint32_t heads = m->rope == GGUF_ROPE_Q ? x->lm.heads : x->lm.kv_heads;
            llama_rope_permute(f, p, heads, t->shape[0], t->shape[1], 1);
            memcpy(f, p, (size_t)t->numel * sizeof *f);
        }
        const void *data = f;
        size_t bytes = (size_t)t->numel * 4;
        if (ty == GGUF_TYPE_F16) {
            for (uint64_t e = 0; e < t->numel; e++) {
                uint16_t h = gguf_f32_to_f16(f[e]);
                memcpy(q + 2 * e, &h, 2);
            }
            data = q;
            bytes = (size_t)t->numel * 2;
        } else if (ty == GGUF_TYPE_Q8_0) {
            gguf_quantize_q8_0(f, q, t->numel);
            data = q;
            bytes = (size_t)gguf_type_nbytes(ty, t->numel);
        }
        if (gguf_writer_write(w, data, bytes, err, err_cap) != 0) goto out;
    }
    if (freqs) {
        llama_rope_freq_factors(&x->lm, f);
        if (gguf_writer_write(w, f, (size_t)half * sizeof *f, err, err_cap) != 0)
            goto out;
    }
    r->tensors = n + (size_t)freqs;
    rc = 0;
out:
    if (rc != 0) x->kind = GPT2_IMPORT_ERR_RUNTIME;
    free(f);
    free(p);
    free(q);
    return rc;
}

static int parse_type(export_ctx *x, const char *t, char *err, size_t err_cap) {
    if (!t || strcmp(t, "f32") == 0) {
        x->wtype = GGUF_TYPE_F32, x->ftype = 0;
    } else if (strcmp(t, "f16") == 0) {
        x->wtype = GGUF_TYPE_F16, x->ftype = 1;
    } else if (strcmp(t, "q8_0") == 0) {
        x->wtype = GGUF_TYPE_Q8_0, x->ftype = 7;
    } else {
        util_set_err(err, err_cap, "--type: '%s' is not f32, f16 or q8_0", t);
        return -1;
    }
    return 0;
}

/* Checkpoint, config, architecture, tokenizer. */
static int open_input(export_ctx *x, gguf_export_result *r, char *err, size_t err_cap) {
    const gguf_export_opts *o = x->o;
    if (ckpt_model_open(o->ckpt, &x->ck, err, err_cap) != 0) return -1;
    x->cfg = x->ck.cfg;
    x->st = x->ck.st;
    x->st_path = x->ck.st_path;
    const char *tok = x->ck.tokenizer;
    snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s", x->ck.dir);
    snprintf(r->warn, sizeof r->warn, "%s", x->ck.warn);
    const config_model *m = &x->cfg->model;
    x->arch = gguf_arch_by_orch(m->arch);
    if (!x->arch) {
        util_set_err(err, err_cap,
                     "%s: model.arch '%s' has no GGUF mapping yet (supported: %s)",
                     r->ckpt_dir, m->arch, gguf_arch_list());
        return -1;
    }
    x->llama = strcmp(m->arch, "llama") == 0;
    if (x->llama) {
        if (llama_model_from_ckpt(x->ck.dir, x->ck.cfg, &x->lm, err, err_cap) != 0)
            return -1;
        x->untied = !x->lm.tied;
    }
    if (strcmp(tok, "hf") == 0) { /* gguf_hf_tok.h reads it while writing */
        x->hf_tok = 1;
        return 0;
    }
    if (strcmp(tok, "gpt2") != 0) {
        util_set_err(err, err_cap,
                     "%s: the '%s' tokenizer has no GGUF equivalent (only checkpoints "
                     "trained with the gpt2 tokenizer export)",
                     r->ckpt_dir, tok);
        return -1;
    }
    if (!x->llama && m->kv_heads != m->heads) {
        util_set_err(err, err_cap, "%s: model.kv_heads %u != heads %u (gpt2 has none)",
                     r->ckpt_dir, m->kv_heads, m->heads);
        return -1;
    }
    char vdir[4096];
    if (o->vocab_dir)
        snprintf(vdir, sizeof vdir, "%s", o->vocab_dir);
    else if (tokenizer_find_gpt2_dir(vdir, sizeof vdir, err, err_cap) != 0)
        return -1;
    if (bpe_vocab_load_gpt2(vdir, &x->voc, err, err_cap) != 0) return -1;
    x->have_voc = 1;
    if (m->vocab_size < x->voc.vocab_size || x->voc.eot < 0) {
        util_set_err(err, err_cap, "%s: model.vocab_size %u is below the %u GPT-2 tokens",
                     r->ckpt_dir, m->vocab_size, x->voc.vocab_size);
        return -1;
    }
    return 0;
}

int gguf_export(const gguf_export_opts *o, gguf_export_result *r, int *err_kind,
                char *err, size_t err_cap) {
    export_ctx x;
    memset(&x, 0, sizeof x);
    memset(r, 0, sizeof *r);
    x.o = o;
    x.kind = GPT2_IMPORT_ERR_INPUT;
    gguf_writer *w = NULL;
    int rc = -1;
    if (!o->ckpt || !o->out) {
        util_set_err(err, err_cap, "need a checkpoint and an output file");
        goto out;
    }
    if (parse_type(&x, o->type, err, err_cap) != 0 ||
        open_input(&x, r, err, err_cap) != 0)
        goto out;
    r->layers = x.cfg->model.layers;
    x.kind = GPT2_IMPORT_ERR_RUNTIME;
    if (gguf_writer_create(o->out, &w, err, err_cap) != 0) goto out;
    if (add_hparams(&x, w, err, err_cap) != 0 ||
        (x.hf_tok ? add_hf_tokenizer(&x, w, err, err_cap)
                  : add_tokenizer(&x, w, err, err_cap)) != 0 ||
        write_tensors(&x, w, r, err, err_cap) != 0)
        goto out;
    gguf_writer *done = w;
    w = NULL;
    x.kind = GPT2_IMPORT_ERR_RUNTIME;
    if (gguf_writer_finish(done, err, err_cap) != 0) goto out;
    struct stat sb;
    if (stat(o->out, &sb) == 0) r->bytes = (uint64_t)sb.st_size;
    rc = 0;
out:
    if (rc != 0) *err_kind = x.kind;
    gguf_writer_abort(w);
    if (x.have_voc) bpe_vocab_free(&x.voc);
    ckpt_model_close(&x.ck);
    return rc;
}
