/*
 * ckpt_files.c - checkpoint file names, listing a run's checkpoints, removing
 * trees and tensor-table access, shared by saving and reading. See
 * ckpt_files.h.
 */
#include "orchestrator/store/ckpt_files.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/util.h"
#include "orchestrator/store/safetensors.h"

int ckpt_path_join(char *out, size_t cap, const char *dir, const char *name, char *err,
                   size_t err_cap) {
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap) {
        util_set_err(err, err_cap, "%s/%s: path too long", dir, name);
        return -1;
    }
    return 0;
}

int ckpt_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int ckpt_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int ckpt_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int ckpt_parse_name(const char *name, uint64_t *step) {
    size_t pl = strlen(CKPT_PREFIX);
    if (strncmp(name, CKPT_PREFIX, pl) != 0) return -1;
    const char *d = name + pl;
    if (!*d || strlen(d) > 19) return -1;
    for (const char *p = d; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    return util_parse_u64(d, step);
}

static int cmp_step_desc(const void *a, const void *b) {
    const ckpt_ent *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

int ckpt_list(const char *run_dir, ckpt_ent **out, size_t *n_out) {
    DIR *d = opendir(run_dir);
    if (!d) return -1;
    size_t n = 0, cap = 16;
    ckpt_ent *v = malloc(cap * sizeof *v);
    if (!v) {
        closedir(d);
        errno = ENOMEM;
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t step;
        if (ckpt_parse_name(e->d_name, &step) != 0) continue;
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", run_dir, e->d_name) >= (int)sizeof p ||
            !ckpt_is_dir(p))
            continue;
        if (n == cap) {
            ckpt_ent *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                closedir(d);
                errno = ENOMEM;
                return -1;
            }
            v = nv;
            cap *= 2;
        }
        v[n].step = step;
        v[n].val_loss = NAN;
        size_t nl = strlen(e->d_name); /* <= 24: ckpt_parse_name checked */
        memcpy(v[n].name, e->d_name, nl + 1);
        n++;
    }
    closedir(d);
    qsort(v, n, sizeof *v, cmp_step_desc);
    *out = v;
    *n_out = n;
    return 0;
}

void ckpt_engine_err(const engine_handle *h, orch_engine_ctx *ctx, int32_t st,
                     const char *what, char *err, size_t err_cap) {
    char msg[512];
    engine_format_error(h, ctx, st, msg, sizeof msg);
    util_set_err(err, err_cap, "%s: %s", what, msg);
}

int ckpt_tsrc_count(const ckpt_tsrc *s, size_t *n, char *err, size_t err_cap) {
    if (!s->h) {
        *n = s->n_mem;
        return 0;
    }
    uint32_t c = 0;
    int32_t st = s->h->api->tensor_count(s->ctx, s->kind, &c);
    if (st != ORCH_OK) {
        ckpt_engine_err(s->h, s->ctx, st, "tensor_count", err, err_cap);
        return -1;
    }
    *n = c;
    return 0;
}

/* A host-memory tensor's description, checked. */
static int mem_desc(const ckpt_tensor *t, size_t i, ckpt_tdesc *d, char *err,
                    size_t err_cap) {
    if (!t->name || strlen(t->name) >= sizeof d->name || t->ndim > ORCH_TENSOR_MAX_DIMS ||
        safetensors_dtype_size(t->dtype) == 0 || t->dtype > SAFETENSORS_I32) {
        util_set_err(err, err_cap, "tensor %zu ('%s'): bad description", i,
                     t->name ? t->name : "");
        return -1;
    }
    snprintf(d->name, sizeof d->name, "%s", t->name);
    d->dtype = t->dtype;
    d->ndim = t->ndim;
    uint64_t numel = 1;
    for (uint32_t k = 0; k < t->ndim; k++) {
        d->shape[k] = t->shape[k];
        numel *= t->shape[k];
    }
    d->nbytes = numel * safetensors_dtype_size(t->dtype);
    return 0;
}

int ckpt_tsrc_desc(const ckpt_tsrc *s, size_t i, ckpt_tdesc *d, char *err,
                   size_t err_cap) {
    memset(d, 0, sizeof *d);
    if (!s->h) return mem_desc(&s->mem[i], i, d, err, err_cap);
    orch_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.struct_size = sizeof ti;
    int32_t st = s->h->api->tensor_info(s->ctx, s->kind, (uint32_t)i, &ti);
    if (st != ORCH_OK) {
        ckpt_engine_err(s->h, s->ctx, st, "tensor_info", err, err_cap);
        return -1;
    }
    ti.name[ORCH_TENSOR_NAME_MAX - 1] = '\0';
    if (ti.ndim > ORCH_TENSOR_MAX_DIMS || ti.dtype > ORCH_DTYPE_I32) {
        util_set_err(err, err_cap, "engine tensor '%s': bad ndim or dtype", ti.name);
        return -1;
    }
    memcpy(d->name, ti.name, sizeof d->name);
    d->dtype = (int)ti.dtype;
    d->ndim = ti.ndim;
    memcpy(d->shape, ti.shape, sizeof d->shape);
    d->nbytes = ti.numel * safetensors_dtype_size(d->dtype);
    return 0;
}
