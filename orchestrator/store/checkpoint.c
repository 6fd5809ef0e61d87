/*
 * checkpoint.c - reading checkpoints: verify by SHA-256, find the newest good
 * one of a run, read state.json (and the run config in it) and meta.json,
 * load tensors by name into an engine. See checkpoint.h; writing is in
 * ckpt_save.c.
 */
#include "orchestrator/store/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_read.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/ckpt_files.h"
#include "orchestrator/store/safetensors.h"
#include "orchestrator/store/sha256.h"

/* ------------------------------------------------------------------------- */
/* Verify, find, read                                                         */
/* ------------------------------------------------------------------------- */

int ckpt_verify(const char *ckpt_dir, char *err, size_t err_cap) {
    char p[PATH_MAX], *text = NULL;
    if (!ckpt_is_dir(ckpt_dir)) {
        util_set_err(err, err_cap, "%s: not a checkpoint directory", ckpt_dir);
        return -1;
    }
    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_SUMS_FILE, err, err_cap) != 0)
        return -1;
    if (!ckpt_is_file(p)) {
        if (ckpt_exists(p))
            util_set_err(err, err_cap, "%s: %s is not a regular file", ckpt_dir,
                         CKPT_SUMS_FILE);
        else
            util_set_err(err, err_cap, "%s: missing %s (incomplete checkpoint)", ckpt_dir,
                         CKPT_SUMS_FILE);
        return -1;
    }
    if (fsio_read_file(p, 1 << 16, &text, NULL, err, err_cap) != 0) return -1;
    char *listed = strdup(text); /* strtok_r below cuts text up */
    if (!listed) {
        free(text);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    int rc = -1, have_model = 0, have_state = 0, lines = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        lines++;
        size_t ll = strlen(line);
        if (ll < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
            util_set_err(err, err_cap, "%s/%s: malformed line %d", ckpt_dir,
                         CKPT_SUMS_FILE, lines);
            goto out;
        }
        const char *file = line + 66;
        if (strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0) {
            util_set_err(err, err_cap, "%s/%s: bad file name '%s'", ckpt_dir,
                         CKPT_SUMS_FILE, file);
            goto out;
        }
        line[64] = '\0';
        for (int i = 0; i < 64; i++)
            if (!((line[i] >= '0' && line[i] <= '9') ||
                  (line[i] >= 'a' && line[i] <= 'f'))) {
                util_set_err(err, err_cap, "%s/%s: malformed line %d", ckpt_dir,
                             CKPT_SUMS_FILE, lines);
                goto out;
            }
        char fp[PATH_MAX];
        if (ckpt_path_join(fp, sizeof fp, ckpt_dir, file, err, err_cap) != 0) goto out;
        if (!ckpt_is_file(fp)) {
            util_set_err(err, err_cap, "%s: %s %s", ckpt_dir,
                         ckpt_exists(fp) ? "not a regular file:" : "missing file", file);
            goto out;
        }
        uint8_t dg[32];
        char hex[65];
        if (sha256_file(fp, dg, err, err_cap) != 0) goto out;
        sha256_hex(dg, hex);
        if (strcmp(hex, line) != 0) {
            util_set_err(err, err_cap,
                         "%s: checksum mismatch for %s (torn or corrupt "
                         "checkpoint)",
                         ckpt_dir, file);
            goto out;
        }
        if (strcmp(file, CKPT_MODEL_FILE) == 0) have_model = 1;
        if (strcmp(file, CKPT_STATE_FILE) == 0) have_state = 1;
    }
    if (!have_model || !have_state) {
        util_set_err(err, err_cap, "%s: %s does not list %s", ckpt_dir, CKPT_SUMS_FILE,
                     have_model ? CKPT_STATE_FILE : CKPT_MODEL_FILE);
        goto out;
    }
    /* Every checkpoint file that is present must be covered (a checksums
     * file cut short would otherwise vouch for fewer files). */
    static const char *const known[] = { CKPT_OPTIM_FILE, CKPT_META_FILE };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        char fp[PATH_MAX], needle[64];
        if (ckpt_path_join(fp, sizeof fp, ckpt_dir, known[k], err, err_cap) != 0)
            goto out;
        snprintf(needle, sizeof needle, "  %s\n", known[k]);
        if (ckpt_is_file(fp) && !strstr(listed, needle)) {
            util_set_err(err, err_cap, "%s: %s does not list %s", ckpt_dir,
                         CKPT_SUMS_FILE, known[k]);
            goto out;
        }
    }
    rc = 0;
out:
    free(listed);
    free(text);
    return rc;
}

int ckpt_find_latest(const char *path, char *out_dir, size_t out_cap, char *warn,
                     size_t warn_cap, char *err, size_t err_cap) {
    char p[PATH_MAX], verr[1024];
    if (warn && warn_cap) warn[0] = '\0';
    if (!path || !ckpt_is_dir(path)) {
        util_set_err(err, err_cap, "%s: no such checkpoint or run directory",
                     path ? path : "(null)");
        return -1;
    }
    /* A checkpoint directory itself. */
    char sp[PATH_MAX], cp[PATH_MAX];
    if (ckpt_path_join(sp, sizeof sp, path, CKPT_STATE_FILE, err, err_cap) != 0 ||
        ckpt_path_join(cp, sizeof cp, path, CKPT_SUMS_FILE, err, err_cap) != 0)
        return -1;
    if (ckpt_is_file(sp) || ckpt_is_file(cp)) {
        if (ckpt_verify(path, err, err_cap) != 0) return -1;
        if (snprintf(out_dir, out_cap, "%s", path) >= (int)out_cap) {
            util_set_err(err, err_cap, "%s: path too long", path);
            return -1;
        }
        return 0;
    }
    /* A run directory: trust `latest` if it names a good checkpoint. */
    char problem[1200] = "";
    char *text = NULL;
    if (ckpt_path_join(p, sizeof p, path, CKPT_LATEST_FILE, err, err_cap) != 0) return -1;
    if (fsio_read_file(p, 4096, &text, NULL, verr, sizeof verr) != 0) {
        if (errno == ENOENT || !ckpt_exists(p))
            snprintf(problem, sizeof problem, "no '%s' file", CKPT_LATEST_FILE);
        else if (!ckpt_is_file(p))
            snprintf(problem, sizeof problem, "'%s' is not a regular file",
                     CKPT_LATEST_FILE);
        else
            snprintf(problem, sizeof problem, "cannot read '%s': %s", CKPT_LATEST_FILE,
                     verr);
    } else {
        size_t l = strlen(text);
        while (l && (text[l - 1] == '\n' || text[l - 1] == '\r' || text[l - 1] == ' '))
            text[--l] = '\0';
        uint64_t step;
        if (ckpt_parse_name(text, &step) != 0) {
            snprintf(problem, sizeof problem,
                     "'%s' is corrupt (does not name "
                     "a ckpt-STEP directory)",
                     CKPT_LATEST_FILE);
        } else if (ckpt_path_join(p, sizeof p, path, text, err, err_cap) != 0) {
            free(text);
            return -1;
        } else if (ckpt_verify(p, verr, sizeof verr) != 0) {
            snprintf(problem, sizeof problem, "'%s' names %s, which is unusable: %s",
                     CKPT_LATEST_FILE, text, verr);
        } else {
            free(text);
            if (snprintf(out_dir, out_cap, "%s", p) >= (int)out_cap) {
                util_set_err(err, err_cap, "%s: path too long", p);
                return -1;
            }
            return 0;
        }
    }
    free(text);
    /* Fall back to the newest checkpoint that verifies. */
    ckpt_ent *v = NULL;
    size_t n = 0;
    if (ckpt_list(path, &v, &n) != 0) {
        util_set_err(err, err_cap, "%s: cannot list: %s", path, strerror(errno));
        return -1;
    }
    char skipped[512] = "";
    size_t sl = 0;
    for (size_t i = 0; i < n; i++) {
        if (ckpt_path_join(p, sizeof p, path, v[i].name, err, err_cap) != 0) {
            free(v);
            return -1;
        }
        if (ckpt_verify(p, verr, sizeof verr) != 0) {
            if (sl < sizeof skipped - 80)
                sl += (size_t)snprintf(skipped + sl, sizeof skipped - sl, "%s%s",
                                       sl ? ", " : "", v[i].name);
            continue;
        }
        free(v);
        if (snprintf(out_dir, out_cap, "%s", p) >= (int)out_cap) {
            util_set_err(err, err_cap, "%s: path too long", p);
            return -1;
        }
        util_set_err(warn, warn_cap, "%s: %s; using %s%s%s%s", path, problem,
                     p + strlen(path) + 1, sl ? " (skipped corrupt: " : "", skipped,
                     sl ? ")" : "");
        return 0;
    }
    free(v);
    if (n == 0)
        util_set_err(err, err_cap,
                     "%s: no checkpoint found (%s, no ckpt-* "
                     "directories)",
                     path, problem);
    else
        util_set_err(err, err_cap,
                     "%s: %s, and none of the %zu ckpt-* "
                     "directories verifies",
                     path, problem, n);
    return -1;
}

int ckpt_read_state(const char *ckpt_dir, char **state_json, char *err, size_t err_cap) {
    char p[PATH_MAX];
    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_STATE_FILE, err, err_cap) != 0)
        return -1;
    return fsio_read_file(p, CKPT_STATE_MAX_BYTES, state_json, NULL, err, err_cap);
}

/* state.json parsed: one JSON object and nothing after it. */
static int parse_state(const char *ckpt_dir, const char *text, size_t len, cJSON **out,
                       char *err, size_t err_cap) {
    if (strlen(text) != len) {
        util_set_err(err, err_cap, "%s/%s: not valid JSON (it contains a NUL byte)",
                     ckpt_dir, CKPT_STATE_FILE);
        return -1;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        int line = 1, col = 1;
        const char *stop = end ? end : text;
        for (const char *p = text; p < stop && *p; p++) {
            if (*p == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        util_set_err(err, err_cap, "%s/%s: not valid JSON (%s at line %d, column %d)",
                     ckpt_dir, CKPT_STATE_FILE,
                     len == 0 ? "empty file"
                     : *stop  ? "unexpected text"
                              : "unexpected end",
                     line, col);
        return -1;
    }
    if (!cJSON_IsObject(root)) {
        util_set_err(err, err_cap, "%s/%s: not a JSON object (it holds %s)", ckpt_dir,
                     CKPT_STATE_FILE, json_read_type_name(root));
        cJSON_Delete(root);
        return -1;
    }
    *out = root;
    return 0;
}

int ckpt_read_config(const char *ckpt_dir, orch_config **out, char *tokenizer,
                     size_t tokenizer_cap, char *err, size_t err_cap) {
    char p[PATH_MAX], *text = NULL;
    size_t len = 0;
    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_STATE_FILE, err, err_cap) != 0 ||
        fsio_read_file(p, CKPT_STATE_MAX_BYTES, &text, &len, err, err_cap) != 0)
        return -1;
    cJSON *root = NULL;
    int rc = parse_state(ckpt_dir, text, len, &root, err, err_cap);
    free(text);
    if (rc != 0) return -1;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    if (!cJSON_IsObject(c)) {
        util_set_err(err, err_cap, "%s/%s: no \"config\" object%s%s", ckpt_dir,
                     CKPT_STATE_FILE, c ? ": it is " : "",
                     c ? json_read_type_name(c) : "");
        cJSON_Delete(root);
        return -1;
    }
    if (t && !cJSON_IsString(t)) {
        util_set_err(err, err_cap, "%s/%s: tokenizer: expected a string, got %s",
                     ckpt_dir, CKPT_STATE_FILE, json_read_type_name(t));
        cJSON_Delete(root);
        return -1;
    }
    char origin[PATH_MAX + 32];
    snprintf(origin, sizeof origin, "%s/%s: config", ckpt_dir, CKPT_STATE_FILE);
    orch_config *cfg = NULL;
    if (config_from_cjson(c, origin, &cfg, err, err_cap) != 0) {
        cJSON_Delete(root);
        return -1;
    }
    if (tokenizer)
        snprintf(tokenizer, tokenizer_cap, "%s",
                 t ? t->valuestring : cfg->data.tokenizer);
    cJSON_Delete(root);
    *out = cfg;
    return 0;
}

int ckpt_read_step(const char *ckpt_dir, uint64_t *step, char *err, size_t err_cap) {
    char p[PATH_MAX], *text = NULL, msg[256];
    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_META_FILE, err, err_cap) != 0)
        return -1;
    if (fsio_read_file(p, CKPT_META_MAX_BYTES, &text, NULL, NULL, 0) == 0) {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
        free(text);
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            util_set_err(err, err_cap, "%s: not a JSON object", p);
            return -1;
        }
        uint64_t s = 0;
        int rc = json_read_u64(j, "step", JSON_READ_REQUIRED, 0, 0, JSON_READ_U64_MAX, &s,
                               msg, sizeof msg);
        int missing = rc != 0 && !cJSON_GetObjectItemCaseSensitive(j, "step");
        cJSON_Delete(j);
        if (rc == 0) {
            *step = s;
            return 0;
        }
        if (!missing) {
            util_set_err(err, err_cap, "%s: %s", p, msg);
            return -1;
        }
    }
    const char *base = strrchr(ckpt_dir, '/');
    base = base ? base + 1 : ckpt_dir;
    if (ckpt_parse_name(base, step) == 0) return 0;
    util_set_err(err, err_cap, "%s: no step recorded", ckpt_dir);
    return -1;
}

int ckpt_has_optimizer(const char *ckpt_dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", ckpt_dir, CKPT_OPTIM_FILE) >= (int)sizeof p)
        return 0;
    return ckpt_is_file(p);
}

/* ------------------------------------------------------------------------- */
/* Load                                                                       */
/* ------------------------------------------------------------------------- */

/* Load one engine table from file f; names get `prefix`. */
static int load_table(const char *fpath, const safetensors_file *f, const char *prefix,
                      const engine_handle *h, orch_engine_ctx *ctx, uint32_t kind,
                      char *err, size_t err_cap) {
    ckpt_tsrc s = { h, ctx, kind, NULL, 0 };
    size_t n;
    if (ckpt_tsrc_count(&s, &n, err, err_cap) != 0) return -1;
    void *buf = NULL;
    size_t buf_cap = 0;
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        ckpt_tdesc d;
        if (ckpt_tsrc_desc(&s, i, &d, err, err_cap) != 0) goto out;
        char name[ORCH_TENSOR_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%s", prefix, d.name);
        const safetensors_tensor *t = safetensors_find(f, name);
        if (!t) {
            util_set_err(err, err_cap,
                         "%s: missing tensor '%s' (the model "
                         "config does not match the checkpoint?)",
                         fpath, name);
            goto out;
        }
        int same = t->ndim == d.ndim;
        for (uint32_t k = 0; same && k < d.ndim; k++) same = t->shape[k] == d.shape[k];
        if (!same) {
            char a[128] = "", b[128] = "";
            size_t al = 0, bl = 0;
            for (uint32_t k = 0; k < t->ndim && al < 100; k++)
                al += (size_t)snprintf(a + al, sizeof a - al, "%s%llu", k ? "," : "",
                                       (unsigned long long)t->shape[k]);
            for (uint32_t k = 0; k < d.ndim && bl < 100; k++)
                bl += (size_t)snprintf(b + bl, sizeof b - bl, "%s%llu", k ? "," : "",
                                       (unsigned long long)d.shape[k]);
            util_set_err(err, err_cap,
                         "%s: tensor '%s' has shape [%s] but the model needs "
                         "[%s]",
                         fpath, name, a, b);
            goto out;
        }
        const void *src = t->data;
        int convert = t->dtype != d.dtype;
        if (convert && !(d.dtype == SAFETENSORS_F32 &&
                         (t->dtype == SAFETENSORS_F16 || t->dtype == SAFETENSORS_BF16))) {
            util_set_err(err, err_cap, "%s: tensor '%s' is %s but the engine needs %s",
                         fpath, name, safetensors_dtype_name(t->dtype),
                         safetensors_dtype_name(d.dtype));
            goto out;
        }
        if (convert || ((uintptr_t)src % 8) != 0) {
            if (d.nbytes > buf_cap) {
                free(buf);
                buf = malloc((size_t)d.nbytes);
                buf_cap = buf ? (size_t)d.nbytes : 0;
                if (!buf) {
                    util_set_err(err, err_cap, "out of memory");
                    goto out;
                }
            }
            if (!convert)
                memcpy(buf, src, (size_t)d.nbytes);
            else
                (void)safetensors_to_f32(t->dtype, src, buf, t->numel);
            src = buf;
        }
        int32_t st = h->api->tensor_write(ctx, kind, (uint32_t)i, src, d.nbytes);
        if (st != ORCH_OK) {
            char what[128];
            snprintf(what, sizeof what, "tensor_write '%s'", name);
            ckpt_engine_err(h, ctx, st, what, err, err_cap);
            goto out;
        }
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

/* The file's own account of its layout (ckpt_files.h): "orch" files must be a
 * layout and version this code reads; files without it (or "pt", as orch
 * wrote before) are layout 1; any other format is not an orch checkpoint. */
int ckpt_check_layout(const char *fpath, const safetensors_file *f, char *err,
                      size_t err_cap) {
    const char *fmt = safetensors_metadata(f, "format");
    if (!fmt || strcmp(fmt, "pt") == 0) return 0;
    if (strcmp(fmt, CKPT_META_FORMAT) != 0) {
        util_set_err(err, err_cap,
                     "%s: __metadata__ format '%.40s' is not an orch checkpoint (orch "
                     "writes '%s'; Hugging Face GPT-2 weights: orch import-gpt2)",
                     fpath, fmt, CKPT_META_FORMAT);
        return -1;
    }
    const char *lay = safetensors_metadata(f, "layout");
    const char *ver = safetensors_metadata(f, "layout_version");
    if (!lay || strncmp(lay, CKPT_LAYOUT_PREFIX, strlen(CKPT_LAYOUT_PREFIX)) != 0 ||
        !ver || strcmp(ver, CKPT_LAYOUT_VERSION) != 0) {
        util_set_err(
            err, err_cap,
            "%s: layout '%.40s' version '%.20s' is not one this orch reads (%sARCH "
            "version %s)",
            fpath, lay ? lay : "(none)", ver ? ver : "(none)", CKPT_LAYOUT_PREFIX,
            CKPT_LAYOUT_VERSION);
        return -1;
    }
    return 0;
}

/* The architecture in f's layout ("orch-ARCH") against model.arch of the
 * config cfg: a file written for one architecture is refused, by name, for
 * another. Files without a layout (before layouts) pass. (ckpt_load_weights
 * only: the exporters, through ckpt_model_open, judge the arch themselves.) */
static int check_layout_arch(const char *fpath, const safetensors_file *f,
                             const orch_config *cfg, char *err, size_t err_cap) {
    const char *lay = safetensors_metadata(f, "layout");
    if (!lay || !cfg) return 0;
    const char *arch = lay + strlen(CKPT_LAYOUT_PREFIX); /* prefix checked before */
    if (strcmp(arch, cfg->model.arch) == 0) return 0;
    util_set_err(err, err_cap,
                 "%s: layout '%.40s' is not model.arch '%s' of the checkpoint's config "
                 "(the config does not match the weights)",
                 fpath, lay, cfg->model.arch);
    return -1;
}

/* check_layout_arch against the config in ckpt_dir's state.json, when it has
 * one (checkpoints written by tests may hold none). */
static int check_dir_arch(const char *fpath, const safetensors_file *f,
                          const char *ckpt_dir, char *err, size_t err_cap) {
    orch_config *cfg = NULL;
    char ignored[512];
    if (ckpt_read_config(ckpt_dir, &cfg, NULL, 0, ignored, sizeof ignored) != 0) return 0;
    int rc = check_layout_arch(fpath, f, cfg, err, err_cap);
    config_free(cfg);
    return rc;
}

/* Every tensor of f must have been consumed by a table (prefix-matched). */
static int check_no_extra(const char *fpath, const safetensors_file *f, size_t expected,
                          char *err, size_t err_cap) {
    if (safetensors_count(f) == expected) return 0;
    util_set_err(err, err_cap,
                 "%s: holds %zu tensors but the model has %zu (the model "
                 "config does not match the checkpoint?)",
                 fpath, safetensors_count(f), expected);
    return -1;
}

int ckpt_load_weights(const char *ckpt_dir, const engine_handle *h, orch_engine_ctx *ctx,
                      int with_optimizer, char *err, size_t err_cap) {
    char p[PATH_MAX];
    safetensors_file *f = NULL;
    uint32_t count = 0;
    if (!h || !h->api || !ctx) {
        util_set_err(err, err_cap, "ckpt_load_weights: missing engine");
        return -1;
    }
    int32_t st = h->api->tensor_count(ctx, ORCH_TENSOR_PARAM, &count);
    if (st != ORCH_OK) {
        ckpt_engine_err(h, ctx, st, "tensor_count", err, err_cap);
        return -1;
    }
    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_MODEL_FILE, err, err_cap) != 0)
        return -1;
    if (safetensors_open(p, &f, err, err_cap) != 0) return -1;
    int rc = ckpt_check_layout(p, f, err, err_cap);
    if (rc == 0) rc = check_dir_arch(p, f, ckpt_dir, err, err_cap);
    if (rc == 0) rc = check_no_extra(p, f, count, err, err_cap);
    if (rc == 0) rc = load_table(p, f, "", h, ctx, ORCH_TENSOR_PARAM, err, err_cap);
    safetensors_close(f);
    if (rc != 0 || !with_optimizer) return rc;

    if (ckpt_path_join(p, sizeof p, ckpt_dir, CKPT_OPTIM_FILE, err, err_cap) != 0)
        return -1;
    if (!ckpt_is_file(p)) {
        util_set_err(err, err_cap,
                     "%s: checkpoint has no optimizer state "
                     "(%s missing)",
                     ckpt_dir, CKPT_OPTIM_FILE);
        return -1;
    }
    if (safetensors_open(p, &f, err, err_cap) != 0) return -1;
    rc = ckpt_check_layout(p, f, err, err_cap);
    if (rc == 0) rc = check_no_extra(p, f, 2 * (size_t)count, err, err_cap);
    if (rc == 0) rc = load_table(p, f, "m.", h, ctx, ORCH_TENSOR_ADAM_M, err, err_cap);
    if (rc == 0) rc = load_table(p, f, "v.", h, ctx, ORCH_TENSOR_ADAM_V, err, err_cap);
    safetensors_close(f);
    return rc;
}

int ckpt_model_open(const char *path, ckpt_model *m, char *err, size_t err_cap) {
    memset(m, 0, sizeof *m);
    if (ckpt_find_latest(path, m->dir, sizeof m->dir, m->warn, sizeof m->warn, err,
                         err_cap) != 0 ||
        ckpt_read_config(m->dir, &m->cfg, m->tokenizer, sizeof m->tokenizer, err,
                         err_cap) != 0 ||
        ckpt_path_join(m->st_path, sizeof m->st_path, m->dir, CKPT_MODEL_FILE, err,
                       err_cap) != 0 ||
        safetensors_open(m->st_path, &m->st, err, err_cap) != 0 ||
        ckpt_check_layout(m->st_path, m->st, err, err_cap) != 0) {
        ckpt_model_close(m);
        return -1;
    }
    return 0;
}

void ckpt_model_close(ckpt_model *m) {
    safetensors_close(m->st);
    config_free(m->cfg);
    memset(m, 0, sizeof *m);
}
