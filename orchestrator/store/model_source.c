/*
 * model_source.c - `orch serve MODEL`: an orch checkpoint as it is, a
 * Hugging Face model or a GGUF file imported into a temporary checkpoint
 * (see model_source.h).
 */
#include "orchestrator/store/model_source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/ckpt_files.h"
#include "orchestrator/store/gguf_import.h"
#include "orchestrator/store/gpt2_import.h"

/* 1 when dir/name exists (as anything). */
static int has(const char *dir, const char *name) {
    char p[4200];
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p) return 0;
    return ckpt_exists(p);
}

/* 1 when the file starts with the 4 bytes "GGUF". */
static int is_gguf(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    char magic[4];
    ssize_t n = read(fd, magic, sizeof magic);
    close(fd);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A new private temporary directory into src->tmp_dir and its "model"
 * subdirectory path (not created: the importers create it) into src->ckpt. */
static int make_tmp(model_source *src, char *err, size_t cap) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char tmpl[4096];
    if (snprintf(tmpl, sizeof tmpl, "%s/orch-model-XXXXXX", base) >= (int)sizeof tmpl) {
        util_set_err(err, cap, "temporary directory name too long ($TMPDIR)");
        return -1;
    }
    if (!mkdtemp(tmpl)) {
        util_set_err(err, cap, "cannot create a temporary directory in %s: %s", base,
                     strerror(errno));
        return -1;
    }
    snprintf(src->tmp_dir, sizeof src->tmp_dir, "%s", tmpl);
    snprintf(src->ckpt, sizeof src->ckpt, "%s/model", tmpl);
    return 0;
}

int model_source_open(const char *model, const char *base_config, const char *tokenizer,
                      model_source *src, int *err_kind, char *err, size_t err_cap) {
    memset(src, 0, sizeof *src);
    *err_kind = GPT2_IMPORT_ERR_INPUT;
    struct stat st;
    if (!model || !*model) {
        util_set_err(err, err_cap, "MODEL is empty");
        return -1;
    }
    if (stat(model, &st) != 0) {
        util_set_err(err, err_cap, "MODEL '%s': %s", model, strerror(errno));
        return -1;
    }
    int kind = 0;
    if (S_ISDIR(st.st_mode)) {
        if (has(model, "state.json") || has(model, "latest"))
            kind = MODEL_SOURCE_ORCH;
        else if (has(model, "config.json") &&
                 (has(model, "model.safetensors") ||
                  has(model, "model.safetensors.index.json")))
            kind = MODEL_SOURCE_HF;
        else {
            util_set_err(err, err_cap,
                         "MODEL '%s': a directory that is neither an orch checkpoint "
                         "(state.json or latest) nor a Hugging Face model (config.json "
                         "with model.safetensors or model.safetensors.index.json)",
                         model);
            return -1;
        }
    } else if (S_ISREG(st.st_mode)) {
        if (is_gguf(model))
            kind = MODEL_SOURCE_GGUF;
        else if (ends_with(model, ".safetensors"))
            kind = MODEL_SOURCE_HF;
        else {
            util_set_err(
                err, err_cap,
                "MODEL '%s': a file that is neither GGUF (no \"GGUF\" magic) nor "
                "Hugging Face weights (.safetensors)",
                model);
            return -1;
        }
    } else {
        util_set_err(err, err_cap, "MODEL '%s': not a directory or a regular file",
                     model);
        return -1;
    }
    if (tokenizer && kind != MODEL_SOURCE_HF) {
        util_set_err(
            err, err_cap,
            "MODEL '%s': a tokenizer ('%s') applies to a Hugging Face model only "
            "(this is %s)",
            model, tokenizer,
            kind == MODEL_SOURCE_ORCH ? "an orch checkpoint, which names its own"
                                      : "a GGUF file, which holds its own");
        return -1;
    }
    src->kind = kind;
    if (kind == MODEL_SOURCE_ORCH) {
        src->kind_name = "orch checkpoint";
        if (snprintf(src->ckpt, sizeof src->ckpt, "%s", model) >= (int)sizeof src->ckpt) {
            util_set_err(err, err_cap, "MODEL '%.200s...': path too long", model);
            return -1;
        }
        return 0;
    }
    if (make_tmp(src, err, err_cap) != 0) {
        *err_kind = GPT2_IMPORT_ERR_RUNTIME;
        return -1;
    }
    char why[2048] = "";
    int rc;
    if (kind == MODEL_SOURCE_HF) {
        src->kind_name = "Hugging Face model";
        gpt2_import_opts o = { 0 };
        o.input = model;
        o.out_dir = src->ckpt;
        o.base_config = base_config;
        o.tokenizer = tokenizer;
        gpt2_import_result r;
        rc = gpt2_import(&o, &r, err_kind, why, sizeof why);
    } else {
        src->kind_name = "GGUF file";
        gguf_import_opts o = { 0 };
        o.input = model;
        o.out_dir = src->ckpt;
        o.base_config = base_config;
        gguf_import_result r;
        rc = gguf_import(&o, &r, err_kind, why, sizeof why);
    }
    if (rc != 0) {
        util_set_err(err, err_cap, "importing the %s '%s': %s", src->kind_name, model,
                     why);
        char ignored[256];
        (void)model_source_close(src, ignored, sizeof ignored);
        return -1;
    }
    return 0;
}

int model_source_close(model_source *src, char *err, size_t err_cap) {
    if (!src) return 0;
    int rc = 0;
    if (src->tmp_dir[0]) rc = fsio_rm_rf(src->tmp_dir, err, err_cap);
    src->tmp_dir[0] = '\0';
    src->ckpt[0] = '\0';
    return rc;
}
