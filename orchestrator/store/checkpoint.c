/*
 * checkpoint.c - atomic checkpoint directories: save through the engine's
 * tensor tables, verify by SHA-256, find the newest good one, load by name,
 * retention. See checkpoint.h for the layout and the protocol.
 */
#include "orchestrator/store/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "orchestrator/store/safetensors.h"
#include "orchestrator/store/sha256.h"
#include "orchestrator/core/util.h"

#define MODEL_FILE "model.safetensors"
#define OPTIM_FILE "optimizer.safetensors"
#define STATE_FILE "state.json"
#define META_FILE "meta.json"
#define SUMS_FILE "checksums.sha256"
#define LATEST_FILE "latest"
#define TMP_PREFIX ".tmp-ckpt-"
#define TRASH_PREFIX ".trash-ckpt-"
#define LATEST_TMP_PREFIX ".latest.tmp-"
#define CKPT_PREFIX "ckpt-"

ckpt_save_opts ckpt_save_opts_default(void) {
    ckpt_save_opts o = {3, 1, NAN};
    return o;
}

/* ------------------------------------------------------------------------- */
/* Small file-system helpers                                                  */
/* ------------------------------------------------------------------------- */

static int fsync_path(const char *path, int is_dir, char *err, size_t err_cap) {
    int fd = open(path, (is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        util_set_err(err, err_cap, "%s: open for fsync: %s", path,
                     strerror(errno));
        return -1;
    }
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && !(is_dir && (e == EINVAL || e == EROFS))) {
        util_set_err(err, err_cap, "%s: fsync: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

static int mkdir_p(const char *path, char *err, size_t err_cap) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        util_set_err(err, err_cap, "%s: path too long", path);
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            util_set_err(err, err_cap, "%s: mkdir: %s", buf, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        util_set_err(err, err_cap, "%s: mkdir: %s", buf, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        util_set_err(err, err_cap, "%s: not a directory", buf);
        return -1;
    }
    return 0;
}

static int rm_cb(const char *p, const struct stat *sb, int flag,
                 struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf PATH (no symlinks followed). */
static int rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* Write a whole small file with O_EXCL-free create/truncate and fsync;
 * sha256_out (may be NULL) gets its digest. */
static int write_file(const char *path, const void *data, size_t len,
                      uint8_t sha256_out[32], char *err, size_t err_cap) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        util_set_err(err, err_cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t n = write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            util_set_err(err, err_cap, "%s: write: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        p += n;
        left -= (size_t)n;
    }
    if (fsync(fd) != 0) {
        util_set_err(err, err_cap, "%s: fsync: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (close(fd) != 0) {
        util_set_err(err, err_cap, "%s: close: %s", path, strerror(errno));
        return -1;
    }
    if (sha256_out) sha256_buffer(data, len, sha256_out);
    return 0;
}

/* Read a whole file into a malloc'd NUL-terminated buffer. */
static int read_file(const char *path, char **out, size_t *out_len,
                     size_t max_len, char *err, size_t err_cap) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        util_set_err(err, err_cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            if (cap >= max_len) {
                util_set_err(err, err_cap, "%s: file larger than %zu bytes",
                             path, max_len);
                free(buf);
                fclose(fp);
                return -1;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - 1 - len, fp);
        len += n;
        if (n == 0) break;
    }
    if (!buf) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        fclose(fp);
        return -1;
    }
    if (ferror(fp)) {
        util_set_err(err, err_cap, "%s: read error", path);
        free(buf);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return 0;
}

static int path_join(char *out, size_t cap, const char *dir, const char *name,
                     char *err, size_t err_cap) {
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap) {
        util_set_err(err, err_cap, "%s/%s: path too long", dir, name);
        return -1;
    }
    return 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* "ckpt-DIGITS" -> step. Returns 0 or -1 when the name is not one. */
static int parse_ckpt_name(const char *name, uint64_t *step) {
    size_t pl = strlen(CKPT_PREFIX);
    if (strncmp(name, CKPT_PREFIX, pl) != 0) return -1;
    const char *d = name + pl;
    if (!*d || strlen(d) > 19) return -1;
    for (const char *p = d; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    return util_parse_u64(d, step);
}

/* ------------------------------------------------------------------------- */
/* Tensor sources: the engine's tables, or host memory (import)               */
/* ------------------------------------------------------------------------- */

typedef struct tsrc {
    /* engine source */
    const engine_handle *h;
    orch_engine_ctx *ctx;
    uint32_t kind;
    /* memory source */
    const ckpt_tensor *mem;
    size_t n_mem;
} tsrc;

typedef struct tdesc {
    char name[ORCH_TENSOR_NAME_MAX];
    int dtype;
    uint32_t ndim;
    uint64_t shape[ORCH_TENSOR_MAX_DIMS];
    uint64_t nbytes;
} tdesc;

static void engine_err(const engine_handle *h, orch_engine_ctx *ctx,
                       int32_t st, const char *what, char *err,
                       size_t err_cap) {
    char msg[512];
    engine_format_error(h, ctx, st, msg, sizeof msg);
    util_set_err(err, err_cap, "%s: %s", what, msg);
}

static int tsrc_count(const tsrc *s, size_t *n, char *err, size_t err_cap) {
    if (!s->h) {
        *n = s->n_mem;
        return 0;
    }
    uint32_t c = 0;
    int32_t st = s->h->api->tensor_count(s->ctx, s->kind, &c);
    if (st != ORCH_OK) {
        engine_err(s->h, s->ctx, st, "tensor_count", err, err_cap);
        return -1;
    }
    *n = c;
    return 0;
}

static int tsrc_desc(const tsrc *s, size_t i, tdesc *d, char *err,
                     size_t err_cap) {
    memset(d, 0, sizeof *d);
    if (!s->h) {
        const ckpt_tensor *t = &s->mem[i];
        if (!t->name || strlen(t->name) >= sizeof d->name ||
            t->ndim > ORCH_TENSOR_MAX_DIMS ||
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
    orch_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.struct_size = sizeof ti;
    int32_t st = s->h->api->tensor_info(s->ctx, s->kind, (uint32_t)i, &ti);
    if (st != ORCH_OK) {
        engine_err(s->h, s->ctx, st, "tensor_info", err, err_cap);
        return -1;
    }
    ti.name[ORCH_TENSOR_NAME_MAX - 1] = '\0';
    if (ti.ndim > ORCH_TENSOR_MAX_DIMS || ti.dtype > ORCH_DTYPE_I32) {
        util_set_err(err, err_cap, "engine tensor '%s': bad ndim or dtype",
                     ti.name);
        return -1;
    }
    memcpy(d->name, ti.name, sizeof d->name);
    d->dtype = (int)ti.dtype;
    d->ndim = ti.ndim;
    memcpy(d->shape, ti.shape, sizeof d->shape);
    d->nbytes = ti.numel * safetensors_dtype_size(d->dtype);
    return 0;
}

/* Write the tables of `n_src` sources into one safetensors file, each with its
 * name prefix. */
static int write_tables(const char *path, const tsrc *srcs,
                        const char *const *prefixes, size_t n_src,
                        uint8_t sha[32], char *err, size_t err_cap) {
    safetensors_writer *w = NULL;
    void *buf = NULL;
    uint64_t max_bytes = 0;
    if (safetensors_writer_create(path, &w, err, err_cap) != 0) return -1;
    if (safetensors_writer_add_metadata(w, "format", "pt", err, err_cap) != 0)
        goto fail;
    for (size_t s = 0; s < n_src; s++) {
        size_t n;
        if (tsrc_count(&srcs[s], &n, err, err_cap) != 0) goto fail;
        for (size_t i = 0; i < n; i++) {
            tdesc d;
            if (tsrc_desc(&srcs[s], i, &d, err, err_cap) != 0) goto fail;
            char name[ORCH_TENSOR_NAME_MAX + 16];
            snprintf(name, sizeof name, "%s%s", prefixes[s], d.name);
            if (safetensors_writer_declare(w, name, d.dtype, d.ndim, d.shape,
                                           err, err_cap) != 0)
                goto fail;
            if (d.nbytes > max_bytes) max_bytes = d.nbytes;
        }
    }
    if (safetensors_writer_begin_data(w, err, err_cap) != 0) goto fail;
    buf = malloc(max_bytes ? (size_t)max_bytes : 1);
    if (!buf) {
        util_set_err(err, err_cap, "%s: out of memory (%llu bytes)", path,
                     (unsigned long long)max_bytes);
        goto fail;
    }
    for (size_t s = 0; s < n_src; s++) {
        size_t n;
        if (tsrc_count(&srcs[s], &n, err, err_cap) != 0) goto fail;
        for (size_t i = 0; i < n; i++) {
            tdesc d;
            if (tsrc_desc(&srcs[s], i, &d, err, err_cap) != 0) goto fail;
            const void *data = buf;
            if (srcs[s].h) {
                int32_t st = srcs[s].h->api->tensor_read(
                    srcs[s].ctx, srcs[s].kind, (uint32_t)i, buf, d.nbytes);
                if (st != ORCH_OK) {
                    char what[128];
                    snprintf(what, sizeof what, "tensor_read '%s'", d.name);
                    engine_err(srcs[s].h, srcs[s].ctx, st, what, err, err_cap);
                    goto fail;
                }
            } else {
                data = srcs[s].mem[i].data;
            }
            if (safetensors_writer_write(w, data, (size_t)d.nbytes, err,
                                         err_cap) != 0)
                goto fail;
        }
    }
    free(buf);
    return safetensors_writer_finish(w, sha, err, err_cap);
fail:
    free(buf);
    safetensors_writer_abort(w);
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Writing a checkpoint directory's contents                                  */
/* ------------------------------------------------------------------------- */

typedef struct sum_entry {
    const char *file;
    uint8_t sha[32];
} sum_entry;

/* Fill DIR (existing, empty) with every file, checksums last, all fsynced,
 * the directory itself fsynced. */
static int write_contents(const char *dir, const tsrc *params,
                          const tsrc *adam_m, const tsrc *adam_v,
                          const char *state_json, uint64_t step,
                          double val_loss, const char *engine_name,
                          char *err, size_t err_cap) {
    char path[PATH_MAX];
    sum_entry sums[4];
    size_t ns = 0;

    cJSON *probe = cJSON_Parse(state_json ? state_json : "");
    if (!probe) {
        util_set_err(err, err_cap, "state JSON given to the checkpoint is not "
                                   "valid JSON");
        return -1;
    }
    cJSON_Delete(probe);

    if (path_join(path, sizeof path, dir, MODEL_FILE, err, err_cap) != 0) return -1;
    static const char *const no_prefix[1] = {""};
    if (write_tables(path, params, no_prefix, 1, sums[ns].sha, err, err_cap) != 0)
        return -1;
    sums[ns++].file = MODEL_FILE;

    if (adam_m && adam_v) {
        if (path_join(path, sizeof path, dir, OPTIM_FILE, err, err_cap) != 0)
            return -1;
        tsrc both[2] = {*adam_m, *adam_v};
        static const char *const pre[2] = {"m.", "v."};
        if (write_tables(path, both, pre, 2, sums[ns].sha, err, err_cap) != 0)
            return -1;
        sums[ns++].file = OPTIM_FILE;
    }

    if (path_join(path, sizeof path, dir, STATE_FILE, err, err_cap) != 0) return -1;
    if (write_file(path, state_json, strlen(state_json), sums[ns].sha, err,
                   err_cap) != 0)
        return -1;
    sums[ns++].file = STATE_FILE;

    cJSON *meta = cJSON_CreateObject();
    if (!meta) goto oom;
    cJSON_AddNumberToObject(meta, "format", CKPT_FORMAT_VERSION);
    cJSON_AddNumberToObject(meta, "step", (double)step);
    if (isfinite(val_loss))
        cJSON_AddNumberToObject(meta, "val_loss", val_loss);
    else
        cJSON_AddNullToObject(meta, "val_loss");
    cJSON_AddStringToObject(meta, "engine", engine_name ? engine_name : "");
    cJSON_AddBoolToObject(meta, "with_optimizer", adam_m != NULL);
    char *mtext = cJSON_Print(meta);
    cJSON_Delete(meta);
    if (!mtext) goto oom;
    if (path_join(path, sizeof path, dir, META_FILE, err, err_cap) != 0) {
        free(mtext);
        return -1;
    }
    int rc = write_file(path, mtext, strlen(mtext), sums[ns].sha, err, err_cap);
    free(mtext);
    if (rc != 0) return -1;
    sums[ns++].file = META_FILE;

    char text[4 * (64 + 2 + 32)];
    size_t tl = 0;
    for (size_t i = 0; i < ns; i++) {
        char hex[65];
        sha256_hex(sums[i].sha, hex);
        tl += (size_t)snprintf(text + tl, sizeof text - tl, "%s  %s\n", hex,
                               sums[i].file);
    }
    if (path_join(path, sizeof path, dir, SUMS_FILE, err, err_cap) != 0) return -1;
    if (write_file(path, text, tl, NULL, err, err_cap) != 0) return -1;
    return fsync_path(dir, 1, err, err_cap);
oom:
    util_set_err(err, err_cap, "out of memory");
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Stale temp dirs, retention                                                 */
/* ------------------------------------------------------------------------- */

/* Remove RUN/.tmp-ckpt-*-PID, RUN/.trash-ckpt-*-PID and RUN/.latest.tmp-PID
 * left by dead processes (or by an earlier failed save of this one). */
static void clean_stale(const char *run_dir) {
    DIR *d = opendir(run_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, TMP_PREFIX, strlen(TMP_PREFIX)) != 0 &&
            strncmp(n, TRASH_PREFIX, strlen(TRASH_PREFIX)) != 0 &&
            strncmp(n, LATEST_TMP_PREFIX, strlen(LATEST_TMP_PREFIX)) != 0)
            continue;
        const char *dash = strrchr(n, '-');
        uint64_t pid = 0;
        int dead = 1;
        if (dash && util_parse_u64(dash + 1, &pid) == 0 && pid > 0 &&
            pid <= INT_MAX && (pid_t)pid != getpid())
            dead = kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if (!dead) continue;
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", run_dir, n) < (int)sizeof p) rm_rf(p);
    }
    closedir(d);
}

typedef struct ckpt_ent {
    uint64_t step;
    double val_loss;
    char name[64];
} ckpt_ent;

static int cmp_step_desc(const void *a, const void *b) {
    const ckpt_ent *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* ckpt-* directories of run_dir, newest first; *out malloc'd. */
static int list_ckpts(const char *run_dir, ckpt_ent **out, size_t *n_out) {
    DIR *d = opendir(run_dir);
    if (!d) return -1;
    size_t n = 0, cap = 16;
    ckpt_ent *v = malloc(cap * sizeof *v);
    struct dirent *e;
    while (v && (e = readdir(d)) != NULL) {
        uint64_t step;
        if (parse_ckpt_name(e->d_name, &step) != 0) continue;
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", run_dir, e->d_name) >= (int)sizeof p ||
            !is_dir(p))
            continue;
        if (n == cap) {
            ckpt_ent *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                v = NULL;
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[n].step = step;
        v[n].val_loss = NAN;
        size_t nl = strlen(e->d_name); /* <= 24: parse_ckpt_name checked */
        memcpy(v[n].name, e->d_name, nl + 1);
        n++;
    }
    closedir(d);
    if (!v) return -1;
    qsort(v, n, sizeof *v, cmp_step_desc);
    *out = v;
    *n_out = n;
    return 0;
}

static double read_meta_val_loss(const char *ckpt_dir) {
    char p[PATH_MAX], *text = NULL;
    double v = NAN;
    if (snprintf(p, sizeof p, "%s/%s", ckpt_dir, META_FILE) >= (int)sizeof p)
        return v;
    if (read_file(p, &text, NULL, 1 << 20, NULL, 0) != 0) return v;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *vl = cJSON_GetObjectItemCaseSensitive(j, "val_loss");
    if (cJSON_IsNumber(vl)) v = vl->valuedouble;
    cJSON_Delete(j);
    return v;
}

/* Delete a checkpoint dir: rename it out of the ckpt-* namespace first, so a
 * crash never leaves a half-deleted ckpt-* behind. */
static void delete_ckpt(const char *run_dir, const char *name) {
    char from[PATH_MAX], to[PATH_MAX];
    if (snprintf(from, sizeof from, "%s/%s", run_dir, name) >= (int)sizeof from ||
        snprintf(to, sizeof to, "%s/%s%s-%ld", run_dir, TRASH_PREFIX,
                 name + strlen(CKPT_PREFIX), (long)getpid()) >= (int)sizeof to)
        return;
    if (rename(from, to) != 0) return;
    rm_rf(to);
}

static void apply_retention(const char *run_dir, const char *latest_name,
                            int keep_last) {
    if (keep_last <= 0) return;
    ckpt_ent *v = NULL;
    size_t n = 0;
    if (list_ckpts(run_dir, &v, &n) != 0) return;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", run_dir, v[i].name) >= (int)sizeof p)
            continue;
        v[i].val_loss = read_meta_val_loss(p);
        if (isfinite(v[i].val_loss) &&
            (best == SIZE_MAX || v[i].val_loss < v[best].val_loss))
            best = i;
    }
    for (size_t i = (size_t)keep_last; i < n; i++) {
        if (i == best || strcmp(v[i].name, latest_name) == 0) continue;
        delete_ckpt(run_dir, v[i].name);
    }
    free(v);
}

/* ------------------------------------------------------------------------- */
/* Save                                                                       */
/* ------------------------------------------------------------------------- */

static int update_latest(const char *run_dir, const char *name, char *err,
                         size_t err_cap) {
    char tmp[PATH_MAX], dst[PATH_MAX], text[128];
    if (snprintf(tmp, sizeof tmp, "%s/" LATEST_TMP_PREFIX "%ld", run_dir,
                 (long)getpid()) >= (int)sizeof tmp ||
        path_join(dst, sizeof dst, run_dir, LATEST_FILE, err, err_cap) != 0) {
        util_set_err(err, err_cap, "%s: path too long", run_dir);
        return -1;
    }
    int tl = snprintf(text, sizeof text, "%s\n", name);
    if (write_file(tmp, text, (size_t)tl, NULL, err, err_cap) != 0) {
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, dst) != 0) {
        util_set_err(err, err_cap, "%s: rename: %s", dst, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return fsync_path(run_dir, 1, err, err_cap);
}

/* Move the finished temp dir onto FINAL. When FINAL exists (the same step
 * saved again, e.g. after a resume) it is exchanged atomically and the old one
 * removed. */
static int install_dir(const char *tmp, const char *final,
                       const char *trash, char *err, size_t err_cap) {
    if (rename(tmp, final) == 0) return 0;
    if (errno != EEXIST && errno != ENOTEMPTY) {
        util_set_err(err, err_cap, "%s: rename: %s", final, strerror(errno));
        return -1;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        rm_rf(tmp); /* now holds the old contents */
        return 0;
    }
    /* No RENAME_EXCHANGE on this file system: move the old one aside first. */
    if (rename(final, trash) != 0 || rename(tmp, final) != 0) {
        util_set_err(err, err_cap, "%s: replace: %s", final, strerror(errno));
        return -1;
    }
    rm_rf(trash);
    return 0;
}

int ckpt_save(const char *run_dir, uint64_t step, const engine_handle *h,
              orch_engine_ctx *ctx, const char *state_json,
              const ckpt_save_opts *o, char *out_dir, size_t out_cap,
              char *err, size_t err_cap) {
    ckpt_save_opts def = ckpt_save_opts_default();
    if (!o) o = &def;
    if (!run_dir || !*run_dir || !h || !h->api || !ctx || !state_json) {
        util_set_err(err, err_cap, "ckpt_save: missing argument");
        return -1;
    }
    int fresh = !is_dir(run_dir);
    if (mkdir_p(run_dir, err, err_cap) != 0) return -1;
    if (fresh) {
        /* Make the new run directory's own entry durable too. */
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", run_dir);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) *slash = '\0';
        else snprintf(parent, sizeof parent, "%s", slash ? "/" : ".");
        if (fsync_path(parent, 1, err, err_cap) != 0) return -1;
    }
    clean_stale(run_dir);

    char name[64], tmp[PATH_MAX], final[PATH_MAX], trash[PATH_MAX];
    snprintf(name, sizeof name, CKPT_PREFIX "%08llu", (unsigned long long)step);
    if (snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%08llu-%ld", run_dir,
                 (unsigned long long)step, (long)getpid()) >= (int)sizeof tmp ||
        snprintf(trash, sizeof trash, "%s/" TRASH_PREFIX "%08llu-%ld", run_dir,
                 (unsigned long long)step, (long)getpid()) >= (int)sizeof trash ||
        path_join(final, sizeof final, run_dir, name, err, err_cap) != 0) {
        util_set_err(err, err_cap, "%s: path too long", run_dir);
        return -1;
    }
    rm_rf(tmp);
    if (mkdir(tmp, 0755) != 0) {
        util_set_err(err, err_cap, "%s: mkdir: %s", tmp, strerror(errno));
        return -1;
    }
    tsrc params = {h, ctx, ORCH_TENSOR_PARAM, NULL, 0};
    tsrc m = {h, ctx, ORCH_TENSOR_ADAM_M, NULL, 0};
    tsrc v = {h, ctx, ORCH_TENSOR_ADAM_V, NULL, 0};
    if (write_contents(tmp, &params, o->with_optimizer ? &m : NULL,
                       o->with_optimizer ? &v : NULL, state_json, step,
                       o->val_loss, h->api->name, err, err_cap) != 0)
        goto fail;
    if (install_dir(tmp, final, trash, err, err_cap) != 0) goto fail;
    if (fsync_path(run_dir, 1, err, err_cap) != 0) return -1;
    if (update_latest(run_dir, name, err, err_cap) != 0) return -1;
    apply_retention(run_dir, name, o->keep_last);
    if (out_dir && out_cap) snprintf(out_dir, out_cap, "%s", final);
    return 0;
fail:
    rm_rf(tmp);
    return -1;
}

int ckpt_write_dir(const char *ckpt_dir, const ckpt_tensor *tensors, size_t n,
                   const char *state_json, uint64_t step, char *err,
                   size_t err_cap) {
    char parent[PATH_MAX], tmp[PATH_MAX];
    if (!ckpt_dir || !*ckpt_dir || !state_json) {
        util_set_err(err, err_cap, "ckpt_write_dir: missing argument");
        return -1;
    }
    if (snprintf(parent, sizeof parent, "%s", ckpt_dir) >= (int)sizeof parent) {
        util_set_err(err, err_cap, "%s: path too long", ckpt_dir);
        return -1;
    }
    size_t pl = strlen(parent);
    while (pl > 1 && parent[pl - 1] == '/') parent[--pl] = '\0';
    char *slash = strrchr(parent, '/');
    const char *base = parent;
    if (slash) {
        *slash = '\0';
        base = slash + 1;
        if (slash == parent) strcpy(parent, "/");
    }
    struct stat st;
    if (lstat(ckpt_dir, &st) == 0) {
        util_set_err(err, err_cap, "%s: already exists (choose a new --out)",
                     ckpt_dir);
        return -1;
    }
    const char *pdir = slash ? parent : ".";
    if (slash && mkdir_p(pdir, err, err_cap) != 0) return -1;
    if (snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%ld", pdir, slash ? base : parent,
                 (long)getpid()) >= (int)sizeof tmp) {
        util_set_err(err, err_cap, "%s: path too long", ckpt_dir);
        return -1;
    }
    rm_rf(tmp);
    if (mkdir(tmp, 0755) != 0) {
        util_set_err(err, err_cap, "%s: mkdir: %s", tmp, strerror(errno));
        return -1;
    }
    tsrc src = {NULL, NULL, 0, tensors, n};
    if (write_contents(tmp, &src, NULL, NULL, state_json, step, NAN, "", err,
                       err_cap) != 0)
        goto fail;
    if (rename(tmp, ckpt_dir) != 0) {
        util_set_err(err, err_cap, "%s: rename: %s", ckpt_dir, strerror(errno));
        goto fail;
    }
    return fsync_path(pdir, 1, err, err_cap);
fail:
    rm_rf(tmp);
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Verify, find, read                                                         */
/* ------------------------------------------------------------------------- */

int ckpt_verify(const char *ckpt_dir, char *err, size_t err_cap) {
    char p[PATH_MAX], *text = NULL;
    if (!is_dir(ckpt_dir)) {
        util_set_err(err, err_cap, "%s: not a checkpoint directory", ckpt_dir);
        return -1;
    }
    if (path_join(p, sizeof p, ckpt_dir, SUMS_FILE, err, err_cap) != 0) return -1;
    if (!file_exists(p)) {
        util_set_err(err, err_cap, "%s: missing %s (incomplete checkpoint)",
                     ckpt_dir, SUMS_FILE);
        return -1;
    }
    if (read_file(p, &text, NULL, 1 << 16, err, err_cap) != 0) return -1;
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
                         SUMS_FILE, lines);
            goto out;
        }
        const char *file = line + 66;
        if (strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0) {
            util_set_err(err, err_cap, "%s/%s: bad file name '%s'", ckpt_dir,
                         SUMS_FILE, file);
            goto out;
        }
        line[64] = '\0';
        for (int i = 0; i < 64; i++)
            if (!((line[i] >= '0' && line[i] <= '9') ||
                  (line[i] >= 'a' && line[i] <= 'f'))) {
                util_set_err(err, err_cap, "%s/%s: malformed line %d", ckpt_dir,
                             SUMS_FILE, lines);
                goto out;
            }
        char fp[PATH_MAX];
        if (path_join(fp, sizeof fp, ckpt_dir, file, err, err_cap) != 0) goto out;
        if (!file_exists(fp)) {
            util_set_err(err, err_cap, "%s: missing file %s", ckpt_dir, file);
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
        if (strcmp(file, MODEL_FILE) == 0) have_model = 1;
        if (strcmp(file, STATE_FILE) == 0) have_state = 1;
    }
    if (!have_model || !have_state) {
        util_set_err(err, err_cap, "%s: %s does not list %s", ckpt_dir,
                     SUMS_FILE, have_model ? STATE_FILE : MODEL_FILE);
        goto out;
    }
    /* Every checkpoint file that is present must be covered (a checksums
     * file cut short would otherwise vouch for fewer files). */
    static const char *const known[] = {OPTIM_FILE, META_FILE};
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        char fp[PATH_MAX], needle[64];
        if (path_join(fp, sizeof fp, ckpt_dir, known[k], err, err_cap) != 0)
            goto out;
        snprintf(needle, sizeof needle, "  %s\n", known[k]);
        if (file_exists(fp) && !strstr(listed, needle)) {
            util_set_err(err, err_cap, "%s: %s does not list %s", ckpt_dir,
                         SUMS_FILE, known[k]);
            goto out;
        }
    }
    rc = 0;
out:
    free(listed);
    free(text);
    return rc;
}

int ckpt_find_latest(const char *path, char *out_dir, size_t out_cap,
                     char *warn, size_t warn_cap, char *err, size_t err_cap) {
    char p[PATH_MAX], verr[1024];
    if (warn && warn_cap) warn[0] = '\0';
    if (!path || !is_dir(path)) {
        util_set_err(err, err_cap, "%s: no such checkpoint or run directory",
                     path ? path : "(null)");
        return -1;
    }
    /* A checkpoint directory itself. */
    char sp[PATH_MAX], cp[PATH_MAX];
    if (path_join(sp, sizeof sp, path, STATE_FILE, err, err_cap) != 0 ||
        path_join(cp, sizeof cp, path, SUMS_FILE, err, err_cap) != 0)
        return -1;
    if (file_exists(sp) || file_exists(cp)) {
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
    if (path_join(p, sizeof p, path, LATEST_FILE, err, err_cap) != 0) return -1;
    if (read_file(p, &text, NULL, 4096, verr, sizeof verr) != 0) {
        if (errno == ENOENT || !file_exists(p))
            snprintf(problem, sizeof problem, "no '%s' file", LATEST_FILE);
        else
            snprintf(problem, sizeof problem, "cannot read '%s': %s",
                     LATEST_FILE, verr);
    } else {
        size_t l = strlen(text);
        while (l && (text[l - 1] == '\n' || text[l - 1] == '\r' ||
                     text[l - 1] == ' '))
            text[--l] = '\0';
        uint64_t step;
        if (parse_ckpt_name(text, &step) != 0) {
            snprintf(problem, sizeof problem, "'%s' is corrupt (does not name "
                                              "a ckpt-STEP directory)",
                     LATEST_FILE);
        } else if (path_join(p, sizeof p, path, text, err, err_cap) != 0) {
            free(text);
            return -1;
        } else if (ckpt_verify(p, verr, sizeof verr) != 0) {
            snprintf(problem, sizeof problem, "'%s' names %s, which is unusable: %s",
                     LATEST_FILE, text, verr);
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
    if (list_ckpts(path, &v, &n) != 0) {
        util_set_err(err, err_cap, "%s: cannot list: %s", path, strerror(errno));
        return -1;
    }
    char skipped[512] = "";
    size_t sl = 0;
    for (size_t i = 0; i < n; i++) {
        if (path_join(p, sizeof p, path, v[i].name, err, err_cap) != 0) {
            free(v);
            return -1;
        }
        if (ckpt_verify(p, verr, sizeof verr) != 0) {
            if (sl < sizeof skipped - 80)
                sl += (size_t)snprintf(skipped + sl, sizeof skipped - sl,
                                       "%s%s", sl ? ", " : "", v[i].name);
            continue;
        }
        free(v);
        if (snprintf(out_dir, out_cap, "%s", p) >= (int)out_cap) {
            util_set_err(err, err_cap, "%s: path too long", p);
            return -1;
        }
        util_set_err(warn, warn_cap, "%s: %s; using %s%s%s%s", path, problem,
                     p + strlen(path) + 1, sl ? " (skipped corrupt: " : "",
                     skipped, sl ? ")" : "");
        return 0;
    }
    free(v);
    if (n == 0)
        util_set_err(err, err_cap, "%s: no checkpoint found (%s, no ckpt-* "
                                   "directories)",
                     path, problem);
    else
        util_set_err(err, err_cap, "%s: %s, and none of the %zu ckpt-* "
                                   "directories verifies",
                     path, problem, n);
    return -1;
}

int ckpt_read_state(const char *ckpt_dir, char **state_json, char *err,
                    size_t err_cap) {
    char p[PATH_MAX];
    if (path_join(p, sizeof p, ckpt_dir, STATE_FILE, err, err_cap) != 0) return -1;
    return read_file(p, state_json, NULL, (size_t)1 << 30, err, err_cap);
}

int ckpt_read_step(const char *ckpt_dir, uint64_t *step, char *err,
                   size_t err_cap) {
    char p[PATH_MAX], *text = NULL;
    if (path_join(p, sizeof p, ckpt_dir, META_FILE, err, err_cap) != 0) return -1;
    if (read_file(p, &text, NULL, 1 << 20, NULL, 0) == 0) {
        cJSON *j = cJSON_Parse(text);
        free(text);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
        if (cJSON_IsNumber(s) && s->valuedouble >= 0) {
            *step = (uint64_t)s->valuedouble;
            cJSON_Delete(j);
            return 0;
        }
        cJSON_Delete(j);
    }
    const char *base = strrchr(ckpt_dir, '/');
    base = base ? base + 1 : ckpt_dir;
    if (parse_ckpt_name(base, step) == 0) return 0;
    util_set_err(err, err_cap, "%s: no step recorded", ckpt_dir);
    return -1;
}

int ckpt_has_optimizer(const char *ckpt_dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", ckpt_dir, OPTIM_FILE) >= (int)sizeof p)
        return 0;
    return file_exists(p);
}

/* ------------------------------------------------------------------------- */
/* Load                                                                       */
/* ------------------------------------------------------------------------- */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Load one engine table from file f; names get `prefix`. */
static int load_table(const char *fpath, const safetensors_file *f,
                      const char *prefix, const engine_handle *h,
                      orch_engine_ctx *ctx, uint32_t kind, char *err,
                      size_t err_cap) {
    tsrc s = {h, ctx, kind, NULL, 0};
    size_t n;
    if (tsrc_count(&s, &n, err, err_cap) != 0) return -1;
    void *buf = NULL;
    size_t buf_cap = 0;
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        tdesc d;
        if (tsrc_desc(&s, i, &d, err, err_cap) != 0) goto out;
        char name[ORCH_TENSOR_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%s", prefix, d.name);
        const safetensors_tensor *t = safetensors_find(f, name);
        if (!t) {
            util_set_err(err, err_cap, "%s: missing tensor '%s' (the model "
                                       "config does not match the checkpoint?)",
                         fpath, name);
            goto out;
        }
        int same = t->ndim == d.ndim;
        for (uint32_t k = 0; same && k < d.ndim; k++)
            same = t->shape[k] == d.shape[k];
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
                         (t->dtype == SAFETENSORS_F16 ||
                          t->dtype == SAFETENSORS_BF16))) {
            util_set_err(err, err_cap,
                         "%s: tensor '%s' is %s but the engine needs %s", fpath,
                         name, safetensors_dtype_name(t->dtype),
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
            if (!convert) {
                memcpy(buf, src, (size_t)d.nbytes);
            } else {
                const uint8_t *in = src;
                float *o = buf;
                for (uint64_t e = 0; e < t->numel; e++) {
                    uint16_t hv = (uint16_t)(in[2 * e] | in[2 * e + 1] << 8);
                    if (t->dtype == SAFETENSORS_F16) {
                        o[e] = half_to_float(hv);
                    } else {
                        uint32_t bits = (uint32_t)hv << 16;
                        memcpy(&o[e], &bits, 4);
                    }
                }
            }
            src = buf;
        }
        int32_t st = h->api->tensor_write(ctx, kind, (uint32_t)i, src, d.nbytes);
        if (st != ORCH_OK) {
            char what[128];
            snprintf(what, sizeof what, "tensor_write '%s'", name);
            engine_err(h, ctx, st, what, err, err_cap);
            goto out;
        }
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

/* Every tensor of f must have been consumed by a table (prefix-matched). */
static int check_no_extra(const char *fpath, const safetensors_file *f,
                          size_t expected, char *err, size_t err_cap) {
    if (safetensors_count(f) == expected) return 0;
    util_set_err(err, err_cap,
                 "%s: holds %zu tensors but the model has %zu (the model "
                 "config does not match the checkpoint?)",
                 fpath, safetensors_count(f), expected);
    return -1;
}

int ckpt_load_weights(const char *ckpt_dir, const engine_handle *h,
                      orch_engine_ctx *ctx, int with_optimizer, char *err,
                      size_t err_cap) {
    char p[PATH_MAX];
    safetensors_file *f = NULL;
    uint32_t count = 0;
    if (!h || !h->api || !ctx) {
        util_set_err(err, err_cap, "ckpt_load_weights: missing engine");
        return -1;
    }
    int32_t st = h->api->tensor_count(ctx, ORCH_TENSOR_PARAM, &count);
    if (st != ORCH_OK) {
        engine_err(h, ctx, st, "tensor_count", err, err_cap);
        return -1;
    }
    if (path_join(p, sizeof p, ckpt_dir, MODEL_FILE, err, err_cap) != 0) return -1;
    if (safetensors_open(p, &f, err, err_cap) != 0) return -1;
    int rc = check_no_extra(p, f, count, err, err_cap);
    if (rc == 0)
        rc = load_table(p, f, "", h, ctx, ORCH_TENSOR_PARAM, err, err_cap);
    safetensors_close(f);
    if (rc != 0 || !with_optimizer) return rc;

    if (path_join(p, sizeof p, ckpt_dir, OPTIM_FILE, err, err_cap) != 0) return -1;
    if (!file_exists(p)) {
        util_set_err(err, err_cap, "%s: checkpoint has no optimizer state "
                                   "(%s missing)",
                     ckpt_dir, OPTIM_FILE);
        return -1;
    }
    if (safetensors_open(p, &f, err, err_cap) != 0) return -1;
    rc = check_no_extra(p, f, 2 * (size_t)count, err, err_cap);
    if (rc == 0)
        rc = load_table(p, f, "m.", h, ctx, ORCH_TENSOR_ADAM_M, err, err_cap);
    if (rc == 0)
        rc = load_table(p, f, "v.", h, ctx, ORCH_TENSOR_ADAM_V, err, err_cap);
    safetensors_close(f);
    return rc;
}
