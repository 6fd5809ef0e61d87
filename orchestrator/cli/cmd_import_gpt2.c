/*
 * cmd_import_gpt2.c - `orch import-gpt2`: convert GPT-2 weights in the
 * Hugging Face layout (model.safetensors of GPT2Model / GPT2LMHeadModel) into
 * an orch checkpoint directory that generate, eval and serve load and that
 * `orch train --init DIR` fine-tunes.
 *
 * Mapping: names lose an optional "transformer." prefix; Conv1D weights
 * (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), stored [in, out], are
 * transposed to orch's nn.Linear layout [out, in]; wte, wpe, ln_1, ln_2, ln_f
 * and every bias are copied; the attention-mask buffers attn.bias and
 * attn.masked_bias are skipped; lm_head.weight is skipped (the head is tied to
 * wte). F16 and BF16 are widened to F32. The shape (vocab, context, width,
 * layers, mlp width) comes from the tensor shapes; the head count, which the
 * shapes do not give, from --heads, else from a Hugging Face config.json next
 * to the file (n_head, layer_norm_epsilon), else width/64 (every released
 * GPT-2 uses 64-wide heads).
 */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/store/checkpoint.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/core/config.h"
#include "orchestrator/store/safetensors.h"
#include "orchestrator/core/util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: orch import-gpt2 MODEL.safetensors --out DIR [options]\n"
            "\n"
            "Import GPT-2 weights in the Hugging Face layout into a new checkpoint\n"
            "directory DIR (model.safetensors, state.json with the config, checksums;\n"
            "no optimizer state). Use it with generate/eval/serve --checkpoint DIR,\n"
            "and fine-tune it with `orch train --init DIR` (the config's data section\n"
            "points at data/finetune/{train,val}_*.bin unless --config gives one).\n"
            "\noptions:\n"
            "  --out DIR            checkpoint directory to create (required, must not\n"
            "                       exist)\n"
            "  --heads N            attention heads (default: n_head of config.json next\n"
            "                       to MODEL, else width/64)\n"
            "  --hf-config FILE     Hugging Face config.json to read n_head and\n"
            "                       layer_norm_epsilon from\n"
            "  --tokenizer T        gpt2|byte (default gpt2 when the vocabulary has\n"
            "                       50257+ tokens, else byte)\n"
            "  --config FILE        take the train/data/engine sections from this\n"
            "                       config (the model section comes from the weights)\n"
            "  --config-out FILE    also write the resulting config to FILE\n"
            "exit status: 0 ok, 1 runtime failure, 2 bad usage or input file\n");
}

/* Engine-order tensor names of one layer, and whether each is a Conv1D
 * weight to transpose. */
static const struct {
    const char *suffix;
    int conv1d;
} layer_tensors[] = {
    {"ln_1.weight", 0},        {"ln_1.bias", 0},
    {"attn.c_attn.weight", 1}, {"attn.c_attn.bias", 0},
    {"attn.c_proj.weight", 1}, {"attn.c_proj.bias", 0},
    {"ln_2.weight", 0},        {"ln_2.bias", 0},
    {"mlp.c_fc.weight", 1},    {"mlp.c_fc.bias", 0},
    {"mlp.c_proj.weight", 1},  {"mlp.c_proj.bias", 0},
};
#define N_LAYER_TENSORS (sizeof layer_tensors / sizeof layer_tensors[0])

/* Name without the optional "transformer." prefix. */
static const char *strip(const char *n) {
    return strncmp(n, "transformer.", 12) == 0 ? n + 12 : n;
}

/* Find by orch name, with or without the prefix. */
static const safetensors_tensor *find(const safetensors_file *f,
                                      const char *name) {
    const safetensors_tensor *t = safetensors_find(f, name);
    if (t) return t;
    char buf[256];
    snprintf(buf, sizeof buf, "transformer.%s", name);
    return safetensors_find(f, buf);
}

static int is_skipped(const char *n) {
    size_t l = strlen(n);
    return strcmp(n, "lm_head.weight") == 0 ||
           (l >= 10 && strcmp(n + l - 10, ".attn.bias") == 0) ||
           (l >= 17 && strcmp(n + l - 17, ".attn.masked_bias") == 0);
}

/* Element e of a tensor as f32 (F32/F16/BF16; others rejected earlier). */
static float elem(const safetensors_tensor *t, uint64_t e) {
    const uint8_t *p = (const uint8_t *)t->data;
    if (t->dtype == SAFETENSORS_F32) {
        float f;
        memcpy(&f, p + 4 * e, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[2 * e] | p[2 * e + 1] << 8);
    if (t->dtype == SAFETENSORS_BF16) {
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1f,
             man = h & 0x3ff, bits;
    if (ex == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (ex == 31)
        bits = sign | 0x7f800000u | man << 13;
    else
        bits = sign | (ex + 112) << 23 | man << 13;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

typedef struct import_ctx {
    const char *file;
    const safetensors_file *st;
    ckpt_tensor *out;
    size_t n_out;
    char names[1024][64];
} import_ctx;

/* Convert one tensor (expected orch shape rows x cols, or a vector when
 * cols == 0) into out[n_out]. conv1d: the file holds [cols, rows]. */
static int take(import_ctx *ic, const char *name, uint64_t rows, uint64_t cols,
                int conv1d, char *err, size_t err_cap) {
    const safetensors_tensor *t = find(ic->st, name);
    if (!t) {
        util_set_err(err, err_cap, "%s: missing tensor '%s'", ic->file, name);
        return -1;
    }
    if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_F16 &&
        t->dtype != SAFETENSORS_BF16) {
        util_set_err(err, err_cap, "%s: tensor '%s' has dtype %s (need F32, F16 "
                                   "or BF16)",
                     ic->file, t->name, safetensors_dtype_name(t->dtype));
        return -1;
    }
    uint64_t want0 = conv1d ? cols : rows, want1 = conv1d ? rows : cols;
    int ok = cols ? (t->ndim == 2 && t->shape[0] == want0 && t->shape[1] == want1)
                  : (t->ndim == 1 && t->shape[0] == rows);
    if (!ok) {
        char got[128] = "";
        size_t gl = 0;
        for (uint32_t k = 0; k < t->ndim && gl < 100; k++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%llu",
                                   k ? "," : "", (unsigned long long)t->shape[k]);
        if (cols)
            util_set_err(err, err_cap,
                         "%s: tensor '%s' has shape [%s], expected [%llu,%llu]%s",
                         ic->file, t->name, got, (unsigned long long)want0,
                         (unsigned long long)want1,
                         conv1d ? " (Hugging Face Conv1D layout [in, out])" : "");
        else
            util_set_err(err, err_cap, "%s: tensor '%s' has shape [%s], expected "
                                       "[%llu]",
                         ic->file, t->name, got, (unsigned long long)rows);
        return -1;
    }
    uint64_t n = cols ? rows * cols : rows;
    float *d = malloc(n ? (size_t)n * sizeof *d : 1);
    if (!d) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    if (conv1d) {
        /* out[r][c] = in[c][r], in is [cols, rows]. */
        for (uint64_t c = 0; c < cols; c++)
            for (uint64_t r = 0; r < rows; r++) d[r * cols + c] = elem(t, c * rows + r);
    } else {
        for (uint64_t e = 0; e < n; e++) d[e] = elem(t, e);
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

/* n_head / layer_norm_epsilon from a Hugging Face config.json. Returns 1 if
 * the file was read, 0 if absent, -1 on a bad file. */
static int read_hf_config(const char *path, uint32_t *heads, double *eps,
                          char *err, size_t err_cap) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j) {
        util_set_err(err, err_cap, "%s: not valid JSON", path);
        return -1;
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "n_head");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "layer_norm_epsilon");
    if (cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble < 65536)
        *heads = (uint32_t)h->valuedouble;
    if (cJSON_IsNumber(e) && e->valuedouble > 0) *eps = e->valuedouble;
    cJSON_Delete(j);
    return 1;
}

int cmd_import_gpt2(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return ORCH_EXIT_OK;
    }
    const char *in = NULL, *out = NULL, *hf_config = NULL, *tok = NULL,
               *base_config = NULL, *config_out = NULL;
    uint64_t heads_arg = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = util_flag_value("--out", argc, argv, &i))) {
            out = v;
        } else if ((v = util_flag_value("--heads", argc, argv, &i))) {
            if (util_parse_u64(v, &heads_arg) != 0 || heads_arg == 0 ||
                heads_arg > 4096) {
                util_error("import-gpt2: --heads: '%s' is not a head count", v);
                return ORCH_EXIT_USAGE;
            }
        } else if ((v = util_flag_value("--hf-config", argc, argv, &i))) {
            hf_config = v;
        } else if ((v = util_flag_value("--tokenizer", argc, argv, &i))) {
            tok = v;
        } else if ((v = util_flag_value("--config-out", argc, argv, &i))) {
            config_out = v;
        } else if ((v = util_flag_value("--config", argc, argv, &i))) {
            base_config = v;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            util_error("import-gpt2: unknown or incomplete option '%s' (see orch "
                       "import-gpt2 --help)",
                       argv[i]);
            return ORCH_EXIT_USAGE;
        } else if (!in) {
            in = argv[i];
        } else {
            util_error("import-gpt2: more than one input file ('%s', '%s')", in,
                       argv[i]);
            return ORCH_EXIT_USAGE;
        }
    }
    if (!in || !out) {
        util_error("import-gpt2: need MODEL.safetensors and --out DIR (see orch "
                   "import-gpt2 --help)");
        return ORCH_EXIT_USAGE;
    }
    if (tok && strcmp(tok, "gpt2") != 0 && strcmp(tok, "byte") != 0) {
        util_error("import-gpt2: --tokenizer: '%s' is not gpt2 or byte", tok);
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    safetensors_file *st = NULL;
    if (safetensors_open(in, &st, err, sizeof err) != 0) {
        util_error("import-gpt2: %s", err);
        return ORCH_EXIT_USAGE;
    }
    int rc = ORCH_EXIT_USAGE;
    import_ctx *ic = util_calloc(1, sizeof *ic);
    orch_config *base = NULL, *cfg = NULL;
    cJSON *doc = NULL, *state = NULL;
    char *state_text = NULL, *cfg_text = NULL;
    if (!ic) goto oom;
    ic->file = in;
    ic->st = st;

    /* Every tensor must be known or deliberately skipped; count layers. */
    uint32_t layers = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const char *n = strip(safetensors_get(st, i)->name);
        if (is_skipped(n)) continue;
        if (strncmp(n, "h.", 2) == 0) {
            char *end;
            unsigned long l = strtoul(n + 2, &end, 10);
            int known = end != n + 2 && *end == '.' && l < 1024;
            for (size_t k = 0; known && k < N_LAYER_TENSORS; k++)
                if (strcmp(end + 1, layer_tensors[k].suffix) == 0) {
                    if (l + 1 > layers) layers = (uint32_t)(l + 1);
                    known = 2;
                }
            if (known == 2) continue;
        } else if (strcmp(n, "wte.weight") == 0 || strcmp(n, "wpe.weight") == 0 ||
                   strcmp(n, "ln_f.weight") == 0 || strcmp(n, "ln_f.bias") == 0) {
            continue;
        }
        util_error("import-gpt2: %s: unexpected tensor '%s' (not a GPT-2 "
                   "parameter in the Hugging Face layout)",
                   in, safetensors_get(st, i)->name);
        goto out;
    }
    const safetensors_tensor *wte = find(st, "wte.weight");
    const safetensors_tensor *wpe = find(st, "wpe.weight");
    const safetensors_tensor *fc = find(st, "h.0.mlp.c_fc.bias");
    if (!wte || !wpe || layers == 0 || !fc || wte->ndim != 2 || wpe->ndim != 2 ||
        fc->ndim != 1) {
        util_error("import-gpt2: %s: not GPT-2 weights (need wte.weight [V,C], "
                   "wpe.weight [T,C] and h.N.* layers)",
                   in);
        goto out;
    }
    uint64_t V = wte->shape[0], C = wte->shape[1], T = wpe->shape[0],
             M = fc->shape[0];
    if (wpe->shape[1] != C || V > INT32_MAX || T > 1048576 || C > 65536 ||
        M > 262144 || V == 0 || C == 0 || T == 0 || M == 0) {
        util_error("import-gpt2: %s: inconsistent shapes (wte [%llu,%llu], wpe "
                   "[%llu,%llu])",
                   in, (unsigned long long)V, (unsigned long long)C,
                   (unsigned long long)wpe->shape[0],
                   (unsigned long long)wpe->shape[1]);
        goto out;
    }
    uint32_t heads = 0;
    double eps = 1e-5;
    char hfpath[PATH_MAX];
    if (!hf_config) {
        const char *slash = strrchr(in, '/');
        int dl = slash ? (int)(slash - in) : 1;
        snprintf(hfpath, sizeof hfpath, "%.*s/config.json", dl, slash ? in : ".");
    } else {
        snprintf(hfpath, sizeof hfpath, "%s", hf_config);
    }
    int got = read_hf_config(hfpath, &heads, &eps, err, sizeof err);
    if (got < 0 || (got == 0 && hf_config)) {
        util_error("import-gpt2: %s", got < 0 ? err : "--hf-config: cannot read file");
        goto out;
    }
    if (heads_arg) heads = (uint32_t)heads_arg;
    if (!heads) {
        if (C % 64 != 0) {
            util_error("import-gpt2: cannot tell the number of heads for width "
                       "%llu (give --heads N)",
                       (unsigned long long)C);
            goto out;
        }
        heads = (uint32_t)(C / 64);
    }
    if (C % heads != 0) {
        util_error("import-gpt2: %u heads do not divide the width %llu", heads,
                   (unsigned long long)C);
        goto out;
    }
    if (!tok) tok = V >= 50257 ? "gpt2" : "byte";

    /* Tensors in engine table order (orch_engine.h). */
    size_t n_total = 4 + (size_t)layers * N_LAYER_TENSORS;
    if (n_total > sizeof ic->names / sizeof ic->names[0]) {
        util_error("import-gpt2: %s: too many layers (%u)", in, layers);
        goto out;
    }
    ic->out = util_calloc(n_total, sizeof *ic->out);
    if (!ic->out) goto oom;
    if (take(ic, "wte.weight", V, C, 0, err, sizeof err) != 0 ||
        take(ic, "wpe.weight", T, C, 0, err, sizeof err) != 0)
        goto bad;
    for (uint32_t l = 0; l < layers; l++) {
        for (size_t k = 0; k < N_LAYER_TENSORS; k++) {
            char name[64];
            snprintf(name, sizeof name, "h.%u.%s", l, layer_tensors[k].suffix);
            const char *sfx = layer_tensors[k].suffix;
            uint64_t rows = C, cols = 0;
            if (strcmp(sfx, "attn.c_attn.weight") == 0) rows = 3 * C, cols = C;
            else if (strcmp(sfx, "attn.c_attn.bias") == 0) rows = 3 * C;
            else if (strcmp(sfx, "attn.c_proj.weight") == 0) cols = C;
            else if (strcmp(sfx, "mlp.c_fc.weight") == 0) rows = M, cols = C;
            else if (strcmp(sfx, "mlp.c_fc.bias") == 0) rows = M;
            else if (strcmp(sfx, "mlp.c_proj.weight") == 0) cols = M;
            if (take(ic, name, rows, cols, layer_tensors[k].conv1d, err,
                     sizeof err) != 0)
                goto bad;
        }
    }
    if (take(ic, "ln_f.weight", C, 0, 0, err, sizeof err) != 0 ||
        take(ic, "ln_f.bias", C, 0, 0, err, sizeof err) != 0)
        goto bad;

    /* The config: model from the weights, the rest from --config or defaults. */
    if (base_config && config_load_file(base_config, &base, err, sizeof err) != 0) {
        util_error("import-gpt2: %s", err);
        goto out;
    }
    doc = base ? (cJSON *)config_to_cjson(base) : cJSON_CreateObject();
    if (!doc) goto oom;
    cJSON_DeleteItemFromObjectCaseSensitive(doc, "model");
    cJSON *model = cJSON_CreateObject();
    if (!model) goto oom;
    cJSON_AddItemToObject(doc, "model", model);
    cJSON_AddStringToObject(model, "arch", "gpt2");
    cJSON_AddNumberToObject(model, "vocab_size", (double)V);
    cJSON_AddNumberToObject(model, "context", (double)T);
    cJSON_AddNumberToObject(model, "layers", layers);
    cJSON_AddNumberToObject(model, "heads", heads);
    cJSON_AddNumberToObject(model, "width", (double)C);
    cJSON_AddNumberToObject(model, "mlp_width", (double)M);
    cJSON_AddNumberToObject(model, "layernorm_eps", eps);
    if (!base) {
        cJSON *tr = cJSON_AddObjectToObject(doc, "train");
        cJSON_AddNumberToObject(tr, "micro_batch", 4);
        cJSON_AddNumberToObject(tr, "seq_len", (double)(T < 1024 ? T : 1024));
        cJSON_AddNumberToObject(tr, "max_steps", 1000);
        cJSON_AddNumberToObject(tr, "lr", 6e-5);
        cJSON *da = cJSON_AddObjectToObject(doc, "data");
        cJSON_AddStringToObject(da, "tokenizer", tok);
        cJSON_AddStringToObject(da, "train", "data/finetune/train_*.bin");
        cJSON_AddStringToObject(da, "val", "data/finetune/val_*.bin");
        cJSON *en = cJSON_AddObjectToObject(doc, "engine");
        cJSON_AddStringToObject(en, "name", "cpu");
    } else {
        cJSON *da = cJSON_GetObjectItemCaseSensitive(doc, "data");
        if (da) cJSON_ReplaceItemInObjectCaseSensitive(da, "tokenizer",
                                                       cJSON_CreateString(tok));
    }
    if (config_from_cjson(doc, "imported config", &cfg, err, sizeof err) != 0) {
        util_error("import-gpt2: %s", err);
        goto out;
    }
    state = cJSON_CreateObject();
    if (!state) goto oom;
    cJSON_AddNumberToObject(state, "format", 1);
    cJSON_AddNumberToObject(state, "step", 0);
    cJSON_AddStringToObject(state, "tokenizer", tok);
    cJSON_AddStringToObject(state, "imported_from", in);
    cJSON *cj = config_to_cjson(cfg);
    if (!cj) goto oom;
    cJSON_AddItemToObject(state, "config", cj);
    state_text = cJSON_Print(state);
    cfg_text = config_to_json(cfg);
    if (!state_text || !cfg_text) goto oom;

    rc = ORCH_EXIT_FAILURE;
    if (ckpt_write_dir(out, ic->out, ic->n_out, state_text, 0, err,
                       sizeof err) != 0) {
        util_error("import-gpt2: %s", err);
        goto out;
    }
    if (config_out) {
        FILE *fp = fopen(config_out, "w");
        if (!fp || fputs(cfg_text, fp) < 0 || fputc('\n', fp) < 0 ||
            fclose(fp) != 0) {
            util_error("import-gpt2: cannot write %s", config_out);
            goto out;
        }
    }
    uint64_t params = 0;
    for (size_t i = 0; i < ic->n_out; i++)
        params += ic->out[i].shape[0] * (ic->out[i].ndim == 2 ? ic->out[i].shape[1] : 1);
    printf("imported GPT-2: %u layers, %u heads, width %llu, mlp %llu, vocab "
           "%llu, context %llu, %llu parameters, tokenizer %s -> %s\n",
           layers, heads, (unsigned long long)C, (unsigned long long)M,
           (unsigned long long)V, (unsigned long long)T, (unsigned long long)params, tok,
           out);
    rc = ORCH_EXIT_OK;
    goto out;
bad:
    util_error("import-gpt2: %s", err);
    goto out;
oom:
    util_error("import-gpt2: out of memory");
    rc = ORCH_EXIT_FAILURE;
out:
    if (ic) {
        for (size_t i = 0; i < ic->n_out; i++) free((void *)ic->out[i].data);
        free(ic->out);
        free(ic);
    }
    free(state_text);
    free(cfg_text);
    cJSON_Delete(state);
    cJSON_Delete(doc);
    config_free(base);
    config_free(cfg);
    safetensors_close(st);
    return rc;
}
