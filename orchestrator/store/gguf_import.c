/*
 * gguf_import.c - GGUF -> orch checkpoint (see gguf_import.h): architecture
 * and hyperparameters, the tokenizer check against orch's GPT-2 vocabulary,
 * every tensor checked, dequantized and renamed, then the checkpoint written.
 */
#include "orchestrator/store/gguf_import.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/bpe_vocab.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/store/ckpt_files.h"
#include "orchestrator/store/gguf.h"
#include "orchestrator/store/gguf_hf_tok.h"
#include "orchestrator/store/gguf_model.h"
#include "orchestrator/store/gpt2_import.h"
#include "orchestrator/store/llama_model.h"
#include "orchestrator/store/safetensors.h"

typedef struct import_ctx {
    const gguf_import_opts *o;
    gguf_file *f;
    const gguf_arch *arch;
    config_model m;
    bpe_vocab voc;
    int have_voc;
    ckpt_tensor *out;
    char (*names)[64];
    size_t n_out;
    int kind;
    int llama, untied; /* architecture llama (lm), its head untied */
    llama_model lm;
    char *hf_json, *hf_cfg; /* llama with another tokenizer: its hf files */
} import_ctx;

static int bad(import_ctx *x, int kind) {
    x->kind = kind;
    return -1;
}

/* The shortest decimal that reads back as the same float as v (GGUF keeps
 * F32 hyperparameters: 1e-5 comes back as 1e-05, not 9.99999974737875e-06). */
static double f32_decimal(double v) {
    char buf[32];
    float f = (float)v;
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return v;
}

/* A required unsigned hyperparameter ARCH.SUFFIX in [lo, hi]. */
static int hparam(import_ctx *x, const char *suffix, uint64_t lo, uint64_t hi,
                  uint32_t *v, char *err, size_t err_cap) {
    char key[128];
    uint64_t u = 0;
    snprintf(key, sizeof key, "%s.%s", x->arch->gguf_name, suffix);
    int got = gguf_get_uint(x->f, key, hi, &u, err, err_cap);
    if (got < 0) return -1;
    if (got == 0 || u < lo) {
        util_set_err(err, err_cap, "%s: %s%s", x->o->input, key,
                     got == 0 ? ": missing" : ": is 0");
        return -1;
    }
    *v = (uint32_t)u;
    return 0;
}

static int read_hparams(import_ctx *x, char *err, size_t err_cap) {
    gguf_str a;
    int got = gguf_get_str(x->f, "general.architecture", &a, err, err_cap);
    if (got <= 0) {
        if (got == 0)
            util_set_err(err, err_cap, "%s: no general.architecture key", x->o->input);
        return -1;
    }
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(a.len < 60 ? a.len : 60), a.p);
    x->arch = a.len < 60 ? gguf_arch_by_gguf(name) : NULL;
    if (!x->arch) {
        util_set_err(err, err_cap,
                     "%s: architecture '%s' is not supported (orch imports: %s)",
                     x->o->input, name, gguf_arch_list());
        return -1;
    }
    config_model *m = &x->m;
    snprintf(m->arch, sizeof m->arch, "%s", x->arch->orch_name);
    if (hparam(x, "block_count", 1, 1023, &m->layers, err, err_cap) != 0 ||
        hparam(x, "context_length", 1, 1048576, &m->context, err, err_cap) != 0 ||
        hparam(x, "embedding_length", 1, 65536, &m->width, err, err_cap) != 0 ||
        hparam(x, "feed_forward_length", 1, 262144, &m->mlp_width, err, err_cap) != 0 ||
        hparam(x, "attention.head_count", 1, 65536, &m->heads, err, err_cap) != 0)
        return -1;
    char key[128];
    uint64_t kvh = m->heads;
    snprintf(key, sizeof key, "%s.attention.head_count_kv", x->arch->gguf_name);
    if (gguf_get_uint(x->f, key, 65536, &kvh, err, err_cap) < 0) return -1;
    x->llama = strcmp(x->arch->orch_name, "llama") == 0;
    if ((x->llama ? kvh == 0 || m->heads % kvh != 0 : kvh != m->heads) ||
        m->width % m->heads != 0) {
        util_set_err(err, err_cap,
                     "%s: %llu kv heads / %u heads / width %u: not a %s "
                     "model orch can run",
                     x->o->input, (unsigned long long)kvh, m->heads, m->width,
                     x->arch->gguf_name);
        return -1;
    }
    m->kv_heads = (uint32_t)kvh;
    m->layernorm_eps = 1e-5;
    snprintf(key, sizeof key, "%s.%s", x->arch->gguf_name, x->arch->eps_key);
    if (gguf_get_float(x->f, key, &m->layernorm_eps, err, err_cap) < 0) return -1;
    m->layernorm_eps = f32_decimal(m->layernorm_eps);
    if (!(m->layernorm_eps > 0 && m->layernorm_eps < 1)) {
        util_set_err(err, err_cap, "%s: %s: %g is not in (0, 1)", x->o->input, key,
                     m->layernorm_eps);
        return -1;
    }
    return 0;
}

static int same(const gguf_str *s, const char *p, size_t n) {
    return s->len == n && memcmp(s->p, p, n) == 0;
}

/* A float KEY (def when absent). */
static int opt_float(import_ctx *x, const char *key, double def, double *v, char *err,
                     size_t err_cap) {
    *v = def;
    int got = gguf_get_float(x->f, key, v, err, err_cap);
    if (got < 0) return -1;
    *v = got == 0 ? def : f32_decimal(*v);
    return 0;
}

/* The llama keys after read_hparams: RoPE base, dimension, scaling. */
static int read_llama(import_ctx *x, char *err, size_t err_cap) {
    const char *in = x->o->input;
    llama_model *l = &x->lm;
    const config_model *m = &x->m;
    memset(l, 0, sizeof *l);
    l->context = m->context;
    l->layers = m->layers;
    l->heads = m->heads;
    l->kv_heads = m->kv_heads;
    l->width = m->width;
    l->mlp_width = m->mlp_width;
    l->eps = m->layernorm_eps;
    uint64_t dim = m->width / m->heads;
    if (opt_float(x, "llama.rope.freq_base", 10000, &l->rope_theta, err, err_cap) != 0 ||
        gguf_get_uint(x->f, "llama.rope.dimension_count", 65536, &dim, err, err_cap) < 0)
        return -1;
    if (dim != m->width / m->heads) {
        util_set_err(err, err_cap,
                     "%s: llama.rope.dimension_count %llu is not supported (orch "
                     "rotates the whole head of %u)",
                     in, (unsigned long long)dim, m->width / m->heads);
        return -1;
    }
    gguf_str st;
    int got = gguf_get_str(x->f, "llama.rope.scaling.type", &st, err, err_cap);
    if (got < 0) return -1;
    if (got && same(&st, "linear", 6)) {
        l->rope_scaling = ORCH_ROPE_LINEAR;
        if (opt_float(x, "llama.rope.scaling.factor", 0, &l->rope_factor, err, err_cap))
            return -1;
    } else if (got && !same(&st, "none", 4)) {
        util_set_err(err, err_cap,
                     "%s: llama.rope.scaling.type '%.*s' is not supported (orch: none, "
                     "linear, and llama3 through rope_freqs.weight)",
                     in, (int)(st.len > 40 ? 40 : st.len), st.p);
        return -1;
    }
    got = gguf_get_str(x->f, "orch.rope.scaling.type", &st, err, err_cap);
    if (got < 0) return -1;
    const gguf_tensor *rf = gguf_find_tensor(x->f, "rope_freqs.weight");
    if (got && same(&st, "llama3", 6) && l->rope_scaling == ORCH_ROPE_NONE) {
        uint64_t oc = 0;
        l->rope_scaling = ORCH_ROPE_LLAMA3;
        if (opt_float(x, "orch.rope.scaling.factor", 0, &l->rope_factor, err, err_cap) ||
            opt_float(x, "orch.rope.scaling.low_freq_factor", 0, &l->rope_low_freq_factor,
                      err, err_cap) ||
            opt_float(x, "orch.rope.scaling.high_freq_factor", 0,
                      &l->rope_high_freq_factor, err, err_cap) ||
            gguf_get_uint(x->f, "orch.rope.scaling.original_context_length", 1048576, &oc,
                          err, err_cap) < 0)
            return -1;
        l->rope_original_context = (uint32_t)oc;
    } else if (got) {
        util_set_err(err, err_cap, "%s: orch.rope.scaling.type '%.*s' is not llama3", in,
                     (int)(st.len > 40 ? 40 : st.len), st.p);
        return -1;
    }
    l->vocab = 1; /* checked with the tokenizer; llama_model_check needs > 0 */
    if (llama_model_check(l, in, err, err_cap) != 0) return -1;
    if (l->rope_scaling == ORCH_ROPE_LLAMA3 || rf) {
        float want[512], got_f[512];
        if (!rf || l->rope_scaling != ORCH_ROPE_LLAMA3 || rf->type != GGUF_TYPE_F32 ||
            rf->ndim != 1 || rf->ne[0] != dim / 2 || dim / 2 > 512) {
            util_set_err(err, err_cap,
                         "%s: rope_freqs.weight (llama3 RoPE scaling) is supported only "
                         "with orch.rope.scaling.* keys and F32 [%llu] factors (orch "
                         "needs the llama3 parameters)",
                         in, (unsigned long long)(dim / 2));
            return -1;
        }
        llama_rope_freq_factors(l, want);
        (void)gguf_to_f32(rf->type, rf->data, got_f, dim / 2);
        for (uint64_t i = 0; i < dim / 2; i++)
            if (!(fabsf(got_f[i] - want[i]) <= 1e-6f * want[i])) {
                util_set_err(err, err_cap,
                             "%s: rope_freqs.weight[%llu] %g is not the llama3 factor %g "
                             "of the orch.rope.scaling keys",
                             in, (unsigned long long)i, got_f[i], want[i]);
                return -1;
            }
    }
    x->untied = gguf_find_tensor(x->f, "output.weight") != NULL;
    l->tied = !x->untied;
    return 0;
}

/* String array KEY with at least min entries. */
static const gguf_kv *str_array(import_ctx *x, const char *key, uint64_t min, char *err,
                                size_t err_cap) {
    const gguf_kv *kv = gguf_find_kv(x->f, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || kv->n < min) {
        util_set_err(err, err_cap, "%s: %s: %s", x->o->input, key,
                     !kv ? "missing (orch needs the GPT-2 tokenizer)"
                     : kv->n < min && kv->type == GGUF_ARRAY ? "too few entries"
                                                             : "not an array of strings");
        return NULL;
    }
    return kv;
}

/* Whether a llama file's tokenizer is GPT-2's (model gpt2, pre gpt-2 or
 * none, <|endoftext|> at 50256): then checked as such, else made an hf one. */
static int llama_gpt2_tok(const import_ctx *x) {
    gguf_str model, pre;
    const gguf_kv *tok = gguf_find_kv(x->f, "tokenizer.ggml.tokens");
    int gp = gguf_get_str(x->f, "tokenizer.ggml.pre", &pre, NULL, 0);
    return gguf_get_str(x->f, "tokenizer.ggml.model", &model, NULL, 0) == 1 &&
           same(&model, "gpt2", 4) && (gp == 0 || (gp == 1 && same(&pre, "gpt-2", 5))) &&
           tok && tok->type == GGUF_ARRAY && tok->arr_type == GGUF_STRING &&
           tok->n >= 50257 && same(&tok->strs[50256], "<|endoftext|>", 13);
}

/* A llama file's own tokenizer as tokenizer.json (gguf_hf_tok.h). */
static int hf_tokenizer(import_ctx *x, char *err, size_t err_cap) {
    int kind = 2;
    if (gguf_hf_tok_files(x->f, x->o->input, &x->hf_json, &x->hf_cfg, &kind, err,
                          err_cap) != 0)
        return bad(x, kind == 2 ? GPT2_IMPORT_ERR_INPUT : GPT2_IMPORT_ERR_RUNTIME);
    const gguf_kv *tok = gguf_find_kv(x->f, "tokenizer.ggml.tokens");
    if (tok->n > (uint64_t)1 << 24) {
        util_set_err(err, err_cap, "%s: tokenizer.ggml.tokens: %llu tokens is too many",
                     x->o->input, (unsigned long long)tok->n);
        return -1;
    }
    x->m.vocab_size = (uint32_t)tok->n;
    return 0;
}

/* The file's tokenizer must be orch's GPT-2 vocabulary (plus padding); a
 * llama file's may also be one gguf_hf_tok.h turns into tokenizer.json. */
static int check_tokenizer(import_ctx *x, char *err, size_t err_cap) {
    if (x->llama && !llama_gpt2_tok(x)) return hf_tokenizer(x, err, err_cap);
    gguf_str model;
    int got = gguf_get_str(x->f, "tokenizer.ggml.model", &model, err, err_cap);
    if (got < 0) return -1;
    if (got == 0 || !same(&model, "gpt2", 4)) {
        util_set_err(err, err_cap,
                     "%s: tokenizer.ggml.model is %s%.*s%s, not GPT-2's BPE (orch "
                     "imports the gpt2 tokenizer only)",
                     x->o->input, got ? "'" : "",
                     got ? (int)(model.len > 40 ? 40 : model.len) : 7,
                     got ? model.p : "missing", got ? "'" : "");
        return -1;
    }
    char vdir[4096];
    if (x->o->vocab_dir)
        snprintf(vdir, sizeof vdir, "%s", x->o->vocab_dir);
    else if (tokenizer_find_gpt2_dir(vdir, sizeof vdir, err, err_cap) != 0)
        return -1;
    if (bpe_vocab_load_gpt2(vdir, &x->voc, err, err_cap) != 0) return -1;
    x->have_voc = 1;
    const bpe_vocab *v = &x->voc;
    const gguf_kv *tok =
        str_array(x, "tokenizer.ggml.tokens", v->vocab_size, err, err_cap);
    if (!tok) return -1;
    if (tok->n > (uint64_t)1 << 24) {
        util_set_err(err, err_cap, "%s: tokenizer.ggml.tokens: %llu tokens is too many",
                     x->o->input, (unsigned long long)tok->n);
        return -1;
    }
    x->m.vocab_size = (uint32_t)tok->n;
    char buf[2048];
    for (uint32_t i = 0; i < v->vocab_size; i++) {
        size_t n = v->off[i + 1] - v->off[i];
        size_t l =
            n <= sizeof buf / 2
                ? bpe_gpt2_spell((const unsigned char *)v->pool + v->off[i], n, buf)
                : 0;
        if (!same(&tok->strs[i], buf, l)) {
            util_set_err(err, err_cap,
                         "%s: tokenizer.ggml.tokens[%u] differs from GPT-2's (orch "
                         "imports the GPT-2 vocabulary only)",
                         x->o->input, i);
            return -1;
        }
    }
    const gguf_kv *mk = str_array(x, "tokenizer.ggml.merges", 0, err, err_cap);
    if (!mk) return -1;
    int32_t *pairs = NULL;
    size_t n_merges = 0;
    if (bpe_vocab_merges(v, &pairs, &n_merges, err, err_cap) != 0)
        return bad(x, GPT2_IMPORT_ERR_RUNTIME);
    int rc = 0;
    if (mk->n != n_merges) {
        util_set_err(err, err_cap,
                     "%s: tokenizer.ggml.merges has %llu merges, GPT-2 has %zu",
                     x->o->input, (unsigned long long)mk->n, n_merges);
        rc = -1;
    }
    for (size_t k = 0; rc == 0 && k < n_merges; k++) {
        int32_t a = pairs[2 * k], b = pairs[2 * k + 1];
        size_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b], l = 0;
        if (2 * (la + lb) + 1 <= sizeof buf) {
            l = bpe_gpt2_spell((const unsigned char *)v->pool + v->off[a], la, buf);
            buf[l++] = ' ';
            l += bpe_gpt2_spell((const unsigned char *)v->pool + v->off[b], lb, buf + l);
        }
        if (!same(&mk->strs[k], buf, l)) {
            util_set_err(err, err_cap,
                         "%s: tokenizer.ggml.merges[%zu] differs from GPT-2's",
                         x->o->input, k);
            rc = -1;
        }
    }
    free(pairs);
    return rc;
}

static int known_type(uint32_t t) {
    return t == GGUF_TYPE_F32 || t == GGUF_TYPE_F16 || t == GGUF_TYPE_BF16 ||
           t == GGUF_TYPE_Q8_0;
}

static void count_type(gguf_import_result *r, uint32_t t) {
    if (t == GGUF_TYPE_F32) r->n_f32++;
    if (t == GGUF_TYPE_F16) r->n_f16++;
    if (t == GGUF_TYPE_BF16) r->n_bf16++;
    if (t == GGUF_TYPE_Q8_0) r->n_q8_0++;
}

/* output.weight is accepted only as the tied head: the bytes of token_embd. */
static int check_output(import_ctx *x, const gguf_tensor *t, char *err, size_t err_cap) {
    const gguf_tensor *e = gguf_find_tensor(x->f, "token_embd.weight");
    if (e && e->type == t->type && e->nbytes == t->nbytes && e->ndim == t->ndim &&
        memcmp(e->ne, t->ne, sizeof e->ne) == 0 &&
        memcmp(e->data, t->data, (size_t)t->nbytes) == 0)
        return 0;
    util_set_err(err, err_cap,
                 "%s: output.weight differs from token_embd.weight (an untied head; "
                 "orch ties the head to the token embedding)",
                 x->o->input);
    return -1;
}

/* Every tensor of the file is in the table (or the tied head). */
static int scan_tensors(import_ctx *x, char *err, size_t err_cap) {
    size_t n = gguf_arch_tensor_count(x->arch, x->m.layers, x->untied);
    for (size_t i = 0; i < gguf_tensor_count(x->f); i++) {
        const gguf_tensor *t = gguf_tensor_get(x->f, i);
        if (x->llama && strcmp(t->name, "rope_freqs.weight") == 0) continue; /* checked */
        if (!x->llama && strcmp(t->name, "output.weight") == 0) {
            if (check_output(x, t, err, err_cap) != 0) return -1;
            continue;
        }
        int found = 0;
        for (size_t k = 0; !found && k < n; k++) {
            char on[64], gn[64];
            gguf_arch_tensor(x->arch, x->m.layers, x->untied, k, on, gn, sizeof on);
            found = strcmp(gn, t->name) == 0;
        }
        if (!found) {
            util_set_err(err, err_cap,
                         "%s: unexpected tensor '%s' (not part of a %s model of %u "
                         "layers)",
                         x->o->input, t->name, x->arch->gguf_name, x->m.layers);
            return -1;
        }
    }
    return 0;
}

static int convert_all(import_ctx *x, gguf_import_result *r, char *err, size_t err_cap) {
    size_t n = gguf_arch_tensor_count(x->arch, x->m.layers, x->untied);
    x->out = util_calloc(n, sizeof *x->out);
    x->names = util_calloc(n, sizeof *x->names);
    if (!x->out || !x->names) {
        util_set_err(err, err_cap, "out of memory");
        return bad(x, GPT2_IMPORT_ERR_RUNTIME);
    }
    for (size_t i = 0; i < n; i++) {
        char gn[64];
        const gguf_tensor_map *mp = gguf_arch_tensor(x->arch, x->m.layers, x->untied, i,
                                                     x->names[i], gn, sizeof gn);
        const gguf_tensor *t = gguf_find_tensor(x->f, gn);
        if (!t) {
            util_set_err(err, err_cap, "%s: missing tensor '%s'", x->o->input, gn);
            return -1;
        }
        if (!known_type(t->type)) {
            const char *tn = gguf_type_name(t->type);
            util_set_err(err, err_cap,
                         "%s: tensor '%s' has type %s, which orch does not import "
                         "(F32, F16, BF16 and Q8_0 are)",
                         x->o->input, gn, tn ? tn : "?");
            return -1;
        }
        uint64_t d0 = gguf_dim_size(&x->m, mp->dim[0]),
                 d1 = gguf_dim_size(&x->m, mp->dim[1]);
        uint32_t nd = mp->dim[1] ? 2 : 1;
        int ok = t->ndim == nd &&
                 (nd == 1 ? t->ne[0] == d0 : t->ne[0] == d1 && t->ne[1] == d0);
        if (!ok) {
            util_set_err(err, err_cap,
                         "%s: tensor '%s' has ne [%llu,%llu], expected [%llu,%llu] for "
                         "the hyperparameters",
                         x->o->input, gn, (unsigned long long)t->ne[0],
                         (unsigned long long)t->ne[1],
                         (unsigned long long)(nd == 1 ? d0 : d1),
                         (unsigned long long)(nd == 1 ? 1 : d0));
            return -1;
        }
        float *d = malloc((size_t)t->numel * sizeof *d);
        if (!d) {
            util_set_err(err, err_cap, "out of memory");
            return bad(x, GPT2_IMPORT_ERR_RUNTIME);
        }
        (void)gguf_to_f32(t->type, t->data, d, t->numel); /* type checked above */
        if (mp->rope != GGUF_ROPE_NONE) { /* llama.cpp pairs -> HF rotate-half rows */
            float *p = malloc((size_t)t->numel * sizeof *p);
            if (!p) {
                free(d);
                util_set_err(err, err_cap, "out of memory");
                return bad(x, GPT2_IMPORT_ERR_RUNTIME);
            }
            llama_rope_permute(d, p, mp->rope == GGUF_ROPE_Q ? x->m.heads : x->m.kv_heads,
                               d0, d1, 0);
            free(d);
            d = p;
        }
        ckpt_tensor *o = &x->out[x->n_out++];
        o->name = x->names[i];
        o->dtype = SAFETENSORS_F32;
        o->ndim = nd;
        o->shape[0] = d0;
        o->shape[1] = d1;
        o->data = d;
        count_type(r, t->type);
        r->params += t->numel;
    }
    return 0;
}

/* ckpt_write_dir_extra: tokenizer.json and tokenizer_config.json. */
static int write_hf_files(const char *tmp, void *user, char *err, size_t err_cap) {
    const import_ctx *x = user;
    char p[4096];
    return ckpt_path_join(p, sizeof p, tmp, "tokenizer.json", err, err_cap) != 0 ||
                   fsio_write_file(p, x->hf_json, strlen(x->hf_json), err, err_cap) !=
                       0 ||
                   ckpt_path_join(p, sizeof p, tmp, "tokenizer_config.json", err,
                                  err_cap) != 0 ||
                   fsio_write_file(p, x->hf_cfg, strlen(x->hf_cfg), err, err_cap) != 0
               ? -1
               : 0;
}

int gguf_import(const gguf_import_opts *o, gguf_import_result *r, int *err_kind,
                char *err, size_t err_cap) {
    import_ctx x;
    memset(&x, 0, sizeof x);
    memset(r, 0, sizeof *r);
    x.o = o;
    x.kind = GPT2_IMPORT_ERR_INPUT;
    char *state = NULL, *cfg = NULL;
    int rc = -1;
    if (!o->input || !o->out_dir) {
        util_set_err(err, err_cap, "need an input file and an output directory");
        goto out;
    }
    if (gguf_open(o->input, &x.f, err, err_cap) != 0 ||
        read_hparams(&x, err, err_cap) != 0 ||
        (x.llama && read_llama(&x, err, err_cap) != 0) ||
        check_tokenizer(&x, err, err_cap) != 0 || scan_tensors(&x, err, err_cap) != 0 ||
        convert_all(&x, r, err, err_cap) != 0)
        goto out;
    x.lm.vocab = x.m.vocab_size;
    gpt2_import_model gm = { x.m.vocab_size,
                             x.m.context,
                             x.m.width,
                             x.m.mlp_width,
                             x.m.layers,
                             x.m.heads,
                             x.m.layernorm_eps,
                             x.hf_json ? "hf" : "gpt2",
                             x.llama ? &x.lm : NULL };
    int kind =
        gpt2_import_texts(&gm, o->input, o->base_config, &state, &cfg, err, err_cap);
    if (kind != 0) {
        x.kind = kind;
        goto out;
    }
    x.kind = GPT2_IMPORT_ERR_RUNTIME;
    if (ckpt_write_dir_extra(o->out_dir, x.out, x.n_out, state, 0,
                             x.hf_json ? write_hf_files : NULL, &x, err, err_cap) != 0)
        goto out;
    snprintf(r->tokenizer, sizeof r->tokenizer, "%s", x.hf_json ? "hf" : "gpt2");
    snprintf(r->arch, sizeof r->arch, "%s", x.arch->gguf_name);
    r->layers = x.m.layers;
    r->heads = x.m.heads;
    r->kv_heads = x.m.kv_heads;
    r->tied = x.llama && !x.untied;
    r->width = x.m.width;
    r->mlp_width = x.m.mlp_width;
    r->vocab = x.m.vocab_size;
    r->context = x.m.context;
    rc = 0;
out:
    if (rc != 0) *err_kind = x.kind;
    for (size_t i = 0; i < x.n_out; i++) free((void *)x.out[i].data);
    free(x.out);
    free(x.names);
    free(state);
    free(cfg);
    free(x.hf_json);
    free(x.hf_cfg);
    if (x.have_voc) bpe_vocab_free(&x.voc);
    gguf_close(x.f);
    return rc;
}
