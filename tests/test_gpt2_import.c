/*
 * test_gpt2_import.c - Check suite for orchestrator/store/gpt2_import.{c,h}
 * called directly: a tiny GPT-2 in the Hugging Face layout (written here with
 * the safetensors writer; F32, F16 and BF16 tensors, Conv1D [in, out]
 * weights, optional "transformer." prefix, attention-mask buffers and
 * lm_head) is imported and every tensor, the config, state.json and the
 * result are checked exactly; the same from a Hugging Face directory
 * (config.json, two shards and model.safetensors.index.json); then each
 * refusal, with its exact message and error kind, leaving no output behind;
 * and a LLaMA-family directory imported exactly, with its refusals.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/store/gpt2_import.h"
#include "orchestrator/store/safetensors.h"
#include "tests/test_util.h"

/* V=256, T=16, C=8, M=32, 2 layers. */
#define V 256
#define T 16
#define C 8
#define M 32

static char dir[128];

static void setup(void) { test_tmpdir(dir, sizeof dir, "gpt2imp"); }
static void teardown(void) { test_rmdir(dir); }

typedef struct hf_tensor {
    char name[64];
    int dtype;
    uint32_t ndim;
    uint64_t shape[4];
} hf_tensor;

typedef struct hf_model {
    hf_tensor t[64];
    int n;
} hf_model;

static void add(hf_model *m, const char *prefix, const char *name, int dtype,
                uint32_t ndim, uint64_t a, uint64_t b) {
    hf_tensor *t = &m->t[m->n++];
    ck_assert_int_lt(strlen(prefix) + strlen(name), sizeof t->name);
    memcpy(t->name, prefix, strlen(prefix));
    memcpy(t->name + strlen(prefix), name, strlen(name) + 1);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
}

/* The tiny GPT-2 (names in HF form, c_fc.bias F16, ln_f.weight BF16). */
static hf_model tiny(const char *prefix, int extras) {
    hf_model m;
    memset(&m, 0, sizeof m);
    add(&m, prefix, "wte.weight", SAFETENSORS_F32, 2, V, C);
    add(&m, prefix, "wpe.weight", SAFETENSORS_F32, 2, T, C);
    for (int l = 0; l < 2; l++) {
        char p[32];
        snprintf(p, sizeof p, "%.12sh.%u.", prefix, (unsigned)l & 7u);
        add(&m, p, "ln_1.weight", SAFETENSORS_F32, 1, C, 0);
        add(&m, p, "ln_1.bias", SAFETENSORS_F32, 1, C, 0);
        add(&m, p, "attn.c_attn.weight", SAFETENSORS_F32, 2, C, 3 * C);
        add(&m, p, "attn.c_attn.bias", SAFETENSORS_F32, 1, 3 * C, 0);
        add(&m, p, "attn.c_proj.weight", SAFETENSORS_F32, 2, C, C);
        add(&m, p, "attn.c_proj.bias", SAFETENSORS_F32, 1, C, 0);
        add(&m, p, "ln_2.weight", SAFETENSORS_F32, 1, C, 0);
        add(&m, p, "ln_2.bias", SAFETENSORS_F32, 1, C, 0);
        add(&m, p, "mlp.c_fc.weight", SAFETENSORS_F32, 2, C, M);
        add(&m, p, "mlp.c_fc.bias", SAFETENSORS_F16, 1, M, 0);
        add(&m, p, "mlp.c_proj.weight", SAFETENSORS_BF16, 2, M, C);
        add(&m, p, "mlp.c_proj.bias", SAFETENSORS_F32, 1, C, 0);
        if (extras) {
            add(&m, p, "attn.bias", SAFETENSORS_F32, 4, 1, 1);
            m.t[m.n - 1].shape[2] = T;
            m.t[m.n - 1].shape[3] = T;
            add(&m, p, "attn.masked_bias", SAFETENSORS_F32, 0, 0, 0);
        }
    }
    add(&m, prefix, "ln_f.weight", SAFETENSORS_BF16, 1, C, 0);
    add(&m, prefix, "ln_f.bias", SAFETENSORS_F32, 1, C, 0);
    if (extras) add(&m, "", "lm_head.weight", SAFETENSORS_F32, 2, V, C);
    return m;
}

/* Value of element e of the tensor called name (HF name, prefix stripped):
 * a hash of both, a multiple of 1/16 in [-2, 2) (exact in F16 and BF16). */
static float hf_val(const char *name, uint64_t e) {
    if (strncmp(name, "transformer.", 12) == 0) name += 12;
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ (uint32_t)e) * 16777619u;
    h ^= h >> 13;
    return (float)(h % 64) / 16.0f - 2.0f;
}

static uint16_t to_f16(float v) {
    if (v == 0) return 0;
    int neg = v < 0, ex;
    float m = frexpf(neg ? -v : v, &ex); /* m in [0.5, 1) */
    uint16_t h =
        (uint16_t)((ex - 1 + 15) << 10 | ((uint16_t)((m * 2 - 1) * 1024) & 0x3ff));
    return neg ? (uint16_t)(h | 0x8000) : h;
}

static void write_model(const char *path, const hf_model *m) {
    char err[512];
    safetensors_writer *w = NULL;
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    /* Reverse order: the importer must not depend on the file's order. */
    for (int k = m->n - 1; k >= 0; k--)
        ck_assert_msg(safetensors_writer_declare(w, m->t[k].name, m->t[k].dtype,
                                                 m->t[k].ndim, m->t[k].shape, err,
                                                 sizeof err) == 0,
                      "%s", err);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    for (int k = m->n - 1; k >= 0; k--) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < m->t[k].ndim; d++) numel *= m->t[k].shape[d];
        for (uint64_t e = 0; e < numel; e++) {
            float v = hf_val(m->t[k].name, e);
            uint32_t bits;
            memcpy(&bits, &v, 4);
            uint16_t h =
                m->t[k].dtype == SAFETENSORS_F16 ? to_f16(v) : (uint16_t)(bits >> 16);
            int32_t i = (int32_t)e;
            const void *p = m->t[k].dtype == SAFETENSORS_F32   ? (const void *)&v
                            : m->t[k].dtype == SAFETENSORS_I32 ? (const void *)&i
                                                               : (const void *)&h;
            size_t n =
                m->t[k].dtype == SAFETENSORS_F32 || m->t[k].dtype == SAFETENSORS_I32 ? 4
                                                                                     : 2;
            ck_assert_int_eq(safetensors_writer_write(w, p, n, err, sizeof err), 0);
        }
    }
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
}

static void write_text(const char *path, const char *text) {
    char err[512];
    ck_assert_msg(fsio_write_file(path, text, strlen(text), err, sizeof err) == 0, "%s",
                  err);
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* The engine-order names the checkpoint must hold. */
static int engine_order(char names[][64]) {
    static const char *sfx[12] = { "ln_1.weight",        "ln_1.bias",
                                   "attn.c_attn.weight", "attn.c_attn.bias",
                                   "attn.c_proj.weight", "attn.c_proj.bias",
                                   "ln_2.weight",        "ln_2.bias",
                                   "mlp.c_fc.weight",    "mlp.c_fc.bias",
                                   "mlp.c_proj.weight",  "mlp.c_proj.bias" };
    int n = 0;
    snprintf(names[n++], 64, "wte.weight");
    snprintf(names[n++], 64, "wpe.weight");
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 12; k++) snprintf(names[n++], 64, "h.%d.%s", l, sfx[k]);
    snprintf(names[n++], 64, "ln_f.weight");
    snprintf(names[n++], 64, "ln_f.bias");
    return n;
}

/* Every tensor of OUT/model.safetensors: engine order, F32, orch shape,
 * exact values (Conv1D weights transposed). */
static void check_tensors(const char *out) {
    char p[300], err[1024], names[32][64];
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    safetensors_file *f = NULL;
    ck_assert_msg(safetensors_open(p, &f, err, sizeof err) == 0, "%s", err);
    int n = engine_order(names);
    ck_assert_uint_eq(safetensors_count(f), (unsigned)n);
    for (int i = 0; i < n; i++) {
        const safetensors_tensor *t = safetensors_get(f, (size_t)i);
        ck_assert_str_eq(t->name, names[i]);
        ck_assert_int_eq(t->dtype, SAFETENSORS_F32);
        int conv = strstr(t->name, "c_attn.weight") || strstr(t->name, "c_proj.weight") ||
                   strstr(t->name, "c_fc.weight");
        for (uint64_t e = 0; e < t->numel; e++) {
            uint64_t src = e;
            if (conv) { /* ours [out, in] = theirs [in, out] transposed */
                uint64_t r = e / t->shape[1], c = e % t->shape[1];
                src = c * t->shape[0] + r;
            }
            float got;
            memcpy(&got, (const char *)t->data + 4 * e, 4);
            if (got != hf_val(t->name, src))
                ck_abort_msg("%s[%llu] = %g, want %g", t->name, (unsigned long long)e,
                             got, hf_val(t->name, src));
        }
    }
    const safetensors_tensor *t = safetensors_find(f, "h.1.attn.c_attn.weight");
    ck_assert_uint_eq(t->ndim, 2);
    ck_assert_uint_eq(t->shape[0], 3 * C);
    ck_assert_uint_eq(t->shape[1], C);
    t = safetensors_find(f, "h.0.mlp.c_proj.weight");
    ck_assert_uint_eq(t->shape[0], C);
    ck_assert_uint_eq(t->shape[1], M);
    t = safetensors_find(f, "h.0.mlp.c_fc.bias");
    ck_assert_uint_eq(t->ndim, 1);
    ck_assert_uint_eq(t->shape[0], M);
    safetensors_close(f);
    ck_assert_msg(ckpt_verify(out, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ckpt_has_optimizer(out), 0);
}

static gpt2_import_opts opts(const char *in, const char *out) {
    gpt2_import_opts o;
    memset(&o, 0, sizeof o);
    o.input = in;
    o.out_dir = out;
    return o;
}

START_TEST(imports_every_tensor_exactly) {
    char in[300], out[300], cfg_out[300], err[1024];
    snprintf(in, sizeof in, "%s/model.safetensors", dir);
    snprintf(out, sizeof out, "%s/ck", dir);
    snprintf(cfg_out, sizeof cfg_out, "%s/ck.json", dir);
    hf_model m = tiny("", 0);
    write_model(in, &m);
    gpt2_import_opts o = opts(in, out);
    o.heads = 2;
    o.config_out = cfg_out;
    gpt2_import_result r;
    int kind = 0;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.layers, 2);
    ck_assert_uint_eq(r.heads, 2);
    ck_assert_uint_eq(r.width, C);
    ck_assert_uint_eq(r.mlp_width, M);
    ck_assert_uint_eq(r.vocab, V);
    ck_assert_uint_eq(r.context, T);
    ck_assert(r.layernorm_eps == 1e-5);
    ck_assert_str_eq(r.tokenizer, "byte"); /* vocabulary < 50257 */
    /* wte, wpe, two layers (ln_1, c_attn, c_proj, ln_2, c_fc, mlp.c_proj), ln_f */
    uint64_t per_layer =
        2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + C * M + M + M * C + C;
    ck_assert_uint_eq(r.params, (uint64_t)V * C + T * C + 2 * per_layer + 2 * C);
    check_tensors(out);

    /* state.json: step 0, tokenizer, source, config with the weights' model
     * and the default sections. */
    char *state = NULL;
    ck_assert_int_eq(ckpt_read_state(out, &state, err, sizeof err), 0);
    cJSON *j = cJSON_Parse(state);
    free(state);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "step")->valueint, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "tokenizer")->valuestring, "byte");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "imported_from")->valuestring, in);
    orch_config *cfg = NULL;
    ck_assert_msg(config_from_cjson(cJSON_GetObjectItem(j, "config"), "state", &cfg, err,
                                    sizeof err) == 0,
                  "%s", err);
    cJSON_Delete(j);
    ck_assert_str_eq(cfg->model.arch, "gpt2");
    ck_assert_uint_eq(cfg->model.vocab_size, V);
    ck_assert_uint_eq(cfg->model.context, T);
    ck_assert_uint_eq(cfg->model.layers, 2);
    ck_assert_uint_eq(cfg->model.heads, 2);
    ck_assert_uint_eq(cfg->model.width, C);
    ck_assert_uint_eq(cfg->model.mlp_width, M);
    ck_assert_uint_eq(cfg->train.micro_batch, 4);
    ck_assert_uint_eq(cfg->train.seq_len, T); /* min(context, 1024) */
    ck_assert_uint_eq(cfg->train.max_steps, 1000);
    ck_assert(cfg->train.lr == 6e-5);
    ck_assert_str_eq(cfg->data.tokenizer, "byte");
    ck_assert_str_eq(cfg->data.train, "data/finetune/train_*.bin");
    ck_assert_str_eq(cfg->data.val, "data/finetune/val_*.bin");
    ck_assert_str_eq(cfg->engine.name, "cpu");
    /* --config-out: the same config as a file. */
    orch_config *written = NULL;
    ck_assert_msg(config_load_file(cfg_out, &written, err, sizeof err) == 0, "%s", err);
    char *a = config_to_json(cfg), *b = config_to_json(written);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    config_free(written);
    config_free(cfg);
}
END_TEST

START_TEST(prefix_buffers_and_hf_config) {
    char sub[200], in[300], out[300], hf[300], err[1024];
    snprintf(sub, sizeof sub, "%s/hf", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(in, sizeof in, "%s/model.safetensors", sub);
    snprintf(hf, sizeof hf, "%s/config.json", sub);
    snprintf(out, sizeof out, "%s/ck", dir);
    hf_model m = tiny("transformer.", 1);
    write_model(in, &m);
    /* n_head and layer_norm_epsilon come from config.json next to the file. */
    write_text(hf, "{\"n_head\": 4, \"layer_norm_epsilon\": 0.001, \"n_embd\": 8}");
    gpt2_import_opts o = opts(in, out);
    gpt2_import_result r;
    int kind = 0;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.heads, 4);
    ck_assert(r.layernorm_eps == 0.001);
    check_tensors(out);
    /* --heads wins over config.json; an explicit --hf-config is read. */
    char out2[300], hf2[300];
    snprintf(out2, sizeof out2, "%s/ck2", dir);
    snprintf(hf2, sizeof hf2, "%s/other.json", dir);
    write_text(hf2, "{\"n_head\": 1}");
    o = opts(in, out2);
    o.hf_config = hf2;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.heads, 1);
    ck_assert(r.layernorm_eps == 1e-5);
    char out3[300];
    snprintf(out3, sizeof out3, "%s/ck3", dir);
    o = opts(in, out3);
    o.heads = 8;
    o.tokenizer = "gpt2";
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) != 0,
                  "gpt2 over vocab 256");
    ck_assert_int_eq(kind, GPT2_IMPORT_ERR_INPUT); /* vocab 256 cannot hold gpt2 */
    ck_assert(!exists(out3));
    o.tokenizer = NULL;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.heads, 8);
}
END_TEST

START_TEST(base_config_sections) {
    char in[300], out[300], base[300], err[1024];
    snprintf(in, sizeof in, "%s/model.safetensors", dir);
    snprintf(out, sizeof out, "%s/ck", dir);
    snprintf(base, sizeof base, "%s/base.json", dir);
    hf_model m = tiny("", 0);
    write_model(in, &m);
    write_text(base, "{\"model\": {\"vocab_size\": 256, \"context\": 64, \"layers\": 1,"
                     " \"heads\": 1, \"width\": 16},"
                     " \"train\": {\"micro_batch\": 2, \"seq_len\": 8, \"max_steps\": 7,"
                     " \"lr\": 0.01},"
                     " \"data\": {\"tokenizer\": \"byte\", \"train\": \"d/t_*.bin\","
                     " \"val\": \"d/v_*.bin\"},"
                     " \"engine\": {\"name\": \"mock\"}}");
    gpt2_import_opts o = opts(in, out);
    o.base_config = base;
    o.heads = 2;
    gpt2_import_result r;
    int kind = 0;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    char *state = NULL;
    ck_assert_int_eq(ckpt_read_state(out, &state, err, sizeof err), 0);
    cJSON *j = cJSON_Parse(state);
    free(state);
    orch_config *cfg = NULL;
    ck_assert_int_eq(
        config_from_cjson(cJSON_GetObjectItem(j, "config"), "s", &cfg, err, sizeof err),
        0);
    cJSON_Delete(j);
    /* The model from the weights, the rest from the base config. */
    ck_assert_uint_eq(cfg->model.context, T);
    ck_assert_uint_eq(cfg->model.width, C);
    ck_assert_uint_eq(cfg->model.layers, 2);
    ck_assert_uint_eq(cfg->train.micro_batch, 2);
    ck_assert_uint_eq(cfg->train.max_steps, 7);
    ck_assert_str_eq(cfg->data.train, "d/t_*.bin");
    ck_assert_str_eq(cfg->engine.name, "mock");
    config_free(cfg);
}
END_TEST

/* Expect gpt2_import to fail with exactly this message and kind. */
static void expect_fail(const gpt2_import_opts *o, int want_kind, const char *want) {
    char err[1024];
    gpt2_import_result r;
    int kind = 0;
    ck_assert_int_eq(gpt2_import(o, &r, &kind, err, sizeof err), -1);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(kind, want_kind);
    if (o->out_dir) ck_assert_msg(!exists(o->out_dir), "%s left behind", o->out_dir);
}

START_TEST(refusals) {
    char in[300], out[300], want[1024];
    snprintf(in, sizeof in, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/ck", dir);
    gpt2_import_opts o = opts(in, out);
    hf_model m = tiny("", 0);

    /* No heads anywhere and a width that is no multiple of 64. */
    write_model(in, &m);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT,
                "cannot tell the number of heads for width 8 (give --heads N)");
    o.heads = 3;
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, "3 heads do not divide the width 8");
    o.heads = 2;
    o.tokenizer = "nope";
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, "--tokenizer: 'nope' is not gpt2, byte or hf");
    o.tokenizer = NULL;
    char hf[300];
    snprintf(hf, sizeof hf, "%s/missing.json", dir);
    o.hf_config = hf;
    snprintf(want, sizeof want, "--hf-config: %s: no such file", hf);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    write_text(hf, "{not json");
    snprintf(want, sizeof want, "--hf-config: %s: not valid JSON", hf);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    o.hf_config = NULL;

    /* A foreign tensor. */
    hf_model x = m;
    add(&x, "", "h.0.attn.rotary.weight", SAFETENSORS_F32, 1, C, 0);
    write_model(in, &x);
    snprintf(want, sizeof want,
             "%s: unexpected tensor 'h.0.attn.rotary.weight' (not a GPT-2 parameter in "
             "the Hugging Face layout)",
             in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    /* A missing one (the last of layer 1). */
    x = m;
    for (int k = 0; k < x.n; k++)
        if (!strcmp(x.t[k].name, "h.1.mlp.c_proj.bias")) x.t[k] = x.t[--x.n];
    write_model(in, &x);
    snprintf(want, sizeof want, "%s: missing tensor 'h.1.mlp.c_proj.bias'", in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    /* A Conv1D weight already in [out, in]. */
    x = m;
    for (int k = 0; k < x.n; k++)
        if (!strcmp(x.t[k].name, "h.0.attn.c_attn.weight")) {
            x.t[k].shape[0] = 3 * C;
            x.t[k].shape[1] = C;
        }
    write_model(in, &x);
    snprintf(want, sizeof want,
             "%s: tensor 'h.0.attn.c_attn.weight' has shape [24,8], expected [8,24] "
             "(Hugging Face Conv1D layout [in, out])",
             in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    /* A vector of the wrong length, and a dtype that is not a float. */
    x = m;
    for (int k = 0; k < x.n; k++)
        if (!strcmp(x.t[k].name, "ln_f.bias")) x.t[k].shape[0] = C + 1;
    write_model(in, &x);
    snprintf(want, sizeof want, "%s: tensor 'ln_f.bias' has shape [9], expected [8]", in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    x = m;
    for (int k = 0; k < x.n; k++)
        if (!strcmp(x.t[k].name, "h.1.ln_1.bias")) x.t[k].dtype = SAFETENSORS_I32;
    write_model(in, &x);
    snprintf(want, sizeof want,
             "%s: tensor 'h.1.ln_1.bias' has dtype I32 (need F32, F16 or BF16)", in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    /* No embeddings at all. */
    x = m;
    x.t[0] = x.t[--x.n]; /* wte */
    write_model(in, &x);
    snprintf(want, sizeof want,
             "%s: not GPT-2 weights (need wte.weight [V,C], wpe.weight [T,C] and h.N.* "
             "layers)",
             in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    /* wpe wider than wte. */
    x = m;
    x.t[1].shape[1] = C * 2;
    write_model(in, &x);
    snprintf(want, sizeof want, "%s: inconsistent shapes (wte [256,8], wpe [16,16])", in);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    /* Options missing. */
    gpt2_import_opts none = opts(in, NULL);
    expect_fail(&none, GPT2_IMPORT_ERR_INPUT,
                "need an input file and an output directory");

    /* An output that exists is a runtime failure and stays untouched. */
    write_model(in, &m);
    ck_assert_int_eq(mkdir(out, 0755), 0);
    char err[1024];
    gpt2_import_result r;
    int kind = 0;
    ck_assert_int_eq(gpt2_import(&o, &r, &kind, err, sizeof err), -1);
    ck_assert_int_eq(kind, GPT2_IMPORT_ERR_RUNTIME);
    ck_assert_msg(strstr(err, "already exists") != NULL, "%s", err);
    ck_assert_int_eq(rmdir(out), 0); /* still empty */
}
END_TEST

/* A Hugging Face directory: config.json (the shape, checked against the
 * weights) and two shards listed in model.safetensors.index.json. */
START_TEST(directory_config_and_shards) {
    char sub[200], path[300], out[300], err[1024], want[1024];
    snprintf(sub, sizeof sub, "%s/hf", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(out, sizeof out, "%s/ck", dir);
    hf_model m = tiny("transformer.", 1), a = m, b = m;
    a.n = m.n / 2;
    b.n = m.n - a.n;
    memmove(b.t, m.t + a.n, (size_t)b.n * sizeof b.t[0]);
    snprintf(path, sizeof path, "%s/a.safetensors", sub);
    write_model(path, &a);
    snprintf(path, sizeof path, "%s/b.safetensors", sub);
    write_model(path, &b);
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int k = 0; k < m.n; k++)
        cJSON_AddStringToObject(wm, m.t[k].name,
                                k < a.n ? "a.safetensors" : "b.safetensors");
    char *text = cJSON_Print(idx);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", sub);
    write_text(path, text);
    free(text);
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/config.json", sub);
    write_text(cfg,
               "{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_layer\": 2, \"n_head\": 2, "
               "\"n_positions\": 16, \"vocab_size\": 256, \"n_inner\": null, "
               "\"activation_function\": \"gelu_new\", \"tie_word_embeddings\": true}");
    gpt2_import_opts o = opts(sub, out);
    gpt2_import_result r;
    int kind = 0;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.heads, 2);
    ck_assert_uint_eq(r.layers, 2);
    check_tensors(out);
    test_rmdir(out);

    /* config.json disagreeing with the weights, or asking for more. */
    write_text(cfg, "{\"n_head\": 2, \"n_layer\": 3}");
    snprintf(want, sizeof want, "%s: n_layer 3 does not match the weights (2)", cfg);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    write_text(cfg, "{\"n_head\": 2, \"n_inner\": 64}");
    snprintf(want, sizeof want, "%s: n_inner 64 does not match the weights (32)", cfg);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    write_text(cfg, "{\"n_head\": 2, \"scale_attn_by_inverse_layer_idx\": true}");
    snprintf(want, sizeof want,
             "%s: scale_attn_by_inverse_layer_idx true is not supported (orch's GPT-2 "
             "has false)",
             cfg);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    write_text(cfg, "{\"n_head\": 2}");

    /* The index must agree with the shards. */
    cJSON_ReplaceItemInObjectCaseSensitive(wm, m.t[0].name,
                                           cJSON_CreateString("b.safetensors"));
    text = cJSON_Print(idx);
    write_text(path, text);
    free(text);
    snprintf(want, sizeof want,
             "%s: tensor '%s' is not in b.safetensors, as the index says", path,
             m.t[0].name);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    cJSON_DeleteItemFromObjectCaseSensitive(wm, m.t[0].name);
    text = cJSON_Print(idx);
    write_text(path, text);
    free(text);
    snprintf(want, sizeof want, "%s/a.safetensors: tensor '%s' is not in the index %s",
             sub, m.t[0].name, path);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    cJSON_Delete(idx);
    unlink(path);
    snprintf(
        want, sizeof want,
        "%s: holds neither model.safetensors nor model.safetensors.index.json (not a "
        "Hugging Face model directory)",
        sub);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
}
END_TEST

/* A LLaMA-family directory (config.json of LlamaForCausalLM, 2 kv heads of
 * 4, tied head, F32/F16/BF16 tensors, an old rotary_emb.inv_freq buffer):
 * every tensor lands in engine order with its exact value, the config is
 * llama's, and refusals name the field. */
START_TEST(llama_directory) {
    char hd[300], p[400], err[1024], out[300];
    snprintf(hd, sizeof hd, "%s/llama", dir);
    snprintf(out, sizeof out, "%s/ck_llama", dir);
    ck_assert_int_eq(mkdir(hd, 0755), 0);
    static const char *const sfx[9] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    };
    /* C = 8, heads 4 (D 2), kv 2 (kv rows 4), M = 32, V = 256 */
    static const uint64_t shp[9][2] = { { C, 0 }, { C, C }, { 4, C }, { 4, C }, { C, C },
                                        { C, 0 }, { M, C }, { M, C }, { C, M } };
    hf_model m;
    memset(&m, 0, sizeof m);
    add(&m, "", "model.embed_tokens.weight", SAFETENSORS_BF16, 2, V, C);
    for (int l = 0; l < 2; l++) {
        char pre[32];
        snprintf(pre, sizeof pre, "model.layers.%d.", l & 7);
        for (int k = 0; k < 9; k++)
            add(&m, pre, sfx[k], k == 6 ? SAFETENSORS_F16 : SAFETENSORS_F32,
                shp[k][1] ? 2 : 1, shp[k][0], shp[k][1]);
        add(&m, pre, "self_attn.rotary_emb.inv_freq", SAFETENSORS_F32, 1, 1, 0);
    }
    add(&m, "", "model.norm.weight", SAFETENSORS_F32, 1, C, 0);
    snprintf(p, sizeof p, "%s/model.safetensors", hd);
    write_model(p, &m);
    static const char cfg[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
        "\"hidden_size\": 8, \"intermediate_size\": 32, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 256, "
        "\"max_position_embeddings\": 16, \"rms_norm_eps\": 1e-06, \"rope_theta\": "
        "500000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": true, "
        "\"rope_scaling\": null, \"attention_bias\": false}";
    snprintf(p, sizeof p, "%s/config.json", hd);
    write_text(p, cfg);
    gpt2_import_opts o = opts(hd, out);
    o.tokenizer = "byte";
    gpt2_import_result r;
    int kind = 0;
    ck_assert_msg(gpt2_import(&o, &r, &kind, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(r.arch, "llama");
    ck_assert_uint_eq(r.kv_heads, 2);
    ck_assert_uint_eq(r.heads, 4);
    ck_assert_int_eq(r.tied, 1);
    ck_assert_uint_eq(r.params,
                      V * C + C + 2 * (2 * C + 2 * C * C + 2 * 4 * C + 3 * M * C));
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    safetensors_file *f = NULL;
    ck_assert_msg(safetensors_open(p, &f, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(safetensors_count(f), 20);
    ck_assert_str_eq(safetensors_metadata(f, "layout"), "orch-llama");
    for (size_t i = 0; i < 20; i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        char want[64];
        if (i == 0)
            snprintf(want, sizeof want, "model.embed_tokens.weight");
        else if (i == 19)
            snprintf(want, sizeof want, "model.norm.weight");
        else
            snprintf(want, sizeof want, "model.layers.%zu.%s", (i - 1) / 9,
                     sfx[(i - 1) % 9]);
        ck_assert_str_eq(t->name, want);
        ck_assert_int_eq(t->dtype, SAFETENSORS_F32);
        for (uint64_t e = 0; e < t->numel; e++) {
            float got;
            memcpy(&got, (const char *)t->data + 4 * e, 4);
            if (got != hf_val(t->name, e))
                ck_abort_msg("%s[%llu] = %g, want %g", t->name, (unsigned long long)e,
                             got, hf_val(t->name, e));
        }
    }
    safetensors_close(f);
    ck_assert_msg(ckpt_verify(out, err, sizeof err) == 0, "%s", err);
    orch_config *c = NULL;
    char tok[32];
    ck_assert_msg(ckpt_read_config(out, &c, tok, sizeof tok, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_str_eq(c->model.arch, "llama");
    ck_assert_uint_eq(c->model.kv_heads, 2);
    ck_assert_double_eq(c->model.rope_theta, 500000.0);
    ck_assert_double_eq(c->model.layernorm_eps, 1e-6);
    ck_assert_str_eq(tok, "byte");
    config_free(c);

    /* Refusals, each naming its field; nothing is left behind. */
    snprintf(out, sizeof out, "%s/ck_bad", dir);
    o = opts(hd, out);
    o.tokenizer = "byte";
    static const struct {
        const char *from, *to, *msg;
    } bad[] = {
        { "\"attention_bias\": false", "\"attention_bias\": true",
          "attention_bias true is not supported (orch's llama has no biases)" },
        { "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"",
          "hidden_act \"gelu\" is not supported (orch's llama has \"silu\")" },
        { "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\"}",
          "rope_scaling rope_type \"yarn\" is not supported (orch has default, linear "
          "and llama3)" },
        { "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 2, \"head_dim\": 4",
          "head_dim 4 is not supported (orch's llama has hidden_size / "
          "num_attention_heads = 8 / 4)" },
        { "\"intermediate_size\": 32, ", "",
          "intermediate_size is missing (orch needs it for a llama model)" },
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        char text[1024];
        const char *at = strstr(cfg, bad[b].from);
        ck_assert_ptr_nonnull(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - cfg), cfg, bad[b].to,
                 at + strlen(bad[b].from));
        snprintf(p, sizeof p, "%s/config.json", hd);
        write_text(p, text);
        char want[1024];
        snprintf(want, sizeof want, "%s/config.json: %s", hd, bad[b].msg);
        expect_fail(&o, GPT2_IMPORT_ERR_INPUT, want);
    }
    /* No tokenizer.json and no --tokenizer. */
    write_text(p, cfg);
    o.tokenizer = NULL;
    snprintf(err, sizeof err,
             "%s/tokenizer.json: no such file (the model's tokenizer; or "
             "give --tokenizer byte|gpt2)",
             hd);
    expect_fail(&o, GPT2_IMPORT_ERR_INPUT, err);
}
END_TEST

static Suite *gpt2_import_suite(void) {
    Suite *s = suite_create("gpt2_import");
    TCase *tc = tcase_create("import");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, imports_every_tensor_exactly);
    tcase_add_test(tc, prefix_buffers_and_hf_config);
    tcase_add_test(tc, base_config_sections);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, directory_config_and_shards);
    tcase_add_test(tc, llama_directory);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(gpt2_import_suite()); }
