/*
 * ckpt_save.c - writing checkpoint directories: tensors to safetensors,
 * state/meta/checksums, the atomic install of the directory, the `latest`
 * pointer, stale temp dirs and retention. See ckpt_save.h (protocol) and
 * checkpoint.h (layout).
 */
#include "orchestrator/store/ckpt_save.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/ckpt_files.h"
#include "orchestrator/store/safetensors.h"
#include "orchestrator/store/sha256.h"

ckpt_save_opts ckpt_save_opts_default(void) {
    ckpt_save_opts o = { 3, 1, NAN };
    return o;
}

/* ------------------------------------------------------------------------- */
/* Writing a checkpoint directory's contents                                  */
/* ------------------------------------------------------------------------- */

/* Write the tables of `n_src` sources into one safetensors file, each with its
 * name prefix. */
static int write_tables(const char *path, const ckpt_tsrc *srcs,
                        const char *const *prefixes, size_t n_src, const char *layout,
                        uint8_t sha[32], char *err, size_t err_cap) {
    safetensors_writer *w = NULL;
    void *buf = NULL;
    uint64_t max_bytes = 0;
    if (safetensors_writer_create(path, &w, err, err_cap) != 0) return -1;
    if (safetensors_writer_add_metadata(w, "format", CKPT_META_FORMAT, err, err_cap) !=
            0 ||
        safetensors_writer_add_metadata(w, "layout", layout, err, err_cap) != 0 ||
        safetensors_writer_add_metadata(w, "layout_version", CKPT_LAYOUT_VERSION, err,
                                        err_cap) != 0)
        goto fail;
    for (size_t s = 0; s < n_src; s++) {
        size_t n;
        if (ckpt_tsrc_count(&srcs[s], &n, err, err_cap) != 0) goto fail;
        for (size_t i = 0; i < n; i++) {
            ckpt_tdesc d;
            if (ckpt_tsrc_desc(&srcs[s], i, &d, err, err_cap) != 0) goto fail;
            char name[ORCH_TENSOR_NAME_MAX + 16];
            snprintf(name, sizeof name, "%s%s", prefixes[s], d.name);
            if (safetensors_writer_declare(w, name, d.dtype, d.ndim, d.shape, err,
                                           err_cap) != 0)
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
        if (ckpt_tsrc_count(&srcs[s], &n, err, err_cap) != 0) goto fail;
        for (size_t i = 0; i < n; i++) {
            ckpt_tdesc d;
            if (ckpt_tsrc_desc(&srcs[s], i, &d, err, err_cap) != 0) goto fail;
            const void *data = buf;
            if (srcs[s].h) {
                int32_t st = srcs[s].h->api->tensor_read(srcs[s].ctx, srcs[s].kind,
                                                         (uint32_t)i, buf, d.nbytes);
                if (st != ORCH_OK) {
                    char what[128];
                    snprintf(what, sizeof what, "tensor_read '%s'", d.name);
                    ckpt_engine_err(srcs[s].h, srcs[s].ctx, st, what, err, err_cap);
                    goto fail;
                }
            } else {
                data = srcs[s].mem[i].data;
            }
            if (safetensors_writer_write(w, data, (size_t)d.nbytes, err, err_cap) != 0)
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

typedef struct sum_entry {
    const char *file;
    uint8_t sha[32];
} sum_entry;

/* DIR/NAME = data (fsynced); its digest goes to the next checksum entry. */
static int put_file(const char *dir, const char *name, const char *data, size_t len,
                    sum_entry *sum, char *err, size_t err_cap) {
    char path[PATH_MAX];
    if (ckpt_path_join(path, sizeof path, dir, name, err, err_cap) != 0) return -1;
    if (fsio_write_file(path, data, len, err, err_cap) != 0) return -1;
    if (sum) {
        sha256_buffer(data, len, sum->sha);
        sum->file = name;
    }
    return 0;
}

static char *meta_json(uint64_t step, double val_loss, const char *engine_name,
                       int with_optimizer) {
    cJSON *meta = cJSON_CreateObject();
    if (!meta) return NULL;
    cJSON_AddNumberToObject(meta, "format", CKPT_FORMAT_VERSION);
    cJSON_AddNumberToObject(meta, "step", (double)step);
    if (isfinite(val_loss))
        cJSON_AddNumberToObject(meta, "val_loss", val_loss);
    else
        cJSON_AddNullToObject(meta, "val_loss");
    cJSON_AddStringToObject(meta, "engine", engine_name ? engine_name : "");
    cJSON_AddBoolToObject(meta, "with_optimizer", with_optimizer);
    char *text = cJSON_Print(meta);
    cJSON_Delete(meta);
    return text;
}

/* Fill DIR (existing, empty) with every file, checksums last, all fsynced,
 * the directory itself fsynced. */
static int write_contents(const char *dir, const ckpt_tsrc *params,
                          const ckpt_tsrc *adam_m, const ckpt_tsrc *adam_v,
                          const char *state_json, uint64_t step, double val_loss,
                          const char *engine_name, char *err, size_t err_cap) {
    char path[PATH_MAX];
    sum_entry sums[4];
    size_t ns = 0;

    cJSON *probe = cJSON_Parse(state_json ? state_json : "");
    if (!probe) {
        util_set_err(err, err_cap,
                     "state JSON given to the checkpoint is not "
                     "valid JSON");
        return -1;
    }
    /* The layout names the architecture of the state's config (gpt2 when the
     * state holds none, as in tests). */
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(probe, "config");
    const cJSON *mdl = cJSON_GetObjectItemCaseSensitive(cfg, "model");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(mdl, "arch");
    char layout[64];
    snprintf(layout, sizeof layout, "%s%s", CKPT_LAYOUT_PREFIX,
             cJSON_IsString(arch) && strlen(arch->valuestring) < 32 ? arch->valuestring
                                                                    : "gpt2");
    cJSON_Delete(probe);

    if (ckpt_path_join(path, sizeof path, dir, CKPT_MODEL_FILE, err, err_cap) != 0)
        return -1;
    static const char *const no_prefix[1] = { "" };
    if (write_tables(path, params, no_prefix, 1, layout, sums[ns].sha, err, err_cap) != 0)
        return -1;
    sums[ns++].file = CKPT_MODEL_FILE;

    if (adam_m && adam_v) {
        if (ckpt_path_join(path, sizeof path, dir, CKPT_OPTIM_FILE, err, err_cap) != 0)
            return -1;
        ckpt_tsrc both[2] = { *adam_m, *adam_v };
        static const char *const pre[2] = { "m.", "v." };
        if (write_tables(path, both, pre, 2, layout, sums[ns].sha, err, err_cap) != 0)
            return -1;
        sums[ns++].file = CKPT_OPTIM_FILE;
    }

    if (put_file(dir, CKPT_STATE_FILE, state_json, strlen(state_json), &sums[ns++], err,
                 err_cap) != 0)
        return -1;

    char *mtext = meta_json(step, val_loss, engine_name, adam_m != NULL);
    if (!mtext) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    int rc =
        put_file(dir, CKPT_META_FILE, mtext, strlen(mtext), &sums[ns++], err, err_cap);
    free(mtext);
    if (rc != 0) return -1;

    char text[4 * (64 + 2 + 32)];
    size_t tl = 0;
    for (size_t i = 0; i < ns; i++) {
        char hex[65];
        sha256_hex(sums[i].sha, hex);
        tl +=
            (size_t)snprintf(text + tl, sizeof text - tl, "%s  %s\n", hex, sums[i].file);
    }
    if (put_file(dir, CKPT_SUMS_FILE, text, tl, NULL, err, err_cap) != 0) return -1;
    return fsio_fsync_path(dir, 1, err, err_cap);
}

/* ------------------------------------------------------------------------- */
/* Stale temp dirs, retention                                                 */
/* ------------------------------------------------------------------------- */

/* 1 when a temp entry named with PID belongs to a process that is gone (or
 * to this one, for the checkpoint's own temp names: an earlier failed save). */
static int owner_gone(uint64_t pid, int own_is_gone) {
    if (pid == 0 || pid > INT_MAX) return 1;
    if ((pid_t)pid == getpid()) return own_is_gone;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Remove RUN/.tmp-ckpt-*-PID, RUN/.trash-ckpt-*-PID and RUN/.latest.tmp-PID
 * left by dead processes (or by an earlier failed save of this one), and the
 * fsio temp files (config.json.tmp.PID.N, metrics.jsonl.tmp.PID.N) of dead
 * processes. Best effort: what cannot be removed now is retried next save. */
static void clean_stale(const char *run_dir) {
    DIR *d = fsio_opendir(run_dir, NULL, 0);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        long tmp_pid = 0;
        uint64_t pid = 0;
        int gone;
        if (strncmp(n, CKPT_TMP_PREFIX, strlen(CKPT_TMP_PREFIX)) == 0 ||
            strncmp(n, CKPT_TRASH_PREFIX, strlen(CKPT_TRASH_PREFIX)) == 0 ||
            strncmp(n, CKPT_LATEST_TMP_PREFIX, strlen(CKPT_LATEST_TMP_PREFIX)) == 0) {
            const char *dash = strrchr(n, '-');
            if (!dash || util_parse_u64(dash + 1, &pid) != 0) pid = 0;
            gone = owner_gone(pid, 1);
        } else if (fsio_tmp_name_pid(n, &tmp_pid)) {
            gone = owner_gone((uint64_t)tmp_pid, 0);
        } else {
            continue;
        }
        if (!gone) continue;
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", run_dir, n) < (int)sizeof p)
            (void)fsio_rm_rf(p, NULL, 0);
    }
    closedir(d);
}

static double read_meta_val_loss(const char *ckpt_dir) {
    char p[PATH_MAX], *text = NULL;
    double v = NAN;
    if (snprintf(p, sizeof p, "%s/%s", ckpt_dir, CKPT_META_FILE) >= (int)sizeof p)
        return v;
    if (fsio_read_file(p, CKPT_META_MAX_BYTES, &text, NULL, NULL, 0) != 0) return v;
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
        snprintf(to, sizeof to, "%s/%s%s-%ld", run_dir, CKPT_TRASH_PREFIX,
                 name + strlen(CKPT_PREFIX), (long)getpid()) >= (int)sizeof to)
        return;
    if (fsio_rename(from, to, NULL, 0) != 0) return;
    (void)fsio_rm_rf(to, NULL, 0); /* the next save retries what is left */
}

static void apply_retention(const char *run_dir, const char *latest_name, int keep_last) {
    if (keep_last <= 0) return;
    ckpt_ent *v = NULL;
    size_t n = 0;
    if (ckpt_list(run_dir, &v, &n) != 0) return;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", run_dir, v[i].name) >= (int)sizeof p) continue;
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

/* RUN/latest = "NAME\n": RUN/.latest.tmp-PID written and fsynced, renamed
 * over `latest`, RUN fsynced. */
static int update_latest(const char *run_dir, const char *name, char *err,
                         size_t err_cap) {
    char tmp[PATH_MAX], dst[PATH_MAX], text[128];
    if (snprintf(tmp, sizeof tmp, "%s/" CKPT_LATEST_TMP_PREFIX "%ld", run_dir,
                 (long)getpid()) >= (int)sizeof tmp ||
        ckpt_path_join(dst, sizeof dst, run_dir, CKPT_LATEST_FILE, err, err_cap) != 0) {
        util_set_err(err, err_cap, "%s: path too long", run_dir);
        return -1;
    }
    int tl = snprintf(text, sizeof text, "%s\n", name);
    if (fsio_write_file(tmp, text, (size_t)tl, err, err_cap) != 0 ||
        fsio_rename(tmp, dst, err, err_cap) != 0) {
        (void)fsio_unlink(tmp, NULL, 0);
        return -1;
    }
    return fsio_fsync_path(run_dir, 1, err, err_cap);
}

/* Move the finished temp dir onto FINAL. When FINAL exists (the same step
 * saved again, e.g. after a resume) it is exchanged atomically and the old one
 * removed. */
static int install_dir(const char *tmp, const char *final, const char *trash, char *err,
                       size_t err_cap) {
    if (fsio_rename(tmp, final, err, err_cap) == 0) return 0;
    if (errno != EEXIST && errno != ENOTEMPTY) return -1;
    if (fsio_exchange(tmp, final, err, err_cap) == 0) {
        (void)fsio_rm_rf(tmp, NULL, 0); /* now holds the old contents */
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS) return -1; /* a real failure */
    /* No RENAME_EXCHANGE on this file system: move the old one aside first. */
    if (fsio_rename(final, trash, err, err_cap) != 0) return -1;
    if (fsio_rename(tmp, final, err, err_cap) != 0) {
        int e = errno;
        (void)fsio_rename(trash, final, NULL, 0); /* put the old one back */
        errno = e;
        return -1;
    }
    (void)fsio_rm_rf(trash, NULL, 0);
    return 0;
}

/* Create RUN_DIR (and make a new one's own directory entry durable). */
static int make_run_dir(const char *run_dir, char *err, size_t err_cap) {
    int fresh = !ckpt_is_dir(run_dir);
    if (fsio_mkdir_p(run_dir, err, err_cap) != 0) return -1;
    return fresh ? fsio_fsync_parent(run_dir, err, err_cap) : 0;
}

int ckpt_save(const char *run_dir, uint64_t step, const engine_handle *h,
              orch_engine_ctx *ctx, const char *state_json, const ckpt_save_opts *o,
              char *out_dir, size_t out_cap, char *err, size_t err_cap) {
    ckpt_save_opts def = ckpt_save_opts_default();
    if (!o) o = &def;
    if (!run_dir || !*run_dir || !h || !h->api || !ctx || !state_json) {
        util_set_err(err, err_cap, "ckpt_save: missing argument");
        return -1;
    }
    if (make_run_dir(run_dir, err, err_cap) != 0) return -1;
    clean_stale(run_dir);

    char name[64], tmp[PATH_MAX], final[PATH_MAX], trash[PATH_MAX];
    snprintf(name, sizeof name, CKPT_PREFIX "%08llu", (unsigned long long)step);
    if (snprintf(tmp, sizeof tmp, "%s/" CKPT_TMP_PREFIX "%08llu-%ld", run_dir,
                 (unsigned long long)step, (long)getpid()) >= (int)sizeof tmp ||
        snprintf(trash, sizeof trash, "%s/" CKPT_TRASH_PREFIX "%08llu-%ld", run_dir,
                 (unsigned long long)step, (long)getpid()) >= (int)sizeof trash ||
        ckpt_path_join(final, sizeof final, run_dir, name, err, err_cap) != 0) {
        util_set_err(err, err_cap, "%s: path too long", run_dir);
        return -1;
    }
    if (fsio_rm_rf(tmp, err, err_cap) != 0 || fsio_mkdir(tmp, err, err_cap) != 0)
        return -1;
    ckpt_tsrc params = { h, ctx, ORCH_TENSOR_PARAM, NULL, 0 };
    ckpt_tsrc m = { h, ctx, ORCH_TENSOR_ADAM_M, NULL, 0 };
    ckpt_tsrc v = { h, ctx, ORCH_TENSOR_ADAM_V, NULL, 0 };
    if (write_contents(tmp, &params, o->with_optimizer ? &m : NULL,
                       o->with_optimizer ? &v : NULL, state_json, step, o->val_loss,
                       h->api->name, err, err_cap) != 0)
        goto fail;
    if (install_dir(tmp, final, trash, err, err_cap) != 0) goto fail;
    if (fsio_fsync_path(run_dir, 1, err, err_cap) != 0) return -1;
    if (update_latest(run_dir, name, err, err_cap) != 0) return -1;
    apply_retention(run_dir, name, o->keep_last);
    if (out_dir && out_cap) snprintf(out_dir, out_cap, "%s", final);
    return 0;
fail:
    (void)fsio_rm_rf(tmp, NULL, 0); /* else removed by the next save */
    return -1;
}

int ckpt_write_dir(const char *ckpt_dir, const ckpt_tensor *tensors, size_t n,
                   const char *state_json, uint64_t step, char *err, size_t err_cap) {
    return ckpt_write_dir_extra(ckpt_dir, tensors, n, state_json, step, NULL, NULL, err,
                                err_cap);
}

int ckpt_write_dir_extra(const char *ckpt_dir, const ckpt_tensor *tensors, size_t n,
                         const char *state_json, uint64_t step, ckpt_extra_fn extra,
                         void *user, char *err, size_t err_cap) {
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
        util_set_err(err, err_cap, "%s: already exists (choose a new --out)", ckpt_dir);
        return -1;
    }
    const char *pdir = slash ? parent : ".";
    if (slash && fsio_mkdir_p(pdir, err, err_cap) != 0) return -1;
    if (snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%ld", pdir, slash ? base : parent,
                 (long)getpid()) >= (int)sizeof tmp) {
        util_set_err(err, err_cap, "%s: path too long", ckpt_dir);
        return -1;
    }
    if (fsio_rm_rf(tmp, err, err_cap) != 0 || fsio_mkdir(tmp, err, err_cap) != 0)
        return -1;
    ckpt_tsrc src = { NULL, NULL, 0, tensors, n };
    if (write_contents(tmp, &src, NULL, NULL, state_json, step, NAN, "", err, err_cap) !=
            0 ||
        (extra && (extra(tmp, user, err, err_cap) != 0 ||
                   fsio_fsync_path(tmp, 1, err, err_cap) != 0)) ||
        fsio_rename(tmp, ckpt_dir, err, err_cap) != 0) {
        (void)fsio_rm_rf(tmp, NULL, 0);
        return -1;
    }
    return fsio_fsync_path(pdir, 1, err, err_cap);
}
